//! One async lock (a mutex or a read/write lock) per key (per consumer group), created on first
//! use and removed again when nobody holds or waits for it, so a node that sees millions of
//! groups over its life keeps locks only for the groups it is busy with.
//!
//! The map's own copy of a lock is its only reference when idle: a holder or waiter keeps a
//! clone. Both the clone (when a caller asks for a key's lock) and the removal (when a [`KeyedGuard`] drops)
//! happen under the map's mutex, so a lock is never removed while someone can still reach it,
//! and two callers of one key always share one lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cluster::node::lock;
use tokio::sync::{
    Mutex as AsyncMutex, OwnedMutexGuard, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock,
};

/// The locks, by key: async mutexes ([`KeyedLocks::lock`]) or read/write locks
/// ([`KeyedLocks::read`], [`KeyedLocks::write`]).
#[derive(Debug, Default)]
pub(super) struct KeyedLocks<L = AsyncMutex<()>> {
    locks: Mutex<HashMap<String, Arc<L>>>,
}

/// A held lock (`G`: the lock's owned guard): dropping it releases the lock and, if nobody else
/// holds or waits for it, removes it from the map.
pub(super) struct KeyedGuard<'a, L, G> {
    locks: &'a KeyedLocks<L>,
    key: String,
    /// The lock: the map's copy and this one are all that is left when nobody else holds or
    /// waits for it.
    shared: Arc<L>,
    /// `Some` until dropped.
    guard: Option<G>,
}

impl<L: Default> KeyedLocks<L> {
    /// The lock of `key` (created if needed), cloned under the map's mutex.
    fn shared(&self, key: &str) -> Arc<L> {
        lock(&self.locks)
            .entry(key.to_string())
            .or_default()
            .clone()
    }

    fn guard<G>(&self, key: &str, shared: Arc<L>, guard: G) -> KeyedGuard<'_, L, G> {
        KeyedGuard {
            locks: self,
            key: key.to_string(),
            shared,
            guard: Some(guard),
        }
    }

    /// How many keys have a lock in memory (held or waited for).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.locks).len()
    }
}

impl KeyedLocks<AsyncMutex<()>> {
    /// Waits for the lock of `key`.
    pub(super) async fn lock(
        &self,
        key: &str,
    ) -> KeyedGuard<'_, AsyncMutex<()>, OwnedMutexGuard<()>> {
        let shared = self.shared(key);
        let guard = shared.clone().lock_owned().await;
        self.guard(key, shared, guard)
    }
}

impl KeyedLocks<RwLock<()>> {
    /// Waits for the lock of `key`, shared.
    pub(super) async fn read(
        &self,
        key: &str,
    ) -> KeyedGuard<'_, RwLock<()>, OwnedRwLockReadGuard<()>> {
        let shared = self.shared(key);
        let guard = shared.clone().read_owned().await;
        self.guard(key, shared, guard)
    }

    /// Waits for the lock of `key`, exclusive.
    pub(super) async fn write(
        &self,
        key: &str,
    ) -> KeyedGuard<'_, RwLock<()>, OwnedRwLockWriteGuard<()>> {
        let shared = self.shared(key);
        let guard = shared.clone().write_owned().await;
        self.guard(key, shared, guard)
    }
}

impl<L, G> Drop for KeyedGuard<'_, L, G> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = lock(&self.locks.locks);
        // The map's copy and `shared`: nobody else holds the lock or waits for it (a waiter
        // holds a clone taken under this same map mutex).
        if Arc::strong_count(&self.shared) == 2 {
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

    #[tokio::test]
    async fn readers_share_a_key_a_writer_excludes_them_and_keys_are_apart() {
        let locks = Arc::new(KeyedLocks::<RwLock<()>>::default());
        let r1 = locks.read("g").await;
        let _r2 = locks.read("g").await;
        // Another key is not held up by them.
        drop(locks.write("other").await);
        let writer = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let _w = locks.write("g").await;
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!writer.is_finished(), "a writer got in beside readers");
        drop(r1);
        drop(_r2);
        writer.await.unwrap();
        assert_eq!(locks.len(), 0, "nothing left behind");
    }
}
