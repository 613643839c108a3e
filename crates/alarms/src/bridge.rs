//! Backing the scheduler's one alarm with this crate: [`SchedulerAlarm`]
//! keeps the object's alarm row (and so the backend job) at the scheduler's
//! stored alarm, and is the [`AlarmHandler`] that runs the scheduler's due
//! capabilities when the backend delivers it. Outbox and topology work then
//! resumes on whichever host owns the object after a crash.

use std::sync::Arc;

use durability_scheduler::{Scheduler, SchedulerTx, Storage};

use crate::error::{AlarmError, BoxError};
use crate::index::AlarmIndex;
use crate::object::{AlarmHandler, Alarms, Fired};
use crate::store::AlarmTx;

/// Pause before a still-due scheduler alarm is delivered again (a capability
/// failed and left its due time in the past).
pub const DEFAULT_SCHEDULER_IDLE_MS: i64 = 1_000;

/// The scheduler's alarm, delivered through the alarm index.
///
/// ```
/// use std::sync::Arc;
/// use durability_alarms::conformance::memory_storage;
/// use durability_alarms::{AlarmIndex, Alarms, MemoryAlarmIndex, SchedulerAlarm};
/// use durability_scheduler::{ManualClock, ObjectContext, ObjectId, Scheduler};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let id = ObjectId::new("shop-1")?;
/// let clock = Arc::new(ManualClock::new(1_000));
/// let ctx = ObjectContext::with_clock(id.clone(), Arc::new(memory_storage()), clock);
/// let scheduler = Scheduler::new(ctx)?;
/// let index = Arc::new(MemoryAlarmIndex::new());
/// let bridge = SchedulerAlarm::new(&scheduler, Alarms::new(&scheduler, index.clone())?);
///
/// // A capability's due time moves the scheduler's alarm; syncing writes it
/// // to the object's alarm row and the index job.
/// scheduler.transaction(|tx| tx.set_due("reports", Some(60_000)))?;
/// bridge.sync().await?;
/// assert_eq!(index.job(&id).await?.map(|job| job.due_at), Some(60_000));
/// # Ok(())
/// # }
/// ```
pub struct SchedulerAlarm<S, I> {
    sched: Scheduler<S>,
    alarms: Alarms<S, I>,
    idle_ms: i64,
}

impl<S, I> std::fmt::Debug for SchedulerAlarm<S, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerAlarm")
            .field("scheduler", &self.sched)
            .field("idle_ms", &self.idle_ms)
            .finish_non_exhaustive()
    }
}

impl<S, I> Clone for SchedulerAlarm<S, I> {
    fn clone(&self) -> Self {
        Self {
            sched: self.sched.clone(),
            alarms: self.alarms.clone(),
            idle_ms: self.idle_ms,
        }
    }
}

impl<S, I> SchedulerAlarm<S, I>
where
    S: Storage,
    for<'t> S::Tx<'t>: AlarmTx,
    I: AlarmIndex,
{
    /// Bridges `sched`'s alarm to `alarms` (the same object).
    pub fn new(sched: &Scheduler<S>, alarms: Alarms<S, I>) -> Self {
        Self {
            sched: sched.clone(),
            alarms,
            idle_ms: DEFAULT_SCHEDULER_IDLE_MS,
        }
    }

    /// The object's alarms.
    pub fn alarms(&self) -> &Alarms<S, I> {
        &self.alarms
    }

    /// Makes the alarm row match the scheduler's stored alarm (set, move or
    /// delete). It compares the scheduler's alarm with the row only: a row
    /// already at the scheduler's time is trusted to have its job. After
    /// opening the object call [`SchedulerAlarm::sync_and_repair`] instead
    /// ([`SchedulerAlarm::watch`] does, then calls `sync` on every change).
    ///
    /// # Errors
    /// A storage failure, or the errors of [`Alarms::set_alarm`] /
    /// [`Alarms::delete_alarm`].
    pub async fn sync(&self) -> Result<(), AlarmError> {
        let (stored, row) = self.read()?;
        if stored == row {
            return Ok(());
        }
        match stored {
            Some(at) => self.alarms.set_alarm(at).await,
            None => self.alarms.delete_alarm().await,
        }
    }

    /// The scheduler's stored alarm and the pending alarm row's time, read
    /// in one transaction.
    fn read(&self) -> Result<(Option<i64>, Option<i64>), AlarmError> {
        self.alarms.storage().transaction(|tx| {
            let stored = tx.alarm()?;
            let row = tx.alarm_row()?.filter(|r| r.is_pending()).map(|r| r.at);
            Ok::<_, AlarmError>((stored, row))
        })
    }

    /// A delivery's last step, after its run of the scheduler's due work
    /// left `next` as the stored alarm: work is left (later, or a
    /// capability still due after failing), so it keeps an alarm for it,
    /// not sooner than the idle pause. The new row token keeps the
    /// delivery's completion from clearing it.
    ///
    /// A call may have moved the stored alarm after `next` was read and
    /// synced its row before this write replaced it (the call was
    /// acknowledged with its due work scheduled): when the stored alarm is
    /// no longer `next`, the row follows the stored alarm again
    /// ([`SchedulerAlarm::sync`]), so that work does not wait for `next`.
    pub(crate) async fn keep(&self, next: Option<i64>) -> Result<(), AlarmError> {
        let Some(at) = next else {
            return Ok(());
        };
        let floor = self.sched.now_ms().saturating_add(self.idle_ms);
        self.alarms.set_alarm(at.max(floor)).await?;
        if self.read()?.0 != Some(at) {
            self.sync().await?;
        }
        Ok(())
    }

    /// [`SchedulerAlarm::sync`], then the seed's repair
    /// ([`Alarms::repair`]): a pending row whose job the index does not
    /// hold (its flush failed on an earlier owner, or its outcome was
    /// unknown) is written to the index again. What an owner runs when it
    /// opens the object, and after any failed sync.
    ///
    /// # Errors
    /// As [`SchedulerAlarm::sync`], and a backend failure of the repair.
    pub async fn sync_and_repair(&self) -> Result<(), AlarmError> {
        self.sync().await?;
        self.alarms.repair().await.map(|_| ())
    }

    /// Follows the scheduler's alarm forever (spawn it next to the object
    /// when it opens): first [`SchedulerAlarm::sync_and_repair`], then
    /// [`SchedulerAlarm::sync`] on every committed change. A failure is
    /// logged and retried after the idle pause with the repair, until one
    /// succeeds: a flush that failed leaves the row's job in doubt.
    pub async fn watch(self) {
        let mut changes = self.sched.watch_alarm();
        let clock = Arc::clone(self.sched.context().clock());
        let mut repair = true;
        loop {
            let synced = if repair {
                self.sync_and_repair().await
            } else {
                self.sync().await
            };
            repair = synced.is_err();
            if let Err(error) = synced {
                tracing::warn!(
                    event = "durability.alarms.scheduler_sync_failed",
                    object = %self.alarms.object(),
                    code = error.code(),
                    %error,
                    "syncing the scheduler's alarm failed"
                );
                clock
                    .sleep_until(clock.now_ms().saturating_add(self.idle_ms))
                    .await;
                continue;
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    }
}

impl<S, I> AlarmHandler for SchedulerAlarm<S, I>
where
    S: Storage,
    for<'t> S::Tx<'t>: AlarmTx,
    I: AlarmIndex,
{
    async fn alarm(&self, _fired: Fired) -> Result<(), BoxError> {
        let next = self.sched.alarm().await.map_err(Box::new)?;
        self.keep(next).await?;
        Ok(())
    }
}
