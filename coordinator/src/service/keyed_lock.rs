//! One async lock per key (per consumer group), created on first use and removed again when
//! nobody holds or waits for it, so a node that sees millions of groups over its life keeps
//! locks only for the groups it is busy with.
//!
//! The map's own copy of a lock is its only reference when idle: a holder or waiter keeps a
//! clone. Both the clone (in [`KeyedLocks::lock`]) and the removal (when a [`KeyedGuard`] drops)
//! happen under the map's mutex, so a lock is never removed while someone can still reach it,
//! and two callers of one key always share one lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cluster::node::lock;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// The locks, by key.
#[derive(Debug, Default)]
pub(super) struct KeyedLocks {
    locks: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

/// A held lock: dropping it releases the lock and, if nobody else holds or waits for it,
/// removes it from the map.
pub(super) struct KeyedGuard<'a> {
    locks: &'a KeyedLocks,
    key: String,
    /// `Some` until dropped.
    guard: Option<OwnedMutexGuard<()>>,
}

impl KeyedLocks {
    /// Waits for the lock of `key`.
    pub(super) async fn lock(&self, key: &str) -> KeyedGuard<'_> {
        let mutex = lock(&self.locks)
            .entry(key.to_string())
            .or_default()
            .clone();
        KeyedGuard {
            locks: self,
            key: key.to_string(),
            guard: Some(mutex.lock_owned().await),
        }
    }

    /// How many keys have a lock in memory (held or waited for).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.locks).len()
    }
}

impl Drop for KeyedGuard<'_> {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let mutex = OwnedMutexGuard::mutex(&guard).clone();
        drop(guard);
        let mut locks = lock(&self.locks.locks);
        // The map's copy and `mutex`: nobody else holds the lock or waits for it (a waiter
        // holds a clone taken under this same map mutex).
        if Arc::strong_count(&mutex) == 2 {
            locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_lock_nobody_holds_or_waits_for_is_removed() {
        let locks = KeyedLocks::default();
        {
            let _a = locks.lock("a").await;
            let _b = locks.lock("b").await;
            assert_eq!(locks.len(), 2);
        }
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn a_waiter_keeps_the_lock_and_is_serialised_behind_the_holder() {
        let locks = Arc::new(KeyedLocks::default());
        let first = locks.lock("g").await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let waiter = {
            let (locks, tx) = (locks.clone(), tx.clone());
            tokio::spawn(async move {
                let _second = locks.lock("g").await;
                tx.send("second").unwrap();
            })
        };
        // The waiter is queued on the same lock: it cannot get in while `first` is held.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(rx.try_recv().is_err(), "the waiter got in while held");
        tx.send("first released").unwrap();
        drop(first);
        // The holder's drop must not remove a lock someone waits for: had it, a third caller
        // would create a fresh lock and run beside the waiter.
        // Sharing the lock, the third gets in only after the waiter has been and gone.
        let third = locks.lock("g").await;
        assert_eq!(rx.try_recv().ok(), Some("first released"));
        assert_eq!(
            rx.try_recv().ok(),
            Some("second"),
            "the third ran beside the waiter"
        );
        drop(third);
        waiter.await.unwrap();
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn many_tasks_on_one_key_never_overlap_and_leave_nothing_behind() {
        let locks = Arc::new(KeyedLocks::default());
        let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (locks, inside) = (locks.clone(), inside.clone());
                tokio::spawn(async move {
                    for _ in 0..20 {
                        let _g = locks.lock("g").await;
                        let n = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        assert_eq!(n, 0, "two holders at once");
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(locks.len(), 0);
    }
}
