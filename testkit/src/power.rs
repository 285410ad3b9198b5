//! A disk whose power can be cut: an ext4 file system on a loop device, for the tests of what a
//! node keeps when the machine loses power, not only the process.
//!
//! A SIGKILL keeps everything a node wrote into the page cache, flushed or not, so it cannot
//! tell a write that reached the disk from one that did not. A power cut can: what is left is
//! what the device holds. Here the device is a file (the image) behind a loop device; everything
//! the kernel wrote to it is in the image, and what is still only in the mounted file system's
//! caches (dirty pages, the inode size and extents of a file that grew, the running journal
//! transaction) is not. [`PowerCutDisk::cut`] copies the image as it stands: the disk after the
//! power went. [`PowerCutDisk::mount_after_cut`] mounts that copy (ext4 replays its journal, as
//! at the next boot), for a node to start on.
//!
//! Stop the node's process (SIGSTOP, [`crate::process::Node::freeze`]) before the cut, so that the
//! copy is of one moment: the kernel's own writeback (every 5 s) and journal commits may still
//! land during the copy, as a disk may finish writes it was handed when the power goes.
//!
//! Needs root (mount, a loop device) and `mkfs.ext4`, as on the project's CI machines;
//! [`PowerCutDisk::mount`] says why it could not, and the test skips (or fails where
//! `MINIBROKER_REQUIRE_POWER_CUT=1`, as `.ci/run` sets it).

use std::path::{Path, PathBuf};
use std::process::Command;

/// An ext4 image mounted (through a loop device) at a directory; unmounted on drop.
#[derive(Debug)]
pub struct PowerCutDisk {
    image: PathBuf,
    mount_point: PathBuf,
    mounted: bool,
}

/// Runs `program args`, its stderr as the error when it fails.
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

impl PowerCutDisk {
    /// Makes a `size_mib` MiB ext4 image at `image` and mounts it at `at` (created); the error
    /// says why it could not (not root, no loop device, no `mkfs.ext4`).
    pub fn mount(image: &Path, at: &Path, size_mib: u64) -> Result<Self, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let file = std::fs::File::create(image).map_err(|e| e.to_string())?;
        file.set_len(size_mib << 20).map_err(|e| e.to_string())?;
        drop(file);
        // Inode tables and journal initialised now, not by a background thread during the test.
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                path_str(image)?,
            ],
        )?;
        let disk = Self {
            image: image.to_path_buf(),
            mount_point: at.to_path_buf(),
            mounted: false,
        };
        disk.mount_image(image)
    }

    fn mount_image(mut self, image: &Path) -> Result<Self, String> {
        run(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                "loop",
                path_str(image)?,
                path_str(&self.mount_point)?,
            ],
        )?;
        self.image = image.to_path_buf();
        self.mounted = true;
        Ok(self)
    }

    /// `MINIBROKER_REQUIRE_POWER_CUT` is set: a disk that cannot be mounted fails the test.
    pub fn required() -> bool {
        std::env::var_os("MINIBROKER_REQUIRE_POWER_CUT").is_some_and(|v| v == "1")
    }

    /// [`PowerCutDisk::mount`], or `None` after saying why the test is skipped; panics instead
    /// where [`PowerCutDisk::required`].
    pub fn mount_or_skip(image: &Path, at: &Path, size_mib: u64) -> Option<Self> {
        match Self::mount(image, at, size_mib) {
            Ok(disk) => Some(disk),
            Err(why) if Self::required() => {
                panic!("MINIBROKER_REQUIRE_POWER_CUT=1 but no disk to cut: {why}")
            }
            Err(why) => {
                eprintln!("skipped: cannot mount a loop device here ({why})");
                None
            }
        }
    }

    /// The power goes: copies the image as the device holds it now to `to`. Freeze the node
    /// first. The mounted file system is left as it is (unmount it, by dropping, after killing
    /// the node).
    pub fn cut(&self, to: &Path) -> Result<(), String> {
        run(
            "cp",
            &["--sparse=always", path_str(&self.image)?, path_str(to)?],
        )
    }

    /// Unmounts this disk (kill the node on it first) and mounts the image `after_cut` (made by
    /// [`PowerCutDisk::cut`]) at the same directory: the machine boots again after the cut.
    pub fn mount_after_cut(mut self, after_cut: &Path) -> Result<Self, String> {
        self.unmount()?;
        self.mount_image(after_cut)
    }

    fn unmount(&mut self) -> Result<(), String> {
        if self.mounted {
            run("umount", &[path_str(&self.mount_point)?])?;
            self.mounted = false;
        }
        Ok(())
    }
}

impl Drop for PowerCutDisk {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mount_point)
                .status();
        }
    }
}
