//! Journaled moves: `reassign_shard` and `reassign_keys`.
//!
//! Order of one move (each journal write lands before the work it
//! describes):
//!
//! 1. claim + `prepared` with the snapshot digests (one journal statement:
//!    the operation row holds its key in `claim`, unique per scope), then
//!    the check that no concurrent move cut the key over on the source
//!    since the snapshot (in the claim's statement when the
//!    journal shares the source's database);
//! 2. copy to the destination, in one batch with the operation's in-flight
//!    marker of every moved table (a live `durability_retired` row of the
//!    operation on the destination, `moved_to` naming the source, digest
//!    the in-flight sentinel): the marker plus one insert when the
//!    destination has no row of the key, else markers + delete + insert per
//!    table. From here to the publish no routed read, write or placement
//!    probe takes the copy for the key's row: writes there match no row
//!    (the tombstone fence) and fail with `MIGRATION_CUTOVER_PENDING`,
//!    reads and probes skip it and find the source;
//! 3. read the destination back and compare digests;
//! 4. `cutover_pending` (the row moves from `prepared` past `copied` and
//!    `verified` in one write: no work separates those states, and recovery
//!    starts `prepared`, `copied` and `verified` over alike);
//! 5. the source cutover: one batch that archives every snapshot row into
//!    `durability_retired` and deletes it, under one predicate (every row
//!    still equals its snapshot), so a write that changed a row first makes
//!    the whole batch write nothing; a miss returns to `prepared` and copies
//!    again, up to three times, then aborts. The first miss first writes
//!    the write hold of the key on the source (`durability_write_hold`,
//!    deadline now + `cutover_hold_ms`): routed writes there fail with
//!    `MIGRATION_CUTOVER_PENDING` until the cutover batch that archives the
//!    key deletes it (in that batch), the abort deletes it, or its deadline
//!    passes (the mover stops at it; a routed write removes an expired
//!    hold);
//! 6. `committed`;
//! 7. publish: one batch on the destination deletes the operation's
//!    in-flight markers and lifts an old fence of the key there, then the
//!    mapping is written and this router's cache updated;
//! 8. `retired` (past `published`, with the retention deadline) and claim
//!    release (one journal statement; recovery finishes `committed` and
//!    `published` alike).
//!
//! An abort deletes the operation's copies (rows equal to the journaled
//! snapshot, and any row still under its marker: nothing routed wrote it
//! since the copy) and its markers in one batch on the destination, before
//! the terminal journal write. A crash between any two writes leaves either
//! no marker (nothing copied) or a marker with a claim held, which recovery
//! settles by finishing (publish deletes it) or aborting (the abort does).
//!
//! When the journal shares the source's database, steps 4–6 are one atomic
//! batch on it: the archive inserts are guarded by the operation's owner (a
//! mover that lost the operation to recovery archives nothing), and one
//! journal write ends the batch, recording `committed` when the archive row
//! exists (the cutover hit) and `cutover_pending` otherwise. Inside one
//! transaction the order of its statements is not observable.

use std::collections::BTreeMap;

use crate::config::{self, TableSpec};
use crate::dialect::{Cutover, CutoverTable, row_idents};
use crate::error::{BackendError, DataRejected, MigrationError, Result, UniqueViolation};
use crate::journal::{
    Change, DEFAULT_RETENTION_MS, Guard, MAX_RECOPIES, MOVE_LIVENESS_MS, MoveState, OpRecord,
};
use crate::recovery::Resumed;
use crate::router::Core;
use crate::shard::Statement;
use crate::value::{self, Row, Value};
use tracing::Instrument as _;

/// When an archived source row may be purged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retire {
    /// After this many milliseconds (default seven days).
    After(u64),
    /// Deadline now; nothing is purged until `purge_retired` runs.
    Immediate,
}

impl Default for Retire {
    fn default() -> Self {
        Self::After(DEFAULT_RETENTION_MS)
    }
}

/// Options of a journaled move.
#[derive(Debug, Clone, Copy, Default)]
pub struct MoveOptions {
    /// Retention of the archived source rows.
    pub retire: Retire,
}

/// The result of a finished move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveOutcome {
    /// The operation id.
    pub op_id: String,
    /// Where the key was.
    pub source: String,
    /// Where the key is now.
    pub target: String,
    /// Missed cutovers before the move committed.
    pub recopies: i64,
}

/// Where a resumed move starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Copy,
    Cutover,
}

pub(crate) struct MoveCtx<'r> {
    pub(crate) r: &'r Core,
    pub(crate) guard: Guard,
    pub(crate) op_id: String,
    pub(crate) key: String,
    pub(crate) specs: Vec<TableSpec>,
    pub(crate) source: String,
    pub(crate) target: String,
    pub(crate) retain_ms: i64,
    /// Claimed by this call (not resumed): no write hold of the operation
    /// exists until its run takes one.
    pub(crate) fresh: bool,
}

pub(crate) type Snapshot = Vec<Option<Row>>;

impl<'r> MoveCtx<'r> {
    pub(crate) fn from_op(r: &'r Core, op: &OpRecord, guard: Guard) -> Result<Self> {
        let specs = op
            .tables
            .iter()
            .map(|t| r.table(t).cloned())
            .collect::<Result<Vec<_>>>()?;
        r.check_movable(&op.source)?;
        r.check_movable(&op.target)?;
        Ok(Self {
            r,
            guard,
            op_id: op.op_id.clone(),
            key: op.key.clone(),
            specs,
            source: op.source.clone(),
            target: op.target.clone(),
            retain_ms: op.retain_ms,
            fresh: false,
        })
    }

