//! The background runtime that owns the object storage's connections, and
//! the one way synchronous code waits for it.
//!
//! Every connection of a [`PostgresObjects`](super::PostgresObjects) is
//! driven by a small tokio runtime of its own (one worker thread). The
//! synchronous transaction methods hand each statement to its connection
//! (the client's futures only talk to the connection task through
//! channels) and park the calling thread until the reply comes: one round
//! trip per statement, no runtime needed on the caller's side.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use durability_scheduler::{StorageError, StorageErrorKind};
use durability_time::Clock;
use tokio::runtime::{Handle, Runtime, RuntimeFlavor};
use tokio_postgres::{Config, NoTls};

/// Runs `f`, a stretch of synchronous code that waits on the database,
/// without tying up a tokio worker: on a multi-thread runtime's worker it
/// runs inside [`tokio::task::block_in_place`] (the worker's other tasks
/// move to another thread while this one waits); on a current-thread
/// runtime or a plain thread it just blocks, which cannot deadlock because
/// the connections are driven on their own runtime's thread.
pub(crate) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Wakes a parked thread.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Parks the calling thread until `fut` is ready. Only for futures that
/// need no runtime context of their own (the client's statement futures,
/// which talk to their connection's task through channels). Unlike an
/// executor's `block_on`, it may run inside any executor's task (a
/// transaction inside an async function driven by any runtime).
pub(crate) fn wait<F: Future>(fut: F) -> F::Output {
    match park_until(fut, None) {
        Some(out) => out,
        None => unreachable!("a wait without a deadline ends only when its future is ready"),
    }
}

/// The one park loop: parks the calling thread until `fut` is ready, or
/// until `deadline` (a time in ms on its clock) passed, `None` then (`fut`
/// is dropped unfinished). A spurious or early wake-up only polls again.
pub(super) fn park_until<F: Future>(
    fut: F,
    deadline: Option<(i64, &dyn Clock)>,
) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut parked = false;
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            count_wait(parked);
            return Some(out);
        }
        match deadline {
            None => {
                parked = true;
                std::thread::park();
            }
            Some((at, clock)) => {
                let left = at.saturating_sub(clock.now_ms());
                if left <= 0 {
                    return None;
                }
                parked = true;
                std::thread::park_timeout(Duration::from_millis(
                    u64::try_from(left).unwrap_or(u64::MAX),
                ));
            }
        }
    }
}

// Waits that parked their caller (each one round trip to the server, or
// a wait for a pooled connection), counted per thread for tests.
#[cfg(feature = "testkit")]
thread_local! {
    static PARKED_WAITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts a finished wait that parked (feature `testkit` only).
#[inline]
pub(crate) fn count_wait(parked: bool) {
    #[cfg(feature = "testkit")]
    if parked {
        PARKED_WAITS.with(|n| n.set(n.get() + 1));
    }
    #[cfg(not(feature = "testkit"))]
    let _ = parked;
}

/// How many times the calling thread parked until the object storage's
/// server answered (feature `testkit`): the round trips it waited for,
/// whatever was pipelined in each.
#[cfg(feature = "testkit")]
pub fn parked_waits() -> u64 {
    PARKED_WAITS.with(std::cell::Cell::get)
}

/// The runtime and connection pool shared by every object of a deployment.
pub(crate) struct Backend {
    rt: Option<Runtime>,
    pool: Pool,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

impl Backend {
    /// A runtime of its own and a pool of up to `size` connections built
    /// from `config` (not connected yet).
    pub(crate) fn new(
        mut config: Config,
        size: usize,
        connect_timeout: Duration,
    ) -> Result<Self, StorageError> {
        // A peer that vanishes mid-statement is noticed within about 20 s
        // instead of the kernel's retransmission timeout.
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(2))
            .keepalives_retries(3)
            .tcp_user_timeout(Duration::from_secs(20));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("durability-pg-objects")
            .enable_all()
            .build()
            .map_err(|e| StorageError::backend("start the PostgreSQL runtime", e))?;
        let mgr = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(connect_timeout))
            .create_timeout(Some(connect_timeout))
            .build()
            .map_err(|e| StorageError::backend("build the PostgreSQL pool", e))?;
        Ok(Self { rt: Some(rt), pool })
    }

    /// A connection from the pool, connecting one if none is idle. The
    /// caller waits on its own thread with the backend's runtime entered
    /// (a new connection's task and the pool's timeouts belong to that
    /// runtime, whose thread drives them): no hand-off per transaction.
    pub(crate) fn client(&self) -> Result<Object, StorageError> {
        let Some(rt) = &self.rt else {
            return Err(StorageError::new(
                StorageErrorKind::Backend,
                "the PostgreSQL runtime is shut down",
            ));
        };
        let _context = rt.enter();
        wait(self.pool.get()).map_err(|e| StorageError::backend("connect to PostgreSQL", e))
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which is refused inside async code:
        // the connections' tasks are dropped without waiting instead.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
