//! `recover_migrations`: one recovery per journal scope at a time, under a
//! lease row, finishing or aborting every interrupted operation.
//!
//! Recovery table (state → action):
//!
//! | state | action |
//! |---|---|
//! | `prepared`, `copied`, `verified` | start over from a fresh snapshot (abort when the source rows are gone) |
//! | `cutover_pending` | cutover check: source unchanged → run the cutover again; changed → abort; gone → the archive decides: present → check the destination, publish; absent → abort |
//! | `committed`, `published` | finish: publish, retire, release |
//! | `retired`, `aborted` with claims left | release the claims |
//! | any, mover still live (same clock domain: its deadline not passed; otherwise: first seen, or its row changed, less than `MOVE_LIVENESS_MS` ago on this router's clock and on the journal database's clock, where the first sighting is persisted) | skip |
//!
//! Every abort drops the destination copy (the rows of the key still under
//! the operation's in-flight marker, and rows equal to the journaled
//! snapshot unless the key is routed there). Every journal write carries the lease predicate, so a
//! recovery that lost its lease writes nothing more to the journal and
//! returns `RECOVERY_FENCED`.

use crate::dialect::{TakeOver, Watched};
use crate::error::{MigrationError, Result};
use crate::journal::{Guard, MOVE_LIVENESS_MS, MoveState, OpFilter, OpRecord, RECOVERY_LEASE_MS};
use crate::moves::{MoveCtx, Stage};
use crate::router::{Core, OpPages};

const PAGE: usize = 100;

/// One operation recovery could not settle (left as it was; its error
/// serializes as `{code, message}`).
#[derive(Debug, serde::Serialize)]
pub struct FailedOp {
    /// The operation.
    pub op_id: String,
    /// Its key.
    pub key: String,
    /// Why.
    #[serde(serialize_with = "crate::status::serialize_error")]
    pub error: MigrationError,
}

/// What a recovery did.
#[derive(Debug, Default, serde::Serialize)]
pub struct RecoveryReport {
    /// Operations looked at.
    pub examined: Vec<String>,
    /// Operations finished (the key moved).
    pub committed: Vec<String>,
    /// Operations aborted (the key stayed).
    pub aborted: Vec<String>,
    /// Finished operations whose leftover claims were released.
    pub released: Vec<String>,
    /// Operations skipped because their mover is still live.
    pub skipped: Vec<String>,
    /// Operations that could not be settled.
    pub failed: Vec<FailedOp>,
    /// The lease generation this recovery held.
    pub generation: i64,
}

#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub(crate) holder: String,
    pub(crate) generation: i64,
}

enum Outcome {
    Committed,
    Aborted,
    Skipped,
}

/// What resuming an operation came to.
pub(crate) enum Resumed {
    /// Moved, after this many missed cutovers.
    Committed(i64),
    /// Ended without moving the key (`MIGRATION_ABORTED`).
    Aborted(MigrationError),
    /// It had already finished.
    Finished,
}

impl Core {
    pub(crate) async fn acquire_lease(&self) -> Result<Lease> {
        let (jname, js, q) = self.journal()?;
        self.check_movable(jname)?;
        let now = self.now();
        let expires = now.saturating_add(i64::try_from(RECOVERY_LEASE_MS).unwrap_or(i64::MAX));
        let holder = format!("{}:{}", self.instance, uuid::Uuid::now_v7());
        let rows = js
            .query(&q.lease_get())
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        let in_progress = || MigrationError::RecoveryInProgress(self.scope.clone());
        let generation = match rows.first() {
            Some(r) => {
                let gen_ = crate::journal::int(r, "generation")?;
                let seen = crate::journal::int(r, "expires_ms")?;
                let held_by = crate::journal::text(r, "holder")?;
                // A released lease (deadline 0) is free on any clock; a
                // held one's deadline is compared only with the clock that
                // wrote it, and one held on another clock is free once this
                // router saw it unchanged for the lease's whole period.
                let token = format!("{held_by}|{gen_}|{seen}");
                if seen > 0
                    && !self
                        .lapsed_journaled(
                            &self.lease_seen,
                            (&held_by, seen),
                            (Watched::Lease, &token),
                            RECOVERY_LEASE_MS,
                            None,
                        )
                        .await
                {
                    return Err(in_progress());
                }
                // Taken only as it was seen: a renewal or another taker
                // since makes this write nothing.
                let n = js
                    .execute(&q.lease_take(&holder, gen_, seen, expires))
                    .await
                    .map_err(|e| MigrationError::shard(jname, e))?;
                if n == 0 {
                    return Err(in_progress());
                }
                gen_ + 1
            }
            None => {
                let n = js
                    .execute(&q.lease_insert(&holder, expires))
                    .await
                    .map_err(|e| MigrationError::shard(jname, e))?;
                if n == 0 {
                    return Err(in_progress());
                }
                1
            }
        };
        tracing::info!(
            event = "durability.migration.recovery_lease_taken",
            scope = %self.scope,
            generation,
            "recovery lease taken"
        );
        Ok(Lease { holder, generation })
    }

