//! The `coordinator` binary (work in progress).
fn main() {}
