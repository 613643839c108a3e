//! `Order`: one object per order, named by its id.
//!
//! - `place` writes the order and stages its `placed` event on the
//!   `order-events` outbox in one transaction, and sets the order's expiry
//!   alarm (the `expire` capability's due time) in that same transaction.
//! - `pay` marks it paid by a payment, with its `paid` event, and clears
//!   the alarm; again one transaction.
//! - The alarm, when it fires on whichever host owns the order then,
//!   expires the order if it is still unpaid, with its `expired` event.
//!
//! Every commit goes through the object's fenced storage, so a host that
//! lost the order's shard cannot commit; the outbox delivers each event to
//! the webhook at least once, from whichever host owns the order.

use std::sync::{Arc, Weak};

use durability_host::{BoxError, Class, ObjectCtx};
use durability_outbox::{ChannelConfig, Outbox};
use durability_scheduler::{Capability, Scheduler, StorageError, Transaction};
use durability_storage_postgres::object::PostgresObjectStorage;

use crate::api::{OrderStatus, OrderView, PayOrder, PlaceOrder, Placed, refuse};
use crate::webhook::{OrderEvent, WebhookSink};

/// The object storage of every class here.
pub type Db = PostgresObjectStorage;

/// The class name.
pub const ORDER: &str = "Order";
/// The largest order, in cents.
pub const MAX_CENTS: i64 = 100_000_000;
/// The longest time an order may stay unpaid.
pub const MAX_TTL_MS: i64 = 7 * 24 * 3_600_000;
/// The expiry capability.
const EXPIRE: &str = "expire";
/// The outbox channel of order events.
pub const EVENTS: &str = "order-events";

/// An order object.
pub struct Order {
    inner: Arc<OrderInner>,
}

impl Class for Order {
    const NAME: &'static str = ORDER;
}

struct OrderInner {
    name: String,
    scheduler: Scheduler<Db>,
    events: Outbox<Db, OrderEvent, WebhookSink>,
    default_ttl_ms: i64,
}

/// A column that does not read as its type (a storage error naming it).
pub(crate) fn pg(what: &'static str) -> impl Fn(tokio_postgres::Error) -> StorageError {
    move |e| StorageError::backend(what, e)
}

/// Creates an object's one-row state table `table` (`id = 0`) with
/// `columns` besides the id, unless it exists.
pub(crate) fn create_state(
    scheduler: &Scheduler<Db>,
    table: &str,
    columns: &str,
) -> Result<(), StorageError> {
    let sql = format!(
        "CREATE TABLE IF NOT EXISTS {table} (id INT PRIMARY KEY CHECK (id = 0), {columns})"
    );
    scheduler.transaction(|tx| tx.sql().batch_execute(&sql))
}

/// Reads an object's one state row (`id = 0`) with `sql` and decodes it;
/// `None` before the object's first write.
pub(crate) fn read_state<T>(
    tx: &mut Transaction<'_, '_, Db>,
    sql: &str,
    decode: impl FnOnce(&tokio_postgres::Row) -> Result<T, StorageError>,
) -> Result<Option<T>, StorageError> {
    tx.sql()
        .query_opt(sql, &[])?
        .as_ref()
        .map(decode)
        .transpose()
}

impl Order {
    /// The class factory: the order's table, its outbox channel (to
    /// `sink`) and its expiry capability.
    ///
    /// # Errors
    /// A storage or outbox error: the object is not opened.
    pub fn open<I>(
        ctx: &ObjectCtx<I, Db>,
        sink: WebhookSink,
        default_ttl_ms: i64,
    ) -> Result<Self, BoxError> {
        create_state(
            &ctx.scheduler,
            "order_state",
            "cents BIGINT NOT NULL, status TEXT NOT NULL, expires_at BIGINT NOT NULL, payment TEXT",
        )?;
        let events = Outbox::attach(&ctx.scheduler, ChannelConfig::new(EVENTS), sink)?;
        let inner = Arc::new(OrderInner {
            name: ctx.name.clone(),
            scheduler: ctx.scheduler.clone(),
            events,
            default_ttl_ms,
        });
        ctx.scheduler
            .attach(EXPIRE, None, Arc::new(Expire(Arc::downgrade(&inner))))?;
        Ok(Self { inner })
    }

    /// Places the order (see [`PlaceOrder`]): a bad amount or TTL is
    /// `invalid_order` and writes nothing; the same order placed again with
    /// another amount is `order_conflict`.
    ///
    /// # Errors
    /// A refusal, or a storage error (nothing was written).
    pub fn place(&self, args: &PlaceOrder) -> Result<Placed, BoxError> {
        let ttl = args.ttl_ms.unwrap_or(self.inner.default_ttl_ms);
        if !(1..=MAX_CENTS).contains(&args.cents) || !(1..=MAX_TTL_MS).contains(&ttl) {
            return Err(refuse(
                "invalid_order",
                format!("cents must be in 1..={MAX_CENTS} and ttl_ms in 1..={MAX_TTL_MS}"),
            ));
        }
        let inner = &self.inner;
        let expires_at = inner.scheduler.now_ms().saturating_add(ttl);
        inner.scheduler.transaction(|tx| {
            if let Some(order) = inner.read(tx)? {
                if order.cents != args.cents {
                    return Err(refuse(
                        "order_conflict",
                        format!("order {} exists with another amount", inner.name),
                    ));
                }
                return Ok(Placed {
                    created: false,
                    order,
                });
            }
            tx.sql().execute(
                "INSERT INTO order_state (id, cents, status, expires_at) VALUES (0, $1, 'placed', $2)",
                &[&args.cents, &expires_at],
            )?;
            let order = OrderView {
                order: inner.name.clone(),
                cents: args.cents,
                status: OrderStatus::Placed,
                expires_at_ms: expires_at,
                payment: None,
            };
            inner.publish(tx, &order)?;
            tx.set_due(EXPIRE, Some(expires_at))?;
            Ok(Placed {
                created: true,
                order,
            })
        })
    }