    pub(crate) async fn renew_lease(&self, lease: &Lease) -> Result<()> {
        let (jname, js, q) = self.journal()?;
        let now = self.now();
        let expires = now.saturating_add(i64::try_from(RECOVERY_LEASE_MS).unwrap_or(i64::MAX));
        let n = js
            .execute(&q.lease_renew(&lease.holder, lease.generation, now, expires))
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        if n == 0 {
            tracing::warn!(
                event = "durability.migration.recovery_fenced",
                scope = %self.scope,
                generation = lease.generation,
                "recovery lease lost"
            );
            return Err(MigrationError::RecoveryFenced(self.scope.clone()));
        }
        Ok(())
    }

    pub(crate) async fn release_lease(&self, lease: &Lease) {
        let Ok((_, js, q)) = self.journal() else {
            return;
        };
        let now = self.now();
        // Expire our own lease so the next call need not wait.
        let st = q.lease_renew(&lease.holder, lease.generation, now, 0);
        if let Err(e) = js.execute(&st).await {
            tracing::warn!(
                event = "durability.migration.lease_release_failed",
                error = %e,
                "releasing the recovery lease failed"
            );
        }
    }

    /// See [`Router::recover_migrations`](crate::Router::recover_migrations).
    pub(crate) async fn recover_migrations(&self) -> Result<RecoveryReport> {
        let lease = self.acquire_lease().await?;
        let res = self.recover_with(&lease).await;
        if !matches!(res, Err(MigrationError::RecoveryFenced(_))) {
            self.release_lease(&lease).await;
        }
        res
    }

    pub(crate) async fn recover_with(&self, lease: &Lease) -> Result<RecoveryReport> {
        let (jname, js, q) = self.journal()?;
        let mut report = RecoveryReport {
            generation: lease.generation,
            ..RecoveryReport::default()
        };
        let guard = Guard {
            owner: lease.holder.clone(),
            lease: Some((self.scope.clone(), lease.generation)),
        };
        let mut pages = OpPages::new(OpFilter::Active, PAGE);
        while let Some(rows) = self.next_ops(&mut pages).await? {
            for row in &rows {
                self.renew_lease(lease).await?;
                let op = OpRecord::from_row(row)?;
                report.examined.push(op.op_id.clone());
                match self.recover_op(&op, &guard).await {
                    Ok(Outcome::Committed) => report.committed.push(op.op_id.clone()),
                    Ok(Outcome::Aborted) | Err(MigrationError::Aborted { .. }) => {
                        report.aborted.push(op.op_id.clone());
                    }
                    Ok(Outcome::Skipped) => report.skipped.push(op.op_id.clone()),
                    Err(e @ MigrationError::RecoveryFenced(_)) => return Err(e),
                    Err(error) => {
                        tracing::warn!(
                            event = "durability.migration.recovery_failed",
                            op_id = %op.op_id,
                            key = %op.key,
                            code = error.code(),
                            error = %error,
                            "recovering an operation failed"
                        );
                        report.failed.push(FailedOp {
                            op_id: op.op_id.clone(),
                            key: op.key.clone(),
                            error,
                        });
                    }
                }
            }
        }
        // Forget what was seen of operations that are no longer active.
        let active: std::collections::HashSet<&str> =
            report.examined.iter().map(String::as_str).collect();
        self.liveness_seen.retain(|op_id| active.contains(op_id));
        // Best effort: a leftover sighting only costs a row.
        if let Err(error) = js.execute(&q.sightings_prune(&guard, self.now())).await {
            tracing::warn!(
                event = "durability.migration.sighting_failed",
                scope = %self.scope,
                %error,
                "the sightings of finished operations could not be pruned"
            );
        }
        // Finished operations whose claims were left behind.
        let rows = js
            .query(&q.terminal_claims())
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        for r in &rows {
            self.renew_lease(lease).await?;
            let op_id = crate::journal::text(r, "op_id")?;
            let released = js
                .execute(&q.release_claim(&op_id, &guard, self.now()))
                .await
                .map_err(|e| MigrationError::shard(jname, e))?;
            if released == 0 {
                return Err(MigrationError::RecoveryFenced(self.scope.clone()));
            }
            report.released.push(op_id);
        }
        Ok(report)
    }

