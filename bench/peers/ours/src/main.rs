//! Our side of `cargo xtask bench peers`, and the peers that link the same
//! SQLite as we do: a hand-written rusqlite queue, rslock 0.10 and raw
//! redis-rs.
//!
//! One invocation measures one group once and prints one JSON object per
//! contender and figure on stdout (flat: `figure`, `who`, `value`, `unit`,
//! `higher_is_better`, `n`); xtask runs it several times, interleaved with
//! the apalis binary (`bench/peers/apalis`), and computes medians and
//! ratios from the figures of that one run. Human text goes to stderr.
//!
//! ```text
//! durability-bench-peers-ours outbox <enqueue> <e2e> <backlog>...
//! durability-bench-peers-ours leases <ops> <redis_url>
//! durability-bench-peers-ours alarms <n>
//! durability-bench-peers-ours pg <enqueue> <backlog> <samples> <postgres-url>
//! ```
//!
//! The `pg` group (module `pg`) is the outbox in the caller's own
//! PostgreSQL transaction, against apalis-postgres.
//!
//! Every SQLite database is a fresh file in a temporary directory, in WAL
//! mode with `synchronous = NORMAL` (ours through `SqliteOptions`, the
//! hand-written queue through pragmas); every payload is a 200-byte string.
//! The Redis group uses its own key prefix and deletes it at the end.

#![allow(clippy::print_stdout, reason = "the bench prints its JSON lines")]

mod pg;

use std::error::Error;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use durability_alarms::{
    AlarmIndex, Delivery, Dispatch, DispatchOutcome, Dispatcher, DispatcherConfig, ObjectId, Token,
};
use durability_outbox::{ChannelConfig, Entry, Outbox, OutboxError, Sink, SinkError};
use durability_ownership::ShardCount;
use durability_scheduler::{Driver, ObjectContext, Scheduler, SystemClock};
use durability_storage_redis::ownership::RedisLeaseStore;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::{SqliteOptions, SqliteStorage, Synchronous};
use rusqlite::TransactionBehavior;
use tokio::sync::watch;

type BoxError = Box<dyn Error + Send + Sync>;
type BoxResult<T = ()> = Result<T, BoxError>;

/// Bytes of every payload.
const BODY_LEN: usize = 200;
/// Entries per transaction in the batched enqueue, and per delivery batch
/// (the outbox's default batch size).
const BATCH: u64 = 100;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BoxError::from)
        .and_then(|rt| rt.block_on(run(&args)));
    if let Err(e) = result {
        eprintln!("durability-bench-peers-ours: {e}");
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
        Some("leases") => {
            let ops = arg_u64(args, 1, "operations")?;
            let url = args.get(2).ok_or("missing redis url")?;
            leases(url, ops).await
        }
        Some("alarms") => alarms(arg_u64(args, 1, "alarm count")?).await,
        Some("pg") => pg::pg(&args[1..]).await,
        _ => Err("usage: durability-bench-peers-ours <outbox ENQUEUE E2E BACKLOG... | leases OPS URL | alarms N | pg ENQUEUE BACKLOG SAMPLES URL>".into()),
    }
}

