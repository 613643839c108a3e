//! `cargo xtask bench [AREA]` (`durability-demo bench-inner [AREA]` in a
//! release build): one JSON object per line and figure on stdout, each with
//! its ratio to a baseline measured in the same run; human text on stderr.
//! `durability-demo bench` runs itself again in a release build unless
//! already in one.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use durability_outbox::{ChannelConfig, Entry, Outbox, OutboxError, Sink, SinkError};
use durability_scheduler::{
    ObjectContext, ObjectId, Scheduler, SchemaStep, SystemClock, Transaction,
};
use durability_storage_sqlite::{
    SqliteOptions, SqliteSchemaStep, SqliteStorage, SqliteTx, Synchronous,
};
use serde_json::json;

use crate::{INITIAL_STEP, Result};

#[rustfmt::skip] // One line: xtask's tidy test reads it.
pub(crate) const AREAS: &[&str] = &["outbox", "topology", "ownership", "alarms", "migration", "host", "semaphore"];

pub(crate) fn run(args: &[String]) -> Result {
    if cfg!(debug_assertions) {
        eprintln!("building durability-demo in release for benchmarks …");
        let status = Command::new(crate::env_cargo())
            .args([
                "run",
                "--release",
                "--quiet",
                "--package",
                "durability-demo",
                "--bin",
                "durability-demo",
                "--",
                "bench-inner",
            ])
            .args(args)
            .status()?;
        return if status.success() {
            Ok(())
        } else {
            Err(format!("benchmarks failed: {status}").into())
        };
    }
    inner(args)
}

pub(crate) fn inner(args: &[String]) -> Result {
    let areas: Vec<&str> = if args.is_empty() {
        AREAS.to_vec()
    } else {
        args.iter().map(String::as_str).collect()
    };
    for area in areas {
        match area {
            "outbox" => {
                // DURABILITY_BENCH_OUTBOX=sqlite or =postgres: that backend's
                // figures alone.
                let only = std::env::var("DURABILITY_BENCH_OUTBOX").ok();
                if only.as_deref() != Some("postgres") {
                    outbox()?;
                }
                if only.as_deref() != Some("sqlite") {
                    tokio::runtime::Runtime::new()?
                        .block_on(crate::pg_outbox::bench(&crate::postgres_url()))?;
                }
            }
            "topology" => crate::topology::bench()?,
            "ownership" => {
                let rt = tokio::runtime::Runtime::new()?;
                rt.block_on(crate::ownership::bench(&crate::redis_url()))?;
                rt.block_on(crate::pg_leases::bench(&crate::postgres_url()))?;
            }
            "alarms" => tokio::runtime::Runtime::new()?
                .block_on(crate::alarms::bench(&crate::redis_url()))?,
            "migration" => {
                let dir = tempfile::tempdir()?;
                tokio::runtime::Runtime::new()?.block_on(crate::migration::bench(dir.path()))?;
            }
            "host" => tokio::runtime::Runtime::new()?.block_on(crate::host::bench())?,
            "semaphore" => tokio::runtime::Runtime::new()?
                .block_on(crate::semaphore::bench(&crate::redis_url()))?,
            other => return Err(format!("unknown bench area {other:?}; known: {AREAS:?}").into()),
        }
    }
    Ok(())
}

pub(crate) fn figure(
    name: &str,
    value: f64,
    baseline: f64,
    unit: &str,
    target: &str,
    n: u64,
    extra: serde_json::Value,
) {
    let mut line = json!({
        "name": name, "value": round(value), "baseline": round(baseline), "unit": unit,
        "ratio": round(value / baseline), "target": target, "n": n,
    });
    if let (Some(map), serde_json::Value::Object(more)) = (line.as_object_mut(), extra) {
        map.extend(more);
    }
    println!("{line}");
}

/// Rounds to three decimals, as figures are written.
pub(crate) fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

