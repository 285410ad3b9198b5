//! The history of a chaos run: one JSON object per line, written by the driver as events happen.
//!
//! Producer workers print their events on stdout ([`WorkerEvent`]); the driver stamps each with
//! the instance that printed it and appends it to the history together with its own events
//! (faults, observations of the read_committed poller). The [`super::checker`] reads nothing but
//! this history and the final read-back, so a history file can be checked again later.
//!
//! Times are microseconds since the Unix epoch, read on the one machine that runs every process,
//! so events of different processes can be ordered by them.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// What a producer worker reports, one line each, on stdout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WorkerEvent {
    /// InitProducerId returned (PID, epoch). `at_us` is when the reply arrived.
    InitOk {
        /// Reply time.
        at_us: i64,
        /// The producer id.
        pid: i64,
        /// The epoch this instance holds.
        epoch: i32,
    },
    /// InitProducerId failed; the worker exits.
    InitFailed {
        /// Reply time.
        at_us: i64,
        /// The error.
        error: String,
    },
    /// A transaction began (client side; nothing is sent yet).
    Begin {
        /// The worker's transaction number (per instance).
        txn: u64,
    },
    /// One record sent inside transaction `txn`.
    Send {
        /// Transaction number.
        txn: u64,
        /// The record's value, unique in the whole run.
        value: String,
        /// When the request was sent.
        sent_us: i64,
        /// When the reply arrived.
        at_us: i64,
        /// `None` if the send failed.
        ok: Option<SendOk>,
        /// The error, if it failed.
        error: Option<String>,
        /// Whether the error was fatal (the instance was fenced).
        fatal: bool,
    },
    /// The worker is about to send EndTxn for `txn` (`commit` true for COMMIT).
    EndStart {
        /// Transaction number.
        txn: u64,
        /// COMMIT or ABORT.
        commit: bool,
        /// When EndTxn was sent.
        sent_us: i64,
    },
    /// EndTxn for `txn` returned.
    End {
        /// Transaction number.
        txn: u64,
        /// COMMIT or ABORT.
        commit: bool,
        /// When EndTxn was sent.
        sent_us: i64,
        /// When the reply arrived.
        at_us: i64,
        /// `None` on success.
        error: Option<String>,
        /// Whether the error was fatal (the instance was fenced).
        fatal: bool,
    },
    /// The worker stops (asked to, fenced, or after an error it cannot recover from).
    Exit {
        /// Why.
        reason: String,
    },
}

/// Where an acknowledged record landed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendOk {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Entry {
    /// A worker's event, stamped with who printed it.
    Worker {
        /// The transactional id.
        txid: String,
        /// The instance (unique in the run), e.g. `p2#1`.
        instance: String,
        /// The event.
        event: WorkerEvent,
    },
    /// A fault the nemesis injected (or healed).
    Fault {
        /// When.
        at_us: i64,
        /// What, e.g. `kill coordinator-1`.
        what: String,
    },
    /// What the read_committed poller saw at one poll of one partition.
    Observed {
        /// When.
        at_us: i64,
        /// Partition.
        partition: i32,
        /// High watermark.
        high_watermark: i64,
        /// Last stable offset.
        last_stable_offset: i64,
        /// Records returned by this poll: (offset, value).
        records: Vec<(i64, String)>,
    },
}

/// A record of the final read-back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Value (as text; chaos values are ASCII).
    pub value: String,
}

/// Everything read back once the cluster has healed and gone quiet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalRead {
    /// Every record a read_committed reader sees, per partition in offset order.
    pub committed: Vec<ReadRecord>,
    /// Every record a read_uncommitted reader sees.
    pub uncommitted: Vec<ReadRecord>,
    /// Transactional ids still Ongoing or Prepare* at the coordinators after quiescence.
    pub open_transactions: Vec<String>,
    /// Partitions whose LSO is below the high watermark after quiescence: (partition, hw, lso).
    pub held_partitions: Vec<(i32, i64, i64)>,
}