/// One measurement on stdout.
fn emit(figure: &str, who: &str, value: f64, unit: &str, higher_is_better: bool, n: u64) {
    let line = serde_json::json!({
        "figure": figure, "who": who, "value": value, "unit": unit,
        "higher_is_better": higher_is_better, "n": n,
    });
    println!("{line}");
    eprintln!("  {figure:<24} {who:<8} {value:>12.1} {unit}");
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

// ---------------------------------------------------------------- outbox

/// A sink that acknowledges every entry and counts them.
#[derive(Clone)]
struct Counting(Arc<watch::Sender<u64>>);

impl Counting {
    fn new() -> Self {
        Self(Arc::new(watch::Sender::new(0)))
    }

    fn count(&self) -> u64 {
        *self.0.borrow()
    }

    async fn reached(&self, n: u64) -> BoxResult {
        self.0.subscribe().wait_for(|c| *c >= n).await?;
        Ok(())
    }
}

impl Sink<String> for Counting {
    async fn publish(&self, batch: &[Entry<String>]) -> Result<(), SinkError> {
        let len = batch.len() as u64;
        self.0.send_modify(|c| *c += len);
        Ok(())
    }
}

/// Our outbox on a fresh SQLite file.
struct Ours {
    scheduler: Scheduler<SqliteStorage>,
    outbox: Outbox<SqliteStorage, String, Counting>,
    sink: Counting,
}

impl Ours {
    fn open(path: &Path) -> BoxResult<Self> {
        let options = SqliteOptions {
            synchronous: Synchronous::Normal,
            ..SqliteOptions::default()
        };
        let storage = Arc::new(SqliteStorage::open(path, options)?);
        let scheduler = Scheduler::new(ObjectContext::new(
            durability_scheduler::ObjectId::new("bench")?,
            storage,
        ))?;
        let sink = Counting::new();
        let outbox = Outbox::attach(&scheduler, ChannelConfig::new("bench"), sink.clone())?;
        Ok(Self {
            scheduler,
            outbox,
            sink,
        })
    }

    /// Stages entries `from..to`, `per_tx` per transaction.
    fn stage(&self, from: u64, to: u64, per_tx: u64) -> BoxResult {
        let value = body();
        let mut i = from;
        while i < to {
            let end = (i + per_tx).min(to);
            self.scheduler.transaction(|tx| {
                for k in i..end {
                    self.outbox.stage(tx, &format!("key-{k}"), &value)?;
                }
                Ok::<_, OutboxError>(())
            })?;
            i = end;
        }
        Ok(())
    }
}

/// The hand-written queue: one table, claim by marking, delete after
/// delivery (the at-least-once shape of an outbox without versions,
/// retries or an alarm). Transactions begin `IMMEDIATE`, so a producer and
/// a consumer on two connections wait for each other's write lock instead
/// of failing the upgrade from a read.
struct Hand {
    conn: rusqlite::Connection,
}

impl Hand {
    fn open(path: &Path) -> BoxResult<Self> {
        let conn = rusqlite::Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(
            "CREATE TABLE queue (id INTEGER PRIMARY KEY, body TEXT NOT NULL,
                 due_at INTEGER NOT NULL, claimed_until INTEGER);
             CREATE INDEX queue_due ON queue (due_at, id);",
        )?;
        Ok(Self { conn })
    }

    fn stage(&mut self, from: u64, to: u64, per_tx: u64) -> BoxResult {
        let value = body();
        let mut i = from;
        while i < to {
            let end = (i + per_tx).min(to);
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut st = tx.prepare_cached(
                    "INSERT INTO queue (body, due_at, claimed_until) VALUES (?1, 0, NULL)",
                )?;
                for _ in i..end {
                    st.execute([&value])?;
                }
            }
            tx.commit()?;
            i = end;
        }
        Ok(())
    }

    /// Claims up to [`BATCH`] due rows, "delivers" them and deletes them;
    /// returns how many.
    fn deliver_batch(&mut self, now: i64) -> BoxResult<u64> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let rows: Vec<(i64, String)> = {
            let mut st = tx.prepare_cached(
                "SELECT id, body FROM queue
                 WHERE due_at <= ?1 AND (claimed_until IS NULL OR claimed_until < ?1)
                 ORDER BY due_at, id LIMIT ?2",
            )?;
            st.query_map((now, BATCH as i64), |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        {
            let mut claim =
                tx.prepare_cached("UPDATE queue SET claimed_until = ?2 WHERE id = ?1")?;
            for (id, _) in &rows {
                claim.execute((id, now + 30_000))?;
            }
        }
        tx.commit()?;
        std::hint::black_box(&rows);
        if rows.is_empty() {
            return Ok(0);
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut del = tx.prepare_cached("DELETE FROM queue WHERE id = ?1")?;
            for (id, _) in &rows {
                del.execute([id])?;
            }
        }
        tx.commit()?;
        Ok(rows.len() as u64)
    }

    fn len(&self) -> BoxResult<u64> {
        let n: i64 = self
            .conn
            .query_row("SELECT COUNT(*) FROM queue", [], |r| r.get(0))?;
        Ok(n as u64)
    }
}

