//! The apalis-sqlite 1.0 side of `cargo xtask bench peers`.
//!
//! One invocation measures one group once and prints one JSON object per
//! figure on stdout, in the same flat shape as `bench/peers/ours`
//! (`figure`, `who` = `apalis`, `value`, `unit`, `higher_is_better`, `n`);
//! xtask interleaves the two binaries and computes the ratios.
//!
//! ```text
//! durability-bench-peers-apalis outbox <enqueue> <e2e> <backlog>...
//! durability-bench-peers-apalis alarms <n>
//! durability-bench-peers-apalis pg <enqueue> <backlog> <samples> <postgres-url>
//! ```
//!
//! The `pg` group is apalis-postgres (module `pg`); the rest below is
//! apalis-sqlite.
//!
//! apalis is used as its README and examples show: `SqliteStorage::setup`,
//! `push` / `push_bulk` / `push_task`, and a `WorkerBuilder` worker. Its
//! worker sleeps after an empty fetch until something wakes it (otherwise
//! its 30 s heartbeat), so every worker here has a poll strategy: the drain
//! and the scheduled jobs poll every 100 ms (`poll_with_interval`, as its
//! own delayed-task test does); the end-to-end run uses the README's
//! event-driven strategy (an SQLite update hook on inserts, then the same
//! 100 ms interval). Not the event-driven one for scheduled jobs: hook
//! events queued by the inserts made its combined strategy miss the
//! wake-up after an empty fetch, and the jobs ran at the 30 s heartbeat
//! (measured: p50 lateness 26 s). Two settings differ from its defaults, and are the
//! same as ours: a fetch batch of 100 (default 10; our outbox delivers 100
//! per batch) and `synchronous = NORMAL` in WAL mode on every connection
//! (its `setup` sets `synchronous = OFF` on the connection it runs on, so
//! it runs on a pool of its own that is closed before measuring). Payloads
//! are 200-byte strings, as ours.

#![allow(clippy::print_stdout, reason = "the bench prints its JSON lines")]

mod pg;

use std::error::Error;
use std::fmt::Display;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use apalis::prelude::*;
use apalis_sqlite::{Config, SqliteStorage};
use futures::channel::mpsc;
use sqlx::SqlitePool;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqliteOperation, SqlitePoolOptions, SqliteSynchronous,
};

type BoxError = Box<dyn Error + Send + Sync>;
type BoxResult<T = ()> = Result<T, BoxError>;

/// Bytes of every payload.
const BODY_LEN: usize = 200;
/// Tasks per transaction in the batched enqueue, and per fetch.
const BATCH: u64 = 100;
/// The interval of the worker's poll strategy (beside the insert hook).
const POLL: Duration = Duration::from_millis(100);
/// The queue every figure uses.
const QUEUE: &str = "bench";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BoxError::from)
        .and_then(|rt| rt.block_on(run(&args)));
    if let Err(e) = result {
        eprintln!("durability-bench-peers-apalis: {e}");
        std::process::exit(1);
    }
}

fn arg_u64(args: &[String], i: usize, what: &str) -> BoxResult<u64> {
    let raw = args.get(i).ok_or_else(|| format!("missing {what}"))?;
    let n: u64 = raw
        .parse()
        .map_err(|_| format!("{what}: {raw:?} is not a count"))?;
    if n == 0 {
        return Err(format!("{what} must be positive").into());
    }
    Ok(n)
}

async fn run(args: &[String]) -> BoxResult {
    match args.first().map(String::as_str) {
        Some("outbox") => {
            let enqueue = arg_u64(args, 1, "enqueue size")?;
            let e2e = arg_u64(args, 2, "end-to-end size")?;
            let drains = (3..args.len())
                .map(|i| arg_u64(args, i, "backlog"))
                .collect::<BoxResult<Vec<u64>>>()?;
            outbox(enqueue, &drains, e2e).await
        }
        Some("alarms") => alarms(arg_u64(args, 1, "alarm count")?).await,
        Some("pg") => {
            let url = args.get(4).ok_or("missing PostgreSQL URL")?;
            pg::pg(
                arg_u64(args, 1, "enqueue size")?,
                arg_u64(args, 2, "backlog")?,
                arg_u64(args, 3, "latency samples")?,
                url,
            )
            .await
        }
        _ => Err(
            "usage: durability-bench-peers-apalis <outbox ENQUEUE E2E BACKLOG... | alarms N | pg ENQUEUE BACKLOG SAMPLES URL>"
                .into(),
        ),
    }
}

fn err(e: impl Display) -> BoxError {
    e.to_string().into()
}

