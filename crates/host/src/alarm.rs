//! An object's own alarm, in the Durable Objects style: a class registers
//! one alarm handler ([`crate::ClassBuilder::alarm`], its `alarm()`), and
//! its code sets, reads and deletes the object's alarm through its
//! [`Handle`] ([`Handle::set_alarm`], [`Handle::get_alarm`],
//! [`Handle::delete_alarm`]) or, inside a transaction with other writes,
//! through the scheduler's due time of [`OBJECT_ALARM`]
//! (`tx.set_due(OBJECT_ALARM, Some(at))`).
//!
//! How it works: the object's alarm is one capability, [`OBJECT_ALARM`], of
//! the object's scheduler, next to any capability a class attaches itself
//! (an outbox, timers); the scheduler keeps the object's one stored alarm
//! at the earliest due time, and the host's alarm index and dispatcher
//! deliver it on whichever host owns the object, admitted and fenced like
//! a call. The invariants:
//!
//! - Setting the alarm is durable when the call that set it returns: the
//!   host returns from a call that moved the alarm only once the alarm
//!   index holds the job, so a crash right after cannot lose it.
//! - One alarm per object: setting it again replaces the time; deleting it
//!   cancels it.
//! - The handler runs once the time has come, after a restart or an
//!   ownership move too (the object is opened by the delivery). After it
//!   returns `Ok`, the alarm is cleared unless the handler set a new time
//!   (a new time stays, and fires in turn).
//! - At least once: a crash (or a lost lease) after the handler's effects
//!   and before the clear runs it again, as Durable Objects do; a handler
//!   that must act once records what it did in the same transaction as
//!   its effects.
//! - A handler error keeps the alarm due: it is retried after the
//!   scheduler's idle pause (1 s by default) until it succeeds or the
//!   alarm is moved or deleted (no retry limit; the error is logged as
//!   `durability.host.object_alarm_failed`).
//!
//! The capability pattern (a [`durability_scheduler::Capability`] attached
//! by the class's factory, as the host's tests' `Counter` timer does)
//! stays for work that is not the object's one alarm; both share the
//! object's one stored alarm.
//!
//! A runnable example: `cargo run -p durability-host --example alarm`.

use std::sync::Arc;

use durability_alarms::Alarms;
use durability_scheduler::{Capability, Scheduler, SchedulerTx as _, Storage};
use futures::future::BoxFuture;

use crate::error::{BoxError, HostError};
use crate::object::{Handle, Handler, Instance, MethodInput, ObjectCtx};

/// The scheduler capability name of an object's own alarm.
pub const OBJECT_ALARM: &str = "object_alarm";

/// What an alarm handler is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlarmFired {
    /// The time the alarm was set for (milliseconds on the host's clock).
    pub scheduled_at: i64,
    /// The time it runs at.
    pub now_ms: i64,
}

/// A class's alarm handler, type-erased.
pub(crate) type AlarmHook<I, D> = crate::object::Erased<I, D, AlarmFired, ()>;

/// The handler of class `T` as an [`AlarmHook`].
pub(crate) fn hook<T, I, D, F>(class: &'static str, handler: F) -> AlarmHook<I, D>
where
    T: Send + Sync + 'static,
    I: Send + Sync + 'static,
    D: Send + Sync + 'static,
    F: Handler<T, I, D, AlarmFired, ()>,
{
    crate::object::erase(class, handler)
}

/// Attaches the object's alarm capability to its scheduler (the host
/// detaches it when the object is closed).
pub(crate) fn attach<I, D>(
    ctx: &ObjectCtx<I, D>,
    instance: Instance,
    hook: AlarmHook<I, D>,
) -> Result<(), BoxError>
where
    I: Send + Sync + 'static,
    D: Storage,
{
    let capability = ObjectAlarm {
        hook,
        instance,
        scheduler: ctx.scheduler.clone(),
        alarms: ctx.alarms.clone(),
        generation: ctx.generation,
    };
    ctx.scheduler
        .attach(OBJECT_ALARM, None, Arc::new(capability))
        .map_err(BoxError::from)
}

/// The object's alarm as a scheduler capability.
struct ObjectAlarm<I, D> {
    hook: AlarmHook<I, D>,
    instance: Instance,
    scheduler: Scheduler<D>,
    alarms: Alarms<D, I>,
    generation: u64,
}

impl<I: Send + Sync + 'static, D: Storage> Capability for ObjectAlarm<I, D> {
    fn run(&self, now_ms: i64) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let due = self
                .scheduler
                .transaction(|tx| tx.capability_due(OBJECT_ALARM));
            let scheduled_at = match due {
                Ok(Some(at)) if at <= now_ms => at,
                Ok(_) => return,
                Err(error) => return failed(&self.scheduler, &error.into()),
            };
            let input = MethodInput {
                instance: Arc::clone(&self.instance),
                scheduler: self.scheduler.clone(),
                alarms: self.alarms.clone(),
                generation: self.generation,
            };
            let fired = AlarmFired {
                scheduled_at,
                now_ms,
            };
            if let Err(error) = (self.hook)(input, fired).await {
                return failed(&self.scheduler, &error);
            }
            // Cleared unless the handler set another time.
            let cleared = self.scheduler.transaction(|tx| {
                if tx.capability_due(OBJECT_ALARM)? == Some(scheduled_at) {
                    tx.set_due(OBJECT_ALARM, None)?;
                }
                Ok::<_, durability_scheduler::StorageError>(())
            });
            if let Err(error) = cleared {
                failed(&self.scheduler, &error.into());
            }
        })
    }
}

fn failed<D: Storage>(scheduler: &Scheduler<D>, error: &BoxError) {
    tracing::warn!(
        event = "durability.host.object_alarm_failed",
        object = %scheduler.context().id(),
        %error,
        "the object's alarm handler failed; the alarm stays due and is retried"
    );
}

impl<T, I, D: Storage> Handle<T, I, D> {
    /// Sets the object's alarm to `at` (milliseconds on the host's clock),
    /// replacing any earlier time; the class's alarm handler runs once it
    /// has come. Durable when the call that set it returns (see
    /// [`crate::alarm`]).
    ///
    /// # Errors
    /// [`HostError::InvalidArgs`] for a negative time (nothing is
    /// written); a storage failure or fence refusal.
    pub fn set_alarm(&self, at: i64) -> Result<(), HostError> {
        if at < 0 {
            return Err(HostError::InvalidArgs {
                reason: format!("the alarm time {at} is negative"),
            });
        }
        self.scheduler
            .transaction(|tx| tx.set_due(OBJECT_ALARM, Some(at)))
            .map_err(HostError::from_storage)
    }

    /// The time the object's alarm is set for, if it is set.
    ///
    /// # Errors
    /// A storage failure.
    pub fn get_alarm(&self) -> Result<Option<i64>, HostError> {
        self.scheduler
            .transaction(|tx| tx.capability_due(OBJECT_ALARM))
            .map_err(HostError::from_storage)
    }

    /// Cancels the object's alarm (a no-op when none is set).
    ///
    /// # Errors
    /// A storage failure or fence refusal.
    pub fn delete_alarm(&self) -> Result<(), HostError> {
        self.scheduler
            .transaction(|tx| tx.set_due(OBJECT_ALARM, None))
            .map_err(HostError::from_storage)
    }
}