static APP_STEPS: &[SchemaStep] = &[INITIAL_STEP];
static APP_SQL: &[SqliteSchemaStep] = &[SqliteSchemaStep {
    step: INITIAL_STEP,
    up: "CREATE TABLE app_rows (id INTEGER PRIMARY KEY, body BLOB NOT NULL);
         CREATE TABLE bench_outbox (
             channel TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,
             version INTEGER NOT NULL, attempt INTEGER NOT NULL, due_at INTEGER NOT NULL,
             claimed_until INTEGER, PRIMARY KEY (channel, key)) WITHOUT ROWID;
         CREATE INDEX bench_outbox_due ON bench_outbox (channel, due_at, version);",
    down: "DROP TABLE app_rows; DROP TABLE bench_outbox;",
}];

/// A sink that acknowledges everything.
pub(crate) struct NoOp;
impl Sink<Vec<u8>> for NoOp {
    async fn publish(&self, _batch: &[Entry<Vec<u8>>]) -> std::result::Result<(), SinkError> {
        Ok(())
    }
}

pub(crate) type Bench = (
    Scheduler<SqliteStorage>,
    Outbox<SqliteStorage, Vec<u8>, NoOp>,
);

pub(crate) fn open_bench(path: &std::path::Path) -> Result<Bench> {
    let options = SqliteOptions {
        synchronous: Synchronous::Normal,
        ..SqliteOptions::default()
    };
    let mut storage = SqliteStorage::open(path, options)?;
    storage.register_schema("app", APP_STEPS, APP_SQL)?;
    let ctx = ObjectContext::with_clock(
        ObjectId::new("bench")?,
        Arc::new(storage),
        Arc::new(SystemClock),
    );
    let scheduler = Scheduler::new(ctx)?;
    durability_scheduler::migrate(
        scheduler.context().storage().as_ref(),
        "app",
        &durability_scheduler::SchemaTarget::Latest,
    )?;
    let outbox = Outbox::attach(&scheduler, ChannelConfig::new("bench"), NoOp)?;
    Ok((scheduler, outbox))
}

fn sql_err(e: rusqlite::Error) -> OutboxError {
    OutboxError::Storage(durability_scheduler::StorageError::backend("bench", e))
}

/// Stages `n` entries of 200 bytes, `per_tx` per transaction.
pub(crate) fn stage_many(b: &Bench, n: u64, per_tx: u64) -> Result {
    let value = vec![7u8; 200];
    let mut i = 0;
    while i < n {
        let end = (i + per_tx).min(n);
        b.0.transaction(|tx| {
            for k in i..end {
                b.1.stage(tx, &format!("key-{k}"), &value)?;
            }
            Ok::<_, OutboxError>(())
        })?;
        i = end;
    }
    Ok(())
}

/// What a step of a measured transaction returns.
type TxResult = std::result::Result<(), OutboxError>;

/// Runs one cached statement in `tx`.
fn execute(tx: &mut SqliteTx<'_>, sql: &str, params: impl rusqlite::Params) -> TxResult {
    tx.sql()
        .prepare_cached(sql)
        .and_then(|mut st| st.execute(params))
        .map(|_| ())
        .map_err(sql_err)
}

/// The application's own row of a transaction.
fn app_row(tx: &mut SqliteTx<'_>, id: u64, body: &[u8]) -> TxResult {
    let sql = "INSERT INTO app_rows (id, body) VALUES (?1, ?2)";
    execute(tx, sql, (id as i64, body))
}

/// The hand-written outbox: one insert into an indexed table shaped like
/// the outbox (no version counter, no alarm bookkeeping).
fn hand_written(tx: &mut SqliteTx<'_>, i: u64, body: &[u8]) -> TxResult {
    let sql = "INSERT INTO bench_outbox VALUES ('probe', ?1, ?2, ?3, 0, 0, NULL)";
    execute(tx, sql, (format!("key-{i}"), body, i as i64))
}

