//! `partition-leader` binary (being written).

fn main() {}
