//! Partition leader (placeholder header, completed with the service).

pub mod core;
pub mod error;
pub mod storage;

pub use error::Error;
