//! Coordinator benchmark (work in progress).
fn main() {}
