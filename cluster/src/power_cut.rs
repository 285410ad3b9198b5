//! A disk whose power can be cut, with a volatile write cache: an ext4 file system on a loop
//! device whose device is itself a file system on a loop device, for what a node keeps when the
//! machine loses power, not only the process (the power-cut tests, and
//! `minibroker chaos --power-cuts`).
//!
//! A SIGKILL keeps everything a node wrote into the page cache, flushed or not, so it cannot
//! tell a write that reached the disk from one that did not. A power cut can: what is left is
//! what the device's stable media hold. And a disk acknowledges a write once it is in its cache:
//! only a cache flush (what `fsync` and `fdatasync` end with, and what ext4 sends around a journal
//! commit) makes it stable. So the device here has a cache that a cut loses:
//!
//! - the node's file system (ext4) lives in an image, `disk.img`, behind a loop device: what
//!   the kernel writes to that device is acknowledged once it is in that image's page cache;
//! - that image is a file of a second ext4 file system (the device's, mounted at `<image>.device`),
//!   itself in the file `image` behind a second loop device. The device's page cache is its
//!   volatile cache: the loop device turns the node file system's cache flush into an `fsync` of
//!   `disk.img`, which writes the cache out and commits the device file system's journal;
//! - the file `image` is the device's stable media.
//!
//! [`PowerCutDisk::cut`] copies `image` as it stands: the media after the power went, without the
//! writes that sat in the cache since the last flush (the kernel writes some of the cache back on
//! its own, after tens of seconds, as a disk's cache may). [`PowerCutDisk::boot_from`] mounts that
//! copy in place of `image` (the device's journal is replayed, then the node's, as at the next
//! boot), for the node to start on again. A write that reached the device but was never flushed
//! is lost, the way a power cut loses it; the model without the cache kept it (a test below).
//!
//! Freeze the node's process (SIGSTOP) before the cut, so that the copy is of one moment: the
//! kernel's own writeback and journal commits (every few seconds) may still land during the
//! copy, as a disk may finish writes it was handed when the power goes. Cut at once after the
//! freeze: a journal commit meanwhile would save what only the page cache held.
//!
//! Needs root (mount, two loop devices) and `mkfs.ext4`: [`PowerCutDisk::create`] says why it
//! could not. Blocking (it runs `mkfs.ext4`, `mount`, `cp`): call it from a blocking context.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The node's ext4 file system mounted at a directory, through a loop device whose image lives
/// on the device's own file system (its cache) over the media file; unmounted on drop.
#[derive(Debug)]
pub struct PowerCutDisk {
    /// The device's stable media: the image of the device's file system.
    media: PathBuf,
    /// Where the device's file system (the cache) is mounted; it holds [`NODE_IMAGE`].
    device: PathBuf,
    /// Where the node's file system is mounted.
    mount_point: PathBuf,
    device_mounted: bool,
    mounted: bool,
}

/// The node file system's image, in the device's file system.
const NODE_IMAGE: &str = "disk.img";

/// What [`PowerCutDisk::cut_after_partial_writeback`] writes back or not, piece by piece.
pub const WRITEBACK_PIECE: u64 = 16 << 10;

/// How long the writeback [`PowerCutDisk::cut_after_partial_writeback`] started is given before
/// the media are copied (what has not landed by then is lost, as on a disk).
pub const WRITEBACK_SETTLE: std::time::Duration = std::time::Duration::from_millis(50);

/// Runs `program args`; its stderr is the error when it fails.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn path_str(p: &Path) -> Result<&str, String> {
    p.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", p.display()))
}

/// Makes a sparse file of `size_mib` MiB at `image` and an ext4 file system in it.
fn make_ext4(image: &Path, size_mib: u64) -> Result<(), String> {
    let file = std::fs::File::create(image).map_err(|e| format!("{}: {e}", image.display()))?;
    file.set_len(size_mib << 20).map_err(|e| e.to_string())?;
    drop(file);
    // Inode tables and journal initialised now, not by a kernel thread during the run.
    run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            path_str(image)?,
        ],
    )
}

