//! `abort_operation`: an operator's abort of a move that cannot finish (its
//! copy keeps failing, its destination is gone), so the key is free to move
//! elsewhere and verification can be clean again (issue 13 item 8).
//!
//! Only an operation that has not reached `cutover_pending` is aborted: in
//! `prepared`, `copied` and `verified` no cutover can have run, so the key's
//! rows are all on the source and dropping the destination copies (only
//! rows equal to the journaled snapshot) loses nothing. The abort takes the
//! scope's recovery lease (so no recovery drives the operation meanwhile)
//! and takes the operation over from its owner in one journal write whose
//! predicate is that state: a mover that journals `cutover_pending` first
//! wins and the abort is refused; one that comes later finds its journal
//! writes fenced (`MIGRATION_TAKEN_OVER`) and its cutover archives nothing.
//!
//! An abort interrupted after the take-over leaves the operation `prepared`
//! under the aborter's name: calling `abort_operation` again (once the
//! interrupted call's lease expired) takes it over again and finishes, and
//! `recover_migrations` settles it as any interrupted move once its
//! liveness lapsed.

use crate::dialect::TakeOver;
use crate::error::{MigrationError, Result};
use crate::journal::{Guard, MOVE_LIVENESS_MS, MoveState};
use crate::moves::MoveCtx;
use crate::recovery::Lease;
use crate::router::Core;

/// How many times an abort looks again when its take-over lost a race.
const TAKE_OVER_TRIES: usize = 3;

/// What [`Router::abort_operation`](crate::Router::abort_operation) did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AbortReport {
    /// The operation.
    pub op_id: String,
    /// Its key.
    pub key: String,
    /// The operation was aborted already (nothing was changed).
    pub already_aborted: bool,
    /// Destination rows removed (copies equal to the journaled snapshot).
    pub copies_dropped: usize,
}

impl Core {
    /// See [`Router::abort_operation`](crate::Router::abort_operation).
    pub(crate) async fn abort_operation(&self, op_id: &str) -> Result<AbortReport> {
        let lease = self.acquire_lease().await?;
        let res = self.abort_under(op_id, &lease).await;
        if !matches!(res, Err(MigrationError::RecoveryFenced(_))) {
            self.release_lease(&lease).await;
        }
        res
    }

    async fn abort_under(&self, op_id: &str, lease: &Lease) -> Result<AbortReport> {
        let guard = Guard {
            owner: lease.holder.clone(),
            lease: Some((self.scope.clone(), lease.generation)),
        };
        let (jname, js, q) = self.journal()?;
        let mut key = String::new();
        for _ in 0..TAKE_OVER_TRIES {
            let Some(op) = self
                .load_op(op_id)
                .await?
                .filter(|op| op.scope == self.scope)
            else {
                return Err(MigrationError::OperationNotFound(op_id.to_owned()));
            };
            key.clone_from(&op.key);
            match op.state {
                MoveState::Aborted => {
                    return Ok(AbortReport {
                        op_id: op.op_id,
                        key: op.key,
                        already_aborted: true,
                        copies_dropped: 0,
                    });
                }
                MoveState::Prepared | MoveState::Copied | MoveState::Verified => {}
                other => {
                    return Err(MigrationError::NotAbortable {
                        op_id: op.op_id,
                        state: other.as_str().to_owned(),
                    });
                }
            }
            let ctx = MoveCtx::from_op(self, &op, guard.clone())?;
            let now = self.now();
            let live = now.saturating_add(i64::try_from(MOVE_LIVENESS_MS).unwrap_or(i64::MAX));
            let n = js
                .execute(&q.take_over(&op, &guard, (now, live), TakeOver::Uncut))
                .await
                .map_err(|e| MigrationError::shard(jname, e))?;
            if n == 0 {
                // The owner stepped on (or the lease lapsed): look again.
                self.renew_lease(lease).await?;
                continue;
            }
            tracing::info!(
                event = "durability.migration.operator_abort",
                op_id = %op.op_id,
                key = %op.key,
                state = op.state.as_str(),
                "an operator aborts the operation"
            );
            let dropped = ctx
                .abort_counted(&op.digests, "aborted by an operator")
                .await?;
            return Ok(AbortReport {
                op_id: op.op_id,
                key: op.key,
                already_aborted: false,
                copies_dropped: dropped,
            });
        }
        Err(MigrationError::AlreadyActive(key))
    }
}
