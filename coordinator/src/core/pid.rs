//! PID allocation: strided across coordinators, reserved in persisted blocks.

use cluster::ProducerId;

/// PIDs reserved (and persisted) per block by [`PidAllocator`].
pub const PID_BLOCK_SIZE: i64 = 1000;

/// Strided, block-persisted PID allocation: coordinator `index` of `count` hands out
/// `seq * count + index` for `seq = 0, 1, ...`, so coordinators never collide; the upper bound of
/// the sequence numbers that may have been handed out is persisted (a block of
/// [`PID_BLOCK_SIZE`] ahead) before any of them is used, so a restart never repeats a PID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PidAllocator {
    index: i64,
    count: i64,
    next_seq: i64,
    reserved_end: i64,
}

/// One allocation: the PID, the block bound to persist before using it (if any), and the
/// allocator to install once that is durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PidAllocation {
    /// The new PID.
    pub producer_id: ProducerId,
    /// Persist this as the PID block bound before handing out `producer_id`.
    pub reserve: Option<i64>,
    /// The allocator after this allocation.
    pub next: PidAllocator,
}

impl PidAllocator {
    /// An allocator for coordinator `index` of `count`, resuming after `persisted_end` (the
    /// block bound read from storage; 0 on first start).
    pub fn new(index: usize, count: usize, persisted_end: i64) -> Self {
        Self {
            index: index as i64,
            count: count.max(1) as i64,
            next_seq: persisted_end.max(0),
            reserved_end: persisted_end.max(0),
        }
    }

    /// Allocates the next PID.
    pub fn allocate(&self) -> PidAllocation {
        let mut next = self.clone();
        let reserve = if self.next_seq >= self.reserved_end {
            next.reserved_end = self.next_seq + PID_BLOCK_SIZE;
            Some(next.reserved_end)
        } else {
            None
        };
        next.next_seq += 1;
        PidAllocation {
            producer_id: self.next_seq * self.count + self.index,
            reserve,
            next,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    // ---- PID allocation and persistence format ----------------------------------------------

    #[test]
    fn pid_allocation_is_strided_and_block_persisted() {
        let a = PidAllocator::new(1, 3, 0);
        let first = a.allocate();
        assert_eq!(first.producer_id, 1);
        assert_eq!(first.reserve, Some(PID_BLOCK_SIZE));
        let second = first.next.allocate();
        assert_eq!(second.producer_id, 4);
        assert_eq!(second.reserve, None);
        // Restart: resumes after the persisted block, never repeating.
        let restarted = PidAllocator::new(1, 3, PID_BLOCK_SIZE).allocate();
        assert_eq!(restarted.producer_id, PID_BLOCK_SIZE * 3 + 1);
        assert_eq!(restarted.reserve, Some(2 * PID_BLOCK_SIZE));
        // Another coordinator never collides.
        let mut seen = BTreeSet::new();
        for index in 0..3 {
            let mut a = PidAllocator::new(index, 3, 0);
            for _ in 0..2500 {
                let next = a.allocate();
                assert!(seen.insert(next.producer_id));
                a = next.next;
            }
        }
    }
}
