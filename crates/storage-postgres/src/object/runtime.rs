//! The runtime that owns the object storage's connections, and the one
//! way synchronous code waits for it.
//!
//! Every connection of every [`PostgresObjects`](super::PostgresObjects)
//! of the process is a task of one current-thread tokio runtime (the
//! [`Driver`]). A synchronous caller inside a [`blocking`] section drives
//! that runtime itself while it waits ([`Runtime::block_on`]): its thread
//! writes the request, waits on the socket and reads the reply, so a
//! round trip costs no hand-off between threads. A background thread
//! drives the runtime whenever no caller does (an idle connection still
//! notices a server that closed it), and for a caller that may not drive
//! it (a task of a current-thread tokio runtime, whose thread cannot
//! start another runtime): such a caller parks until the reply comes, as
//! every caller once did (two hand-offs per round trip).

use std::future::Future;
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use durability_scheduler::StorageError;
use durability_time::Clock;
use tokio::runtime::{Handle, Runtime, RuntimeFlavor};
use tokio_postgres::{Config, NoTls};

/// Runs `f`, a stretch of synchronous code that waits on the database,
/// without tying up a tokio worker: on a multi-thread runtime's worker it
/// runs inside [`tokio::task::block_in_place`] (the worker's other tasks
/// move to another thread while this one waits). Where the thread may
/// start a runtime (a plain thread, a multi-thread runtime's thread inside
/// `block_in_place`), its waits drive the connections themselves; on a
/// current-thread runtime it just blocks while the background thread
/// drives them (no deadlock either way).
pub(crate) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| driving(f))
        }
        // This thread runs a current-thread runtime's task, which may not
        // start another runtime: its waits park (even inside a section
        // that drives, entered before that runtime was).
        Ok(_) => {
            let _restore = Restore(DRIVING.replace(false));
            f()
        }
        Err(_) => driving(f),
    }
}

/// Puts back the thread's [`DRIVING`] flag when dropped.
struct Restore(bool);

impl Drop for Restore {
    fn drop(&mut self) {
        DRIVING.set(self.0);
    }
}

