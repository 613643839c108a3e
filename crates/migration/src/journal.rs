//! The journal: operation rows (each active one holding its key's claim)
//! and the recovery lease, on the journal shard. Every statement here is
//! generated per dialect.

use std::collections::BTreeMap;
use std::fmt;

use crate::dialect::{Dialect, Sql, names};
use crate::error::{MigrationError, Result};
use crate::shard::Statement;
use crate::value::{Row, Value};

/// How long a live move's claim on its operation lasts without a step (ms).
/// Recovery skips an operation whose mover stepped more recently: by the
/// recorded deadline when the mover reads its clock (its clock domain),
/// otherwise by seeing the row unchanged for this long on its own clock.
pub const MOVE_LIVENESS_MS: u64 = 30_000;
/// How long a recovery lease lasts without renewal (ms).
pub const RECOVERY_LEASE_MS: u64 = 60_000;
/// How many times a missed cutover copies again before the move aborts.
pub const MAX_RECOPIES: i64 = 3;
/// Default retention of archived source rows (seven days, ms).
pub const DEFAULT_RETENTION_MS: u64 = 7 * 24 * 60 * 60 * 1000;

/// A state of a move operation (serialized as its stored name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveState {
    /// Claimed, snapshot digested; the copy follows.
    Prepared,
    /// Copied to the destination.
    Copied,
    /// Destination digest matched.
    Verified,
    /// The source cutover is about to run (or ran).
    CutoverPending,
    /// The source cutover archived and deleted the rows.
    Committed,
    /// The mapping points at the destination.
    Published,
    /// Finished; the archive is kept until its retention deadline.
    Retired,
    /// Ended without moving the key.
    Aborted,
}

impl MoveState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prepared => "prepared",
            Self::Copied => "copied",
            Self::Verified => "verified",
            Self::CutoverPending => "cutover_pending",
            Self::Committed => "committed",
            Self::Published => "published",
            Self::Retired => "retired",
            Self::Aborted => "aborted",
        }
    }

    /// Parses a stored name.
    ///
    /// # Errors
    /// `CORRUPT_RECORD` for an unknown name.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "prepared" => Self::Prepared,
            "copied" => Self::Copied,
            "verified" => Self::Verified,
            "cutover_pending" => Self::CutoverPending,
            "committed" => Self::Committed,
            "published" => Self::Published,
            "retired" => Self::Retired,
            "aborted" => Self::Aborted,
            other => return Err(MigrationError::Corrupt(format!("unknown state {other:?}"))),
        })
    }

    /// Whether the operation has ended.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Retired | Self::Aborted)
    }
}

impl fmt::Display for MoveState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One journaled operation, as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpRecord {
    /// Operation id (UUID v7).
    pub op_id: String,
    /// Journal scope.
    pub scope: String,
    /// The key.
    pub key: String,
    /// The tables moved together.
    pub tables: Vec<String>,
    /// Source shard.
    pub source: String,
    /// Destination shard.
    pub target: String,
    /// Latest recorded state.
    pub state: MoveState,
    /// Missed cutovers so far.
    pub attempts: i64,
    /// Snapshot digest per table (`-` when the key had no row there).
    pub digests: BTreeMap<String, String>,
    /// The mover (or recovery) that owns the operation.
    pub owner: String,
    /// Until when the owner is considered live (Unix ms).
    pub live_until_ms: i64,
    /// Retention period of the archive (ms).
    pub retain_ms: i64,
    /// Retention deadline, set when retired.
    pub retire_at_ms: Option<i64>,
    /// Created (Unix ms).
    pub created_ms: i64,
    /// Last step (Unix ms).
    pub updated_ms: i64,
    /// Finished (Unix ms), set when retired or aborted.
    pub finished_ms: Option<i64>,
    /// Whether the archive payload was purged.
    pub purged: bool,
    /// Whether a verification pass examined the finished operation (its
    /// tombstones, copy and mapping) and found nothing on its key: later
    /// passes skip it unless they are full, and purge requires it.
    pub verified: bool,
    /// Why it aborted, if it did.
    pub error: Option<String>,
}

