//! A disk whose power can be cut: an ext4 file system on a loop device, for what a node keeps
//! when the machine loses power, not only the process (the power-cut tests, and
//! `minibroker chaos --power-cuts`).
//!
//! A SIGKILL keeps everything a node wrote into the page cache, flushed or not, so it cannot
//! tell a write that reached the disk from one that did not. A power cut can: what is left is
//! what the device holds. Here the device is a file (the image) behind a loop device; everything
//! the kernel wrote to it is in the image, and what is still only in the mounted file system's
//! caches (dirty pages, the inode size and extents of a file that grew, the running journal
//! transaction) is not. [`PowerCutDisk::cut`] copies the image as it stands: the disk after the
//! power went. [`PowerCutDisk::boot_from`] mounts that copy in place of the image (ext4 replays
//! its journal, as at the next boot), for the node to start on again.
//!
//! Freeze the node's process (SIGSTOP) before the cut, so that the copy is of one moment: the
//! kernel's own writeback and journal commits (every few seconds) may still land during the
//! copy, as a disk may finish writes it was handed when the power goes. Cut at once after the
//! freeze: a journal commit meanwhile would save what only the page cache held.
//!
//! Needs root (mount, a loop device) and `mkfs.ext4`: [`PowerCutDisk::create`] says why it
//! could not. Blocking (it runs `mkfs.ext4`, `mount`, `cp`): call it from a blocking context.

use std::path::{Path, PathBuf};
use std::process::Command;

/// An ext4 image mounted (through a loop device) at a directory; unmounted on drop.
#[derive(Debug)]
pub struct PowerCutDisk {
    image: PathBuf,
    mount_point: PathBuf,
    mounted: bool,
}

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

impl PowerCutDisk {
    /// Makes a `size_mib` MiB ext4 image at `image` and mounts it at `at` (created); the error
    /// says why it could not (not root, no loop device, no `mkfs.ext4`).
    pub fn create(image: &Path, at: &Path, size_mib: u64) -> Result<Self, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let file = std::fs::File::create(image).map_err(|e| e.to_string())?;
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
        )?;
        let mut disk = Self {
            image: image.to_path_buf(),
            mount_point: at.to_path_buf(),
            mounted: false,
        };
        disk.mount()?;
        Ok(disk)
    }

    fn mount(&mut self) -> Result<(), String> {
        run(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                "loop",
                path_str(&self.image)?,
                path_str(&self.mount_point)?,
            ],
        )?;
        self.mounted = true;
        Ok(())
    }

    /// Where the file system is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// The power goes: copies the image, as the device holds it now, to `to`. Freeze the node
    /// first. The mounted file system is left as it is: kill the node, then
    /// [`PowerCutDisk::boot_from`] the copy.
    pub fn cut(&self, to: &Path) -> Result<(), String> {
        run(
            "cp",
            &["--sparse=always", path_str(&self.image)?, path_str(to)?],
        )
    }

    /// The machine boots again after the cut: unmounts this disk (kill the node on it first),
    /// puts the image `after_cut` (made by [`PowerCutDisk::cut`]) in place of its image and
    /// mounts it at the same directory.
    pub fn boot_from(&mut self, after_cut: &Path) -> Result<(), String> {
        if self.mounted {
            run("umount", &[path_str(&self.mount_point)?])?;
            self.mounted = false;
        }
        std::fs::rename(after_cut, &self.image).map_err(|e| e.to_string())?;
        self.mount()
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
            image: dir.path().join("disk.img"),
            mount_point: dir.path().join("m"),
            mounted: false,
        };
        assert!(disk.cut(&dir.path().join("copy.img")).is_err());
        assert!(disk.boot_from(&dir.path().join("missing.img")).is_err());
        assert!(!disk.mounted);
    }
}
