//! `cargo xtask demo`: the main job, on embedded SQLite in a temporary
//! directory. Application transactions stage outbox entries, a flaky sink
//! receives them with retries, the process "crashes" mid-delivery, the
//! object is reopened from its file, and everything arrives. Then the
//! topology, ownership, alarm and migration scenes, and the cluster scene
//! (three host processes: kill, pause, drain), and the table of the figures
//! recorded through the `metrics` facade.
//!
//! Flags: `--redis` runs topology, ownership, alarms and the cluster's
//! leases and alarm jobs through Redis;
//! `--postgres` and `--mariadb` run the migration scene on PostgreSQL or
//! MariaDB shards instead of SQLite files (both flags: once on each), and
//! `--postgres` runs the cluster scene's hosts on PostgreSQL alone (with
//! `--redis` too, the cluster scene takes PostgreSQL). The
//! servers are checked before the first scene, so an unreachable one fails
//! the command at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durability_outbox::{ChannelConfig, Entry, Outbox, OutboxError, RetryPolicy, Sink, SinkError};
use durability_scheduler::{Driver, ObjectContext, ObjectId, Scheduler, SchemaStep, StorageError};
use durability_storage_sqlite::{SqliteOptions, SqliteSchemaStep, SqliteStorage};
use serde::{Deserialize, Serialize};

use crate::migration::Backend;
use crate::{INITIAL_STEP, Result};

static ORDER_STEPS: &[SchemaStep] = &[INITIAL_STEP];
static ORDER_SQL: &[SqliteSchemaStep] = &[SqliteSchemaStep {
    step: INITIAL_STEP,
    up: "CREATE TABLE shop_orders (id INTEGER PRIMARY KEY, total_cents INTEGER NOT NULL)",
    down: "DROP TABLE shop_orders",
}];

/// What the shop publishes about an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderEvent {
    id: u32,
    total_cents: i64,
}

/// The receiving side: keeps the newest version per key, as sinks must.
#[derive(Default)]
struct Ledger {
    newest: BTreeMap<String, (u64, OrderEvent)>,
    deliveries: u32,
    stale_ignored: u32,
}

/// A sink that fails every third call, and can be told to hang (the crash).
struct FlakySink {
    ledger: Arc<Mutex<Ledger>>,
    calls: AtomicU32,
    failures: Arc<AtomicU32>,
    hang_after: Option<u32>,
}

impl Sink<OrderEvent> for FlakySink {
    async fn publish(&self, batch: &[Entry<OrderEvent>]) -> std::result::Result<(), SinkError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.hang_after.is_some_and(|h| n > h) {
            std::future::pending::<()>().await;
        }
        if n.is_multiple_of(3) {
            self.failures.fetch_add(1, Ordering::SeqCst);
            println!(
                "  sink: call {n} with {} entries fails (flaky network)",
                batch.len()
            );
            return Err(SinkError::new("connection reset"));
        }
        let mut ledger = self
            .ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for e in batch {
            ledger.deliveries += 1;
            let keep = ledger
                .newest
                .get(e.key())
                .is_none_or(|(v, _)| *v < e.version());
            if keep {
                ledger
                    .newest
                    .insert(e.key().to_owned(), (e.version(), e.value().clone()));
            } else {
                ledger.stale_ignored += 1;
            }
        }
        println!("  sink: call {n} delivered {} entries", batch.len());
        Ok(())
    }
}

type Shop = (
    Scheduler<SqliteStorage>,
    Outbox<SqliteStorage, OrderEvent, FlakySink>,
);

fn open_shop(path: &std::path::Path, sink: FlakySink) -> Result<Shop> {
    let mut storage = SqliteStorage::open(path, SqliteOptions::default())?;
    storage.register_schema("shop", ORDER_STEPS, ORDER_SQL)?;
    let ctx = ObjectContext::new(ObjectId::new("shop-1")?, Arc::new(storage));
    let scheduler = Scheduler::new(ctx)?;
    scheduler.attach("shop", Some("shop"), Arc::new(NoWork))?;
    let retry = RetryPolicy {
        delay: Some(Arc::new(|attempt| 100.0 * f64::from(attempt))),
        ..RetryPolicy::default()
    };
    let config = ChannelConfig::new("orders")
        .attempt_timeout_ms(400)
        .batch_size(4)
        .retry(retry);
    let outbox = Outbox::attach(&scheduler, config, sink)?;
    Ok((scheduler, outbox))
}