/// What the postcard codec costs per stage, in microseconds: encoding the
/// value, then the round-trip check (decode and encode again).
#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
fn codec_us(value: &Vec<u8>, n: u64) -> Result<f64> {
    use durability_outbox::{Codec, Postcard};
    let start = Instant::now();
    for _ in 0..n {
        let mut out = vec![durability_outbox::POSTCARD_FORMAT];
        Codec::<Vec<u8>>::encode(&Postcard, value, &mut out)?;
        Codec::<Vec<u8>>::check_round_trip(&Postcard, value, &out[1..])?;
        std::hint::black_box(&out);
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// The middle value of `xs` (sorted in place).
pub(crate) fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// The body of one measured transaction: the bench's storage, the
/// transaction and the round index.
type TxBody<'a> =
    Box<dyn Fn(&Bench, &mut Transaction<'_, '_, SqliteStorage>, u64) -> TxResult + 'a>;

/// One staging variant: a fresh database and a transaction body.
struct Variant<'a> {
    name: &'static str,
    bench: Bench,
    body: TxBody<'a>,
    per_round: Vec<f64>,
}

impl<'a> Variant<'a> {
    fn new(
        name: &'static str,
        bench: Bench,
        body: impl Fn(&Bench, &mut Transaction<'_, '_, SqliteStorage>, u64) -> TxResult + 'a,
    ) -> Self {
        Self {
            name,
            bench,
            body: Box::new(body),
            per_round: Vec::new(),
        }
    }
}

/// Runs the variants in interleaved rounds (so noise on this shared machine
/// hits all alike) and returns each one's median time per transaction, in
/// microseconds.
#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
fn interleaved(variants: &mut [Variant<'_>], rounds: u64, per_round: u64) -> Result {
    for round in 0..rounds {
        for v in variants.iter_mut() {
            let start = Instant::now();
            for i in (round * per_round)..((round + 1) * per_round) {
                v.bench.0.transaction(|tx| (v.body)(&v.bench, tx, i))?;
            }
            v.per_round
                .push(start.elapsed().as_secs_f64() * 1e6 / per_round as f64);
        }
    }
    Ok(())
}

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
fn outbox() -> Result {
    let dir = tempfile::tempdir()?;
    let rt = tokio::runtime::Runtime::new()?;
    let body = vec![3u8; 200];
    let n: u64 = 10_000;
    let rounds: u64 = 20;
    let open = |name: &str| open_bench(&dir.path().join(format!("{name}.db")));

    // One entry per transaction: the bare transaction (one application
    // row), the hand-written outbox (the same plus one insert into an
    // indexed outbox table) and ours (the same plus one stage). The
    // "+counter" and "+due read" variants are the hand-written outbox plus
    // the statements a stage adds, to measure what each one costs.
    let mut single = vec![
        Variant::new("bare", open("bare")?, |_, tx, i| app_row(tx, i, &body)),
        Variant::new("hand_written", open("hand")?, |_, tx, i| {
            app_row(tx, i, &body)?;
            hand_written(tx, i, &body)
        }),
        Variant::new("hand_written+counter", open("counter")?, |_, tx, i| {
            app_row(tx, i, &body)?;
            hand_written(tx, i, &body)?;
            tx.sql()
                .prepare_cached(
                    "UPDATE durability_outbox_version SET last = last + 1
                     WHERE id = 0 RETURNING last",
                )
                .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)))
                .map(|_| ())
                .map_err(sql_err)
        }),
        Variant::new("hand_written+due_read", open("due")?, |_, tx, i| {
            app_row(tx, i, &body)?;
            hand_written(tx, i, &body)?;
            Ok(tx.lower_due("outbox:bench", 0)?)
        }),
        Variant::new("ours", open("ours")?, |b, tx, i| {
            app_row(tx, i, &body)?;
            b.1.stage(tx, &format!("key-{i}"), &body)?;
            Ok(())
        }),
    ];
    interleaved(&mut single, rounds, n / rounds)?;
    let med: Vec<(&str, f64)> = single
        .iter_mut()
        .map(|v| (v.name, median(&mut v.per_round)))
        .collect();
    let get = |name: &str| med.iter().find(|m| m.0 == name).map_or(f64::NAN, |m| m.1);
    let (bare, hand, ours) = (get("bare"), get("hand_written"), get("ours"));
    let (counter, due) = (get("hand_written+counter"), get("hand_written+due_read"));
    eprintln!(
        "staging, one entry per transaction (median of {rounds} interleaved rounds, us/txn): \
         bare {bare:.1}, hand-written outbox {hand:.1}, ours {ours:.1}; \
         the counter update adds {:.1}, the due-time read {:.1}",
        counter - hand,
        due - hand
    );
    let codec = codec_us(&body, n)?;
    eprintln!("  of which encoding and the round-trip check: {codec:.2} us per stage");
    let extra = json!({"backend": "sqlite", "synchronous": "NORMAL", "value_bytes": 200,
        "codec_us": round(codec),
        "rounds": rounds, "statistic": "median",
        "bare_us": round(bare), "hand_written_us": round(hand), "ours_us": round(ours),
        "counter_update_us": round(counter - hand), "due_read_us": round(due - hand)});
    for (name, value, baseline, target) in [
        ("outbox.stage_vs_bare", ours, bare, "report"),
        ("outbox.hand_written_vs_bare", hand, bare, "report"),
        ("outbox.stage_overhead", ours, hand, "<=1.25"),
    ] {
        figure(name, value, baseline, "us/txn", target, n, extra.clone());
    }
    drop(single);

    // 100 entries per transaction: per-entry cost of 100 stages against
    // 100 bare inserts into the indexed outbox-shaped table.
    let per_tx: u64 = 100;
    let txns: u64 = 200;
    let mut batched = vec![
        Variant::new("bare_100", open("bare100")?, |_, tx, t| {
            for i in (t * per_tx)..((t + 1) * per_tx) {
                hand_written(tx, i, &body)?;
            }
            Ok(())
        }),
        Variant::new("ours_100", open("ours100")?, |b, tx, t| {
            for i in (t * per_tx)..((t + 1) * per_tx) {
                b.1.stage(tx, &format!("key-{i}"), &body)?;
            }
            Ok(())
        }),
    ];
    interleaved(&mut batched, rounds, txns / rounds)?;
    let bare100 = median(&mut batched[0].per_round) / per_tx as f64;
    let ours100 = median(&mut batched[1].per_round) / per_tx as f64;
    eprintln!(
        "staging, {per_tx} entries per transaction (us/entry): 100 bare inserts {bare100:.2}, ours {ours100:.2}"
    );
    figure(
        "outbox.stage_100_per_txn",
        ours100,
        bare100,
        "us/entry",
        "<=1.25",
        txns * per_tx,
        json!({"backend": "sqlite", "synchronous": "NORMAL", "value_bytes": 200,
            "per_txn": per_tx, "rounds": rounds, "statistic": "median"}),
    );
    drop(batched);

    // Delivery: 100k staged entries through a no-op sink, against a bare
    // loop issuing claim + delete per batch on an equivalent table, in
    // interleaved rounds of 20k (median of each).
    let total: u64 = 100_000;
    let delivery_rounds: u64 = 5;
    let per_round = total / delivery_rounds;
    let b = open_bench(&dir.path().join("deliver.db"))?;
    let (mut ours_rounds, mut bare_rounds) = (Vec::new(), Vec::new());
    for _ in 0..delivery_rounds {
        ours_rounds.push(stage_and_deliver(&rt, &b, per_round)?);
        bare_rounds.push(bare_delivery(&b, per_round)?);
    }
    let (ours, base) = (median(&mut ours_rounds), median(&mut bare_rounds));
    eprintln!(
        "delivery (median of {delivery_rounds} interleaved rounds): {ours:.0} entries/s, bare loop {base:.0} entries/s"
    );
    figure(
        "outbox.delivery",
        ours,
        base,
        "entries/s",
        ">=0.6",
        total,
        json!({"backend": "sqlite", "synchronous": "NORMAL", "batch": 100, "value_bytes": 200,
            "rounds": delivery_rounds, "statistic": "median"}),
    );
    drop(b);
    drain_by_backlog(&rt, dir.path())?;

    if std::env::var_os("DURABILITY_BENCH_SKIP_RSS").is_some() {
        return Ok(());
    }
    // Memory: peak RSS delivering 1M staged entries against 100k, each in a
    // fresh process.
    let small = crate::rss::measure("outbox-delivery", 100_000)?;
    let large = crate::rss::measure("outbox-delivery", 1_000_000)?;
    eprintln!("peak RSS: {small} KiB for 100k, {large} KiB for 1M");
    figure(
        "outbox.delivery_peak_rss",
        large as f64,
        small as f64,
        "KiB",
        "<=1.2",
        1_000_000,
        json!({"backend": "sqlite", "rss_100k_kib": small, "rss_1m_kib": large}),
    );
    Ok(())
}

