//! The owner fence on PostgreSQL: the decisions over what was read, the
//! claim (`ObjectFence`), and ending a stale holder's session.

use std::sync::{Arc, PoisonError};

use deadpool_postgres::Object;
use durability_ownership::{BudgetCheck, ObjectFence, OwnerRecord, OwnershipError};
use durability_scheduler::{StorageError, StorageErrorKind};
use tokio_postgres::error::SqlState;

use super::driver::{Held, begin_locked};
use super::runtime::{blocking, wait};
use super::{FENCE_ROUNDS, PostgresObjectStorage};

/// The largest generation a fence stores: a safe integer.
const MAX_SAFE: i64 = (1 << 53) - 1;

/// What a transaction's fence check found.
pub(super) enum FenceCheck {
    /// The fence holds exactly this claim.
    Held,
    /// Another claim holds it, or none was recorded.
    Refused(OwnershipError),
}

fn stored_generation(generation: i64, record: &OwnerRecord) -> Result<u64, StorageError> {
    u64::try_from(generation)
        .ok()
        .filter(|g| (1..=MAX_SAFE.unsigned_abs()).contains(g))
        .ok_or_else(|| {
            StorageError::corrupt(format!(
                "the fence of scope {} holds generation {generation}, not a positive safe integer",
                record.scope()
            ))
        })
}

fn held_by(generation: u64, holder: Option<&[u8]>, record: &OwnerRecord) -> bool {
    generation == record.generation().get() && holder == Some(record.encoded().as_bytes())
}

fn stale(record: &OwnerRecord, stored: u64) -> OwnershipError {
    OwnershipError::StaleGeneration {
        scope: record.scope().to_string(),
        attempted: record.generation().get(),
        stored,
    }
}

/// The check every fenced transaction makes on the fence it read.
pub(super) fn check_fence(
    generation: Option<i64>,
    holder: Option<&[u8]>,
    record: &OwnerRecord,
) -> Result<FenceCheck, StorageError> {
    let stored = generation
        .map(|g| stored_generation(g, record))
        .transpose()?;
    Ok(match stored {
        Some(g) if held_by(g, holder, record) => FenceCheck::Held,
        Some(g) if g >= record.generation().get() => FenceCheck::Refused(stale(record, g)),
        _ => FenceCheck::Refused(OwnershipError::FenceNotRecorded {
            scope: record.scope().to_string(),
            attempted: record.generation().get(),
        }),
    })
}

/// Whether a claim must write the fence: `false` when it already holds
/// it; an error when a higher generation, or the same generation of
/// another claim, holds it (the fence only rises; one generation has one
/// holder).
fn claim_writes(
    generation: Option<i64>,
    holder: Option<&[u8]>,
    record: &OwnerRecord,
) -> Result<bool, OwnershipError> {
    let stored = generation
        .map(|g| stored_generation(g, record))
        .transpose()
        .map_err(|e| OwnershipError::InvalidLifecycleState {
            lifecycle: record.scope().to_string(),
            reason: e.to_string(),
        })?;
    match stored {
        Some(g) if held_by(g, holder, record) => Ok(false),
        Some(g) if g >= record.generation().get() => Err(stale(record, g)),
        _ => Ok(true),
    }
}

/// An ownership refusal as the storage error a transaction returns.
pub(super) fn fenced(e: OwnershipError) -> StorageError {
    let kind = match e {
        OwnershipError::StaleGeneration { .. }
        | OwnershipError::FenceNotRecorded { .. }
        | OwnershipError::StaleOwner { .. } => StorageErrorKind::Fenced,
        _ => StorageErrorKind::Backend,
    };
    StorageError::new(kind, e.to_string())
}

fn unavailable(e: tokio_postgres::Error) -> OwnershipError {
    OwnershipError::StoreUnavailable {
        source: Box::new(e),
    }
}

/// How one round of a claim ended.
enum Round {
    Done,
    /// Another session held the object row past the wait.
    Busy,
}

/// How ending the holder's session went.
enum Ended {
    /// The holder's session was ended, or it had finished on its own.
    Tried,
    /// This role may not end the holder's session.
    NoRight,
}

impl PostgresObjectStorage {
    /// Fences this object's storage to an owner claim (see
    /// [`ObjectFence::fence_claim`], without a lease budget).
    ///
    /// # Errors
    /// `StorageErrorKind::Fenced` when a newer generation, or the same
    /// generation from another claim, is recorded (nothing is written); a
    /// backend failure.
    pub fn fence(&self, record: &OwnerRecord) -> Result<(), StorageError> {
        self.fence_claim(record, None).map_err(fenced)
    }

    /// One round: lock the object row (waiting at most `wait_ms`), read the
    /// fence, raise it if this claim is newer, commit.
    fn claim_round(
        &self,
        client: &Object,
        record: &OwnerRecord,
        wait_ms: u128,
    ) -> Result<Round, OwnershipError> {
        let s = &self.shared.s;
        let scope = record.scope().host_id();
        let begin = format!("BEGIN; SET LOCAL lock_timeout = {}", wait_ms.max(1));
        let (began, locked) = begin_locked(client, s, &self.object, &begin, Some(scope));
        began.map_err(unavailable)?;
        let rows = match locked {
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => return Ok(Round::Busy),
            other => other.map_err(unavailable)?,
        };
        let row = rows.first().ok_or_else(|| OwnershipError::InvalidInput {
            what: "object",
            reason: format!("object {:?} is not recorded in the deployment", self.object),
        })?;
        let generation: Option<i64> = row.try_get(0).map_err(unavailable)?;
        let holder: Option<Vec<u8>> = row.try_get(1).map_err(unavailable)?;
        if generation.is_none() {
            self.check_one_shard(client, record)?;
        }
        if claim_writes(generation, holder.as_deref(), record)? {
            let g = i64::try_from(record.generation().get()).unwrap_or(i64::MAX);
            wait(client.execute(
                &format!(
                    "INSERT INTO {s}.durability_object_fences (object_id, scope, generation, holder)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (object_id, scope) DO UPDATE
                       SET generation = EXCLUDED.generation, holder = EXCLUDED.holder
                     WHERE EXCLUDED.generation > durability_object_fences.generation"
                ),
                &[&self.object, &scope, &g, &record.encoded().as_bytes()],
            ))
            .map_err(unavailable)?;
        }
        super::commit::commit(client, self.shared.options.commit_timeout).map_err(|e| {
            OwnershipError::OwnerUnavailable {
                source: Box::new(e),
            }
        })?;
        Ok(Round::Done)
    }

