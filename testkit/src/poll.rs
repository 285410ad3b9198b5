//! Waiting on a condition with a deadline: the only way tests synchronise with background work.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long [`eventually`] waits before it fails the test.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// How often the condition is polled.
pub const POLL_EVERY: Duration = Duration::from_millis(10);

/// Polls `f` every [`POLL_EVERY`] until it returns `Some`, and returns that value; panics with
/// `what` after [`DEADLINE`]. A condition that is a plain `bool` returns `ok.then_some(())`.
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(DEADLINE, what, f).await
}

/// [`eventually`] with another deadline.
pub async fn eventually_within<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// [`eventually_within`] for a condition that is a plain `bool`: returns once it holds.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(timeout, what, || {
        let holds = condition();
        async move { holds.await.then_some(()) }
    })
    .await
}

/// Polls `measure` (a count that only grows: records processed, commits reported) until it
/// reaches `target`, and returns it. Progress-based: the wait fails with `what` only when the
/// count has not grown for `stall`, so a slow but moving system (a busy CI machine) is waited
/// for, and a stuck one fails after `stall` instead of after one long overall timeout.
pub async fn wait_for_progress<F, Fut>(
    stall: Duration,
    what: &str,
    target: u64,
    mut measure: F,
) -> u64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = u64>,
{
    let mut best = 0;
    let mut grew_at = Instant::now();
    loop {
        let now = measure().await;
        if now >= target {
            return now;
        }
        if now > best {
            best = now;
            grew_at = Instant::now();
        }
        assert!(
            grew_at.elapsed() < stall,
            "no progress for {stall:?} waiting for: {what} (at {best} of {target})"
        );
        tokio::time::sleep(PROGRESS_POLL_EVERY).await;
    }
}

/// How often [`wait_for_progress`] measures (its measures are usually whole reads).
pub const PROGRESS_POLL_EVERY: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn returns_the_first_some() {
        let calls = AtomicUsize::new(0);
        let v = eventually("the third call", || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move { (n == 2).then_some(n) }
        })
        .await;
        assert_eq!(v, 2);
    }

    #[tokio::test]
    async fn wait_until_returns_once_the_condition_holds() {
        let calls = AtomicUsize::new(0);
        wait_until(DEADLINE, "the second call", || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move { n == 1 }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    #[should_panic(expected = "timed out after 50ms waiting for: never")]
    async fn fails_at_the_deadline() {
        eventually_within(Duration::from_millis(50), "never", || async { None::<()> }).await;
    }

    #[tokio::test]
    async fn progress_keeps_the_wait_alive() {
        let calls = AtomicUsize::new(0);
        // Each measure grows by one: 20 polls of 100 ms outlast the 1 s stall limit, yet the
        // wait succeeds because the count keeps moving.
        let reached = wait_for_progress(Duration::from_secs(1), "twenty", 20, || {
            let n = calls.fetch_add(1, Ordering::SeqCst) as u64;
            async move { n }
        })
        .await;
        assert_eq!(reached, 20);
    }

    #[tokio::test]
    #[should_panic(expected = "no progress for 300ms waiting for: stuck (at 3 of 10)")]
    async fn a_stalled_count_fails_after_the_stall_limit() {
        wait_for_progress(Duration::from_millis(300), "stuck", 10, || async { 3 }).await;
    }
}