thread_local! {
    /// Whether this thread is inside a section whose waits drive the
    /// connections' runtime themselves.
    static DRIVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` as a section whose waits drive the connections' runtime (see
/// [`blocking`]); the background thread stands aside meanwhile.
fn driving<R>(f: impl FnOnce() -> R) -> R {
    if DRIVING.get() {
        return f();
    }
    struct Section;
    impl Drop for Section {
        fn drop(&mut self) {
            DRIVING.set(false);
            DRIVER.leave();
        }
    }
    DRIVER.enter();
    DRIVING.set(true);
    let _section = Section;
    f()
}

/// The process's connection runtime and who drives it.
pub(crate) struct Driver {
    rt: Runtime,
    state: Mutex<Drivers>,
    /// Wakes the background thread when it may drive again.
    idle: Condvar,
}

/// Who drives the runtime.
#[derive(Default)]
struct Drivers {
    /// Threads inside a driving section.
    sections: usize,
    /// Threads waiting on the runtime that may not drive it.
    parked: usize,
    /// The background thread's idle future, while it drives.
    stand_aside: Option<Waker>,
}

impl Drivers {
    /// Whether the background thread must drive the runtime.
    fn background_drives(&self) -> bool {
        self.sections == 0 || self.parked > 0
    }
}

static DRIVER: LazyLock<Arc<Driver>> = LazyLock::new(|| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("start the PostgreSQL objects runtime: {e}"));
    let driver = Arc::new(Driver {
        rt,
        state: Mutex::new(Drivers::default()),
        idle: Condvar::new(),
    });
    let background = Arc::clone(&driver);
    std::thread::Builder::new()
        .name("durability-pg-objects".to_owned())
        .spawn(move || background.background())
        .unwrap_or_else(|e| panic!("start the PostgreSQL objects thread: {e}"));
    driver
});

impl Driver {
    fn state(&self) -> MutexGuard<'_, Drivers> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The background thread: drives the runtime while no caller does.
    fn background(&self) {
        loop {
            {
                let mut state = self.state();
                while !state.background_drives() {
                    state = self
                        .idle
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
            self.rt.block_on(std::future::poll_fn(|cx| {
                let mut state = self.state();
                if state.background_drives() {
                    state.stand_aside = Some(cx.waker().clone());
                    Poll::Pending
                } else {
                    state.stand_aside = None;
                    Poll::Ready(())
                }
            }));
        }
    }

    /// A driving section starts: the background thread stands aside.
    fn enter(&self) {
        let waker = {
            let mut state = self.state();
            state.sections += 1;
            state.stand_aside.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// A driving section ended.
    fn leave(&self) {
        let mut state = self.state();
        state.sections -= 1;
        if state.background_drives() {
            self.idle.notify_all();
        }
    }

    /// A caller that may not drive the runtime waits on it: the background
    /// thread drives it meanwhile.
    fn park(&self) {
        let mut state = self.state();
        state.parked += 1;
        self.idle.notify_all();
    }

    /// The waiting caller of [`Driver::park`] was answered.
    fn unpark(&self) {
        let waker = {
            let mut state = self.state();
            state.parked -= 1;
            if state.background_drives() {
                None
            } else {
                state.stand_aside.take()
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Wakes a parked thread.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Waits until `fut` is ready: inside a driving section (see [`blocking`])
/// by driving the connections' runtime on this thread, else by parking
/// while the background thread drives it. Only for futures of the
/// connections of this runtime (the client's statement futures) or that
/// need no runtime context of their own; never from inside a future.
pub(crate) fn wait<F: Future>(fut: F) -> F::Output {
    match park_until(fut, None) {
        Some(out) => out,
        None => unreachable!("a wait without a deadline ends only when its future is ready"),
    }
}

/// The one wait: until `fut` is ready, or until `deadline` (a time in ms on
/// its clock) passed, `None` then (`fut` is dropped unfinished). Driving
/// or parked as [`wait`] says.
pub(super) fn park_until<F: Future>(
    fut: F,
    deadline: Option<(i64, &dyn Clock)>,
) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    // Ready at once (a cached statement, an idle pooled connection): no
    // wait at all.
    if let Poll::Ready(out) = fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        count_wait(false);
        return Some(out);
    }
    let out = if DRIVING.get() {
        let driver = &*DRIVER;
        driver.rt.block_on(async {
            let Some((at, clock)) = deadline else {
                return Some(fut.as_mut().await);
            };
            loop {
                let left = at.saturating_sub(clock.now_ms());
                if left <= 0 {
                    return None;
                }
                let left = Duration::from_millis(u64::try_from(left).unwrap_or(u64::MAX));
                if let Ok(out) = tokio::time::timeout(left, fut.as_mut()).await {
                    return Some(out);
                }
            }
        })
    } else {
        DRIVER.park();
        let out = park_loop(fut, deadline);
        DRIVER.unpark();
        if out.is_some() {
            count_hand_off();
        }
        out
    };
    count_wait(out.is_some());
    out
}

/// Parks the calling thread until `fut` is ready or `deadline` passed. A
/// spurious or early wake-up only polls again.
fn park_loop<F: Future>(
    mut fut: std::pin::Pin<&mut F>,
    deadline: Option<(i64, &dyn Clock)>,
) -> Option<F::Output> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Some(out);
        }
        match deadline {
            None => std::thread::park(),
            Some((at, clock)) => {
                let left = at.saturating_sub(clock.now_ms());
                if left <= 0 {
                    return None;
                }
                std::thread::park_timeout(Duration::from_millis(
                    u64::try_from(left).unwrap_or(u64::MAX),
                ));
            }
        }
    }
}

// Waits that waited (each one round trip to the server, or a wait for a
// pooled connection), and those of them answered by the background
// thread, counted per thread for tests.
#[cfg(feature = "testkit")]
thread_local! {
    static PARKED_WAITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static HANDED_OFF: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts a wait the background thread answered (feature `testkit` only).
#[inline]
fn count_hand_off() {
    #[cfg(feature = "testkit")]
    HANDED_OFF.with(|n| n.set(n.get() + 1));
}

/// Counts a finished wait that waited (feature `testkit` only).
#[inline]
pub(crate) fn count_wait(parked: bool) {
    #[cfg(feature = "testkit")]
    if parked {
        PARKED_WAITS.with(|n| n.set(n.get() + 1));
    }
    #[cfg(not(feature = "testkit"))]
    let _ = parked;
}

/// How many times the calling thread waited until the object storage's
/// server answered (feature `testkit`): the round trips it waited for,
/// whatever was pipelined in each.
#[cfg(feature = "testkit")]
pub fn parked_waits() -> u64 {
    PARKED_WAITS.with(std::cell::Cell::get)
}

/// How many of the calling thread's waits were answered by the background
/// thread, which drives the connections for a caller that may not
/// (feature `testkit`): each such wait hands off to that thread and back.
#[cfg(feature = "testkit")]
pub fn handed_off_waits() -> u64 {
    HANDED_OFF.with(std::cell::Cell::get)
}

/// The connection pool shared by every object of a deployment (its
/// connections are tasks of the process's [`Driver`] runtime).
pub(crate) struct Backend {
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
    /// A pool of up to `size` connections built from `config` (not
    /// connected yet).
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
        Ok(Self { pool })
    }

    /// A connection from the pool, connecting one if none is idle. The
    /// caller waits with the connections' runtime entered (a new
    /// connection's task and the pool's timeouts belong to it).
    pub(crate) fn client(&self) -> Result<Object, StorageError> {
        let _context = DRIVER.rt.enter();
        wait(self.pool.get()).map_err(|e| StorageError::backend("connect to PostgreSQL", e))
    }
}