    /// Refuses a first claim of this object under one shard of a storage
    /// id and class when its fence already recorded another shard of them:
    /// an object has one scope, so another shard means a host with another
    /// shard count ([`OwnershipError::ObjectScopeMismatch`], nothing
    /// written; the lease store refuses such a claim too, this is the
    /// object's own last line). Runs under the object row's lock.
    fn check_one_shard(&self, client: &Object, record: &OwnerRecord) -> Result<(), OwnershipError> {
        let s = &self.shared.s;
        let scope = record.scope();
        let prefix = format!(
            "{}:{}:shard",
            scope.storage_id().as_str(),
            scope.class().as_str()
        );
        let rows = wait(client.query(
            &format!(
                "SELECT scope FROM {s}.durability_object_fences
                 WHERE object_id = $1 AND scope <> $2 AND left(scope, length($3)) = $3 LIMIT 1"
            ),
            &[&self.object, &scope.host_id(), &prefix],
        ))
        .map_err(unavailable)?;
        match rows.first() {
            Some(row) => Err(OwnershipError::ObjectScopeMismatch {
                recorded: row.try_get(0).map_err(unavailable)?,
                attempted: scope.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Ends the session whose transaction holds the object row: its
    /// transaction id is the row's `xmax`, held as a granted exclusive
    /// `transactionid` lock (a row lock taken with `FOR UPDATE` is not in
    /// `pg_locks` itself). Waits up to `terminate_timeout` for it to exit.
    fn end_holder(&self, client: &Object) -> Result<Ended, OwnershipError> {
        let s = &self.shared.s;
        let timeout =
            i64::try_from(self.shared.options.terminate_timeout.as_millis()).unwrap_or(i64::MAX);
        let ended = wait(client.query(
            &format!(
                "SELECT l.pid, pg_terminate_backend(l.pid, $2) FROM {s}.durability_objects o
                 JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = o.xmax
                   AND l.mode = 'ExclusiveLock' AND l.granted
                 WHERE o.id = $1 AND l.pid <> pg_backend_pid()"
            ),
            &[&self.object, &timeout],
        ));
        match ended {
            Ok(rows) => {
                for row in &rows {
                    let pid: i32 = row.try_get(0).map_err(unavailable)?;
                    tracing::warn!(
                        event = "durability.storage_postgres.holder_ended",
                        object = %self.object,
                        pid,
                        "a new owner's fence ended the session holding the object"
                    );
                }
                Ok(Ended::Tried)
            }
            Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                tracing::warn!(
                    event = "durability.storage_postgres.holder_not_ended",
                    object = %self.object,
                    error = %e,
                    "this role may not end the session holding the object: waiting instead"
                );
                Ok(Ended::NoRight)
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Claims the fence: up to [`FENCE_ROUNDS`] rounds of waiting
    /// `fence_wait` for the object row and ending its holder.
    fn claim(&self, record: &OwnerRecord) -> Result<(), OwnershipError> {
        let options = self.shared.options;
        let mut wait_ms = options.fence_wait.as_millis();
        for _ in 0..FENCE_ROUNDS {
            let held = Held(Some(self.shared.backend.client().map_err(|e| {
                OwnershipError::StoreUnavailable {
                    source: Box::new(e),
                }
            })?));
            let client = held.client();
            let busy = match self.claim_round(client, record, wait_ms) {
                Ok(Round::Done) => {
                    held.release();
                    return Ok(());
                }
                Ok(Round::Busy) => Ok(()),
                Err(e) => Err(e),
            };
            // The round's transaction is over either way; a connection
            // that cannot roll back is closed (dropping `held`), as is one
            // whose round failed (its COMMIT may still be waiting).
            busy?;
            let clean = wait(client.batch_execute("ROLLBACK")).is_ok();
            match self.end_holder(client)? {
                Ended::Tried => {}
                // Without the right, wait as long as any writer would.
                Ended::NoRight => wait_ms = options.lock_timeout.as_millis(),
            }
            if clean {
                held.release();
            }
        }
        Err(OwnershipError::OwnerRace {
            scope: record.scope().to_string(),
        })
    }
}

impl ObjectFence for PostgresObjectStorage {
    fn fence_claim(
        &self,
        record: &OwnerRecord,
        budget: Option<Arc<dyn BudgetCheck>>,
    ) -> Result<(), OwnershipError> {
        // Waits for this handle's transaction in progress off the worker,
        // as `Storage::transaction` does.
        blocking(|| {
            let _serial = self.serial.lock().unwrap_or_else(PoisonError::into_inner);
            self.claim(record)?;
            *self.fence.lock().unwrap_or_else(PoisonError::into_inner) =
                Some((record.clone(), budget));
            Ok(())
        })
    }
}
