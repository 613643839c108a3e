//! Storage lifecycle: one object's delete-all ([`DeleteAll`],
//! [`DeleteAllReport`], run by `Host::delete_all`) and the deletion of a
//! whole storage id ([`delete_storage_id`]) with its tombstone.
//!
//! Neither is atomic. Delete-all drops the object's own tables page by page,
//! each page a fenced transaction; a failure leaves the pages already
//! dropped, and running it again finishes the job. A storage id's deletion
//! writes a tombstone, takes the lifecycle's whole-delete lock, removes the
//! active storage pointer, waits out the calls admitted before it (the
//! object store's shared admission), deletes the object files and the
//! alarm jobs of the storage id, and reports what it could and could not
//! delete; run again, it finishes what a crash or a failure left.

use durability_alarms::AlarmIndex;
use durability_ownership::{
    ClassName, DeleteLock, LeaseStore, LifecycleAdmin, LifecycleId, OwnerScope, ShardCount,
    StorageId,
};

use crate::error::HostError;
use crate::store::{ObjectStore, TombstoneState};

/// How many schema objects one delete-all page drops (one transaction), and
/// how many alarm jobs a storage deletion lists per page: at most
/// 128 keys per storage page.
pub const DELETE_PAGE: usize = 128;

/// Options of `Host::delete_all`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeleteAll {
    /// Keep the object's alarm: its capabilities' due times, the stored
    /// alarm and its job in the alarm index stay. By default (`false`) the
    /// due times of the object's own capabilities are cleared (the outbox's
    /// stay: its committed entries are acknowledged work and still deliver),
    /// which moves the alarm to the outbox's next due time or removes it,
    /// index job included.
    pub keep_alarm: bool,
}

impl DeleteAll {
    /// Keep the alarm (`deleteAlarm: false` in Durable Objects).
    #[must_use]
    pub fn keep_alarm(mut self, keep: bool) -> Self {
        self.keep_alarm = keep;
        self
    }
}

/// What `Host::delete_all` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteAllReport {
    /// The object's own tables, views and triggers dropped, in order.
    pub dropped: Vec<String>,
    /// Transactions committed to drop them (pages of at most
    /// [`DELETE_PAGE`]).
    pub pages: usize,
    /// Capabilities whose due times were cleared (empty with
    /// [`DeleteAll::keep_alarm`]).
    pub cancelled_due: Vec<String>,
}

/// One thing a storage deletion could not delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteFailure {
    /// What: a file path, an alarm job's object id, or a lifecycle record.
    pub what: String,
    /// Why.
    pub error: String,
}

/// What [`delete_storage_id`] did: a partial result lists what was not
/// deleted (the shape `{ ok: false, deleted, errors }`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageDeleteReport {
    /// The storage id deleted.
    pub storage_id: String,
    /// Whether this run removed the active storage pointer (it named this
    /// storage id). `false` when it was already gone or names a newer
    /// storage id (a redeploy, which the deletion leaves alone).
    pub pointer_removed: bool,
    /// Objects deleted (the object store's
    /// [`crate::store::ObjectStore::delete_object`] found and removed them).
    pub objects_deleted: usize,
    /// Alarm jobs of the storage id removed from the index.
    pub jobs_deleted: usize,
    /// What could not be deleted; empty when the deletion is complete.
    pub failures: Vec<DeleteFailure>,
}