    pub(crate) fn fenced(&self) -> MigrationError {
        match &self.guard.lease {
            Some((scope, _)) => MigrationError::RecoveryFenced(scope.clone()),
            None => MigrationError::TakenOver(self.op_id.clone()),
        }
    }

    /// Runs journal statements as one batch; the first must change a row.
    async fn journal(&self, stmts: Vec<Statement>) -> Result<()> {
        let (jname, js) = self.r.journal_shard()?;
        let counts = js
            .batch(&stmts)
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        if counts.first().copied().unwrap_or(0) == 0 {
            let e = self.fenced();
            tracing::warn!(
                event = "durability.migration.journal_fenced",
                op_id = %self.op_id,
                code = e.code(),
                "journal write fenced: the operation moved on"
            );
            return Err(e);
        }
        Ok(())
    }

    fn update(&self, state: MoveState, change: &Change) -> Result<Statement> {
        let (_, _, q) = self.r.journal()?;
        let now = self.r.now();
        let live = now.saturating_add(i64::try_from(MOVE_LIVENESS_MS).unwrap_or(i64::MAX));
        Ok(q.update_state(&self.op_id, state, change, &self.guard, now, live))
    }

    pub(crate) async fn step(&self, state: MoveState, change: Change) -> Result<()> {
        let st = self.update(state, &change)?;
        self.journal(vec![st]).await
    }

    async fn read_rows(&self, shard_name: &str) -> Result<Snapshot> {
        let mut out = Vec::with_capacity(self.specs.len());
        for spec in &self.specs {
            out.push(self.r.read_row((shard_name, spec), &self.key).await?);
        }
        Ok(out)
    }

    /// Why a snapshot before the claim found no row of the key on the
    /// source: a concurrent move cut it over after this call located the
    /// key (its tombstone is there), which is the conflict
    /// (`MIGRATION_ALREADY_ACTIVE`), or the key has no row
    /// (`MIGRATION_ROW_NOT_FOUND`).
    async fn no_row(&self) -> Result<MigrationError> {
        Ok(if self.moved_away().await? {
            MigrationError::AlreadyActive(self.key.clone())
        } else {
            MigrationError::RowNotFound(self.key.clone())
        })
    }

    /// Whether the source holds a live tombstone (or in-flight marker) of
    /// the key in a moved table: the key was moved away from it (or is
    /// being moved into it) by another operation.
    pub(crate) async fn moved_away(&self) -> Result<bool> {
        let (name, shard) = self.r.shard_named(&self.source)?;
        let tables: Vec<&crate::dialect::Ident> = self.specs.iter().map(|s| &s.name).collect();
        let rows = shard
            .query(
                &shard
                    .dialect()
                    .foreign_tombstone_query(&tables, &self.key, &self.op_id),
            )
            .await
            .map_err(|e| MigrationError::shard(name, e))?;
        Ok(!rows.is_empty())
    }

    /// The write of the terminal `state` with `change` (which releases the
    /// claim).
    async fn end_with(&self, state: MoveState, change: Change) -> Result<()> {
        let change = Change {
            finished: true,
            ..change
        };
        self.journal(vec![self.update(state, &change)?]).await
    }

    /// The terminal `aborted` write (which releases the claim), logged
    /// with `note`. Before the copy (nothing copied, no hold taken) it is
    /// all an abort does.
    async fn end_aborted(&self, reason: &str, note: &str) -> Result<()> {
        let error = Some(reason.to_owned());
        self.end_with(
            MoveState::Aborted,
            Change {
                error,
                ..Change::default()
            },
        )
        .await?;
        tracing::info!(
            event = "durability.migration.aborted",
            op_id = %self.op_id,
            key = %self.key,
            reason,
            "{note}"
        );
        Ok(())
    }