async fn outbox(enqueue: u64, drains: &[u64], e2e: u64) -> BoxResult {
    let dir = tempfile::tempdir()?;
    let file = |name: &str| dir.path().join(format!("{name}.db"));

    for (figure, per_tx) in [
        ("outbox.enqueue_single", 1),
        ("outbox.enqueue_batched", BATCH),
    ] {
        let ours = Ours::open(&file(&format!("{figure}-ours")))?;
        let t = now();
        ours.stage(0, enqueue, per_tx)?;
        let elapsed = t.elapsed();
        if ours.outbox.len()? != enqueue {
            return Err(format!("{figure}: ours holds {} of {enqueue}", ours.outbox.len()?).into());
        }
        emit(
            figure,
            "ours",
            rate(enqueue, elapsed),
            "entries/s",
            true,
            enqueue,
        );

        let mut hand = Hand::open(&file(&format!("{figure}-hand")))?;
        let t = now();
        hand.stage(0, enqueue, per_tx)?;
        let elapsed = t.elapsed();
        if hand.len()? != enqueue {
            return Err(format!("{figure}: the rusqlite queue holds {}", hand.len()?).into());
        }
        emit(
            figure,
            "rusqlite",
            rate(enqueue, elapsed),
            "entries/s",
            true,
            enqueue,
        );
    }

    for &n in drains {
        let figure = format!("outbox.drain_{}k", n / 1000);
        let ours = Ours::open(&file(&format!("{figure}-ours")))?;
        ours.stage(0, n, 1_000)?;
        let t = now();
        while ours.sink.count() < n {
            let report = ours.outbox.deliver_due().await?;
            if report.delivered == 0 {
                return Err(
                    format!("{figure}: ours stopped at {} of {n}", ours.sink.count()).into(),
                );
            }
        }
        let elapsed = t.elapsed();
        if !ours.outbox.is_empty()? {
            return Err(format!("{figure}: entries left in our outbox").into());
        }
        emit(&figure, "ours", rate(n, elapsed), "entries/s", true, n);

        let mut hand = Hand::open(&file(&format!("{figure}-hand")))?;
        hand.stage(0, n, 1_000)?;
        let t = now();
        let mut done = 0;
        while done < n {
            let k = hand.deliver_batch(1)?;
            if k == 0 {
                return Err(
                    format!("{figure}: the rusqlite queue stopped at {done} of {n}").into(),
                );
            }
            done += k;
        }
        let elapsed = t.elapsed();
        if hand.len()? != 0 {
            return Err(format!("{figure}: rows left in the rusqlite queue").into());
        }
        emit(&figure, "rusqlite", rate(n, elapsed), "entries/s", true, n);
    }

    // End to end: a producer commits one entry per transaction while a
    // consumer delivers; the figure is entries per second from the first
    // commit to the last delivery.
    let figure = "outbox.end_to_end";
    let ours = Arc::new(Ours::open(&file("e2e-ours"))?);
    let driver = Driver::start(ours.scheduler.clone());
    let t = now();
    let producer = tokio::task::spawn_blocking({
        let ours = Arc::clone(&ours);
        move || ours.stage(0, e2e, 1)
    });
    ours.sink.reached(e2e).await?;
    let elapsed = t.elapsed();
    producer.await??;
    driver.stop();
    emit(figure, "ours", rate(e2e, elapsed), "entries/s", true, e2e);

    let path = file("e2e-hand");
    let mut producer = Hand::open(&path)?;
    let mut consumer = Hand {
        conn: rusqlite::Connection::open(&path)?,
    };
    consumer.conn.pragma_update(None, "synchronous", "NORMAL")?;
    consumer.conn.busy_timeout(Duration::from_secs(5))?;
    producer.conn.busy_timeout(Duration::from_secs(5))?;
    let t = now();
    let consumer = std::thread::spawn(move || -> BoxResult<u64> {
        let mut done = 0;
        while done < e2e {
            let k = consumer.deliver_batch(1)?;
            if k == 0 {
                // Nothing committed yet: poll again soon, as a hand-written
                // consumer without a wake-up would.
                std::thread::sleep(Duration::from_millis(1));
            }
            done += k;
        }
        Ok(done)
    });
    producer.stage(0, e2e, 1)?;
    let done = consumer
        .join()
        .map_err(|_| "the consumer thread panicked")??;
    let elapsed = t.elapsed();
    if done != e2e {
        return Err(format!("{figure}: the rusqlite consumer delivered {done} of {e2e}").into());
    }
    emit(
        figure,
        "rusqlite",
        rate(e2e, elapsed),
        "entries/s",
        true,
        e2e,
    );
    Ok(())
}

// ---------------------------------------------------------------- leases

/// The contenders, shared with the demo's `cargo xtask bench ownership`
/// (one file, compiled by both: the demo is outside this workspace).
#[path = "../../../../demo/src/lease_peers/contenders.rs"]
mod contenders;