/// One measurement on stdout.
fn emit(figure: &str, value: f64, unit: &str, higher_is_better: bool, n: u64) {
    let line = serde_json::json!({
        "figure": figure, "who": "apalis", "value": value, "unit": unit,
        "higher_is_better": higher_is_better, "n": n,
    });
    println!("{line}");
    eprintln!("  {figure:<24} apalis   {value:>12.1} {unit}");
}

fn rate(n: u64, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64().max(1e-9)
}

fn body() -> String {
    "x".repeat(BODY_LEN)
}

/// Wall-clock time in milliseconds since the epoch, with microseconds.
#[allow(clippy::disallowed_methods, reason = "a benchmark measures wall time")]
fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

#[allow(clippy::disallowed_methods, reason = "a benchmark measures wall time")]
fn now() -> Instant {
    Instant::now()
}

/// A fresh database at `path`: migrated by `SqliteStorage::setup` on a pool
/// of its own, then a pool whose every connection runs WAL with
/// `synchronous = NORMAL`. With `hook`, every connection reports inserts
/// into the jobs table on the returned receiver (what apalis'
/// `connect_with_callback` does, with these options).
async fn open(path: &Path, hook: bool) -> BoxResult<(SqlitePool, mpsc::UnboundedReceiver<()>)> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5));
    let setup = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options.clone())
        .await?;
    SqliteStorage::setup(&setup).await.map_err(err)?;
    setup.close().await;
    let (tx, rx) = mpsc::unbounded::<()>();
    let mut pool = SqlitePoolOptions::new();
    if hook {
        pool = pool.after_connect(move |conn, _| {
            let tx = tx.clone();
            Box::pin(async move {
                let mut handle = conn.lock_handle().await?;
                handle.set_update_hook(move |ev| {
                    if ev.operation == SqliteOperation::Insert && ev.table == "Jobs" {
                        let _ = tx.unbounded_send(());
                    }
                });
                Ok(())
            })
        });
    }
    Ok((pool.connect_with(options).await?, rx))
}

fn storage<T>(pool: &SqlitePool) -> SqliteStorage<T> {
    SqliteStorage::new(pool).with_config(Config::default().queue(QUEUE).batch_size(BATCH as usize))
}

/// How many tasks of the queue have `status`.
async fn count(pool: &SqlitePool, status: &str) -> BoxResult<u64> {
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM Jobs WHERE job_type = ?1 AND status = ?2")
            .bind(QUEUE)
            .bind(status)
            .fetch_one(pool)
            .await?;
    Ok(n as u64)
}

/// Counts handled tasks; the handler that reaches `target` stops the
/// worker.
struct Counter {
    done: AtomicU64,
    target: u64,
}

async fn handle(
    _body: String,
    counter: Data<Arc<Counter>>,
    worker: WorkerContext,
) -> Result<(), BoxDynError> {
    if counter.done.fetch_add(1, Ordering::SeqCst) + 1 == counter.target {
        worker.stop()?;
    }
    Ok(())
}

impl Counter {
    /// A counter that stops its worker at the `target`th task.
    fn to(target: u64) -> Arc<Self> {
        Arc::new(Self {
            done: AtomicU64::new(0),
            target,
        })
    }
}

/// Times `work` on `n` tasks, checks that `check` then counts `n` of them
/// (`state`, as "pending" or "done"), and emits the rate.
async fn timed(
    figure: &str,
    n: u64,
    work: impl Future<Output = BoxResult>,
    state: &str,
    check: impl Future<Output = BoxResult<u64>>,
) -> BoxResult {
    let t = now();
    work.await?;
    let elapsed = t.elapsed();
    let seen = check.await?;
    if seen != n {
        return Err(format!("{figure}: {seen} {state} of {n}").into());
    }
    emit(figure, rate(n, elapsed), "entries/s", true, n);
    Ok(())
}

/// Pushes `n` tasks, `per_push` per `push_bulk` (one transaction), or one
/// `push` each when `per_push` is 1.
async fn push_many<S, K>(s: &mut S, n: u64, per_push: u64) -> BoxResult
where
    S: TaskSink<String, K>,
    S::Error: Display,
{
    let value = body();
    let mut i = 0;
    while i < n {
        let end = (i + per_push).min(n);
        if per_push == 1 {
            s.push(value.clone()).await.map_err(err)?;
        } else {
            let batch = (i..end).map(|_| value.clone()).collect();
            s.push_bulk(batch).await.map_err(err)?;
        }
        i = end;
    }
    Ok(())
}

/// The README's event-driven strategy: wake on inserts, and every
/// [`POLL`].
fn strategy(rx: mpsc::UnboundedReceiver<()>) -> Strategy {
    Strategy::new().stream(rx).interval(POLL)
}

