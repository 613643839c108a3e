//! The takeover sweep: after this host acquires a scope that an earlier
//! claim held (a generation above 1), every object of the scope that is
//! not open here is opened, its alarm synced and repaired, and closed.
//!
//! Why: a call commits the object's alarm (the scheduler's stored alarm,
//! in the object's own transaction) and only then writes the alarm row and
//! the index job ([`durability_alarms::SchedulerAlarm::sync`]); the two
//! stores share no transaction. A host killed or paused between the two
//! leaves the object with due work and no index job that wakes it (or a
//! later one). Opening the object repairs that
//! ([`durability_alarms::SchedulerAlarm::sync_and_repair`]), but nothing
//! opens an object that gets no call. The sweep does, on the next owner,
//! so the delivery contract holds even when the process that committed
//! the alarm died before syncing it.
//!
//! Invariants:
//! - One sweeper task per host, fed by [`Queue`]; it runs while the host
//!   runs and lists each class once per batch of acquired scopes.
//! - An object is repaired under its registry slot's lock (no call or
//!   delivery opens it meanwhile) and under an admission at the swept
//!   generation, held until it is closed again: a scope lost or claimed
//!   anew since refuses, and a drain waits for it. An object already open
//!   here is skipped (its opening repaired it).
//! - A failure (listing, opening, repairing one object) is logged and
//!   isolated: the sweep goes on with the next object; the object's next
//!   opening repairs it. A scope no longer held at its generation (lost,
//!   claimed anew, draining) leaves the sweep; its next owner sweeps it.
//!   A transient failure (the object store's listing, or the lease store
//!   unreachable for the owner check) sweeps the scope again after one
//!   owner-loop period, while it is still held.

use std::collections::BTreeMap;

use durability_scheduler::StorageErrorKind;
use tokio::sync::Notify;

use super::*;
use crate::store::ObjectQuery;
use crate::store::moving::MAX_LIST_LIMIT;

/// The scopes acquired and not yet swept.
#[derive(Default)]
pub(super) struct Queue {
    pending: Mutex<Vec<(OwnerScope, Generation)>>,
    notify: Notify,
}

impl Queue {
    /// Asks for a sweep of `scope`, acquired at `generation`. The first
    /// claim of a scope (generation 1) had no earlier owner and is not
    /// swept.
    pub(super) fn push(&self, scope: &OwnerScope, generation: Generation) {
        if generation.get() <= 1 {
            return;
        }
        lock(&self.pending).push((scope.clone(), generation));
        self.notify.notify_one();
    }
}

/// One class's pass of a sweep: the scopes still swept, those to sweep
/// again, and the counts.
struct Pass {
    scopes: HashMap<OwnerScope, Generation>,
    retry: Vec<(OwnerScope, Generation)>,
    swept: Swept,
}

/// What one pass did, for its log line.
#[derive(Debug, Default)]
struct Swept {
    listed: usize,
    repaired: usize,
    skipped_open: usize,
    failed: usize,
}

