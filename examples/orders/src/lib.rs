//! An orders service on `durability-host`: one object per shop, each shop
//! a SQLite file under the hosts' shared directory.
//!
//! - Placing an order writes its row and stages its event on the shop's
//!   outbox in one transaction: both commit or neither does, and the event
//!   reaches the sink at least once even if the host dies right after.
//! - An unpaid order is cancelled by the shop's alarm once its time is up
//!   (`AutoCancel`, a scheduler capability whose due time is the earliest
//!   unpaid order's deadline); the cancellation and its event are again one
//!   transaction.
//! - The sink appends the events as JSON lines to a file ([`FileSink`]); a
//!   reader keeps the newest version per key, since delivery is at least
//!   once.
//!
//! `src/main.rs` runs one host process over Redis (lease store and alarm
//! index) taking commands on stdin; `tests/two_hosts.rs` runs two of them.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use durability_host::{BoxError, ObjectCtx};
use durability_outbox::{ChannelConfig, Entry, Outbox, OutboxError, Sink, SinkError};
use durability_scheduler::{Capability, Scheduler, StorageError, Transaction};
use durability_storage_sqlite::SqliteStorage;
use serde::{Deserialize, Serialize};

/// The object class name of a shop.
pub const SHOP: &str = "Shop";

/// The capability that cancels unpaid orders.
const AUTO_CANCEL: &str = "auto-cancel";

/// What the shop publishes about an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderEvent {
    /// The shop.
    pub shop: String,
    /// The order id.
    pub order: String,
    /// `placed`, `paid` or `cancelled`.
    pub status: String,
    /// The order's total.
    pub cents: i64,
}

/// One line of the sink file: an event with its outbox key and version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkLine {
    /// The outbox key (`<shop>/<order>`).
    pub key: String,
    /// The entry's version (newer versions supersede older ones).
    pub version: u64,
    /// The event.
    pub event: OrderEvent,
}

/// A sink that appends each delivered event to a file as a JSON line and
/// syncs the file before acknowledging.
#[derive(Debug, Clone)]
pub struct FileSink {
    path: PathBuf,
}

impl FileSink {
    /// A sink appending to `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }
}

impl Sink<OrderEvent> for FileSink {
    async fn publish(&self, batch: &[Entry<OrderEvent>]) -> Result<(), SinkError> {
        let mut text = String::new();
        for e in batch {
            let line = SinkLine {
                key: e.key().to_owned(),
                version: e.version(),
                event: e.value().clone(),
            };
            let json = serde_json::to_string(&line).map_err(|e| SinkError::new(e.to_string()))?;
            text.push_str(&json);
            text.push('\n');
        }
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
            f.write_all(text.as_bytes())?;
            f.sync_data()
        };
        write().map_err(|e| SinkError::new(e.to_string()))
    }
}

/// A shop: its orders table, its outbox channel and its auto-cancel alarm.
pub struct Shop {
    inner: Arc<ShopInner>,
}

struct ShopInner {
    name: String,
    scheduler: Scheduler<SqliteStorage>,
    events: Outbox<SqliteStorage, OrderEvent, FileSink>,
    cancel_after_ms: i64,
}

fn sql(e: rusqlite::Error) -> OutboxError {
    OutboxError::Storage(StorageError::backend("orders sql", e))
}

/// A call's error, keeping a storage error (a fence refusal included)
/// visible to the host as one.
fn boxed(e: OutboxError) -> BoxError {
    match e {
        OutboxError::Storage(s) => Box::new(s),
        other => Box::new(other),
    }
}