use contenders::{BLOCK, Contenders, Who};

/// A contender's name in the figures (`redis-rs` for the raw one).
fn peer_name(who: Who) -> &'static str {
    match who {
        Who::Raw => "redis-rs",
        other => other.name(),
    }
}

/// Deletes every key under `prefix`.
async fn delete_prefix(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> BoxResult {
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL").arg(&keys).query_async(conn).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

async fn leases(url: &str, ops: u64) -> BoxResult {
    let prefix = format!("durability:bench-peers:{}:", std::process::id());
    let client = redis::Client::open(url)?;
    let mut cleanup = client.get_multiplexed_async_connection().await?;
    let result = leases_on(url, &prefix, ops).await;
    delete_prefix(&mut cleanup, &prefix).await?;
    result
}

async fn leases_on(url: &str, prefix: &str, ops: u64) -> BoxResult {
    let store = RedisLeaseStore::connect(url, prefix, ShardCount::default()).await?;
    let mut c = Contenders::connect(url, store, prefix).await?;
    c.warm_up(200).await?;
    // Blocks of BLOCK operations, the contenders' order rotating every
    // block, so that load from other processes falls on all three alike.
    let blocks = ops.div_ceil(BLOCK);
    let n = blocks * BLOCK;
    let (pairs, renews) = c.rotate(blocks, 0).await?;
    for (figure, times, unit) in [
        ("leases.lock_unlock", pairs, "pairs/s"),
        ("leases.extend", renews, "ops/s"),
    ] {
        for (who, elapsed) in Who::ALL.into_iter().zip(times) {
            emit(figure, peer_name(who), rate(n, elapsed), unit, true, n);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- alarms

/// Records each delivery's lateness (ms, from the wall clock with
/// microseconds) and counts them.
struct Late {
    late: Mutex<Vec<f64>>,
    count: watch::Sender<u64>,
}

impl Dispatch for Late {
    async fn dispatch(&self, d: Delivery) -> DispatchOutcome {
        let late = wall_ms() - d.scheduled_at as f64;
        if let Ok(mut l) = self.late.lock() {
            l.push(late);
        }
        self.count.send_modify(|c| *c += 1);
        DispatchOutcome::Delivered
    }
}

/// The `p` quantile of `sorted` (nearest rank).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The due times of `n` alarms: whole seconds (the peer stores seconds),
/// spread evenly over the three seconds starting two seconds after the
/// next whole second.
fn due_times_ms(n: u64) -> Vec<i64> {
    let first = (wall_ms() / 1000.0).ceil() as i64 + 2;
    (0..n).map(|i| (first + (i % 3) as i64) * 1000).collect()
}

async fn alarms(n: u64) -> BoxResult {
    let dir = tempfile::tempdir()?;
    let index = Arc::new(SqliteAlarmIndex::open(
        dir.path().join("alarms.db"),
        Synchronous::Normal,
    )?);
    let token = Token::new("t")?;
    for (i, due) in due_times_ms(n).into_iter().enumerate() {
        index
            .upsert(&ObjectId::new(format!("alarm-{i}"))?, &token, due)
            .await?;
    }
    let late = Arc::new(Late {
        late: Mutex::new(Vec::with_capacity(n as usize)),
        count: watch::Sender::new(0),
    });
    let dispatcher = Arc::new(Dispatcher::new(
        Arc::clone(&index),
        Arc::clone(&late),
        Arc::new(SystemClock),
        DispatcherConfig::default(),
    )?);
    let running = tokio::spawn({
        let d = Arc::clone(&dispatcher);
        async move { d.run().await }
    });
    late.count.subscribe().wait_for(|c| *c >= n).await?;
    dispatcher.stop();
    running.await?;
    let mut seen = late.late.lock().map_err(|_| "poisoned")?.clone();
    if seen.len() as u64 != n {
        return Err(format!("alarms: {} deliveries of {n}", seen.len()).into());
    }
    seen.sort_by(f64::total_cmp);
    emit(
        "alarms.lateness_p50",
        "ours",
        percentile(&seen, 0.5),
        "ms",
        false,
        n,
    );
    emit(
        "alarms.lateness_p99",
        "ours",
        percentile(&seen, 0.99),
        "ms",
        false,
        n,
    );
    Ok(())
}
