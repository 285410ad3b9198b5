//! The power-cut disk ([`cluster::power_cut::PowerCutDisk`]) for tests: mounted, or the test
//! skipped saying why (a failure where `MINIBROKER_REQUIRE_POWER_CUT=1`, as `.ci/run` sets it).

use std::path::Path;

pub use cluster::power_cut::PowerCutDisk;

use crate::process::Node;

/// The power goes for `node` on `disk`: freezes it (SIGSTOP) and copies the disk as the device
/// holds it to `to`, at once (the kernel commits its journal every few seconds, which would save
/// what only the page cache holds). Kill the node next, then [`PowerCutDisk::boot_from`] `to`.
///
/// With `partial_writeback` (a seed), the device first wrote back about half of its cache, in
/// pieces that seed picks ([`PowerCutDisk::cut_after_partial_writeback`]): the media then hold
/// part of what was never flushed, in no order, which the node's recovery must make sense of.
pub fn cut_power(node: &Node, disk: &PowerCutDisk, to: &Path, partial_writeback: Option<u64>) {
    node.freeze();
    match partial_writeback {
        None => disk.cut(to).unwrap(),
        Some(seed) => disk.cut_after_partial_writeback(to, seed, 0.5).unwrap(),
    }
}

/// `MINIBROKER_REQUIRE_POWER_CUT` is set: a disk that cannot be mounted fails the test.
pub fn required() -> bool {
    std::env::var_os("MINIBROKER_REQUIRE_POWER_CUT").is_some_and(|v| v == "1")
}

/// [`PowerCutDisk::create`], or `None` after saying why the test is skipped; panics instead
/// where [`required`].
pub fn disk_or_skip(image: &Path, at: &Path, size_mib: u64) -> Option<PowerCutDisk> {
    match PowerCutDisk::create(image, at, size_mib) {
        Ok(disk) => Some(disk),
        Err(why) if required() => {
            panic!("MINIBROKER_REQUIRE_POWER_CUT=1 but no disk to cut: {why}")
        }
        Err(why) => {
            eprintln!("skipped: cannot mount a disk on loop devices here ({why})");
            None
        }
    }
}