/// The shop's own capability: it only owns the `shop_orders` schema.
struct NoWork;
impl durability_scheduler::Capability for NoWork {
    fn run(&self, _now: i64) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Writes an order row and stages its event in one transaction.
fn save_order(
    scheduler: &Scheduler<SqliteStorage>,
    outbox: &Outbox<SqliteStorage, OrderEvent, FlakySink>,
    id: u32,
    total_cents: i64,
) -> Result {
    scheduler.transaction(|tx| {
        tx.sql()
            .execute(
                "INSERT INTO shop_orders (id, total_cents) VALUES (?1, ?2)
                 ON CONFLICT (id) DO UPDATE SET total_cents = excluded.total_cents",
                (id, total_cents),
            )
            .map_err(|e| OutboxError::Storage(StorageError::backend("save order", e)))?;
        outbox.stage(tx, &format!("order-{id}"), &OrderEvent { id, total_cents })
    })?;
    Ok(())
}

pub(crate) fn run(args: &[String]) -> Result {
    let mut redis = false;
    let mut shards = Vec::new();
    for a in args {
        match a.as_str() {
            "--redis" => redis = true,
            "--postgres" if !shards.contains(&Backend::Postgres) => {
                shards.push(Backend::Postgres);
            }
            "--mariadb" if !shards.contains(&Backend::MariaDb) => shards.push(Backend::MariaDb),
            "--postgres" | "--mariadb" => {}
            other => {
                return Err(format!(
                    "unknown demo flag {other:?}; known: --redis --postgres --mariadb"
                )
                .into());
            }
        }
    }
    let postgres = shards.contains(&Backend::Postgres);
    if shards.is_empty() {
        shards.push(Backend::Sqlite);
    }
    // Before the first scene: the libraries bind their handles when a
    // channel is attached or an `Ownership` built.
    let figures = crate::figures::install()?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        for backend in &shards {
            crate::migration::probe(*backend).await?;
        }
        outbox_scene().await?;
        println!();
        let url = redis.then(crate::redis_url);
        crate::topology::demo(url.as_deref()).await?;
        println!();
        crate::ownership::demo(url.as_deref()).await?;
        println!();
        crate::alarms::demo(url.as_deref()).await?;
        println!();
        let dir = tempfile::tempdir()?;
        for (i, backend) in shards.into_iter().enumerate() {
            if i > 0 {
                println!();
            }
            crate::migration::demo(backend, dir.path()).await?;
        }
        println!();
        // `--postgres`: the hosts on PostgreSQL alone (no shared directory).
        let backing = match (postgres, url) {
            (true, _) => crate::cluster::Backing::Postgres(crate::postgres_url()),
            (false, Some(url)) => crate::cluster::Backing::Redis(url),
            (false, None) => crate::cluster::Backing::Sqlite,
        };
        crate::cluster::demo(backing).await?;
        println!();
        crate::figures::print(&figures);
        Ok(())
    })
}

async fn outbox_scene() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shop-1.db");
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let failures = Arc::new(AtomicU32::new(0));
    println!("== outbox: orders staged in application transactions, delivered at least once");
    println!("object database: {}", path.display());

    let sink = FlakySink {
        ledger: ledger.clone(),
        calls: AtomicU32::new(0),
        failures: failures.clone(),
        hang_after: Some(4),
    };
    let (scheduler, outbox) = open_shop(&path, sink)?;
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    let mut save = |id: u32, total: i64| -> Result {
        save_order(&scheduler, &outbox, id, total)?;
        expected.insert(format!("order-{id}"), total);
        Ok(())
    };
    for id in 1..=20u32 {
        save(id, i64::from(id) * 1_000)?;
    }
    println!("staged 20 orders, each in the transaction that wrote its row");
    for id in [3u32, 7, 11, 15, 19] {
        save(id, i64::from(id) * 1_000 + 99)?;
    }
    println!("updated 5 orders: only their newest values stay pending");

    let driver = Driver::start(scheduler.clone());
    // Let the driver deliver a few batches; the sink then hangs mid-call.
    for _ in 0..100 {
        if outbox.len()? <= 12 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let left = outbox.len()?;
    println!(
        "CRASH: the process dies mid-delivery with {left} entries pending (one attempt claimed)"
    );
    driver.stop();
    scheduler.abort_background();
    drop(outbox);
    drop(scheduler);

    let sink = FlakySink {
        ledger: ledger.clone(),
        calls: AtomicU32::new(0),
        failures: failures.clone(),
        hang_after: None,
    };
    let (scheduler, outbox) = open_shop(&path, sink)?;
    println!("reopened from the file; the stored alarm re-arms the driver");
    let _driver = Driver::start(scheduler.clone());
    for _ in 0..500 {
        if outbox.is_empty()? {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pending = outbox.len()?;
    let ledger = ledger
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let arrived = expected
        .iter()
        .filter(|(k, total)| {
            ledger
                .newest
                .get(*k)
                .is_some_and(|(_, e)| e.total_cents == **total)
        })
        .count();
    println!();
    println!("| figure                                | value |");
    println!("|---------------------------------------|-------|");
    println!(
        "| orders written                        | {:>5} |",
        expected.len()
    );
    println!("| newest value of each order arrived    | {arrived:>5} |");
    println!(
        "| deliveries (at least once)            | {:>5} |",
        ledger.deliveries
    );
    println!(
        "| stale versions ignored by the sink    | {:>5} |",
        ledger.stale_ignored
    );
    println!(
        "| failed publish calls, retried         | {:>5} |",
        failures.load(Ordering::SeqCst)
    );
    println!("| crashes survived                      | {:>5} |", 1);
    println!("| entries still pending                 | {pending:>5} |");
    if arrived != expected.len() || pending != 0 {
        return Err("not everything arrived".into());
    }
    println!("everything arrived.");
    Ok(())
}
