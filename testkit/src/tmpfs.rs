//! A small tmpfs to fill up: a disk that runs out of room, for the tests of what a node does
//! then. Mounting needs root (as on the project's CI machines); [`Tmpfs::mount`] says why it
//! could not, and the test skips.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted at a directory, unmounted (lazily) on drop.
#[derive(Debug)]
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`mount -o size=`, e.g. `"6m"`) at `at`, creating it; the
    /// error says why it could not (not root, no `mount`).
    pub fn mount(at: &Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Self(at.to_path_buf()))
    }

    /// Gives it `size` (more room, without unmounting: what is stored stays).
    pub fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