/// Stages `n` entries, 1,000 per transaction, then delivers them all in
/// one run; returns the delivery rate in entries per second.
#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
fn stage_and_deliver(rt: &tokio::runtime::Runtime, b: &Bench, n: u64) -> Result<f64> {
    stage_many(b, n, 1_000)?;
    let t = Instant::now();
    let report = rt.block_on(b.1.deliver_due())?;
    let rate = n as f64 / t.elapsed().as_secs_f64();
    assert_eq!(report.delivered, n, "everything delivered");
    assert_eq!(b.1.len()?, 0, "nothing left");
    Ok(rate)
}

/// The drain rate of a 10k and of a 1M backlog (each staged first, 1,000
/// per transaction, then delivered by one run). Some fall is expected (a 1M
/// file outgrows SQLite's page cache, so claims and deletes read pages
/// from the OS); a cost per batch that grows with the backlog (as a count
/// of the channel after every batch did) drops the ratio far below the
/// target.
#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
fn drain_by_backlog(rt: &tokio::runtime::Runtime, dir: &std::path::Path) -> Result {
    let mut rates = Vec::new();
    for n in [10_000_u64, 1_000_000] {
        let b = open_bench(&dir.join(format!("drain-{n}.db")))?;
        rates.push(stage_and_deliver(rt, &b, n)?);
    }
    let (small, large) = (rates[0], rates[1]);
    eprintln!("drain rate by backlog: 10k {small:.0} entries/s, 1M {large:.0} entries/s");
    figure(
        "outbox.drain_1m_vs_10k",
        large,
        small,
        "entries/s",
        ">=0.25",
        1_010_000,
        json!({"backend": "sqlite", "synchronous": "NORMAL", "batch": 100, "value_bytes": 200,
            "rate_10k": round(small), "rate_1m": round(large), "statistic": "one run each"}),
    );
    Ok(())
}

