//! A publication the outbox could not deliver because its stored row is
//! corrupt is never the group's last word: the coordinator stages its
//! newest snapshot (or deletion) again, so publication attempts never stop.
//!
//! Two ways a publication row is lost, both on the `durability.topology`
//! channel, which has no maximum attempts:
//!
//! - its value does not decode: the outbox hands it to the channel's
//!   dead-letter sink, which restages in its own transaction before the
//!   outbox settles the row (version-guarded, so the restaged entry stays);
//!   a failed restage keeps the row and the dead-lettering is retried;
//! - its version or attempt is out of range: the outbox moves it to the
//!   quarantine in the claim's transaction and reports
//!   `EventKind::Quarantined` after the commit; the coordinator restages on
//!   that event, in a background task of the object.
//!
//! Each restage is logged (`durability.topology.publication_restaged`); a
//! failed one is reported like any restage failure
//! (`TopologyEvent::RestageFailed`). Limit: a crash between the quarantine's
//! commit and the restage's leaves the group unpublished until its next
//! change (the outbox has no hook inside the claim's transaction).

use std::sync::{Arc, Weak};

use durability_outbox::{DeadLetter, DeadLetterFn, EventHook, EventKind, OutboxEvent, SinkError};
use durability_scheduler::Storage;

use super::{Core, Publication};
use crate::error::TopologyError;
use crate::store::{Publisher, TopologyTx};

/// The publication channel's event hook: the user's hook (if any), then a
/// restage on a quarantined row.
pub(super) fn publication_hook<S: Storage, P: Publisher>(
    user: Option<EventHook>,
    core: Weak<Core<S, P>>,
) -> EventHook
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    Arc::new(move |event: &OutboxEvent| {
        if let Some(user) = &user {
            user(event);
        }
        if matches!(event.kind, EventKind::Quarantined { .. })
            && let Some(core) = core.upgrade()
        {
            let group = event.key.clone();
            let task = Arc::clone(&core);
            core.scheduler.wait_until(async move {
                if let Err(error) = task.restage_lost(&group, "quarantined") {
                    task.report_restage_failed(&group, error);
                }
            });
        }
    })
}

/// The publication channel's dead-letter sink: an undecodable publication
/// is replaced by the group's newest one.
pub(super) fn dead_letter<S: Storage, P: Publisher>(
    core: Weak<Core<S, P>>,
) -> DeadLetterFn<Publication>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    Arc::new(move |letter: DeadLetter<Publication>| {
        let core = core.clone();
        Box::pin(async move {
            let Some(core) = core.upgrade() else {
                return Err(SinkError::new("the coordinator was dropped"));
            };
            core.restage_lost(&letter.key, "undecodable")
                .map_err(|error| {
                    let message = error.to_string();
                    core.report_restage_failed(&letter.key, error);
                    SinkError::new(message)
                })
        })
    })
}

impl<S: Storage, P: Publisher> Core<S, P>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    /// Stages the group's newest snapshot again in place of a lost
    /// publication row.
    fn restage_lost(&self, group: &str, why: &'static str) -> Result<(), TopologyError> {
        self.scheduler
            .transaction(|tx| self.stage_latest(tx, group))?;
        tracing::warn!(
            event = "durability.topology.publication_restaged",
            group,
            why,
            "a corrupt publication row was replaced by the group's newest snapshot"
        );
        Ok(())
    }
}
