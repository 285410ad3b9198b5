//! The fencing of transaction markers, in one place: the rule a partition leader applies to
//! WriteTxnMarkers (per partition and PID) and a group's coordinator applies to
//! WriteGroupOffsetMarker (per group), PROTOCOL.md section 9.
//!
//! What: [`check`] compares a marker's (epoch, coordinator generation) with what the receiver
//! recorded and answers, in this order:
//!
//! | marker vs. recorded                         | answer                                          |
//! |---------------------------------------------|-------------------------------------------------|
//! | epoch below the recorded epoch for the PID  | [`Fenced::InvalidProducerEpoch`]                |
//! | generation below the recorded generation    | [`Fenced::CoordinatorFenced`]                   |
//! | epoch above, or nothing recorded            | [`Decision::Apply`]: end the transaction, record both |
//! | same epoch, newer generation                | [`Decision::RecordGeneration`]: the same marker again, record only the generation |
//! | same epoch, same or no newer generation     | [`Decision::Nothing`]: the same marker again    |
//!
//! Why it is enough: every transaction ends with an epoch bump, so each transaction's marker
//! carries an epoch no earlier marker of its PID had; a late marker of an older transaction
//! always has a lower epoch, and a marker from an older incarnation of a coordinator a lower
//! generation.
//!
//! CAVEATS: shape checks (negative ids, out-of-range epochs) stay with each receiver, which
//! answers INVALID_REQUEST in its own words before asking this module; what "apply" writes
//! (a control record, committed offsets) is the receiver's business too.

use crate::ProducerEpoch;

/// What the receiver recorded: the epoch of the last marker applied for the marker's PID and the
/// highest generation seen from the marker's coordinator (`None`: never).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The PID's recorded epoch.
    pub producer_epoch: Option<ProducerEpoch>,
    /// The coordinator's recorded generation.
    pub coordinator_generation: Option<i64>,
}

/// A marker accepted by [`check`]: what to do with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A new epoch for the PID: end the transaction (write what it decided) and record the
    /// epoch and the generation.
    Apply,
    /// The same marker again, from a newer generation of its coordinator: record the
    /// generation only, write nothing else.
    RecordGeneration,
    /// The same marker again: nothing to write (answer NONE).
    Nothing,
}

/// A marker refused by [`check`]: the wire error and the values that decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fenced {
    /// INVALID_PRODUCER_EPOCH: the marker's epoch is below the one recorded for its PID.
    InvalidProducerEpoch {
        /// The marker's epoch.
        epoch: ProducerEpoch,
        /// The recorded epoch.
        recorded: ProducerEpoch,
    },
    /// TRANSACTION_COORDINATOR_FENCED: the marker comes from an older generation of its
    /// coordinator.
    CoordinatorFenced {
        /// The marker's generation.
        generation: i64,
        /// The recorded generation.
        recorded: i64,
    },
}

/// The fencing decision for a marker with `epoch` and `generation` against `recorded` (see the
/// module docs for the table). The epoch is checked before the generation.
pub fn check(
    recorded: Recorded,
    epoch: ProducerEpoch,
    generation: i64,
) -> Result<Decision, Fenced> {
    if let Some(r) = recorded.producer_epoch.filter(|&r| epoch < r) {
        return Err(Fenced::InvalidProducerEpoch { epoch, recorded: r });
    }
    if let Some(r) = recorded.coordinator_generation.filter(|&r| generation < r) {
        return Err(Fenced::CoordinatorFenced {
            generation,
            recorded: r,
        });
    }
    if recorded.producer_epoch != Some(epoch) {
        return Ok(Decision::Apply);
    }
    if recorded
        .coordinator_generation
        .is_none_or(|r| generation > r)
    {
        return Ok(Decision::RecordGeneration);
    }
    Ok(Decision::Nothing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(epoch: Option<ProducerEpoch>, generation: Option<i64>) -> Recorded {
        Recorded {
            producer_epoch: epoch,
            coordinator_generation: generation,
        }
    }

    #[test]
    fn every_row() {
        assert_eq!(check(rec(None, None), 0, 0), Ok(Decision::Apply));
        assert_eq!(check(rec(Some(3), Some(2)), 4, 2), Ok(Decision::Apply));
        assert_eq!(check(rec(Some(3), Some(2)), 4, 5), Ok(Decision::Apply));
        assert_eq!(check(rec(None, Some(2)), 0, 2), Ok(Decision::Apply));
        assert_eq!(
            check(rec(Some(3), Some(2)), 2, 9),
            Err(Fenced::InvalidProducerEpoch {
                epoch: 2,
                recorded: 3
            })
        );
        assert_eq!(
            check(rec(Some(3), Some(2)), 4, 1),
            Err(Fenced::CoordinatorFenced {
                generation: 1,
                recorded: 2
            })
        );
        assert_eq!(check(rec(Some(3), Some(2)), 3, 2), Ok(Decision::Nothing));
        assert_eq!(
            check(rec(Some(3), Some(2)), 3, 3),
            Ok(Decision::RecordGeneration)
        );
        assert_eq!(
            check(rec(Some(3), None), 3, 0),
            Ok(Decision::RecordGeneration)
        );
    }

    #[test]
    fn epoch_is_checked_before_generation() {
        assert!(matches!(
            check(rec(Some(3), Some(2)), 2, 1),
            Err(Fenced::InvalidProducerEpoch { .. })
        ));
    }
}
