//! Node plumbing: what a coordinator and a partition leader both need around their cores, written
//! once. The wall clock ([`now_ms`]), poison-tolerant std locks ([`lock`]), running synchronous
//! storage calls off the async threads ([`blocking`]), accepted connections with `TCP_NODELAY`
//! ([`incoming`]), the process's stop signal ([`shutdown_signal`]), and the sled database's
//! lifecycle: [`open_sled`] waits (with a deadline) for a previous instance's lock file and
//! [`close_sled`] releases it deterministically before returning.
//!
//! Why here: each node used to carry its own copy, and the copies had drifted (one node waited
//! for sled's lock on open, the other did not; one recovered poisoned mutexes, the others
//! panicked). The rules are node-level, not protocol-level, so they sit beside the topology
//! every node already shares.
//!
//! CAVEATS: sled's lock is an advisory `flock` on `<dir>/db`; waiting on it only helps against
//! another instance that is shutting down, not against one that keeps running (open then fails
//! after the deadline, which is the point).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long [`open_sled`] and [`close_sled`] wait for sled's lock file by default.
pub const SLED_LOCK_WAIT: Duration = Duration::from_secs(10);

/// Unix time in milliseconds: the `now_ms` the pure cores are handed (0 before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Locks a std mutex, recovering the data if a panicking thread poisoned it. The state behind
/// every such mutex in the nodes is replaced whole under the lock (never left half-updated), so
/// a panic elsewhere is no reason to stop serving.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A blocking task that did not return (it panicked, or the runtime is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("blocking task failed: {0}")]
pub struct TaskFailed(pub String);

/// Runs a synchronous call (a sled read or a durable write) on tokio's blocking pool, so the
/// async threads never wait on a disk.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, TaskFailed> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TaskFailed(e.to_string()))
}

/// Accepted connections with `TCP_NODELAY` set: tonic only sets it on listeners it binds
/// itself, and without it every small request/response waits for Nagle + delayed ACK.
pub fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(conn)
    })
}

/// Resolves on ctrl-c or SIGTERM (what a node binary passes as its `shutdown`).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutdown requested");
}

/// Opens (or creates) the sled database in `dir`, first creating the directory and waiting (up
/// to `wait`) until no previous instance holds sled's lock file. Blocking: call it through
/// [`blocking`].
pub fn open_sled(dir: &Path, wait: Duration) -> std::io::Result<sled::Db> {
    prepare_sled_dir(dir, wait)?;
    sled::Config::new()
        .path(dir)
        .open()
        .map_err(std::io::Error::other)
}

/// What [`open_sled`] does before opening, for a store that opens sled itself: creates `dir`
/// (durably, [`create_dir_durably`]) and waits (up to `wait`) until no previous instance holds
/// sled's lock file. Blocking.
pub fn prepare_sled_dir(dir: &Path, wait: Duration) -> std::io::Result<()> {
    create_dir_durably(dir)?;
    wait_until_unlocked(dir, wait)
}