async fn outbox(enqueue: u64, drains: &[u64], e2e: u64) -> BoxResult {
    let dir = tempfile::tempdir()?;
    let file = |name: &str| dir.path().join(format!("{name}.db"));

    for (figure, per_push) in [
        ("outbox.enqueue_single", 1),
        ("outbox.enqueue_batched", BATCH),
    ] {
        let (pool, _) = open(&file(figure), false).await?;
        let mut s = storage::<String>(&pool);
        let push = push_many(&mut s, enqueue, per_push);
        timed(figure, enqueue, push, "pending", count(&pool, "Pending")).await?;
        pool.close().await;
    }

    for &n in drains {
        let figure = format!("outbox.drain_{}k", n / 1000);
        let (pool, _) = open(&file(&figure), false).await?;
        let mut s = storage::<String>(&pool);
        push_many(&mut s, n, 1_000).await?;
        let worker = WorkerBuilder::new(format!("drain-{n}"))
            .backend(s.poll_with_interval(POLL))
            .data(Counter::to(n))
            .build(handle);
        let run = async { worker.run().await.map_err(err) };
        timed(&figure, n, run, "done", count(&pool, "Done")).await?;
        pool.close().await;
    }

    // End to end: a producer pushes one task at a time while the worker
    // runs; entries per second from the first push to the worker's stop
    // after the last task (its acknowledgements flushed).
    let figure = "outbox.end_to_end";
    let (pool, rx) = open(&file("e2e"), true).await?;
    let mut producer = storage::<String>(&pool);
    let counter = Counter::to(e2e);
    let worker = WorkerBuilder::new("e2e")
        .backend(storage::<String>(&pool).poll_with_strategy(strategy(rx)))
        .data(Arc::clone(&counter))
        .build(handle);
    let t = now();
    let (ran, pushed) = tokio::join!(worker.run(), push_many(&mut producer, e2e, 1));
    let elapsed = t.elapsed();
    ran.map_err(err)?;
    pushed?;
    let done = count(&pool, "Done").await?;
    if done != e2e {
        return Err(format!("{figure}: {done} done of {e2e}").into());
    }
    emit(figure, rate(e2e, elapsed), "entries/s", true, e2e);
    pool.close().await;
    Ok(())
}

/// Records each task's lateness (ms) against the due time it carries.
struct Late {
    late: Mutex<Vec<f64>>,
    target: u64,
}

async fn fire(due_ms: i64, rec: Data<Arc<Late>>, worker: WorkerContext) -> Result<(), BoxDynError> {
    let late = wall_ms() - due_ms as f64;
    let seen = {
        let mut l = rec.late.lock().map_err(|_| "poisoned")?;
        l.push(late);
        l.len() as u64
    };
    if seen == rec.target {
        worker.stop()?;
    }
    Ok(())
}

/// The `p` quantile of `sorted` (nearest rank).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The same due times as ours: whole seconds (apalis stores `run_at` in
/// seconds), spread evenly over the three seconds starting two seconds
/// after the next whole second.
fn due_times_ms(n: u64) -> Vec<i64> {
    let first = (wall_ms() / 1000.0).ceil() as i64 + 2;
    (0..n).map(|i| (first + (i % 3) as i64) * 1000).collect()
}

async fn alarms(n: u64) -> BoxResult {
    let dir = tempfile::tempdir()?;
    let (pool, _) = open(&dir.path().join("alarms.db"), false).await?;
    let mut s = storage::<i64>(&pool);
    for due in due_times_ms(n) {
        let task = TaskBuilder::new(due)
            .run_at_timestamp((due / 1000) as u64)
            .build();
        s.push_task(task).await.map_err(err)?;
    }
    let rec = Arc::new(Late {
        late: Mutex::new(Vec::with_capacity(n as usize)),
        target: n,
    });
    let worker = WorkerBuilder::new("alarms")
        .backend(s.poll_with_interval(POLL))
        .data(Arc::clone(&rec))
        .build(fire);
    worker.run().await.map_err(err)?;
    let mut seen = rec.late.lock().map_err(|_| "poisoned")?.clone();
    if seen.len() as u64 != n {
        return Err(format!("alarms: {} runs of {n}", seen.len()).into());
    }
    seen.sort_by(f64::total_cmp);
    emit(
        "alarms.lateness_p50",
        percentile(&seen, 0.5),
        "ms",
        false,
        n,
    );
    emit(
        "alarms.lateness_p99",
        percentile(&seen, 0.99),
        "ms",
        false,
        n,
    );
    pool.close().await;
    Ok(())
}