impl StorageDeleteReport {
    /// Whether everything was deleted (no failures).
    pub fn complete(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Deletes a whole storage id: every object the object store lists for
/// it, whatever else the store holds for it, every alarm job of the
/// storage id, and the lifecycle's active storage pointer when it still
/// names this storage id; the storage id is tombstoned, so no host serves
/// it again (`Host::start` refuses a tombstoned storage id).
///
/// In order, each step idempotent so that a run after a crash or a failure
/// finishes the deletion:
///
/// 1. The tombstone is written (state `deleting`) before anything is
///    deleted: from here on no host starts on this storage id.
/// 2. When the active storage pointer names this storage id, the
///    lifecycle's whole-delete lock is taken and the pointer removed: every
///    host's admission, renew and claim for the storage id fails closed
///    (`delete_locked`, then `storage_inactive`), and its alarm jobs
///    discard themselves when they come due. A pointer that names another
///    storage id (a redeploy) is left alone: the deletion is fenced to its
///    own storage id.
/// 3. The deletion enters the shared in-flight admission
///    ([`ObjectStore::exclude`]): it waits until every call admitted on
///    any host before the tombstone has ended (each committed before the
///    deletion counts its object, or failed), and while it holds it no
///    call is admitted, no object opened or created, so no write is
///    acknowledged after the deletion and no file appears under the
///    deleted storage id; every call admitted later finds the tombstone
///    (`storage_inactive`). Holding it, the objects are listed page by
///    page and deleted one by one, then whatever else the store holds for
///    the storage id. A call that never ends (a paused host process)
///    holds the deletion until it ends or its process dies. When the
///    admission cannot be taken nothing is deleted (a failure in the
///    report).
/// 4. The alarm jobs whose object id starts with `<storage_id>:` are listed
///    page by page and removed at their listed token; a job replaced
///    meanwhile (a late alarm write of an old host) is reported and
///    discards itself when due.
/// 5. The delete lock this deletion holds is released (a redeploy with a
///    new storage id can then set the pointer), and the tombstone's state
///    becomes `deleted` when nothing failed.
///
/// Run it from one control plane at a time: the lifecycle records have no
/// compare-and-set.
///
/// # Errors
/// [`HostError::InvalidSetting`] for a malformed storage or lifecycle id
/// or object store setting (nothing is touched); [`HostError::Ownership`]
/// when the lease store cannot be read or written, and
/// [`HostError::Storage`] when the tombstone cannot be written (run it
/// again). Failures to delete an object or a job are not errors: they are
/// listed in the report.
pub async fn delete_storage_id<S, I, O>(
    lease_store: &S,
    alarm_index: &I,
    objects: &O,
    lifecycle: &str,
    storage_id: &str,
) -> Result<StorageDeleteReport, HostError>
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
    O: ObjectStore,
{
    let bad = |setting: &'static str| {
        move |e: durability_ownership::OwnershipError| HostError::setting(setting, e.to_string())
    };
    let storage = StorageId::new(storage_id).map_err(bad("storage_id"))?;
    let lifecycle = LifecycleId::new(lifecycle).map_err(bad("lifecycle"))?;
    objects
        .validate()
        .map_err(|(setting, reason)| HostError::setting(setting, reason))?;
    let mut report = StorageDeleteReport {
        storage_id: storage.as_str().to_owned(),
        ..StorageDeleteReport::default()
    };
    // The lifecycle records are read through any scope of the storage.
    let scope = OwnerScope::new(
        storage.clone(),
        ClassName::new("StorageCleanup").map_err(bad("class"))?,
        0,
        ShardCount::new(1).map_err(bad("shard_count"))?,
    )
    .map_err(bad("storage_id"))?;

    // 1. Tombstone first.
    objects.write_tombstone(&storage, &lifecycle, TombstoneState::Deleting)?;

    // 2. Lock and remove the pointer when it names this storage.
    let holds_lock = take_pointer(lease_store, &scope, &lifecycle, &storage, &mut report).await?;

    // 3. The shared admission, exclusively: every call admitted before the
    // tombstone has ended (committed or failed), none is admitted after.
    // Then the objects, while no host can open, create or write one.
    match objects.exclude(&storage).await {
        Ok(exclusion) => {
            delete_objects(objects, &storage, &mut report).await;
            drop(exclusion);
        }
        Err(e) => report.failures.push(DeleteFailure {
            what: format!("admission of storage {}", storage.as_str()),
            error: format!("{e}; no object was deleted"),
        }),
    }
    // 4. The alarm jobs.
    delete_jobs(alarm_index, &storage, &mut report).await;

    // 5. Release the lock, mark the tombstone.
    if holds_lock && let Err(e) = lease_store.set_delete_lock(&lifecycle, None).await {
        report.failures.push(DeleteFailure {
            what: format!("delete lock of lifecycle {}", lifecycle.as_str()),
            error: e.to_string(),
        });
    }
    if report.complete() {
        objects.write_tombstone(&storage, &lifecycle, TombstoneState::Deleted)?;
    }
    tracing::info!(
        event = "durability.host.storage_deleted",
        storage_id = storage.as_str(),
        objects = report.objects_deleted,
        jobs = report.jobs_deleted,
        failures = report.failures.len(),
        "storage id deleted"
    );
    Ok(report)
}

/// Step 2 of [`delete_storage_id`]: when the active storage pointer names
/// this storage, the whole-delete lock is taken and the pointer removed.
/// Whether this deletion holds the lock (to release at the end).
async fn take_pointer<S: LeaseStore + LifecycleAdmin>(
    lease_store: &S,
    scope: &OwnerScope,
    lifecycle: &LifecycleId,
    storage: &StorageId,
    report: &mut StorageDeleteReport,
) -> Result<bool, HostError> {
    let snapshot = lease_store.snapshot(scope, lifecycle).await?;
    let ours = snapshot.active_storage.as_ref() == Some(storage);
    if ours {
        lease_store
            .set_delete_lock(lifecycle, Some(DeleteLock::Whole))
            .await?;
        lease_store.set_active_storage(lifecycle, None).await?;
        report.pointer_removed = true;
    }
    tracing::info!(
        event = "durability.host.storage_delete_started",
        storage_id = storage.as_str(),
        lifecycle = lifecycle.as_str(),
        pointer_removed = report.pointer_removed,
        "deleting a storage id"
    );
    // A whole lock with no pointer is this deletion's own (an earlier run
    // stopped before releasing it); with a pointer to another storage it
    // belongs to someone else and stays.
    Ok(ours
        || (snapshot.active_storage.is_none() && snapshot.delete_lock == Some(DeleteLock::Whole)))
}

/// Step 3 of [`delete_storage_id`]: every listed object, then the rest.
async fn delete_objects<O: ObjectStore>(
    objects: &O,
    storage: &StorageId,
    report: &mut StorageDeleteReport,
) {
    let mut cursor: Option<String> = None;
    loop {
        let page = match objects.list(storage, cursor.as_deref(), DELETE_PAGE).await {
            Ok(page) => page,
            Err(e) => {
                report.failures.push(DeleteFailure {
                    what: format!("objects of storage {}", storage.as_str()),
                    error: e.to_string(),
                });
                return;
            }
        };
        for object in &page.objects {
            match objects.delete_object(storage, object).await {
                Ok(true) => report.objects_deleted += 1,
                Ok(false) => {}
                Err(e) => report.failures.push(DeleteFailure {
                    what: format!("object {}:{}", object.class, object.name),
                    error: e.to_string(),
                }),
            }
        }
        match page.cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    for (what, error) in objects.delete_rest(storage).await {
        report.failures.push(DeleteFailure { what, error });
    }
}

/// Step 4 of [`delete_storage_id`]: the storage id's alarm jobs, page by
/// page, each at its listed token.
async fn delete_jobs<I: AlarmIndex>(
    alarm_index: &I,
    storage: &StorageId,
    report: &mut StorageDeleteReport,
) {
    let prefix = format!("{}:", storage.as_str());
    let mut cursor: Option<String> = None;
    loop {
        let page = match alarm_index
            .jobs_with_prefix(
                durability_alarms::JobPageRequest::first(&prefix, DELETE_PAGE)
                    .after(cursor.as_deref()),
            )
            .await
        {
            Ok(page) => page,
            Err(e) => {
                report.failures.push(DeleteFailure {
                    what: format!("alarm jobs of {prefix}*"),
                    error: e.to_string(),
                });
                return;
            }
        };
        for (object, job) in &page.jobs {
            match alarm_index.delete(object, &job.token).await {
                Ok(true) => report.jobs_deleted += 1,
                Ok(false) => {
                    // Removed meanwhile (nothing to do) or replaced by a late
                    // write: look again to tell which.
                    if let Ok(Some(_)) = alarm_index.job(object).await {
                        report.failures.push(DeleteFailure {
                            what: format!("alarm job {object}"),
                            error: "replaced while deleting; it discards itself when due"
                                .to_owned(),
                        });
                    }
                }
                Err(e) => report.failures.push(DeleteFailure {
                    what: format!("alarm job {object}"),
                    error: e.to_string(),
                }),
            }
        }
        match page.cursor {
            Some(next) => cursor = Some(next),
            None => return,
        }
    }
}