    /// Configured tables outside the move that exist on the source.
    async fn others(&self) -> Result<Vec<TableSpec>> {
        let mut out = Vec::new();
        for spec in self.r.tables.values() {
            if self.specs.contains(spec) {
                continue;
            }
            match self.r.columns(&self.source, spec).await {
                Ok(_) => out.push(spec.clone()),
                Err(MigrationError::UnknownTable(_) | MigrationError::UnknownKeyColumn { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Configured tables outside the move that exist on the source and on
    /// the destination (both re-validated, as a moved table is).
    async fn others_on_target(&self) -> Result<Vec<TableSpec>> {
        let mut out = Vec::new();
        for spec in self.others().await? {
            self.r.columns_fresh(&self.source, &spec).await?;
            match self.r.columns_fresh(&self.target, &spec).await {
                Ok(_) => out.push(spec),
                Err(MigrationError::UnknownTable(_) | MigrationError::UnknownKeyColumn { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Configured tables outside the move that hold a row of the key on the
    /// source (a move of only some of them would strand the others).
    pub(crate) async fn rows_elsewhere(&self) -> Result<Vec<String>> {
        let (name, shard) = self.r.shard_named(&self.source)?;
        let d = shard.dialect();
        let mut out = Vec::new();
        for spec in self.others().await? {
            let rows = shard
                .query(&d.key_probe(&spec.name, &spec.key_col, &self.key))
                .await
                .map_err(|e| MigrationError::shard(name, e))?;
            if !rows.is_empty() {
                out.push(spec.name.as_str().to_owned());
            }
        }
        Ok(out)
    }

    pub(crate) async fn snapshot(&self) -> Result<Snapshot> {
        self.read_rows(&self.source).await
    }

    pub(crate) fn digests(&self, snap: &Snapshot) -> BTreeMap<String, String> {
        self.specs
            .iter()
            .zip(snap)
            .map(|(s, r)| (s.name.as_str().to_owned(), value::digest(r.as_ref())))
            .collect()
    }

    /// The source's side of a new move, before its claim: the source's
    /// columns, the snapshot (widened to every other configured table on
    /// both shards) and the refusals that need no write: no row
    /// (`MIGRATION_ROW_NOT_FOUND`, or the conflict code when a concurrent
    /// move cut the key over), a value the destination cannot store, rows
    /// in tables outside the move (`MIGRATION_PARTIAL_MOVE`). The reads run
    /// concurrently and are checked in this order.
    async fn claimable_snapshot(&mut self) -> Result<Snapshot> {
        let (source_cols, snap, elsewhere, extra) = futures::join!(
            self.r.columns_fresh_all(&self.source, &self.specs),
            self.snapshot(),
            self.rows_elsewhere(),
            self.others_on_target(),
        );
        source_cols?;
        let mut snap = snap?;
        if snap.iter().all(Option::is_none) {
            return Err(self.no_row().await?);
        }
        // A value the destination can never store: refused before anything
        // is written.
        self.check_storable(&snap)?;
        // A move of some tables only would strand the key's rows in the
        // others: refused before anything is written.
        let elsewhere = elsewhere?;
        if !elsewhere.is_empty() {
            return Err(MigrationError::PartialMove {
                key: self.key.clone(),
                tables: elsewhere,
            });
        }
        // Every other configured table on both shards (empty of the key
        // on the source: checked above) moves too, so the cutover fences it
        // on the source and the publish lifts its old fence on the
        // destination: a router whose cache still names the source, or a
        // write between the cutover and the publish, cannot leave a row of
        // it there that the mapping no longer routes to.
        let extra = extra?;
        if !extra.is_empty() {
            self.specs.extend(extra);
            snap = self.snapshot().await?;
            // Another move may have taken the key away since the first
            // snapshot: a move of nothing would cut over where the key no
            // longer lives and publish its target.
            if snap.iter().all(Option::is_none) {
                return Err(self.no_row().await?);
            }
            self.check_storable(&snap)?;
        }
        Ok(snap)
    }

    /// Copies the snapshot to the destination, with the operation's
    /// in-flight marker of every moved table in the same batch. A one-table
    /// move first tries one batch (marker + an insert that lands only when
    /// the destination has no row of the key: the usual case); otherwise,
    /// and for a table set, one batch writes the markers and replaces the
    /// key's rows (delete + insert per table; delete only for a table the
    /// snapshot holds no row of), superseding an earlier attempt's copy.
    /// The markers stay until the publish (or the abort) deletes them.
    ///
    /// A definite refusal (a value the destination's dialect cannot hold,
    /// found before any write; a [`DataRejected`] or [`UniqueViolation`]
    /// from the shard) is `MIGRATION_COPY_REJECTED`; any other failure is
    /// `SHARD_UNAVAILABLE` (outcome unknown).
    async fn copy(&self, snap: &Snapshot) -> Result<()> {
        self.check_storable(snap)?;
        let (name, shard) = self.r.shard_named(&self.target)?;
        let d = shard.dialect();
        // The in-flight markers land in the copy's batch: no routed read,
        // write or probe sees the copy before the publish.
        let now = self.r.now();
        let marks: Vec<Statement> = self
            .specs
            .iter()
            .map(|spec| {
                d.in_flight_mark(
                    &self.op_id,
                    &self.r.scope,
                    &spec.name,
                    &self.key,
                    &self.source,
                    now,
                )
            })
            .collect();
        if let ([spec], [Some(row)]) = (self.specs.as_slice(), snap.as_slice()) {
            let mut stmts = marks.clone();
            stmts.push(d.insert_row_absent(
                &spec.name,
                &spec.key_col,
                &self.key,
                (&row_idents(row)?, false),
            ));
            let counts = shard
                .batch(&stmts)
                .await
                .map_err(|e| self.copy_error(name, snap, e))?;
            if counts.last().copied().unwrap_or(0) > 0 {
                return Ok(());
            }
        }
        // Every moved table's row of the key is replaced, an absent one by
        // nothing: an earlier attempt's copy of a row deleted on the source
        // since must not be published.
        let mut stmts = marks;
        for (spec, row) in self.specs.iter().zip(snap) {
            stmts.push(d.delete_key(&spec.name, &spec.key_col, &self.key));
            if let Some(row) = row {
                stmts.push(d.insert_row(&spec.name, &row_idents(row)?));
            }
        }
        shard
            .batch(&stmts)
            .await
            .map_err(|e| self.copy_error(name, snap, e))?;
        Ok(())
    }

    /// Refuses a snapshot holding a value the destination's dialect can
    /// never store (`MIGRATION_COPY_REJECTED`, naming table and column).
    pub(crate) fn check_storable(&self, snap: &Snapshot) -> Result<()> {
        let (name, shard) = self.r.shard_named(&self.target)?;
        let d = shard.dialect();
        for (spec, row) in self.specs.iter().zip(snap) {
            let Some(row) = row else { continue };
            for (col, v) in row {
                if let Some(reason) = d.unstorable(v) {
                    return Err(MigrationError::CopyRejected {
                        key: self.key.clone(),
                        shard: name.to_owned(),
                        table: spec.name.as_str().to_owned(),
                        column: Some(col.clone()),
                        reason: reason.to_owned(),
                    });
                }
            }
        }
        Ok(())
    }

    /// A copy's failure: a definite refusal by the destination is
    /// `MIGRATION_COPY_REJECTED`, anything else `SHARD_UNAVAILABLE`. The
    /// refused table is the one the shard names, else the one moved table
    /// the snapshot holds a row of (the others are copied empty), else every
    /// moved table with a row.
    fn copy_error(&self, shard: &str, snap: &Snapshot, e: BackendError) -> MigrationError {
        let rejected = DataRejected::find(e.as_ref());
        if rejected.is_none() && !UniqueViolation::is(e.as_ref()) {
            return MigrationError::shard(shard, e);
        }
        let table = rejected.and_then(|r| r.table.clone()).unwrap_or_else(|| {
            self.specs
                .iter()
                .zip(snap)
                .filter(|(_, row)| row.is_some())
                .map(|(s, _)| s.name.as_str())
                .collect::<Vec<_>>()
                .join(",")
        });
        MigrationError::CopyRejected {
            key: self.key.clone(),
            shard: shard.to_owned(),
            table,
            column: rejected.and_then(|r| r.column.clone()),
            reason: crate::error::chain(rejected.map_or(e.as_ref(), |r| r.source.as_ref())),
        }
    }

    /// Whether the destination holds every snapshot row.
    pub(crate) async fn destination_matches(
        &self,
        digests: &BTreeMap<String, String>,
    ) -> Result<bool> {
        let dest = self.read_rows(&self.target).await?;
        let got = self.digests(&dest);
        Ok(digests
            .iter()
            .all(|(t, h)| h == "-" || got.get(t) == Some(h)))
    }

    /// Runs the source cutover. Returns (hit, committed-recorded).
    ///
    /// `pending`: journal `cutover_pending` first (a fresh copy was just
    /// verified). When the journal lives in the source's database, the
    /// journal write joins the cutover batch as its last statement instead:
    /// it records `committed` when the batch archived the rows and
    /// `cutover_pending` otherwise, and writes nothing when the operation
    /// is no longer this mover's (the archive insert is guarded by the same
    /// owner, so such a batch writes nothing at all).
    ///
    /// `held`: the operation may hold the key's writes on the source (the
    /// batch then deletes the hold when it archives the key).
    async fn cutover(&self, snap: &Snapshot, pending: bool, held: bool) -> Result<(bool, bool)> {
        let with_commit = self.r.journal.as_deref() == Some(self.source.as_str());
        if pending && !with_commit {
            self.step(MoveState::CutoverPending, Change::default())
                .await?;
        }
        let (name, shard) = self.r.shard_named(&self.source)?;
        let d = shard.dialect();
        let mut tables = Vec::with_capacity(self.specs.len());
        for (spec, row) in self.specs.iter().zip(snap) {
            tables.push(CutoverTable {
                table: spec.name.clone(),
                key_col: spec.key_col.clone(),
                row: row.as_ref().map(row_idents).transpose()?,
                payload: row.as_ref().map(value::encode_row),
                digest: value::digest(row.as_ref()),
            });
        }
        let c = Cutover {
            op_id: &self.op_id,
            scope: &self.r.scope,
            key: &self.key,
            moved_to: &self.target,
            now_ms: self.r.now(),
            tables: &tables,
            journal_owner: with_commit.then_some(self.guard.owner.as_str()),
        };
        // Tables outside the move must still hold no row of the key: a row
        // inserted there meanwhile would be stranded by the cutover.
        let absent: Vec<_> = self
            .others()
            .await?
            .into_iter()
            .map(|t| (t.name, t.key_col))
            .collect();
        let mut stmts = d.cutover_batch_guarded(&c, &absent);
        // The write hold (if any) ends with the cutover that archived the
        // key, in its batch; a missed cutover keeps it for the next copy.
        if held {
            stmts.push(d.hold_release_archived(&self.op_id, &self.key));
        }
        if with_commit {
            let change = Change {
                committed_if_archived: Some(self.key.clone()),
                ..Change::default()
            };
            stmts.push(self.update(MoveState::CutoverPending, &change)?);
        }
        let counts = shard
            .batch(&stmts)
            .await
            .map_err(|e| MigrationError::shard(name, e))?;
        if with_commit && counts.last().copied().unwrap_or(0) == 0 {
            return Err(self.fenced());
        }
        let hit = counts.first().copied().unwrap_or(0) > 0;
        Ok((hit, hit && with_commit))
    }

    /// Whether the source holds this operation's archive rows.
    pub(crate) async fn archive_exists(&self) -> Result<bool> {
        Ok(!self.archive_rows(false).await?.is_empty())
    }

    /// This operation's archive rows on the source (`tname`, and `payload`
    /// when `payloads`).
    async fn archive_rows(&self, payloads: bool) -> Result<Vec<Row>> {
        let (name, shard) = self.r.shard_named(&self.source)?;
        let st = shard.dialect().op_archive(&self.key, &self.op_id, payloads);
        shard
            .query(&st)
            .await
            .map_err(|e| MigrationError::shard(name, e))
    }

    /// The snapshot this operation archived on the source (its payloads).
    pub(crate) async fn archived_snapshot(&self) -> Result<Snapshot> {
        let rows = self.archive_rows(true).await?;
        let mut out = vec![None; self.specs.len()];
        for r in &rows {
            let t = crate::journal::text(r, "tname")?;
            let Some(i) = self.specs.iter().position(|s| s.name.as_str() == t) else {
                continue;
            };
            if let Some(Value::Blob(b)) = r.get("payload") {
                out[i] = Some(value::decode_row(b)?);
            }
        }
        Ok(out)
    }

    async fn publish(&self, snap: &Snapshot) -> Result<()> {
        let (name, shard) = self.r.shard_named(&self.target)?;
        let d = shard.dialect();
        let tnames: Vec<&crate::dialect::Ident> = self.specs.iter().map(|s| &s.name).collect();
        // One batch on the destination: re-insert a copy that went missing
        // while the destination still fenced the key (a verify repair that
        // read the key's claim before this move took it can take the copy
        // for a ghost behind the old tombstone), then lift the destination's
        // old tombstones of the key (from an earlier move away from it), if
        // any: only now, after the source cutover, may writes land there.
        // The same batch deletes this operation's in-flight markers: the
        // copy becomes the key's row for routed reads, writes and probes at
        // once (the source is cut over, so nothing else is).
        let mut stmts = Vec::with_capacity(self.specs.len() + 2);
        for (spec, row) in self.specs.iter().zip(snap) {
            if let Some(row) = row {
                let cols = row_idents(row)?;
                stmts.push(d.insert_row_absent(
                    &spec.name,
                    &spec.key_col,
                    &self.key,
                    (&cols, true),
                ));
            }
        }
        let restores = stmts.len();
        stmts.push(d.in_flight_clear(&self.op_id, &self.key));
        stmts.push(d.tombstone_lift(&tnames, &self.key));
        let counts = shard
            .batch(&stmts)
            .await
            .map_err(|e| MigrationError::shard(name, e))?;
        if counts.iter().take(restores).any(|n| *n > 0) {
            tracing::warn!(
                event = "durability.migration.copy_restored",
                op_id = %self.op_id,
                key = %self.key,
                "a copy removed before publish was restored from the snapshot"
            );
        }
        self.r
            .mapping
            .put(&self.key, &self.target)
            .await
            .map_err(MigrationError::MappingUnavailable)?;
        self.r.cache_set(&self.key, &self.target);
        if self.r.computed() {
            self.r.publish_placement(&self.key, &self.target).await?;
        }
        Ok(())
    }

    /// Removes this operation's copies from the destination: any row of the
    /// key in a moved table still under the operation's in-flight marker
    /// (nothing routed can have written it since the copy, so it is this
    /// operation's copy, whatever the mapping says: a mapping restored to a
    /// shard the key once left may name the destination), and, unless the
    /// key is routed there, rows equal to the journaled snapshot; then, in
    /// the same batch, the markers.
    pub(crate) async fn drop_copies(&self, digests: &BTreeMap<String, String>) -> Result<usize> {
        let (name, shard) = self.r.shard_named(&self.target)?;
        let d = shard.dialect();
        let mut stmts = Vec::new();
        let routed_there =
            self.r.mapping_fresh(&self.key).await?.as_deref() == Some(self.target.as_str());
        let dest = self.read_rows(&self.target).await?;
        for (spec, row) in self.specs.iter().zip(&dest) {
            let Some(row) = row else { continue };
            if !routed_there && digests.get(spec.name.as_str()) == Some(&value::digest(Some(row))) {
                stmts.push(d.delete_matching(
                    &spec.name,
                    &spec.key_col,
                    &self.key,
                    &row_idents(row)?,
                ));
            }
            stmts.push(d.delete_marked(&spec.name, &spec.key_col, &self.key, &self.op_id));
        }
        let deletes = stmts.len();
        stmts.push(d.in_flight_clear(&self.op_id, &self.key));
        let counts = shard
            .batch(&stmts)
            .await
            .map_err(|e| MigrationError::shard(name, e))?;
        Ok(counts.iter().take(deletes).filter(|c| **c > 0).count())
    }

    /// Aborts: drops the destination copies, then journals `aborted` and
    /// releases the claim. Returns the `MIGRATION_ABORTED` error to report.
    pub(crate) async fn abort(
        &self,
        digests: &BTreeMap<String, String>,
        reason: &str,
    ) -> Result<MigrationError> {
        self.abort_counted(digests, reason).await?;
        Ok(MigrationError::Aborted {
            key: self.key.clone(),
            reason: reason.to_owned(),
        })
    }

    /// [`MoveCtx::abort`], returning how many destination rows it dropped.
    pub(crate) async fn abort_counted(
        &self,
        digests: &BTreeMap<String, String>,
        reason: &str,
    ) -> Result<usize> {
        let dropped = self.drop_copies(digests).await?;
        self.release_hold().await;
        self.end_aborted(reason, "move aborted").await?;
        Ok(dropped)
    }

    /// Holds the key's writes on the source until `cutover_hold_ms` from
    /// now (one statement batch, replacing an earlier hold of this
    /// operation). Returns the deadline.
    async fn take_hold(&self) -> Result<i64> {
        let (name, shard) = self.r.shard_named(&self.source)?;
        let d = shard.dialect();
        let until = self
            .r
            .now()
            .saturating_add(i64::try_from(self.r.cutover_hold_ms).unwrap_or(i64::MAX));
        let hold = crate::dialect::Hold {
            until_ms: until,
            owner: &self.guard.owner,
            hold_ms: i64::try_from(self.r.cutover_hold_ms).unwrap_or(i64::MAX),
        };
        shard
            .batch(&d.hold_take(&self.op_id, &self.r.scope, &self.key, hold))
            .await
            .map_err(|e| MigrationError::shard(name, e))?;
        tracing::debug!(
            event = "durability.migration.hold_taken",
            op_id = %self.op_id,
            key = %self.key,
            until_ms = until,
            "holding the key's writes on the source for the final copy"
        );
        Ok(until)
    }

    /// Deletes this operation's write hold on the source. Best effort: a
    /// hold left behind ends at its deadline (the next routed write there
    /// removes it).
    async fn release_hold(&self) {
        let Ok((name, shard)) = self.r.shard_named(&self.source) else {
            return;
        };
        let d = shard.dialect();
        if let Err(e) = shard.execute(&d.hold_release(&self.op_id, &self.key)).await {
            tracing::warn!(
                event = "durability.migration.hold_release_failed",
                op_id = %self.op_id,
                key = %self.key,
                shard = name,
                error = %e,
                "write hold not released; it ends at its deadline"
            );
        }
    }

    /// Runs the move from `stage` with the journaled snapshot `snap`.
    /// Returns the number of re-copies, or `MIGRATION_ABORTED`.
    pub(crate) async fn run(
        &self,
        mut snap: Snapshot,
        mut attempts: i64,
        mut stage: Stage,
    ) -> Result<i64> {
        // The digests of the copy before the current one (its rows are
        // superseded by the next copy, unless that copy is refused).
        let mut previous: Option<BTreeMap<String, String>> = None;
        // The deadline of this run's write hold on the source, once taken.
        let mut hold_until: Option<i64> = None;
        let committed = loop {
            let digests = self.digests(&snap);
            let mut hit = (false, false);
            if stage == Stage::Copy {
                match self.copy(&snap).await {
                    Ok(()) => {}
                    Err(e @ MigrationError::CopyRejected { .. }) => {
                        // The destination can never hold this snapshot:
                        // abort (dropping earlier copies, releasing the
                        // claim) instead of leaving the key claimed.
                        if let Some(p) = &previous {
                            self.drop_copies(p).await?;
                        }
                        self.abort(&digests, &e.to_string()).await?;
                        return Err(e);
                    }
                    Err(e) => return Err(e),
                }
                if self.destination_matches(&digests).await? {
                    // Copied and verified: `cutover_pending` lands after the
                    // copy and the digest comparison and before the cutover
                    // (in the cutover's batch when the journal shares the
                    // source's database). A crash before it leaves
                    // `prepared`, which recovery treats exactly as `copied`
                    // and `verified`: start over from a fresh snapshot.
                    hit = self
                        .cutover(&snap, true, !self.fresh || hold_until.is_some())
                        .await?;
                }
            } else {
                hit = self
                    .cutover(&snap, false, !self.fresh || hold_until.is_some())
                    .await?;
            }
            if hit.0 {
                break hit.1;
            }
            attempts += 1;
            tracing::debug!(
                event = "durability.migration.cutover_missed",
                op_id = %self.op_id,
                attempts,
                "cutover batch missed; retrying"
            );
            if attempts > MAX_RECOPIES {
                return Err(self.abort(&digests, "copies used up").await?);
            }
            // A write changed the row since the snapshot: hold the key's
            // writes on the source for the final copy (bounded by the
            // configured window on the injected clock), so a key under
            // constant writes still moves.
            if self.r.cutover_hold_ms > 0 {
                match hold_until {
                    None => hold_until = Some(self.take_hold().await?),
                    Some(until) if self.r.now() >= until => {
                        return Err(self.abort(&digests, "cutover hold expired").await?);
                    }
                    Some(_) => {}
                }
            }
            let fresh = self.snapshot().await?;
            if fresh.iter().all(Option::is_none) {
                return Err(self.abort(&digests, "source row gone").await?);
            }
            let elsewhere = self.rows_elsewhere().await?;
            if !elsewhere.is_empty() {
                let reason = format!("rows appeared in tables outside the move: {elsewhere:?}");
                return Err(self.abort(&digests, &reason).await?);
            }
            // A value the destination can never store: abort while the
            // journal still holds the digests of the copy that landed.
            if let Err(e) = self.check_storable(&fresh) {
                self.abort(&digests, &e.to_string()).await?;
                return Err(e);
            }
            // The previous copy is superseded by the next one (delete + insert).
            let change = Change {
                attempts: Some(attempts),
                digests: Some(crate::journal::encode_digests(&self.digests(&fresh))),
                ..Change::default()
            };
            self.step(MoveState::Prepared, change).await?;
            previous = Some(digests);
            snap = fresh;
            stage = Stage::Copy;
        };
        if !committed {
            self.step(MoveState::Committed, Change::default()).await?;
        }
        self.finish(Some(&snap)).await?;
        Ok(attempts)
    }

    /// From `committed` (or `published`): publish, then retire and release.
    ///
    /// `snap`: the snapshot the cutover archived (`None`: read it back from
    /// the archive).
    pub(crate) async fn finish(&self, snap: Option<&Snapshot>) -> Result<()> {
        match snap {
            Some(s) => self.publish(s).await?,
            None => self.publish(&self.archived_snapshot().await?).await?,
        }
        let retire_at_ms = Some(self.r.now().saturating_add(self.retain_ms));
        // Published (the mapping is written), retired and the claim released
        // in one write.
        let change = Change {
            retire_at_ms,
            ..Change::default()
        };
        self.end_with(MoveState::Retired, change).await?;
        tracing::info!(
            event = "durability.migration.moved",
            op_id = %self.op_id,
            key = %self.key,
            target = %self.target,
            "key moved"
        );
        Ok(())
    }
}

/// Marks an operation as driven by a task of this router until dropped.
struct Running<'r> {
    r: &'r Core,
    op_id: String,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.r
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.op_id);
    }
}

impl Core {
    /// Marks `op_id` as driven by the calling task; `None` when another task
    /// of this router drives it already.
    fn drive(&self, op_id: &str) -> Option<Running<'_>> {
        let fresh = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(op_id.to_owned());
        fresh.then(|| Running {
            r: self,
            op_id: op_id.to_owned(),
        })
    }

    /// The key's active operation, resumed when this router started it, no
    /// task of this router drives it now, and it moves the same tables to
    /// the same target; otherwise `MIGRATION_ALREADY_ACTIVE`.
    async fn resume_own(&self, key: &str, target: &str, tables: &[String]) -> Result<MoveOutcome> {
        let busy = || MigrationError::AlreadyActive(key.to_owned());
        let (jname, js, q) = self.journal()?;
        let holders = js
            .query(&q.claim_holder(key))
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        let Some(holder) = holders.first() else {
            return Err(busy());
        };
        let op_id = crate::journal::text(holder, "op_id")?;
        let Some(op) = self.load_op(&op_id).await? else {
            return Err(busy());
        };
        // A move fences every configured table on both shards (it takes
        // the others along, empty): the same call asks for a subset of them.
        if op.owner != self.instance
            || op.target != target
            || !tables.iter().all(|t| op.tables.contains(t))
        {
            return Err(busy());
        }
        let Some(_running) = self.drive(&op.op_id) else {
            return Err(busy());
        };
        tracing::info!(
            event = "durability.migration.resumed",
            op_id = %op.op_id,
            key,
            state = op.state.as_str(),
            "resuming an interrupted move"
        );
        let guard = Guard {
            owner: self.instance.clone(),
            lease: None,
        };
        let ctx = MoveCtx::from_op(self, &op, guard.clone())?;
        match self.resume(&ctx, &op, &guard).await? {
            Resumed::Committed(recopies) => Ok(MoveOutcome {
                op_id: op.op_id.clone(),
                source: op.source.clone(),
                target: op.target.clone(),
                recopies,
            }),
            Resumed::Aborted(e) => Err(e),
            Resumed::Finished => Err(busy()),
        }
    }

    /// Where a move of `key` starts: the shard its mapping names, or under
    /// computed placement with no mapping the shard holding its row.
    async fn move_source(&self, key: &str, specs: &[TableSpec]) -> Result<String> {
        if let Some(s) = self.mapping_fresh(key).await? {
            return Ok(s);
        }
        if !self.computed() {
            return Err(MigrationError::MappingNotFound(key.to_owned()));
        }
        let m = self.manifest_for_write().await?;
        for spec in specs {
            if let Some(s) = self.probe_key(&m, key, spec).await? {
                return Ok(s);
            }
        }
        Err(MigrationError::RowNotFound(key.to_owned()))
    }

    /// [`Core::columns_fresh`] of every table on `shard`, concurrently; the
    /// first table's error in `specs` order.
    async fn columns_fresh_all(&self, shard: &str, specs: &[TableSpec]) -> Result<()> {
        futures::future::join_all(specs.iter().map(|spec| self.columns_fresh(shard, spec)))
            .await
            .into_iter()
            .try_for_each(|r| r.map(drop))
    }

    /// See [`Router::reassign_keys_with`](crate::Router::reassign_keys_with).
    pub(crate) async fn reassign_keys_with(
        &self,
        key: &str,
        target: &str,
        tables: &[&str],
        opts: MoveOptions,
    ) -> Result<MoveOutcome> {
        let span = tracing::debug_span!(
            "durability.migration.move",
            scope = %self.scope,
            key,
            target
        );
        let started = self.now();
        let result = async {
            let specs = self.move_specs(key, tables)?;
            self.reassign_specs(key, target, specs, opts).await
        }
        .instrument(span)
        .await;
        let outcome = crate::metrics::outcome(&result);
        crate::metrics::record_move(outcome, self.now().saturating_sub(started));
        tracing::debug!(
            event = "durability.migration.move_finished",
            key,
            target,
            outcome,
            "reassign call finished"
        );
        result
    }

    /// The specs of the move of `key` over `tables` (each once), after
    /// checking the key and that there is a table.
    fn move_specs(&self, key: &str, tables: &[&str]) -> Result<Vec<TableSpec>> {
        config::validate_key(key)?;
        if tables.is_empty() {
            return Err(MigrationError::UnknownTable(String::new()));
        }
        let mut specs: Vec<TableSpec> = Vec::new();
        for t in tables {
            let spec = self.table(t)?.clone();
            if !specs.contains(&spec) {
                specs.push(spec);
            }
        }
        Ok(specs)
    }

    /// Moves `key`'s rows of `specs` to `target`.
    async fn reassign_specs(
        &self,
        key: &str,
        target: &str,
        specs: Vec<TableSpec>,
        opts: MoveOptions,
    ) -> Result<MoveOutcome> {
        self.shard_named(target)?;
        let (jname, js, q) = self.journal()?;
        let jname = jname.to_owned();
        self.check_movable(&jname)?;
        self.check_movable(target)?;
        let names: Vec<String> = specs.iter().map(|s| s.name.as_str().to_owned()).collect();
        // The reads before the claim do not depend on each other (except the
        // source's on the mapping), so they run concurrently; each result is
        // then checked in this order, so the error reported does not depend
        // on which read answered first. The claim's insert is the guard:
        // none of these reads needs to precede another.
        let (source, target_cols) = futures::join!(
            self.move_source(key, &specs),
            self.columns_fresh_all(target, &specs),
        );
        let source = source?;
        if source == target {
            // This router's own interrupted move may have published already.
            return match self.resume_own(key, target, &names).await {
                Err(MigrationError::AlreadyActive(_)) => Err(MigrationError::SameShard {
                    key: key.to_owned(),
                    shard: source,
                }),
                other => other,
            };
        }
        self.check_movable(&source)?;
        target_cols?;
        // A key has one active operation: a move while another holds the
        // claim gets the conflict code (or resumes this router's own). The
        // claim's insert finds a held claim; a refusal before it first asks
        // whether one is held (a held claim comes first, as if it had been
        // read here), so a move that finds nothing wrong reads no claim.
        let refuse = async |e: MigrationError| -> Result<MoveOutcome> {
            if self.claim_held(key).await? {
                self.resume_own(key, target, &names).await
            } else {
                Err(e)
            }
        };
        let retain_ms = match opts.retire {
            Retire::After(ms) => i64::try_from(ms).unwrap_or(i64::MAX),
            Retire::Immediate => 0,
        };
        let now = self.now();
        let op_id = uuid::Uuid::now_v7().to_string();
        let mut ctx = MoveCtx {
            r: self,
            guard: Guard {
                owner: self.instance.clone(),
                lease: None,
            },
            op_id: op_id.clone(),
            key: key.to_owned(),
            specs,
            source: source.clone(),
            target: target.to_owned(),
            retain_ms,
            fresh: true,
        };
        // The source's side: the snapshot and the checks before the claim.
        let snap = match ctx.claimable_snapshot().await {
            Ok(snap) => snap,
            Err(e) => return refuse(e).await,
        };
        let op = OpRecord {
            op_id: op_id.clone(),
            scope: self.scope.clone(),
            key: key.to_owned(),
            tables: ctx
                .specs
                .iter()
                .map(|s| s.name.as_str().to_owned())
                .collect(),
            source: source.clone(),
            target: target.to_owned(),
            state: MoveState::Prepared,
            attempts: 0,
            digests: ctx.digests(&snap),
            owner: self.instance.clone(),
            live_until_ms: now.saturating_add(i64::try_from(MOVE_LIVENESS_MS).unwrap_or(i64::MAX)),
            retain_ms,
            retire_at_ms: None,
            created_ms: now,
            updated_ms: now,
            finished_ms: None,
            purged: false,
            verified: false,
            error: None,
        };
        // Driven by this task from before its claim lands, so no other task
        // of this router takes it for an interrupted move of its own.
        let _running = self.drive(&op_id);
        // The claim and `prepared` are one statement; when the journal
        // shares the source's database, with the check that no concurrent
        // move cut the key over since the snapshot. One statement suffices
        // on every proven dialect: a winner commits its cutover's tombstone
        // before the write that releases its claim, both in this database,
        // and the statement reads both from one view (SQLite under its
        // write lock; PostgreSQL from one snapshot; MariaDB/MySQL by
        // locking reads of the latest rows): a view in which the claim is
        // free holds the tombstone. A claim taken since the check above:
        // the conflict code (or this router's own move, resumed).
        let fold = self.journal.as_deref() == Some(source.as_str());
        let tnames: Vec<&crate::dialect::Ident> = ctx.specs.iter().map(|s| &s.name).collect();
        match js
            .batch(&[q.insert_op(&op, fold.then_some(tnames.as_slice()))])
            .await
        {
            Ok(counts) if counts.first().copied().unwrap_or(0) > 0 => {}
            // Nothing inserted: a claim is held (the conflict code, or this
            // router's own move resumed), or, folded, a concurrent move cut
            // the key over (the conflict code).
            Ok(_) if fold && !self.claim_held(key).await? && ctx.moved_away().await? => {
                return Err(MigrationError::AlreadyActive(key.to_owned()));
            }
            Ok(_) => return self.resume_own(key, target, &op.tables).await,
            Err(e) => {
                // A racing claim trips the unique claim index; report it as such.
                let holders = js.query(&q.claim_holder(key)).await.unwrap_or_default();
                if !holders.is_empty() {
                    return Err(MigrationError::AlreadyActive(key.to_owned()));
                }
                return Err(MigrationError::shard(&jname, e));
            }
        }
        // A concurrent move of the key that finished between this call's
        // snapshot and its claim has cut the source over (its claim is
        // released, so ours landed): our snapshot is stale and the key's
        // row is elsewhere. End the operation before any write outside the
        // journal (a copy would overwrite the winner's row) and report the
        // conflict.
        if !fold && ctx.moved_away().await? {
            ctx.end_aborted(
                "the key was moved by a concurrent operation",
                "move aborted before its copy",
            )
            .await?;
            return Err(MigrationError::AlreadyActive(key.to_owned()));
        }
        let recopies = ctx.run(snap, 0, Stage::Copy).await?;
        Ok(MoveOutcome {
            op_id,
            source,
            target: target.to_owned(),
            recopies,
        })
    }

    /// See [`Router::get_migration_status`](crate::Router::get_migration_status).
    pub(crate) async fn get_migration_status(
        &self,
        key: &str,
        table: &str,
    ) -> Result<Option<OpRecord>> {
        config::validate_key(key)?;
        for op in self.key_ops(key).await? {
            if op.tables.iter().any(|t| t == table) {
                return Ok(Some(op));
            }
        }
        Ok(None)
    }
}