impl<S, I, O: ObjectStore> Host<S, I, O>
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
{
    /// The sweeper: sweeps each batch of acquired scopes until the host
    /// stops. Scopes a transient failure interrupted (the object or lease
    /// store unreachable) are swept again after one owner-loop period,
    /// while this host still holds them.
    pub(super) async fn sweeper(&self) {
        loop {
            match select(
                std::pin::pin!(self.inner.sweeps.notify.notified()),
                std::pin::pin!(self.inner.stop.cancelled()),
            )
            .await
            {
                Either::Left(_) => {}
                Either::Right(_) => return,
            }
            let batch = std::mem::take(&mut *lock(&self.inner.sweeps.pending));
            let retry = self.sweep(batch).await;
            if retry.is_empty() {
                continue;
            }
            let interval = i64::try_from(self.inner.settings.renew_interval()).unwrap_or(i64::MAX);
            let next = self.inner.clock.now_ms().saturating_add(interval);
            if timeout_at(&self.inner.clock, next, self.inner.stop.cancelled())
                .await
                .is_ok()
            {
                return;
            }
            for (scope, generation) in retry {
                if self.holds(&scope, generation) {
                    self.inner.sweeps.push(&scope, generation);
                }
            }
        }
    }

    /// Sweeps `batch`: lists each of its classes, page by page, and
    /// repairs the objects of the batch's scopes still held at their
    /// generation. Returns the scopes to sweep again (a transient
    /// failure).
    async fn sweep(&self, batch: Vec<(OwnerScope, Generation)>) -> Vec<(OwnerScope, Generation)> {
        let mut classes: BTreeMap<String, HashMap<OwnerScope, Generation>> = BTreeMap::new();
        for (scope, generation) in batch {
            classes
                .entry(scope.class().as_str().to_owned())
                .or_default()
                .insert(scope, generation);
        }
        let mut retry = Vec::new();
        for (class, scopes) in classes {
            let mut pass = Pass {
                scopes,
                retry: Vec::new(),
                swept: Swept::default(),
            };
            let mut after: Option<String> = None;
            loop {
                if !self.running() {
                    return Vec::new();
                }
                let page = match ObjectQuery::new(&class, "", after.as_deref(), MAX_LIST_LIMIT) {
                    Ok(query) => self
                        .inner
                        .objects
                        .list_class(&self.inner.storage_id, &query)
                        .await
                        .map_err(|e| (e.kind() != StorageErrorKind::Corrupt, e.to_string())),
                    Err(e) => Err((false, e.to_string())),
                };
                let page = match page {
                    Ok(page) => page,
                    Err((transient, error)) => {
                        tracing::warn!(
                            event = "durability.host.sweep_failed",
                            class = class.as_str(),
                            transient,
                            %error,
                            "listing objects for the takeover sweep failed; each object is repaired when it is next opened"
                        );
                        pass.swept.failed += 1;
                        if transient {
                            pass.retry.extend(pass.scopes.drain());
                        }
                        break;
                    }
                };
                for key in page.objects {
                    if !self.running() {
                        return Vec::new();
                    }
                    pass.swept.listed += 1;
                    self.sweep_one(&key, &mut pass).await;
                }
                match page.cursor {
                    Some(cursor) => after = Some(cursor),
                    None => break,
                }
            }
            let swept = &pass.swept;
            tracing::info!(
                event = "durability.host.swept",
                class = class.as_str(),
                listed = swept.listed,
                repaired = swept.repaired,
                skipped_open = swept.skipped_open,
                failed = swept.failed,
                retried = pass.retry.len(),
                "takeover sweep done"
            );
            retry.append(&mut pass.retry);
        }
        retry
    }

    /// Repairs `key` when it belongs to one of the pass's scopes (still
    /// held here at its generation) and is not open. A scope this host no
    /// longer holds at that generation leaves the pass; one whose owner
    /// check could not reach the lease store leaves it for a retry.
    async fn sweep_one(&self, key: &ObjectKey, pass: &mut Pass) {
        let address = match self.make_address(&key.class, &key.name) {
            Ok(address) => address,
            Err(error) => {
                tracing::warn!(
                    event = "durability.host.sweep_failed",
                    class = key.class.as_str(),
                    object = key.name.as_str(),
                    code = error.code(),
                    %error,
                    "a listed object has no valid address"
                );
                pass.swept.failed += 1;
                return;
            }
        };
        let Some(&generation) = pass.scopes.get(&address.scope) else {
            return;
        };
        if !self.holds(&address.scope, generation) {
            pass.scopes.remove(&address.scope);
            return;
        }
        let error = match self.repair_closed(&address, generation).await {
            Ok(repaired) => {
                if repaired {
                    pass.swept.repaired += 1;
                } else {
                    pass.swept.skipped_open += 1;
                }
                return;
            }
            Err(error) => error,
        };
        let transient = matches!(
            &error,
            HostError::Ownership(
                OwnershipError::OwnerUnavailable { .. } | OwnershipError::StoreUnavailable { .. }
            )
        );
        if !transient && matches!(&error, HostError::Ownership(_) | HostError::NotOwner { .. }) {
            // The scope moved on (lost, claimed anew, draining): its new
            // owner sweeps it.
            pass.scopes.remove(&address.scope);
            return;
        }
        tracing::warn!(
            event = "durability.host.sweep_failed",
            object = %address.id,
            code = error.code(),
            transient,
            %error,
            "repairing an object's alarm in the takeover sweep failed: a transient failure sweeps its scope again, any other leaves the object to be repaired when it is next opened"
        );
        if transient {
            pass.scopes.remove(&address.scope);
            pass.retry.push((address.scope.clone(), generation));
        } else {
            pass.swept.failed += 1;
        }
    }

    /// Whether this host holds `scope` at `generation` now (local state).
    fn holds(&self, scope: &OwnerScope, generation: Generation) -> bool {
        lock(&self.inner.scopes)
            .get(scope)
            .is_some_and(|e| e.generation == generation && !e.token.is_cancelled())
    }

    /// Opens `address` (not open here) under its slot's lock and an
    /// admission at `generation`, syncs and repairs its alarm, and closes
    /// it again. `false` when the object is open here already.
    async fn repair_closed(
        &self,
        address: &Address,
        generation: Generation,
    ) -> Result<bool, HostError> {
        let _store = self.store_admission().await?;
        let slot = self.slot(address);
        let guard = slot.lock().await;
        if guard
            .as_ref()
            .is_some_and(|o| !o.closed.load(Ordering::SeqCst))
        {
            return Ok(false);
        }
        let _permit = self.admit_to_open(&address.scope, generation).await?;
        let open = self.open(address).await?;
        let repaired = open.bridge.sync_and_repair().await;
        open.close();
        drop(guard);
        self.prune_slots();
        repaired.map_err(HostError::Alarm)?;
        Ok(true)
    }
}