    async fn recover_op(&self, op: &OpRecord, guard: &Guard) -> Result<Outcome> {
        let now = self.now();
        // A deadline is compared only with the clock that wrote it: a move
        // owned outside this router's clock domain is judged by its row
        // staying unchanged over this router's own elapsed time.
        let same_clock = self.same_clock(&op.owner);
        let token = format!(
            "{}|{}|{}|{}|{}",
            op.owner,
            op.state.as_str(),
            op.attempts,
            op.updated_ms,
            op.live_until_ms
        );
        if !self
            .lapsed_journaled(
                &self.liveness_seen,
                (&op.owner, op.live_until_ms),
                (Watched::Op(&op.op_id), &token),
                MOVE_LIVENESS_MS,
                Some(guard),
            )
            .await
        {
            return Ok(Outcome::Skipped);
        }
        let ctx = MoveCtx::from_op(self, op, guard.clone())?;
        // Take the operation over from its dead mover.
        let (jname, js, q) = self.journal()?;
        let live = now.saturating_add(i64::try_from(MOVE_LIVENESS_MS).unwrap_or(i64::MAX));
        let when = if same_clock {
            TakeOver::Expired
        } else {
            TakeOver::Unchanged
        };
        let take = q.take_over(op, guard, (now, live), when);
        let n = js
            .execute(&take)
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        if n == 0 {
            if let Some(lease) = self.lease_of(guard) {
                self.renew_lease(&lease).await?;
            }
            return Ok(Outcome::Skipped);
        }
        Ok(match self.resume(&ctx, op, guard).await? {
            Resumed::Committed(_) => Outcome::Committed,
            Resumed::Aborted(_) => Outcome::Aborted,
            Resumed::Finished => Outcome::Skipped,
        })
    }

    /// Drives an interrupted operation on from its recorded state, per the
    /// recovery table, as `guard` (which owns it: a recovery that took it
    /// over, or the router that started it).
    pub(crate) async fn resume(
        &self,
        ctx: &MoveCtx<'_>,
        op: &OpRecord,
        guard: &Guard,
    ) -> Result<Resumed> {
        let (jname, js, q) = self.journal()?;
        let live = self
            .now()
            .saturating_add(i64::try_from(MOVE_LIVENESS_MS).unwrap_or(i64::MAX));
        match op.state {
            MoveState::Prepared | MoveState::Copied | MoveState::Verified => {
                let fresh = ctx.snapshot().await?;
                if fresh.iter().all(Option::is_none) {
                    let e = ctx.abort(&op.digests, "source row gone").await?;
                    return Ok(Resumed::Aborted(e));
                }
                // A value the destination can never store: abort while the
                // journal still holds the digests of any copy that landed.
                if let Err(e) = ctx.check_storable(&fresh) {
                    ctx.abort(&op.digests, &e.to_string()).await?;
                    return Ok(Resumed::Aborted(e));
                }
                let change = crate::journal::Change {
                    digests: Some(crate::journal::encode_digests(&ctx.digests(&fresh))),
                    ..Default::default()
                };
                let st = q.update_state(
                    &op.op_id,
                    MoveState::Prepared,
                    &change,
                    guard,
                    self.now(),
                    live,
                );
                let counts = js
                    .batch(std::slice::from_ref(&st))
                    .await
                    .map_err(|e| MigrationError::shard(jname, e))?;
                if counts.first().copied().unwrap_or(0) == 0 {
                    return Err(ctx.fenced());
                }
                // The stale copy (if any) is replaced by the fresh one.
                run_resumed(ctx, fresh, op.attempts, Stage::Copy).await
            }
            MoveState::CutoverPending => {
                let current = ctx.snapshot().await?;
                if ctx.digests(&current) == op.digests {
                    return run_resumed(ctx, current, op.attempts, Stage::Cutover).await;
                }
                if ctx.archive_exists().await? {
                    if ctx.destination_matches(&op.digests).await? {
                        ctx.step(MoveState::Committed, crate::journal::Change::default())
                            .await?;
                        ctx.finish(None).await?;
                        return Ok(Resumed::Committed(op.attempts));
                    }
                    return Err(MigrationError::Corrupt(format!(
                        "operation {} archived its source but the destination copy does not match",
                        op.op_id
                    )));
                }
                let e = ctx
                    .abort(&op.digests, "source row changed before the cutover")
                    .await?;
                Ok(Resumed::Aborted(e))
            }
            MoveState::Committed | MoveState::Published => {
                ctx.finish(None).await?;
                Ok(Resumed::Committed(op.attempts))
            }
            MoveState::Retired | MoveState::Aborted => Ok(Resumed::Finished),
        }
    }

    fn lease_of(&self, guard: &Guard) -> Option<Lease> {
        guard.lease.as_ref().map(|(_, generation)| Lease {
            holder: guard.owner.clone(),
            generation: *generation,
        })
    }
}

async fn run_resumed(
    ctx: &MoveCtx<'_>,
    snap: crate::moves::Snapshot,
    attempts: i64,
    stage: Stage,
) -> Result<Resumed> {
    match ctx.run(snap, attempts, stage).await {
        Ok(n) => Ok(Resumed::Committed(n)),
        Err(e @ (MigrationError::Aborted { .. } | MigrationError::CopyRejected { .. })) => {
            Ok(Resumed::Aborted(e))
        }
        Err(e) => Err(e),
    }
}