/// The baseline: per batch of 100, one transaction claiming the due rows
/// (select + update each) and one deleting them.
#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
fn bare_delivery(b: &Bench, total: u64) -> Result<f64> {
    let value = vec![7u8; 200];
    b.0.transaction(|tx| {
        let mut st = tx
            .sql()
            .prepare("INSERT INTO bench_outbox VALUES ('bench', ?1, ?2, ?3, 0, 0, NULL)")
            .map_err(sql_err)?;
        for k in 0..total {
            st.execute((format!("key-{k}"), &value, k as i64))
                .map_err(sql_err)?;
        }
        Ok::<_, OutboxError>(())
    })?;
    let t = Instant::now();
    let mut done = 0u64;
    loop {
        let claimed: Vec<(String, i64)> = b.0.transaction(|tx| {
            let c = tx.sql();
            let rows = c
                .prepare_cached(
                    "SELECT key, value, version FROM bench_outbox WHERE channel = 'bench' AND due_at <= ?1
                     ORDER BY due_at, version LIMIT 100",
                )
                .and_then(|mut st| {
                    st.query_map([1i64], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?, r.get::<_, i64>(2)?)))?
                        .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(sql_err)?;
            let mut claim = c
                .prepare_cached("UPDATE bench_outbox SET attempt = attempt + 1, due_at = 99 WHERE channel = 'bench' AND key = ?1")
                .map_err(sql_err)?;
            for (k, _, _) in &rows {
                claim.execute([k]).map_err(sql_err)?;
            }
            Ok::<_, OutboxError>(rows.into_iter().map(|(k, _, v)| (k, v)).collect())
        })?;
        if claimed.is_empty() {
            break;
        }
        b.0.transaction(|tx| {
            let mut del = tx
                .sql()
                .prepare_cached("DELETE FROM bench_outbox WHERE channel = 'bench' AND key = ?1 AND version = ?2")
                .map_err(sql_err)?;
            for (k, v) in &claimed {
                del.execute((k, v)).map_err(sql_err)?;
            }
            Ok::<_, OutboxError>(())
        })?;
        done += claimed.len() as u64;
    }
    assert_eq!(done, total);
    Ok(total as f64 / t.elapsed().as_secs_f64())
}