pub(crate) fn encode_digests(d: &BTreeMap<String, String>) -> String {
    d.iter()
        .map(|(t, h)| format!("{t}={h}"))
        .collect::<Vec<_>>()
        .join(";")
}

fn decode_digests(s: &str) -> Result<BTreeMap<String, String>> {
    s.split(';')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| MigrationError::Corrupt(format!("digest entry {p:?}")))
        })
        .collect()
}

/// A text column; byte columns holding UTF-8 (MySQL `VARBINARY` keys) read
/// as text.
pub(crate) fn text(row: &Row, col: &str) -> Result<String> {
    match row.get(col) {
        Some(Value::Text(s)) => Ok(s.clone()),
        Some(Value::Blob(b)) if std::str::from_utf8(b).is_ok() => {
            Ok(String::from_utf8_lossy(b).into_owned())
        }
        other => Err(MigrationError::Corrupt(format!("column {col}: {other:?}"))),
    }
}

pub(crate) fn int(row: &Row, col: &str) -> Result<i64> {
    match row.get(col) {
        Some(Value::Integer(i)) => Ok(*i),
        other => Err(MigrationError::Corrupt(format!("column {col}: {other:?}"))),
    }
}

pub(crate) fn opt_int(row: &Row, col: &str) -> Result<Option<i64>> {
    match row.get(col) {
        Some(Value::Null) | None => Ok(None),
        Some(Value::Integer(i)) => Ok(Some(*i)),
        other => Err(MigrationError::Corrupt(format!("column {col}: {other:?}"))),
    }
}

impl OpRecord {
    pub(crate) fn from_row(row: &Row) -> Result<Self> {
        Ok(Self {
            op_id: text(row, "op_id")?,
            scope: text(row, "scope")?,
            key: text(row, "mkey")?,
            tables: text(row, "tables")?.split(',').map(str::to_owned).collect(),
            source: text(row, "source")?,
            target: text(row, "target")?,
            state: MoveState::parse(&text(row, "state")?)?,
            attempts: int(row, "attempts")?,
            digests: decode_digests(&text(row, "digests")?)?,
            owner: text(row, "owner")?,
            live_until_ms: int(row, "live_until_ms")?,
            retain_ms: int(row, "retain_ms")?,
            retire_at_ms: opt_int(row, "retire_at_ms")?,
            created_ms: int(row, "created_ms")?,
            updated_ms: int(row, "updated_ms")?,
            finished_ms: opt_int(row, "finished_ms")?,
            purged: int(row, "purged")? != 0,
            verified: int(row, "verified")? != 0,
            error: match row.get("error") {
                Some(Value::Text(s)) => Some(s.clone()),
                _ => None,
            },
        })
    }
}

/// Who may write an operation's journal rows: its owner, and for a recovery
/// also the holder of the scope's lease at a generation.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub(crate) owner: String,
    pub(crate) lease: Option<(String, i64)>,
}

/// A state change of one operation.
#[derive(Debug, Clone, Default)]
pub(crate) struct Change {
    pub(crate) attempts: Option<i64>,
    pub(crate) digests: Option<String>,
    pub(crate) finished: bool,
    pub(crate) retire_at_ms: Option<i64>,
    pub(crate) error: Option<String>,
    /// The state becomes `committed` instead when this operation's archive
    /// row of this key exists in the same database: the cutover and its
    /// journal write share one batch, and this write is the batch's last.
    pub(crate) committed_if_archived: Option<String>,
}

pub(crate) struct JournalSql<'a> {
    pub(crate) d: &'a Dialect,
    pub(crate) scope: &'a str,
}

