//! Read-only views for operators: the journal's operations with their
//! counts per state ([`Router::migration_status`](crate::Router::migration_status)), and the [`Progress`]
//! events long passes ([`Router::verify_migrations_observed`](crate::Router::verify_migrations_observed),
//! [`Router::rebalance_observed`](crate::Router::rebalance_observed)) report while they run.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{MigrationError, Result};
use crate::journal::{MoveState, OpFilter, OpRecord, int, opt_int, text};
use crate::router::Core;

/// Most operations one [`Router::migration_status`](crate::Router::migration_status) call lists.
pub const MAX_STATUS_OPERATIONS: usize = 10_000;

/// Default number of operations [`Router::migration_status`](crate::Router::migration_status) lists.
pub const DEFAULT_STATUS_LIMIT: usize = 100;

/// Which operations [`Router::migration_status`](crate::Router::migration_status) lists (the counts always
/// cover the whole scope).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusOptions {
    /// Only operations in this state.
    pub state: Option<MoveState>,
    /// Only operations that have not ended (neither retired nor aborted).
    pub active_only: bool,
    /// Only operations of this key.
    pub key: Option<String>,
    /// Only this operation (with the other filters applied to it).
    pub op_id: Option<String>,
    /// List at most this many (clamped to 1..=[`MAX_STATUS_OPERATIONS`]).
    pub limit: usize,
}

impl Default for StatusOptions {
    fn default() -> Self {
        Self {
            state: None,
            active_only: false,
            key: None,
            op_id: None,
            limit: DEFAULT_STATUS_LIMIT,
        }
    }
}

/// The scope's recovery lease as stored (a recovery, a repairing verify or
/// an abort holds it while it runs; a released lease has expired).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseStatus {
    /// Who took it last.
    pub holder: String,
    /// How many times it was taken.
    pub generation: i64,
    /// Until when it holds (Unix ms; at or before `now_ms`: free).
    pub expires_ms: i64,
}

/// What [`Router::migration_status`](crate::Router::migration_status) read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusReport {
    /// The journal scope.
    pub scope: String,
    /// The shard holding the journal.
    pub journal_shard: String,
    /// The router clock's time when the journal was read (Unix ms).
    pub now_ms: i64,
    /// Exact number of operations per stored state name (states without an
    /// operation are absent).
    pub counts: BTreeMap<String, u64>,
    /// Exact number of operations in the scope.
    pub total: u64,
    /// Exact number of operations that have not ended.
    pub active: u64,
    /// The selected operations in id order (UUID v7: creation order), at
    /// most the requested limit.
    pub operations: Vec<OpRecord>,
    /// More operations matched than were listed.
    pub truncated: bool,
    /// The recovery lease, if one was ever taken in this scope.
    pub recovery_lease: Option<LeaseStatus>,
    /// Start time of the last clean verification pass (Unix ms).
    pub last_clean_verify_ms: Option<i64>,
    /// Start time of the last verification pass, clean or not (Unix ms).
    pub last_verify_pass_ms: Option<i64>,
}

/// One progress event of a long pass: `done` items of `phase` examined so
/// far, and `changed` changes made so far by the whole pass.
///
/// Phases of [`Router::verify_migrations_observed`](crate::Router::verify_migrations_observed): `operations` (active
/// operations), `moves` (finished operations examined: their tombstones,
/// stranded copies and mappings), `tombstones` (a full pass only: archive
/// rows on every shard); `changed` counts repairs. Phase of [`Router::rebalance_observed`](crate::Router::rebalance_observed): `keys` (mappings
/// examined); `changed` counts committed moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// What is being examined.
    pub phase: &'static str,
    /// Items of this phase examined so far.
    pub done: u64,
    /// Changes made so far (repairs, moves).
    pub changed: u64,
}

/// Serializes an error as `{ "code": ..., "message": ... }` (reports keep
/// the typed error; JSON readers get its stable code).
pub(crate) fn serialize_error<S: serde::Serializer>(
    e: &MigrationError,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut st = s.serialize_struct("Error", 2)?;
    st.serialize_field("code", e.code())?;
    st.serialize_field("message", &e.to_string())?;
    st.end()
}

impl Core {
    /// See [`Router::migration_status`](crate::Router::migration_status).
    pub(crate) async fn migration_status(&self, opts: &StatusOptions) -> Result<StatusReport> {
        let (jname, js, q) = self.journal()?;
        if let Some(k) = &opts.key {
            crate::config::validate_key(k)?;
        }
        let now_ms = self.now();
        let shard_err = |e| MigrationError::shard(jname, e);
        let mut counts = BTreeMap::new();
        let (mut total, mut active) = (0u64, 0u64);
        for r in js.query(&q.state_counts()).await.map_err(shard_err)? {
            let state = MoveState::parse(&text(&r, "state")?)?;
            let n = u64::try_from(int(&r, "n")?)
                .map_err(|_| MigrationError::Corrupt("negative count".into()))?;
            total += n;
            if !state.is_terminal() {
                active += n;
            }
            *counts.entry(state.as_str().to_owned()).or_insert(0) += n;
        }
        let limit = opts.limit.clamp(1, MAX_STATUS_OPERATIONS);
        let keep = |op: &OpRecord| {
            opts.state.is_none_or(|s| op.state == s)
                && (!opts.active_only || !op.state.is_terminal())
        };
        let mut operations = Vec::new();
        if let Some(op_id) = &opts.op_id {
            for r in js.query(&q.load_op(op_id)).await.map_err(shard_err)? {
                let op = OpRecord::from_row(&r)?;
                let key_ok = opts.key.as_ref().is_none_or(|k| *k == op.key);
                if op.scope == self.scope && key_ok && keep(&op) {
                    operations.push(op);
                }
            }
        } else if let Some(key) = &opts.key {
            for r in js.query(&q.ops_for_key(key)).await.map_err(shard_err)? {
                let op = OpRecord::from_row(&r)?;
                if keep(&op) {
                    operations.push(op);
                }
            }
            operations.sort_by(|a, b| a.op_id.cmp(&b.op_id));
        } else {
            let filter = match (opts.state, opts.active_only) {
                (Some(s), _) => OpFilter::State(s),
                (None, true) => OpFilter::Active,
                (None, false) => OpFilter::All,
            };
            for r in js
                .query(&q.ops_page("", limit + 1, filter))
                .await
                .map_err(shard_err)?
            {
                let op = OpRecord::from_row(&r)?;
                if keep(&op) {
                    operations.push(op);
                }
            }
        }
        let truncated = operations.len() > limit;
        operations.truncate(limit);
        let recovery_lease = match js.query(&q.lease_get()).await.map_err(shard_err)?.first() {
            Some(r) => Some(LeaseStatus {
                holder: text(r, "holder")?,
                generation: int(r, "generation")?,
                expires_ms: int(r, "expires_ms")?,
            }),
            None => None,
        };
        let last_clean_verify_ms = match js.query(&q.meta_get()).await.map_err(shard_err)?.first() {
            Some(r) => opt_int(r, "last_clean_verify_ms")?,
            None => None,
        };
        let last_verify_pass_ms = match js.query(&q.pass_get()).await.map_err(shard_err)?.first() {
            Some(r) => opt_int(r, "started_ms")?,
            None => None,
        };
        Ok(StatusReport {
            scope: self.scope.clone(),
            journal_shard: jname.to_owned(),
            now_ms,
            counts,
            total,
            active,
            operations,
            truncated,
            recovery_lease,
            last_clean_verify_ms,
            last_verify_pass_ms,
        })
    }
}

#[cfg(test)]
mod tests;
