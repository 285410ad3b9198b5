//! WriteTxnMarkers on one partition in the shell: under the write lock the core plans the marker
//! (`PartitionState::plan_marker`), the plan is logged and made durable. May touch: the
//! partition's write lock and state, storage (through `persist`).

use proto::TopicPartition;
use tracing::{debug, info};

use super::{now_ms, LeaderService};
use crate::core::{LogEntry, Marker};
use crate::error::Result;

impl LeaderService {
    pub(super) async fn write_marker(&self, tp: &TopicPartition, marker: Marker) -> Result<()> {
        let part = self.partition(&tp.topic, tp.partition)?;
        let guard = part.write_lock.clone().lock_owned().await;
        part.check_online()?;
        let plan = part.state().plan_marker(&marker, now_ms())?;
        let entries: Vec<LogEntry> = plan
            .control
            .clone()
            .map(LogEntry::Control)
            .into_iter()
            .collect();
        if let Some(control) = &plan.control {
            debug!(partition = %part.tp, pid = marker.producer_id, epoch = control.producer_epoch,
                   commit = control.commit, offset = plan.base_offset,
                   aborted = ?plan.aborted, "transaction marker written");
        } else if plan.is_noop() {
            debug!(partition = %part.tp, pid = marker.producer_id, "repeated marker");
        } else {
            info!(partition = %part.tp, pid = marker.producer_id, epoch = marker.producer_epoch,
                  "marker without an open transaction: epoch recorded");
        }
        self.persist(guard, part, plan, entries).await
    }
}
