//! `Payment`: one object per payment, named by its id. `capture` pays an
//! order through the host (wherever the order is owned), then records the
//! outcome. A payment is captured at most once: a repeated capture answers
//! the recorded outcome, and a capture whose order call had an unknown
//! outcome records nothing, so calling again is safe (`Order.pay` is
//! idempotent per payment id).

use durability_host::{BoxError, CallError, Class, ObjectCtx};
use durability_scheduler::{Scheduler, StorageError, Transaction};

use crate::HostSlot;
use crate::api::{Capture, PayOrder, PaymentView, refuse};
use crate::order::{Db, Order, create_state, pg, read_state};

/// The class name.
pub const PAYMENT: &str = "Payment";

/// A payment object.
pub struct Payment {
    name: String,
    scheduler: Scheduler<Db>,
    host: HostSlot,
}

impl Class for Payment {
    const NAME: &'static str = PAYMENT;
}

impl Payment {
    /// The class factory: the payment's table.
    ///
    /// # Errors
    /// A storage error.
    pub fn open<I>(ctx: &ObjectCtx<I, Db>, host: HostSlot) -> Result<Self, BoxError> {
        create_state(
            &ctx.scheduler,
            "payment_state",
            "order_id TEXT NOT NULL, cents BIGINT NOT NULL,
             status TEXT NOT NULL CHECK (status IN ('applied', 'rejected')), reason TEXT",
        )?;
        Ok(Self {
            name: ctx.name.clone(),
            scheduler: ctx.scheduler.clone(),
            host,
        })
    }

    /// Captures the payment (see the module docs). `payment_conflict` when
    /// this payment was captured for another order or amount.
    ///
    /// # Errors
    /// A refusal; the order call's error when its outcome is not a
    /// definite answer (nothing recorded: call again); a storage error.
    pub async fn capture(&self, args: Capture) -> Result<PaymentView, BoxError> {
        if let Some(done) = self.stored(&args)? {
            return Ok(done);
        }
        let host = self.host.get().ok_or("the host is not started yet")?;
        let pay = PayOrder {
            payment: self.name.clone(),
            cents: args.cents,
        };
        let (status, reason) = match host.object::<Order>(&args.order).call(pay).await {
            Ok(_) => ("applied", None),
            Err(CallError::Method(refusal)) => ("rejected", Some(refusal.code)),
            Err(e) => return Err(e.into()),
        };
        self.scheduler.transaction(|tx| {
            tx.sql().execute(
                "INSERT INTO payment_state (id, order_id, cents, status, reason)
                 VALUES (0, $1, $2, $3, $4) ON CONFLICT (id) DO NOTHING",
                &[&args.order, &args.cents, &status, &reason],
            )?;
            self.read(tx)?
                .ok_or_else(|| StorageError::corrupt("the payment row vanished").into())
        })
    }

    /// The payment, if captured.
    ///
    /// # Errors
    /// A storage error.
    pub fn get(&self) -> Result<Option<PaymentView>, BoxError> {
        self.scheduler
            .transaction(|tx| self.read(tx).map_err(BoxError::from))
    }

    /// The recorded outcome for these arguments, if any; another order or
    /// amount is `payment_conflict`.
    fn stored(&self, args: &Capture) -> Result<Option<PaymentView>, BoxError> {
        let Some(done) = self.get()? else {
            return Ok(None);
        };
        if done.order != args.order || done.cents != args.cents {
            return Err(refuse(
                "payment_conflict",
                format!("payment {} was captured for another order", self.name),
            ));
        }
        Ok(Some(done))
    }

    fn read(&self, tx: &mut Transaction<'_, '_, Db>) -> Result<Option<PaymentView>, StorageError> {
        let sql = "SELECT order_id, cents, status, reason FROM payment_state WHERE id = 0";
        read_state(tx, sql, |row| {
            Ok(PaymentView {
                payment: self.name.clone(),
                order: row.try_get(0).map_err(pg("payment order"))?,
                cents: row.try_get(1).map_err(pg("payment cents"))?,
                status: row.try_get(2).map_err(pg("payment status"))?,
                reason: row.try_get(3).map_err(pg("payment reason"))?,
            })
        })
    }
}