/// Creates `dir` and its missing parents, as `create_dir_all`, and makes each new directory's
/// entry durable (an fsync of the directory holding it), so that a power cut after the first
/// flush of a file in `dir` cannot take `dir` away. Nothing is synced when `dir` existed.
pub fn create_dir_durably(dir: &Path) -> std::io::Result<()> {
    // The nearest existing ancestor: every directory below it is new.
    let existing = dir.ancestors().find(|a| a.is_dir());
    if existing == Some(dir) {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    for created in dir.ancestors() {
        let parent = created.parent().filter(|p| !p.as_os_str().is_empty());
        std::fs::File::open(parent.unwrap_or(Path::new(".")))?.sync_all()?;
        if parent == existing {
            break;
        }
    }
    Ok(())
}

/// Closes a sled-backed store for good: waits (up to `wait`) until `store` is the last
/// reference (a task finishing a write may still hold a clone), drops it, and waits until sled's
/// background threads released the lock file, so `dir` can be reopened as soon as this returns.
/// Flush before calling (the stores flush on every durable write; shutdown flushes once more).
pub async fn close_sled<S: ?Sized + Send + Sync + 'static>(
    store: Arc<S>,
    dir: PathBuf,
    wait: Duration,
) -> std::io::Result<()> {
    let deadline = Instant::now() + wait;
    // Condition polling with a deadline: `Arc` has no "last reference" notification.
    while Arc::strong_count(&store) > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if Arc::strong_count(&store) > 1 {
        tracing::warn!(
            references = Arc::strong_count(&store),
            "storage still referenced at shutdown; closing it anyway"
        );
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    blocking(move || {
        drop(store);
        wait_until_unlocked(&dir, remaining.max(Duration::from_millis(100)))
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Waits until nobody holds sled's exclusive lock on `dir/db` (or `timeout` passed).
///
/// Why: dropping the last `sled::Db` does not release the lock at once; sled's background
/// threads still hold the file for a moment, so an immediate reopen in the same process (a
/// restart in tests, an embedded cluster) could fail with "could not acquire lock". This polls
/// the same `flock` sled takes, with a deadline.
pub fn wait_until_unlocked(dir: &Path, timeout: Duration) -> std::io::Result<()> {
    use fs2::FileExt;
    let path = dir.join("db");
    let deadline = Instant::now() + timeout;
    loop {
        let file = match std::fs::OpenOptions::new().read(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        match file.try_lock_exclusive() {
            Ok(()) => {
                file.unlock()?;
                return Ok(());
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{} is still locked after {timeout:?}: {e}", path.display()),
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// What a node binary starts beside its gRPC listener: the optional Kafka listener (bound here,
/// so a taken port fails the start), the optional metrics endpoint, and the stop future that
/// resolves on ctrl-c or SIGTERM (and stops the endpoint too).
pub async fn binary_extras(
    kafka_listen: Option<&str>,
    metrics_listen: Option<&str>,
    metrics: crate::metrics::Metrics,
) -> std::io::Result<(
    Option<tokio::net::TcpListener>,
    impl std::future::Future<Output = ()> + Send + 'static,
)> {
    let kafka = match kafka_listen {
        Some(address) => Some(tokio::net::TcpListener::bind(address).await.map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("binding the Kafka listener {address}: {e}"),
            )
        })?),
        None => None,
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    if let Some(address) = metrics_listen {
        let (bound, _) = crate::metrics::spawn_endpoint(address, metrics, stopped.clone()).await?;
        tracing::info!(address = %bound, "metrics at /metrics");
    }
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let mut stopped = stopped;
    Ok((kafka, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }))
}

/// HTTP/2 stream window of every gRPC server and channel of the cluster. HTTP/2's default is
/// 64 KiB, so a Produce of 100 KiB of records (or a large Fetch answer) would stop for
/// WINDOW_UPDATE round trips mid-message.
pub const HTTP2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;

/// HTTP/2 connection window (all streams of a connection together).
pub const HTTP2_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;

/// A gRPC server builder with the cluster's HTTP/2 windows.
pub fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
}

/// `endpoint` with the cluster's HTTP/2 windows and TCP_NODELAY (clients and nodes alike).
pub fn grpc_endpoint(endpoint: tonic::transport::Endpoint) -> tonic::transport::Endpoint {
    endpoint
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .tcp_nodelay(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_recovers_a_poisoned_mutex() {
        let m = Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }

    #[test]
    fn create_dir_durably_creates_the_missing_parents_and_keeps_what_exists() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        create_dir_durably(&deep).unwrap();
        assert!(deep.is_dir());
        std::fs::write(deep.join("kept"), b"x").unwrap();
        create_dir_durably(&deep).unwrap();
        assert_eq!(std::fs::read(deep.join("kept")).unwrap(), b"x");
        // A file in the way is an error, not a panic.
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        assert!(create_dir_durably(&dir.path().join("file/d")).is_err());
    }

    #[tokio::test]
    async fn close_then_reopen_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        for round in 0..3u8 {
            let p = path.clone();
            let db = blocking(move || open_sled(&p, SLED_LOCK_WAIT))
                .await
                .unwrap()
                .unwrap();
            db.insert([round], &[round][..]).unwrap();
            db.flush().unwrap();
            close_sled(Arc::new(db), path.clone(), SLED_LOCK_WAIT)
                .await
                .unwrap();
        }
        let p = path.clone();
        let db = blocking(move || open_sled(&p, SLED_LOCK_WAIT))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(db.len(), 3);
    }

    #[tokio::test]
    async fn close_waits_for_the_last_reference() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let p = path.clone();
        let db = Arc::new(
            blocking(move || open_sled(&p, SLED_LOCK_WAIT))
                .await
                .unwrap()
                .unwrap(),
        );
        let straggler = db.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let holder = tokio::spawn(async move {
            let _ = rx.await;
            drop(straggler);
        });
        let close = tokio::spawn(close_sled(db, path.clone(), SLED_LOCK_WAIT));
        tx.send(()).unwrap();
        close.await.unwrap().unwrap();
        holder.await.unwrap();
        let p = path.clone();
        blocking(move || open_sled(&p, Duration::from_millis(10)))
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn now_is_after_2020() {
        assert!(now_ms() > 1_577_836_800_000);
    }
}