    /// Pays the order (see [`PayOrder`]); paying again with the same
    /// payment answers the paid order. Refusals: `order_not_found`,
    /// `amount_mismatch`, `order_expired`, `already_paid` (by another
    /// payment); nothing is written then.
    ///
    /// # Errors
    /// A refusal, or a storage error (nothing was written).
    pub fn pay(&self, args: &PayOrder) -> Result<OrderView, BoxError> {
        let inner = &self.inner;
        inner.scheduler.transaction(|tx| {
            let Some(mut order) = inner.read(tx)? else {
                return Err(refuse(
                    "order_not_found",
                    format!("no order {}", inner.name),
                ));
            };
            match order.status {
                OrderStatus::Paid if order.payment.as_deref() == Some(args.payment.as_str()) => {
                    return Ok(order);
                }
                OrderStatus::Paid => return Err(refuse("already_paid", "paid by another payment")),
                OrderStatus::Expired => return Err(refuse("order_expired", "the order expired")),
                OrderStatus::Placed => {}
            }
            if order.cents != args.cents {
                return Err(refuse(
                    "amount_mismatch",
                    format!("the order is {} cents, not {}", order.cents, args.cents),
                ));
            }
            tx.sql().execute(
                "UPDATE order_state SET status = 'paid', payment = $1",
                &[&args.payment],
            )?;
            order.status = OrderStatus::Paid;
            order.payment = Some(args.payment.clone());
            inner.publish(tx, &order)?;
            tx.set_due(EXPIRE, None)?;
            Ok(order)
        })
    }

    /// The order, if placed.
    ///
    /// # Errors
    /// A storage error; a stored row that does not decode is `Corrupt`.
    pub fn get(&self) -> Result<Option<OrderView>, BoxError> {
        let inner = &self.inner;
        inner
            .scheduler
            .transaction(|tx| inner.read(tx).map_err(BoxError::from))
    }
}

impl OrderInner {
    /// The stored order, decoded strictly.
    fn read(&self, tx: &mut Transaction<'_, '_, Db>) -> Result<Option<OrderView>, StorageError> {
        let sql = "SELECT cents, status, expires_at, payment FROM order_state WHERE id = 0";
        read_state(tx, sql, |row| {
            let status: String = row.try_get(1).map_err(pg("order status"))?;
            let status = OrderStatus::parse(&status)
                .ok_or_else(|| StorageError::corrupt(format!("order status {status:?}")))?;
            Ok(OrderView {
                order: self.name.clone(),
                cents: row.try_get(0).map_err(pg("order cents"))?,
                status,
                expires_at_ms: row.try_get(2).map_err(pg("order expiry"))?,
                payment: row.try_get(3).map_err(pg("order payment"))?,
            })
        })
    }

    fn publish(
        &self,
        tx: &mut Transaction<'_, '_, Db>,
        order: &OrderView,
    ) -> Result<(), durability_outbox::OutboxError> {
        let event = OrderEvent {
            order: order.order.clone(),
            status: order.status,
            cents: order.cents,
            payment: order.payment.clone(),
        };
        self.events.stage(tx, &self.name, &event)?;
        Ok(())
    }

    /// The alarm's work: expire the order if it is unpaid and due, with its
    /// event; keep the alarm at the deadline otherwise.
    fn expire(&self, now: i64) -> Result<bool, BoxError> {
        self.scheduler.transaction(|tx| {
            let Some(mut order) = self.read(tx)? else {
                tx.set_due(EXPIRE, None)?;
                return Ok(false);
            };
            if order.status != OrderStatus::Placed {
                tx.set_due(EXPIRE, None)?;
                return Ok(false);
            }
            if order.expires_at_ms > now {
                tx.set_due(EXPIRE, Some(order.expires_at_ms))?;
                return Ok(false);
            }
            tx.sql()
                .execute("UPDATE order_state SET status = 'expired'", &[])?;
            order.status = OrderStatus::Expired;
            self.publish(tx, &order)?;
            tx.set_due(EXPIRE, None)?;
            Ok(true)
        })
    }
}

/// The order's expiry alarm.
struct Expire(Weak<OrderInner>);

impl Capability for Expire {
    fn run(&self, now_ms: i64) -> futures::future::BoxFuture<'_, ()> {
        let inner = self.0.upgrade();
        Box::pin(async move {
            let Some(inner) = inner else { return };
            // A failure leaves the due time where it was: the alarm runs
            // this again.
            if let Err(e) = inner.expire(now_ms) {
                tracing::warn!(order = %inner.name, error = %e, "orders.expire_failed");
            }
        })
    }
}