impl JournalSql<'_> {
    fn push_lease_guard(&self, s: &mut Sql<'_>, g: &Guard, now: i64) {
        if let Some((scope, generation)) = &g.lease {
            s.raw(" AND EXISTS (SELECT 1 FROM ")
                .raw(names::LEASE)
                .raw(" WHERE scope = ")
                .bind(scope.as_str())
                .raw(" AND generation = ")
                .bind(*generation)
                .raw(" AND expires_ms > ")
                .bind(now)
                .raw(")");
        }
    }

    /// The claim and `prepared` in one statement: inserts the operation
    /// holding its key in `claim`, unless an active operation of the key
    /// holds it already (then it inserts nothing; a racing claim that slips
    /// past the check trips the unique claim index instead).
    pub(crate) fn insert_op(&self, op: &OpRecord) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("INSERT INTO ").raw(names::OPS).raw(
            " (op_id, scope, mkey, tables, source, target, state, attempts, digests, owner, \
                 live_until_ms, retain_ms, created_ms, updated_ms, purged, claim) SELECT ",
        );
        let vals: Vec<Value> = vec![
            op.op_id.clone().into(),
            op.scope.clone().into(),
            op.key.clone().into(),
            op.tables.join(",").into(),
            op.source.clone().into(),
            op.target.clone().into(),
            op.state.as_str().into(),
            op.attempts.into(),
            encode_digests(&op.digests).into(),
            op.owner.clone().into(),
            op.live_until_ms.into(),
            op.retain_ms.into(),
            op.created_ms.into(),
            op.updated_ms.into(),
            0i64.into(),
            op.key.clone().into(),
        ];
        for (i, v) in vals.into_iter().enumerate() {
            if i > 0 {
                s.raw(", ");
            }
            s.bind(v);
        }
        s.dual()
            .raw(" WHERE NOT EXISTS (SELECT 1 FROM ")
            .raw(names::OPS)
            .raw(" WHERE scope = ")
            .bind(self.scope)
            .raw(" AND claim = ")
            .bind(op.key.as_str())
            .raw(")");
        s.finish()
    }

    /// The operation holding `key`'s claim, if any.
    pub(crate) fn claim_holder(&self, key: &str) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("SELECT op_id FROM ")
            .raw(names::OPS)
            .raw(" WHERE scope = ")
            .bind(self.scope)
            .raw(" AND claim = ")
            .bind(key);
        s.finish()
    }

    pub(crate) fn update_state(
        &self,
        op_id: &str,
        state: MoveState,
        change: &Change,
        g: &Guard,
        now: i64,
        live_until: i64,
    ) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("UPDATE ").raw(names::OPS).raw(" SET state = ");
        match &change.committed_if_archived {
            Some(key) => {
                s.raw("CASE WHEN EXISTS (SELECT 1 FROM ")
                    .raw(names::RETIRED)
                    .raw(" WHERE mkey = ")
                    .bind(key.as_str())
                    .raw(" AND op_id = ")
                    .bind(op_id)
                    .raw(") THEN ")
                    .bind(MoveState::Committed.as_str())
                    .raw(" ELSE ")
                    .bind(state.as_str())
                    .raw(" END");
            }
            None => {
                s.bind(state.as_str());
            }
        }
        s.raw(", updated_ms = ")
            .bind(now)
            .raw(", live_until_ms = ")
            .bind(live_until);
        if let Some(a) = change.attempts {
            s.raw(", attempts = ").bind(a);
        }
        if let Some(d) = &change.digests {
            s.raw(", digests = ").bind(d.as_str());
        }
        if change.finished {
            s.raw(", finished_ms = ").bind(now);
        }
        if let Some(r) = change.retire_at_ms {
            s.raw(", retire_at_ms = ").bind(r);
        }
        if let Some(e) = &change.error {
            s.raw(", error = ").bind(e.as_str());
        }
        if change.finished {
            // A terminal state releases the claim in the same write.
            s.raw(", claim = NULL");
        }
        s.raw(" WHERE op_id = ")
            .bind(op_id)
            .raw(" AND owner = ")
            .bind(g.owner.as_str());
        self.push_lease_guard(&mut s, g, now);
        s.finish()
    }

    /// Recovery takes an operation over from a mover that is no longer live.
    pub(crate) fn take_over(
        &self,
        op: &OpRecord,
        g: &Guard,
        now: i64,
        live_until: i64,
    ) -> Statement {
        self.take_over_when(op, g, now, live_until, |s| {
            s.raw(" AND live_until_ms <= ").bind(now);
        })
    }

    /// Recovery takes an operation over whose owner is outside its clock
    /// domain and whose row it saw unchanged for the liveness period: only
    /// while the row is still exactly as seen (no clock reading of another
    /// host is compared).
    pub(crate) fn take_over_unchanged(
        &self,
        op: &OpRecord,
        g: &Guard,
        now: i64,
        live_until: i64,
    ) -> Statement {
        self.take_over_when(op, g, now, live_until, |s| {
            s.raw(" AND state = ")
                .bind(op.state.as_str())
                .raw(" AND attempts = ")
                .bind(op.attempts)
                .raw(" AND updated_ms = ")
                .bind(op.updated_ms)
                .raw(" AND live_until_ms = ")
                .bind(op.live_until_ms);
        })
    }

    /// An operator's abort takes an operation over from its owner, live or
    /// not, only while it has not reached `cutover_pending` (so no cutover
    /// can have run): the owner's next journal write is then fenced.
    pub(crate) fn take_over_uncut(
        &self,
        op: &OpRecord,
        g: &Guard,
        now: i64,
        live_until: i64,
    ) -> Statement {
        self.take_over_when(op, g, now, live_until, |s| {
            s.raw(" AND state IN ('prepared', 'copied', 'verified')");
        })
    }

    /// Takes `op` over for `g` from its recorded owner when `condition`
    /// (appended to the `WHERE`) holds, under the lease guard.
    fn take_over_when(
        &self,
        op: &OpRecord,
        g: &Guard,
        now: i64,
        live_until: i64,
        condition: impl FnOnce(&mut Sql<'_>),
    ) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("UPDATE ")
            .raw(names::OPS)
            .raw(" SET owner = ")
            .bind(g.owner.as_str())
            .raw(", live_until_ms = ")
            .bind(live_until)
            .raw(" WHERE op_id = ")
            .bind(op.op_id.as_str())
            .raw(" AND owner = ")
            .bind(op.owner.as_str());
        condition(&mut s);
        self.push_lease_guard(&mut s, g, now);
        s.finish()
    }

    pub(crate) fn load_op(&self, op_id: &str) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("SELECT * FROM ")
            .raw(names::OPS)
            .raw(" WHERE op_id = ")
            .bind(op_id);
        s.finish()
    }

    pub(crate) fn ops_for_key(&self, key: &str) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("SELECT * FROM ")
            .raw(names::OPS)
            .raw(" WHERE scope = ")
            .bind(self.scope)
            .raw(" AND mkey = ")
            .bind(key)
            .raw(" ORDER BY created_ms DESC, op_id DESC");
        s.finish()
    }

    /// A page of operations after `after` (by id); `active` selects
    /// non-terminal ones, otherwise `state` selects one state.
    pub(crate) fn ops_page(&self, after: &str, limit: usize, filter: OpFilter) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("SELECT * FROM ")
            .raw(names::OPS)
            .raw(" WHERE scope = ")
            .bind(self.scope)
            .raw(" AND op_id > ")
            .bind(after);
        match filter {
            OpFilter::Active => {
                // Every active operation holds its claim: the claim index
                // finds them without reading the finished history.
                s.raw(" AND claim IS NOT NULL AND state NOT IN ('retired', 'aborted')");
            }
            OpFilter::State(st) => {
                s.raw(" AND state = ").bind(st.as_str());
            }
            OpFilter::Unpurged => {
                s.raw(" AND state = 'retired' AND purged = 0");
            }
            OpFilter::Unverified => {
                s.raw(" AND verified = 0 AND state IN ('retired', 'aborted')");
            }
            OpFilter::Finished => {
                s.raw(" AND state IN ('retired', 'aborted')");
            }
            OpFilter::All => {}
        }
        s.raw(&format!(" ORDER BY op_id LIMIT {limit}"));
        s.finish()
    }

    /// Finished operations still holding a claim (the terminal write
    /// releases it, so only a journal written otherwise has these).
    pub(crate) fn terminal_claims(&self) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("SELECT op_id FROM ")
            .raw(names::OPS)
            .raw(" WHERE scope = ")
            .bind(self.scope)
            .raw(" AND claim IS NOT NULL AND state IN ('retired', 'aborted')");
        s.finish()
    }

    /// Releases a finished operation's leftover claim (under the lease).
    pub(crate) fn release_claim(&self, op_id: &str, g: &Guard, now: i64) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("UPDATE ")
            .raw(names::OPS)
            .raw(" SET claim = NULL WHERE op_id = ")
            .bind(op_id)
            .raw(" AND state IN ('retired', 'aborted')");
        self.push_lease_guard(&mut s, g, now);
        s.finish()
    }

    /// Marks `op_ids` examined by a verification pass (one statement, by
    /// primary key only: a condition on the scope would let a planner
    /// walk the scope's whole `(scope, verified, op_id)` index instead).
    pub(crate) fn mark_verified(&self, op_ids: &[String]) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("UPDATE ")
            .raw(names::OPS)
            .raw(" SET verified = 1 WHERE op_id IN (");
        for (i, op) in op_ids.iter().enumerate() {
            if i > 0 {
                s.raw(", ");
            }
            s.bind(op.as_str());
        }
        s.raw(")");
        s.finish()
    }

    /// Every key the last finished verification pass found something on.
    pub(crate) fn unclean_keys(&self) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("SELECT mkey FROM ")
            .raw(names::UNCLEAN)
            .raw(" WHERE scope = ")
            .bind(self.scope)
            .raw(" ORDER BY mkey");
        s.finish()
    }

    /// Deletes a compacted operation's row (see `Router::purge_retired`).
    pub(crate) fn delete_op(&self, op_id: &str) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("DELETE FROM ")
            .raw(names::OPS)
            .raw(" WHERE scope = ")
            .bind(self.scope)
            .raw(" AND op_id = ")
            .bind(op_id)
            .raw(" AND state = 'retired' AND purged = 1");
        s.finish()
    }

    /// Deletes an aborted operation's row once a pass examined it (see
    /// `Router::purge_retired`).
    pub(crate) fn delete_aborted_op(&self, op_id: &str) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("DELETE FROM ")
            .raw(names::OPS)
            .raw(" WHERE scope = ")
            .bind(self.scope)
            .raw(" AND op_id = ")
            .bind(op_id)
            .raw(" AND state = 'aborted' AND verified = 1");
        s.finish()
    }

    pub(crate) fn mark_purged(&self, op_id: &str) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("UPDATE ")
            .raw(names::OPS)
            .raw(" SET purged = 1 WHERE op_id = ")
            .bind(op_id);
        s.finish()
    }

    pub(crate) fn lease_get(&self) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("SELECT holder, generation, expires_ms FROM ")
            .raw(names::LEASE)
            .raw(" WHERE scope = ")
            .bind(self.scope);
        s.finish()
    }

    pub(crate) fn lease_insert(&self, holder: &str, expires: i64) -> Statement {
        self.d.insert_absent(
            names::LEASE,
            &[
                ("scope", self.scope.into()),
                ("holder", holder.into()),
                ("generation", 1i64.into()),
                ("expires_ms", expires.into()),
            ],
            1,
        )
    }

    pub(crate) fn lease_take(
        &self,
        holder: &str,
        old_gen: i64,
        now: i64,
        expires: i64,
    ) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("UPDATE ")
            .raw(names::LEASE)
            .raw(" SET holder = ")
            .bind(holder)
            .raw(", generation = ")
            .bind(old_gen + 1)
            .raw(", expires_ms = ")
            .bind(expires)
            .raw(" WHERE scope = ")
            .bind(self.scope)
            .raw(" AND generation = ")
            .bind(old_gen)
            .raw(" AND expires_ms <= ")
            .bind(now);
        s.finish()
    }

    pub(crate) fn lease_renew(
        &self,
        holder: &str,
        generation: i64,
        now: i64,
        expires: i64,
    ) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("UPDATE ")
            .raw(names::LEASE)
            .raw(" SET expires_ms = ")
            .bind(expires)
            .raw(" WHERE scope = ")
            .bind(self.scope)
            .raw(" AND generation = ")
            .bind(generation)
            .raw(" AND holder = ")
            .bind(holder)
            .raw(" AND expires_ms > ")
            .bind(now);
        s.finish()
    }

    pub(crate) fn meta_get(&self) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("SELECT last_clean_verify_ms FROM ")
            .raw(names::META)
            .raw(" WHERE scope = ")
            .bind(self.scope);
        s.finish()
    }

    pub(crate) fn meta_set(&self, now: i64) -> Vec<Statement> {
        let mut u = Sql::new(self.d);
        u.raw("UPDATE ")
            .raw(names::META)
            .raw(" SET last_clean_verify_ms = ")
            .bind(now)
            .raw(" WHERE scope = ")
            .bind(self.scope);
        let i = self.d.insert_absent(
            names::META,
            &[
                ("scope", self.scope.into()),
                ("last_clean_verify_ms", now.into()),
            ],
            1,
        );
        vec![u.finish(), i]
    }
}