/// Unmounts `at`, retrying for up to [`UNMOUNT_WAIT`] while it is busy: a loop device lets go
/// of its image a moment after the file system on it is unmounted (the kernel clears it
/// asynchronously), and a killed process a moment after its kill.
fn unmount(at: &Path) -> Result<(), String> {
    let deadline = std::time::Instant::now() + UNMOUNT_WAIT;
    loop {
        match run("umount", &[path_str(at)?]) {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "unmount busy; retrying");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long [`unmount`] retries a busy file system.
const UNMOUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn mount_loop(image: &Path, at: &Path) -> Result<(), String> {
    run(
        "mount",
        &["-t", "ext4", "-o", "loop", path_str(image)?, path_str(at)?],
    )
}

impl PowerCutDisk {
    /// Makes a disk whose node file system has `size_mib` MiB: its media in the file `image`,
    /// the device's file system mounted at `<image>.device`, and the node's at `at` (created).
    /// The error says why it could not (not root, no loop device, no `mkfs.ext4`).
    pub fn create(image: &Path, at: &Path, size_mib: u64) -> Result<Self, String> {
        let mut device = image.as_os_str().to_owned();
        device.push(".device");
        let mut disk = Self {
            media: image.to_path_buf(),
            device: PathBuf::from(device),
            mount_point: at.to_path_buf(),
            device_mounted: false,
            mounted: false,
        };
        std::fs::create_dir_all(at).map_err(|e| format!("{}: {e}", at.display()))?;
        std::fs::create_dir_all(&disk.device)
            .map_err(|e| format!("{}: {e}", disk.device.display()))?;
        // Room for the node's image (sparse: what it writes is allocated as it goes), plus
        // the device file system's own journal and tables.
        make_ext4(image, size_mib + size_mib / 8 + 64)?;
        mount_loop(image, &disk.device)?;
        disk.device_mounted = true;
        make_ext4(&disk.device.join(NODE_IMAGE), size_mib)?;
        disk.mount()?;
        Ok(disk)
    }

    fn mount(&mut self) -> Result<(), String> {
        mount_loop(&self.device.join(NODE_IMAGE), &self.mount_point)?;
        self.mounted = true;
        Ok(())
    }

    /// Where the node's file system is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// The power goes: copies the device's media, as they hold now (without what is only in
    /// the device's cache), to `to`. Freeze the node first. The mounted file systems are left
    /// as they are: kill the node, then [`PowerCutDisk::boot_from`] the copy.
    pub fn cut(&self, to: &Path) -> Result<(), String> {
        run(
            "cp",
            &["--sparse=always", path_str(&self.media)?, path_str(to)?],
        )
    }

    /// The power goes after the device wrote back part of its cache on its own, in no order
    /// of its writes: a disk may persist cached writes in any order, so a cut may find any part
    /// of what it was never told to flush on the media. About `fraction` of the node image (in
    /// [`WRITEBACK_PIECE`] pieces chosen by `seed`) has its cached writes started towards the
    /// media, and [`WRITEBACK_SETTLE`] later the media are copied as [`PowerCutDisk::cut`] does.
    pub fn cut_after_partial_writeback(
        &self,
        to: &Path,
        seed: u64,
        fraction: f64,
    ) -> Result<(), String> {
        use rand::{Rng, SeedableRng};
        use std::os::fd::AsRawFd;

        let image = self.device.join(NODE_IMAGE);
        let file = std::fs::File::open(&image).map_err(|e| format!("{}: {e}", image.display()))?;
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let piece = WRITEBACK_PIECE;
        for offset in (0..len).step_by(piece as usize) {
            if rng.gen_bool(fraction.clamp(0.0, 1.0)) {
                // POSIX_FADV_DONTNEED starts the writeback of the range's dirty pages (the
                // device's cache) without waiting, and drops its clean ones.
                nix::fcntl::posix_fadvise(
                    file.as_raw_fd(),
                    offset as i64,
                    piece as i64,
                    nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
                )
                .map_err(|e| format!("writing back part of the cache: {e}"))?;
            }
        }
        std::thread::sleep(WRITEBACK_SETTLE);
        self.cut(to)
    }

    /// The machine boots again after the cut: unmounts both file systems (kill the node on
    /// this disk first), puts the media `after_cut` (made by [`PowerCutDisk::cut`]) in place of
    /// this disk's, and mounts the device's file system and the node's again, at the same
    /// directories.
    pub fn boot_from(&mut self, after_cut: &Path) -> Result<(), String> {
        if !after_cut.is_file() {
            return Err(format!("{}: no such disk image", after_cut.display()));
        }
        if self.mounted {
            unmount(&self.mount_point)?;
            self.mounted = false;
        }
        if self.device_mounted {
            unmount(&self.device)?;
            self.device_mounted = false;
        }
        std::fs::rename(after_cut, &self.media).map_err(|e| e.to_string())?;
        mount_loop(&self.media, &self.device)?;
        self.device_mounted = true;
        self.mount()
    }
}

impl Drop for PowerCutDisk {
    fn drop(&mut self) {
        for (mounted, dir) in [
            (self.mounted, &self.mount_point),
            (self.device_mounted, &self.device),
        ] {
            if mounted {
                let _ = Command::new("umount").arg("-l").arg(dir).status();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_that_cannot_be_made_is_an_error_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        // The image's directory is a file: no image, an error, no panic, nothing mounted.
        let err =
            PowerCutDisk::create(&dir.path().join("file/disk.img"), &dir.path().join("m"), 16)
                .unwrap_err();
        assert!(!err.is_empty());
        // A mount point that cannot be a directory.
        let err = PowerCutDisk::create(&dir.path().join("disk.img"), &dir.path().join("file"), 16)
            .unwrap_err();
        assert!(!err.is_empty());
    }

    #[test]
    fn a_copy_that_is_not_there_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut disk = PowerCutDisk {
            media: dir.path().join("disk.img"),
            device: dir.path().join("disk.img.device"),
            mount_point: dir.path().join("m"),
            device_mounted: false,
            mounted: false,
        };
        assert!(disk.cut(&dir.path().join("copy.img")).is_err());
        // No device file system, no image in it: an error saying which file, no copy made.
        let err = disk
            .cut_after_partial_writeback(&dir.path().join("copy.img"), 1, 0.5)
            .unwrap_err();
        assert!(err.contains("disk.img"), "{err}");
        assert!(!dir.path().join("copy.img").exists());
        assert!(disk.boot_from(&dir.path().join("missing.img")).is_err());
        assert!(!disk.mounted && !disk.device_mounted);
    }

    /// Writes `byte` over the first `len` bytes (a multiple of 64 KiB) of `file` with O_DIRECT
    /// (`dd oflag=direct`): the write completes once the device acknowledged it; nothing asks
    /// for a cache flush.
    fn write_direct_unflushed(file: &Path, byte: u8, len: usize, scratch: &Path) {
        std::fs::write(scratch, vec![byte; len]).unwrap();
        run(
            "dd",
            &[
                &format!("if={}", scratch.display()),
                &format!("of={}", file.display()),
                "bs=65536",
                &format!("count={}", len / 65536),
                "oflag=direct",
                "conv=notrunc",
                "status=none",
            ],
        )
        .unwrap();
    }

    /// Writes `byte` x `len` to `file` and fsyncs it and its directory.
    fn write_flushed(file: &Path, byte: u8, len: usize) {
        use std::io::Write;
        let mut f = std::fs::File::create(file).unwrap();
        f.write_all(&vec![byte; len]).unwrap();
        f.sync_all().unwrap();
        std::fs::File::open(file.parent().unwrap())
            .unwrap()
            .sync_all()
            .unwrap();
    }

    /// What `file` holds, in a line: how many of each byte ("65536 x 'a'").
    fn summary(file: &Path) -> String {
        let mut counts = std::collections::BTreeMap::new();
        for b in std::fs::read(file).unwrap() {
            *counts.entry(b as char).or_insert(0usize) += 1;
        }
        let parts: Vec<String> = counts.iter().map(|(b, n)| format!("{n} x {b:?}")).collect();
        parts.join(", ")
    }

    /// A disk to cut, or `None` (the test skipped, saying why) where loop devices cannot be
    /// mounted; a failure where `MINIBROKER_REQUIRE_POWER_CUT=1`.
    fn disk_or_skip(dir: &Path) -> Option<PowerCutDisk> {
        match PowerCutDisk::create(&dir.join("media.img"), &dir.join("m"), 64) {
            Ok(disk) => Some(disk),
            Err(why)
                if std::env::var_os("MINIBROKER_REQUIRE_POWER_CUT").is_some_and(|v| v == "1") =>
            {
                panic!("MINIBROKER_REQUIRE_POWER_CUT=1 but no disk to cut: {why}")
            }
            Err(why) => {
                eprintln!("skipped: cannot mount a disk on loop devices here ({why})");
                None
            }
        }
    }

    #[test]
    fn a_write_the_device_acknowledged_but_was_never_told_to_flush_is_lost_at_a_cut() {
        let dir = tempfile::tempdir().unwrap();
        let Some(mut disk) = disk_or_skip(dir.path()) else {
            return;
        };
        let (kept, cached) = (
            disk.mount_point().join("kept"),
            disk.mount_point().join("cached"),
        );
        write_flushed(&kept, b'k', 64 << 10);
        write_flushed(&cached, b'a', 64 << 10);
        // Reaches the device (the write completed, O_DIRECT past the page cache) and sits in
        // its cache: a disk without a volatile cache (the loop device alone) would keep it.
        write_direct_unflushed(&cached, b'b', 64 << 10, &dir.path().join("scratch"));
        assert_eq!(summary(&cached), "65536 x 'b'");
        let copy = dir.path().join("after-cut.img");
        disk.cut(&copy).unwrap();
        disk.boot_from(&copy).unwrap();
        assert_eq!(
            summary(&kept),
            "65536 x 'k'",
            "a flushed write survives the cut"
        );
        assert_eq!(
            summary(&cached),
            "65536 x 'a'",
            "the unflushed write was only in the device's cache"
        );
    }

    #[test]
    fn a_cut_after_a_partial_writeback_finds_part_of_the_unflushed_writes_on_the_media() {
        let dir = tempfile::tempdir().unwrap();
        let Some(mut disk) = disk_or_skip(dir.path()) else {
            return;
        };
        let file = disk.mount_point().join("f");
        let len = 4 << 20;
        write_flushed(&file, b'a', len);
        write_direct_unflushed(&file, b'b', len, &dir.path().join("scratch"));
        let copy = dir.path().join("after-cut.img");
        disk.cut_after_partial_writeback(&copy, 7, 0.5).unwrap();
        disk.boot_from(&copy).unwrap();
        let after = summary(&file);
        // Some pieces of the cache reached the media and some did not; the file is whole.
        assert!(
            after.contains("x 'a'") && after.contains("x 'b'"),
            "expected a mix of the flushed and the unflushed bytes, found {after}"
        );
        assert_eq!(std::fs::metadata(&file).unwrap().len(), len as u64);
    }
}
