//! Wire validation of a Produce batch: malformed or oversized input is rejected here, before it
//! reaches any state. Touches no state.

use crate::error::{Error, Result};

use super::{
    BatchHeader, Header, Limits, ProduceBatch, HEADER_OVERHEAD_BYTES, NO_PRODUCER_ID,
    RECORD_OVERHEAD_BYTES,
};

/// `sequence + increment`, wrapping from `i32::MAX` to 0 (Kafka's `incrementSequence`).
pub fn increment_sequence(sequence: i32, increment: i32) -> i32 {
    if sequence > i32::MAX - increment {
        increment - (i32::MAX - sequence) - 1
    } else {
        sequence + increment
    }
}

/// Rejects malformed or oversized batches before they reach any state.
pub fn validate_batch(limits: &Limits, batch: &ProduceBatch) -> Result<BatchHeader> {
    check_size(limits, batch)?;
    let record_count = batch.records.len() as i64;
    if batch.producer_id == NO_PRODUCER_ID {
        if batch.is_transactional {
            return Err(Error::InvalidRequest(
                "a transactional batch needs a producer id".into(),
            ));
        }
        return Ok(BatchHeader {
            producer_id: NO_PRODUCER_ID,
            epoch: -1,
            first_seq: -1,
            last_seq: -1,
            record_count,
            transactional: false,
            any_first_sequence: false,
        });
    }
    idempotent_header(batch)
}

/// The record count and the byte limits (MESSAGE_TOO_LARGE).
fn check_size(limits: &Limits, batch: &ProduceBatch) -> Result<()> {
    if batch.records.is_empty() {
        return Err(Error::InvalidRequest(
            "a batch needs at least one record".into(),
        ));
    }
    let count = batch.records.len();
    if count > i32::MAX as usize {
        return Err(Error::InvalidRequest(format!(
            "{count} records in one batch"
        )));
    }
    let mut batch_bytes = 0usize;
    for (i, r) in batch.records.iter().enumerate() {
        let size = r.key.len() + r.value.len() + r.headers.iter().map(Header::size).sum::<usize>();
        if size > limits.max_record_bytes {
            return Err(Error::MessageTooLarge(format!(
                "record {i} is {size} bytes, the limit is {}",
                limits.max_record_bytes
            )));
        }
        batch_bytes += size + RECORD_OVERHEAD_BYTES + r.headers.len() * HEADER_OVERHEAD_BYTES;
    }
    if batch_bytes > limits.max_batch_bytes {
        return Err(Error::MessageTooLarge(format!(
            "batch is {batch_bytes} bytes, the limit is {}",
            limits.max_batch_bytes
        )));
    }
    Ok(())
}

/// The header of a batch with a PID: PID, epoch, sequence and transactional id in range.
fn idempotent_header(batch: &ProduceBatch) -> Result<BatchHeader> {
    if batch.producer_id < 0 {
        return Err(Error::InvalidRequest(format!(
            "producer id {} is negative",
            batch.producer_id
        )));
    }
    let epoch = cluster::epoch_from_wire(batch.producer_epoch, false).ok_or_else(|| {
        Error::InvalidRequest(format!(
            "producer epoch {} is outside [0, {}]",
            batch.producer_epoch,
            i16::MAX
        ))
    })?;
    if batch.base_sequence < 0 {
        return Err(Error::InvalidRequest(format!(
            "base sequence {} is negative",
            batch.base_sequence
        )));
    }
    if batch.is_transactional
        && (batch.transactional_id.is_empty() || batch.transactional_id.len() > cluster::MAX_ID_LEN)
    {
        return Err(Error::InvalidRequest(format!(
            "a transactional batch needs a transactional id of 1..={} bytes",
            cluster::MAX_ID_LEN
        )));
    }
    let count = batch.records.len();
    Ok(BatchHeader {
        producer_id: batch.producer_id,
        epoch,
        first_seq: batch.base_sequence,
        last_seq: increment_sequence(batch.base_sequence, (count - 1) as i32),
        record_count: count as i64,
        transactional: batch.is_transactional,
        any_first_sequence: false,
    })
}