impl JournalSql<'_> {
    /// The start time of the last finished verification pass.
    pub(crate) fn pass_get(&self) -> Statement {
        let mut s = Sql::new(self.d);
        s.raw("SELECT started_ms FROM ")
            .raw(names::PASS)
            .raw(" WHERE scope = ")
            .bind(self.scope);
        s.finish()
    }

    /// Records a finished verification pass that started at `started` and
    /// found something on exactly `keys` (one batch: the previous pass's
    /// keys are replaced).
    pub(crate) fn pass_set<'k>(
        &self,
        started: i64,
        keys: impl IntoIterator<Item = &'k String>,
    ) -> Vec<Statement> {
        let mut del = Sql::new(self.d);
        del.raw("DELETE FROM ")
            .raw(names::UNCLEAN)
            .raw(" WHERE scope = ")
            .bind(self.scope);
        let mut out = vec![del.finish()];
        for k in keys {
            let mut ins = Sql::new(self.d);
            ins.raw("INSERT INTO ")
                .raw(names::UNCLEAN)
                .raw(" (scope, mkey) VALUES (")
                .bind(self.scope)
                .raw(", ")
                .bind(k.as_str())
                .raw(")");
            out.push(ins.finish());
        }
        let mut u = Sql::new(self.d);
        u.raw("UPDATE ")
            .raw(names::PASS)
            .raw(" SET started_ms = ")
            .bind(started)
            .raw(" WHERE scope = ")
            .bind(self.scope);
        out.push(u.finish());
        out.push(self.d.insert_absent(
            names::PASS,
            &[("scope", self.scope.into()), ("started_ms", started.into())],
            1,
        ));
        out
    }
}

/// Which operations a page selects.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OpFilter {
    Active,
    State(MoveState),
    Unpurged,
    /// Finished operations no verification pass has examined.
    Unverified,
    /// Every finished operation.
    Finished,
    /// Every operation of the scope (read-only listings).
    All,
}