impl Shop {
    /// The class factory: creates the schema if needed, attaches the
    /// outbox channel `order-events` and the auto-cancel capability.
    ///
    /// # Errors
    /// A storage or outbox error: the shop is not opened.
    pub fn open<I>(
        ctx: &ObjectCtx<I>,
        sink: FileSink,
        cancel_after_ms: i64,
    ) -> Result<Self, BoxError> {
        ctx.scheduler.transaction(|tx| {
            tx.sql()
                .execute_batch(
                    "CREATE TABLE IF NOT EXISTS orders (
                         id TEXT PRIMARY KEY NOT NULL,
                         cents INTEGER NOT NULL,
                         status TEXT NOT NULL,
                         cancel_at INTEGER NOT NULL
                     );
                     CREATE INDEX IF NOT EXISTS orders_unpaid ON orders (cancel_at)
                         WHERE status = 'placed';",
                )
                .map_err(|e| StorageError::backend("orders schema", e))
        })?;
        let events = Outbox::attach(&ctx.scheduler, ChannelConfig::new("order-events"), sink)?;
        let inner = Arc::new(ShopInner {
            name: ctx.name.clone(),
            scheduler: ctx.scheduler.clone(),
            events,
            cancel_after_ms,
        });
        ctx.scheduler.attach(
            AUTO_CANCEL,
            None,
            Arc::new(AutoCancel(Arc::downgrade(&inner))),
        )?;
        Ok(Self { inner })
    }

    /// Places an order: its row and its `placed` event in one transaction,
    /// and the auto-cancel alarm moved to its deadline if that is earlier;
    /// `false` (nothing written) when the order id exists already.
    ///
    /// # Errors
    /// A storage error (nothing was written).
    pub fn place(&self, order: &str, cents: i64) -> Result<bool, BoxError> {
        let inner = &self.inner;
        let now = inner.scheduler.now_ms();
        let cancel_at = now.saturating_add(inner.cancel_after_ms);
        inner
            .scheduler
            .transaction(|tx| {
                let inserted = tx
                    .sql()
                    .execute(
                        "INSERT INTO orders (id, cents, status, cancel_at) VALUES (?1, ?2, 'placed', ?3)
                         ON CONFLICT (id) DO NOTHING",
                        rusqlite::params![order, cents, cancel_at],
                    )
                    .map_err(sql)?;
                if inserted == 0 {
                    return Ok(false);
                }
                inner.publish(tx, order, "placed", cents)?;
                tx.lower_due(AUTO_CANCEL, cancel_at)?;
                Ok(true)
            })
            .map_err(boxed)
    }

    /// Pays a placed order (its row and its `paid` event in one
    /// transaction); `false` when it is not placed (paid, cancelled or
    /// unknown).
    ///
    /// # Errors
    /// A storage error (nothing was written).
    pub fn pay(&self, order: &str) -> Result<bool, BoxError> {
        let inner = &self.inner;
        inner
            .scheduler
            .transaction(|tx| {
                let cents: Option<i64> = tx
                    .sql()
                    .query_row(
                        "UPDATE orders SET status = 'paid' WHERE id = ?1 AND status = 'placed' RETURNING cents",
                        [order],
                        |r| r.get(0),
                    )
                    .map(Some)
                    .or_else(|e| match e {
                        rusqlite::Error::QueryReturnedNoRows => Ok(None),
                        e => Err(e),
                    })
                    .map_err(sql)?;
                let Some(cents) = cents else { return Ok(false) };
                inner.publish(tx, order, "paid", cents)?;
                Ok(true)
            })
            .map_err(boxed)
    }

    /// An order's status, if the order exists.
    ///
    /// # Errors
    /// A storage error.
    pub fn status(&self, order: &str) -> Result<Option<String>, BoxError> {
        self.inner
            .scheduler
            .transaction(|tx| {
                tx.sql()
                    .query_row("SELECT status FROM orders WHERE id = ?1", [order], |r| {
                        r.get(0)
                    })
                    .map(Some)
                    .or_else(|e| match e {
                        rusqlite::Error::QueryReturnedNoRows => Ok(None),
                        e => Err(e),
                    })
                    .map_err(sql)
            })
            .map_err(boxed)
    }
}

impl ShopInner {
    fn publish(
        &self,
        tx: &mut Transaction<'_, '_, SqliteStorage>,
        order: &str,
        status: &str,
        cents: i64,
    ) -> Result<(), OutboxError> {
        let event = OrderEvent {
            shop: self.name.clone(),
            order: order.to_owned(),
            status: status.to_owned(),
            cents,
        };
        self.events
            .stage(tx, &format!("{}/{order}", self.name), &event)?;
        Ok(())
    }

    /// Cancels every placed order whose deadline passed, each with its
    /// event, and moves the alarm to the next deadline; one transaction.
    fn cancel_due(&self, now: i64) -> Result<usize, OutboxError> {
        self.scheduler.transaction(|tx| {
            let due: Vec<(String, i64)> = {
                let mut st = tx
                    .sql()
                    .prepare(
                        "SELECT id, cents FROM orders WHERE status = 'placed' AND cancel_at <= ?1",
                    )
                    .map_err(sql)?;
                st.query_map([now], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(sql)?
                    .collect::<Result<_, _>>()
                    .map_err(sql)?
            };
            for (order, cents) in &due {
                tx.sql()
                    .execute(
                        "UPDATE orders SET status = 'cancelled' WHERE id = ?1",
                        [order],
                    )
                    .map_err(sql)?;
                self.publish(tx, order, "cancelled", *cents)?;
            }
            let next: Option<i64> = tx
                .sql()
                .query_row(
                    "SELECT MIN(cancel_at) FROM orders WHERE status = 'placed'",
                    [],
                    |r| r.get(0),
                )
                .map_err(sql)?;
            tx.set_due(AUTO_CANCEL, next)?;
            Ok(due.len())
        })
    }
}

/// The shop's alarm work: cancel unpaid orders whose time is up.
struct AutoCancel(Weak<ShopInner>);

impl Capability for AutoCancel {
    fn run(&self, now_ms: i64) -> futures::future::BoxFuture<'_, ()> {
        let inner = self.0.upgrade();
        Box::pin(async move {
            let Some(inner) = inner else { return };
            // A failure leaves the due time where it was: the alarm runs
            // this again.
            let _ = inner.cancel_due(now_ms);
        })
    }
}

/// Reads the sink file: the newest event per key.
///
/// # Errors
/// The file cannot be read, or a line is not a [`SinkLine`].
pub fn newest_events(
    path: &std::path::Path,
) -> Result<std::collections::BTreeMap<String, SinkLine>, BoxError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e.into()),
    };
    let mut newest = std::collections::BTreeMap::new();
    for line in text.lines() {
        let line: SinkLine = serde_json::from_str(line)?;
        let keep = newest
            .get(&line.key)
            .is_none_or(|old: &SinkLine| old.version < line.version);
        if keep {
            newest.insert(line.key.clone(), line);
        }
    }
    Ok(newest)
}
