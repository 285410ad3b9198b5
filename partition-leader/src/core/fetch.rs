//! The read side: what a fetch may see ([`FetchView`]). Read-only.

use crate::error::{Error, Result};

use super::{FetchView, PartitionState};

impl PartitionState {
    /// What a fetch from `offset` may read: up to the published [`PartitionState::visible`]
    /// watermarks, never a write that no flush has covered yet. `offset` must be in
    /// `[log start, log end]` (an offset written but not yet visible reads nothing, as in Kafka
    /// between the log end and the high watermark; one below the log start was deleted).
    pub fn fetch_view(&self, offset: i64, read_committed: bool) -> Result<FetchView> {
        if offset < self.log_start_offset || offset > self.high_watermark {
            return Err(Error::OffsetOutOfRange(format!(
                "offset {offset} is outside [{}, {}]",
                self.log_start_offset, self.high_watermark
            )));
        }
        let visible = self.visible;
        let lso = visible.last_stable_offset;
        let upper = if read_committed {
            lso
        } else {
            visible.high_watermark
        };
        let aborted = if read_committed {
            self.aborted
                .range(offset..)
                .map(|(_, a)| *a)
                .filter(|a| a.first_offset < upper)
                .collect()
        } else {
            Vec::new()
        };
        Ok(FetchView {
            high_watermark: visible.high_watermark,
            last_stable_offset: lso,
            upper,
            aborted,
            read_committed,
        })
    }
}
