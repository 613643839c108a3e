//! `verify_migrations` (leftovers of stalled writers, with optional repair),
//! retention and `purge_retired`. Both stream the journal and the tombstone
//! tables in pages.

use std::collections::{BTreeSet, HashSet};

use crate::dialect::{names, row_idents};
use crate::error::{MigrationError, Result};
use crate::journal::{MoveState, OpFilter, OpRecord};
use crate::recovery::RecoveryReport;
use crate::republish::Home;
use crate::router::{Core, OpPages};
use crate::status::Progress;
use crate::value::{self, Value};

/// Most entries kept in each list of a report (counts stay exact).
pub const MAX_REPORT_ENTRIES: usize = 1000;

/// Options of [`Router::verify_migrations`](crate::Router::verify_migrations).
#[derive(Debug, Clone, Copy)]
pub struct VerifyOptions {
    /// Run recovery first (taking the lease) and repair what can be proven.
    pub repair: bool,
    /// Rows read per page.
    pub page_size: usize,
    /// Examine every finished operation and every tombstone on every shard
    /// (finding tombstones without a journal record, and leftovers written
    /// after an earlier pass examined their move), instead of only the
    /// operations no pass has examined yet and the keys the last pass found
    /// something on.
    pub full: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        Self {
            repair: false,
            page_size: 500,
            full: false,
        }
    }
}

/// A row-level leftover.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Leftover {
    /// The shard holding it.
    pub shard: String,
    /// The table.
    pub table: String,
    /// The key.
    pub key: String,
    /// The operation it belongs to.
    pub op_id: String,
}

/// A key whose mapping disagrees with the journal: the key's newest
/// finished move put it on `expected`, the mapping store says `found` (its
/// publish was lost: a failover, a restore).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MappingMismatch {
    /// The key.
    pub key: String,
    /// The key's newest finished (retired) operation.
    pub op_id: String,
    /// Its target: where the key lives.
    pub expected: String,
    /// What the mapping store holds (`None`: no mapping).
    pub found: Option<String>,
}

/// A tombstone whose move the journal ended as aborted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StaleCutover {
    /// Where.
    pub leftover: Leftover,
    /// Whether repair can restore the archived row.
    pub restorable: bool,
}

/// What verification found (after repair, what remains).
///
/// Each list keeps its first [`MAX_REPORT_ENTRIES`] entries; the matching
/// `*_count` field is the exact total.
#[derive(Debug, serde::Serialize)]
pub struct VerifyReport {
    /// Operations still active in the journal (first entries).
    pub dangling_ops: Vec<String>,
    /// Live rows on a shard that also holds a live tombstone for the key
    /// (first entries).
    pub ghosts: Vec<Leftover>,
    /// Tombstones with no journal record (first entries).
    pub stranded_archives: Vec<Leftover>,
    /// Rows on the destination of an aborted move equal to the journaled row,
    /// on a shard the key does not live on by its mapping or by the
    /// journal's newest finished move (first entries).
    pub stranded_copies: Vec<Leftover>,
    /// Tombstones whose move was aborted (first entries).
    pub stale_cutovers: Vec<StaleCutover>,
    /// Keys whose mapping disagrees with their newest finished move (first
    /// entries; repair publishes the move's target again).
    pub mapping_mismatches: Vec<MappingMismatch>,
    /// In-flight markers of finished moves (first entries): the publish and
    /// the abort delete a move's markers in the batch that ends its copy's
    /// fence, so one found later was written after that by a stalled
    /// mover's stale copy batch (or a hand edit, a partial restore). It
    /// fails the key's routed writes on that shard with
    /// `MIGRATION_CUTOVER_PENDING`, and the row under it may be one the
    /// application deleted since (the seed's undetectable case). Repair
    /// removes an aborted move's late copy and its marker; it leaves a
    /// retired move's, which the operator decides on ([`crate::docs::verify`]).
    pub leftover_markers: Vec<Leftover>,
    /// What repair changed (first entries).
    pub repaired: Vec<String>,
    /// Exact number of dangling operations.
    pub dangling_count: u64,
    /// Exact number of ghosts.
    pub ghost_count: u64,
    /// Exact number of stranded archives.
    pub stranded_archive_count: u64,
    /// Exact number of stranded copies.
    pub stranded_copy_count: u64,
    /// Exact number of stale cutovers.
    pub stale_cutover_count: u64,
    /// Exact number of mapping mismatches.
    pub mapping_mismatch_count: u64,
    /// Exact number of leftover in-flight markers.
    pub leftover_marker_count: u64,
    /// Exact number of repairs.
    pub repaired_count: u64,
    /// Nothing remains to report.
    pub clean: bool,
    /// The recovery `repair` ran first.
    pub recovery: Option<RecoveryReport>,
    /// Every key something was reported on: purge refuses only these
    /// keys' operations after an unclean pass. `None` once more than
    /// [`MAX_UNCLEAN_KEYS`] were found: such a pass is not recorded (purge
    /// then needs a clean pass), which keeps a pass's memory bounded.
    #[serde(skip)]
    pub(crate) unclean_keys: Option<BTreeSet<String>>,
}

/// Most keys an unclean pass remembers for purge (see
/// [`Router::purge_retired`](crate::Router::purge_retired)); a pass that finds more covers nothing.
pub(crate) const MAX_UNCLEAN_KEYS: usize = 10_000;

impl Default for VerifyReport {
    fn default() -> Self {
        Self {
            dangling_ops: Vec::new(),
            ghosts: Vec::new(),
            stranded_archives: Vec::new(),
            stranded_copies: Vec::new(),
            stale_cutovers: Vec::new(),
            mapping_mismatches: Vec::new(),
            leftover_markers: Vec::new(),
            repaired: Vec::new(),
            dangling_count: 0,
            ghost_count: 0,
            stranded_archive_count: 0,
            stranded_copy_count: 0,
            stale_cutover_count: 0,
            mapping_mismatch_count: 0,
            leftover_marker_count: 0,
            repaired_count: 0,
            clean: false,
            recovery: None,
            unclean_keys: Some(BTreeSet::new()),
        }
    }
}

impl VerifyReport {
    pub(crate) fn flag(&mut self, key: &str) {
        let Some(keys) = &mut self.unclean_keys else {
            return;
        };
        if keys.contains(key) {
            return;
        }
        if keys.len() >= MAX_UNCLEAN_KEYS {
            self.unclean_keys = None;
        } else {
            keys.insert(key.to_owned());
        }
    }
}

/// One refused purge (its error serializes as `{code, message}`).
#[derive(Debug, serde::Serialize)]
pub struct Refusal {
    /// The operation.
    pub op_id: String,
    /// `RETENTION_NOT_ELAPSED` or `NOT_VERIFIED`.
    #[serde(serialize_with = "crate::status::serialize_error")]
    pub error: MigrationError,
}

/// What `purge_retired` did.
#[derive(Debug, Default, serde::Serialize)]
pub struct PurgeReport {
    /// Operations whose archived payload was cleared (first 1000).
    pub purged: Vec<String>,
    /// Operations refused (first 1000).
    pub refused: Vec<Refusal>,
    /// Exact number of operations purged.
    pub purged_count: u64,
    /// Exact number of operations refused.
    pub refused_count: u64,
    /// Journal rows deleted by the compaction: purged operations, and
    /// aborted ones a pass examined whose retention elapsed.
    pub compacted_count: u64,
}

fn push_capped<T>(v: &mut Vec<T>, x: T) {
    if v.len() < MAX_REPORT_ENTRIES {
        v.push(x);
    }
}

/// Counts `x` in `n` (exact) and keeps it in `v` (the first entries only).
fn push_counted<T>(v: &mut Vec<T>, n: &mut u64, x: T) {
    *n += 1;
    push_capped(v, x);
}

impl VerifyReport {
    /// Records one repair (`what` was done).
    fn repaired(&mut self, what: String) {
        push_counted(&mut self.repaired, &mut self.repaired_count, what);
    }
}

struct Tomb {
    op_id: String,
    table: String,
    key: String,
    payload: Option<Vec<u8>>,
    digest: String,
    superseded: bool,
}

impl Tomb {
    /// This tombstone's row as a leftover on `shard`.
    fn leftover(&self, shard: &str) -> Leftover {
        Leftover {
            shard: shard.to_owned(),
            table: self.table.clone(),
            key: self.key.clone(),
            op_id: self.op_id.clone(),
        }
    }

    fn from_row(r: &value::Row) -> Result<Self> {
        Ok(Self {
            op_id: crate::journal::text(r, "op_id")?,
            table: crate::journal::text(r, "tname")?,
            key: crate::journal::text(r, "mkey")?,
            payload: match r.get("payload") {
                Some(Value::Blob(b)) => Some(b.clone()),
                _ => None,
            },
            digest: crate::journal::text(r, "digest")?,
            superseded: crate::journal::int(r, "superseded")? != 0,
        })
    }
}

/// The shards an operation's tombstones and markers live on: its source
/// and its destination.
fn op_shards(op: &OpRecord) -> Vec<&str> {
    let mut shards = vec![op.source.as_str()];
    if op.target != op.source {
        shards.push(op.target.as_str());
    }
    shards
}

/// Operations marked verified per statement.
const MARK_CHUNK: usize = 200;

impl Core {
    /// Whether an active operation holds `key`'s claim (a move of the key is
    /// in flight: its rows cannot be judged, and repair leaves them alone).
    pub(crate) async fn claim_held(&self, key: &str) -> Result<bool> {
        let rows = self.journal_query(|q| q.claim_holder(key)).await?;
        Ok(!rows.is_empty())
    }

    /// A repair's delete of a row equal to `cols` on `shard_name`, which
    /// re-checks in the same statement what can be checked there: that the
    /// tombstone `tomb` (op id, table) is still live, and, when the journal
    /// shares the shard's database, that no operation holds the key's claim.
    fn repair_delete(
        &self,
        shard_name: &str,
        spec: &crate::config::TableSpec,
        key: &str,
        cols: &[(crate::dialect::Ident, Value)],
        tomb: Option<(&str, &str)>,
    ) -> Result<crate::shard::Statement> {
        let (_, shard) = self.shard_named(shard_name)?;
        let claim_scope =
            (self.journal.as_deref() == Some(shard_name)).then_some(self.scope.as_str());
        Ok(shard
            .dialect()
            .repair_delete(&spec.name, &spec.key_col, key, cols, tomb, claim_scope))
    }

    /// See [`Router::verify_migrations`](crate::Router::verify_migrations).
    pub(crate) async fn verify_migrations(&self, opts: VerifyOptions) -> Result<VerifyReport> {
        let quiet = |_: Progress| {};
        self.verify_migrations_observed(opts, &quiet).await
    }

    /// See [`Router::verify_migrations_observed`](crate::Router::verify_migrations_observed).
    pub(crate) async fn verify_migrations_observed(
        &self,
        opts: VerifyOptions,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<VerifyReport> {
        self.journal_shard()?;
        // A clean pass covers the moves that finished before it started:
        // one that finished while it ran may not have been examined, so the
        // clean stamp is the start time, never the end.
        let started = self.now();
        let page = opts.page_size.clamp(1, 10_000);
        let mut report = VerifyReport::default();
        let lease = if opts.repair {
            let lease = self.acquire_lease().await?;
            match self.recover_with(&lease).await {
                Ok(r) => report.recovery = Some(r),
                Err(e) => {
                    if !matches!(e, MigrationError::RecoveryFenced(_)) {
                        self.release_lease(&lease).await;
                    }
                    return Err(e);
                }
            }
            Some(lease)
        } else {
            None
        };
        let res = self
            .verify_scan(&mut report, opts, page, lease.as_ref(), progress)
            .await;
        if let Some(l) = &lease
            && !matches!(res, Err(MigrationError::RecoveryFenced(_)))
        {
            self.release_lease(l).await;
        }
        let examined = res?;
        report.clean = report.dangling_ops.is_empty()
            && report.ghosts.is_empty()
            && report.stranded_archives.is_empty()
            && report.stranded_copies.is_empty()
            && report.stale_cutovers.is_empty()
            && report.mapping_mismatches.is_empty()
            && report.leftover_markers.is_empty();
        {
            // The pass and the keys it found something on, in one batch: an
            // unclean pass still covers every other key's finished moves
            // (one stuck operation does not block purge of the others).
            let (jname, js, q) = self.journal()?;
            let mut stmts = match &report.unclean_keys {
                Some(keys) => q.pass_set(started, keys),
                None => Vec::new(),
            };
            if report.clean {
                stmts.extend(q.meta_set(started));
            }
            if !stmts.is_empty() {
                js.batch(&stmts)
                    .await
                    .map_err(|e| MigrationError::shard(jname, e))?;
            }
            // The examined operations whose key the pass found nothing on
            // (none when the pass found too many keys to remember).
            if let Some(unclean) = &report.unclean_keys {
                let fine: Vec<String> = examined
                    .into_iter()
                    .filter(|(_, key)| !unclean.contains(key))
                    .map(|(op, _)| op)
                    .collect();
                for chunk in fine.chunks(MARK_CHUNK) {
                    js.execute(&q.mark_verified(chunk))
                        .await
                        .map_err(|e| MigrationError::shard(jname, e))?;
                }
            }
        }
        if !report.clean {
            tracing::warn!(
                event = "durability.migration.verify_unclean",
                dangling = report.dangling_count,
                ghosts = report.ghost_count,
                stranded_archives = report.stranded_archive_count,
                stranded_copies = report.stranded_copy_count,
                stale_cutovers = report.stale_cutover_count,
                mapping_mismatches = report.mapping_mismatch_count,
                "verification found inconsistencies"
            );
        }
        Ok(report)
    }

    /// The pass's scan; returns the finished operations it examined
    /// (op id, key), read after they finished.
    async fn verify_scan(
        &self,
        report: &mut VerifyReport,
        opts: VerifyOptions,
        page: usize,
        lease: Option<&crate::recovery::Lease>,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<Vec<(String, String)>> {
        let repair = opts.repair;
        let tell = |phase, done: &mut u64, n: usize, report: &VerifyReport| {
            *done += n as u64;
            progress(Progress {
                phase,
                done: *done,
                changed: report.repaired_count,
            });
        };
        let (jname, js, q) = self.journal()?;
        // Dangling operations.
        let mut pages = OpPages::new(OpFilter::Active, page);
        let mut done = 0;
        while let Some(rows) = self.next_ops(&mut pages).await? {
            for r in &rows {
                push_counted(
                    &mut report.dangling_ops,
                    &mut report.dangling_count,
                    crate::journal::text(r, "op_id")?,
                );
                report.flag(&crate::journal::text(r, "mkey")?);
            }
            tell("operations", &mut done, rows.len(), report);
        }
        // Finished operations: unexamined ones (every one in a full pass),
        // each read after it finished.
        let mut examined: Vec<(String, String)> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        // (shard, op id, key) of every tombstone lookup made.
        let mut read: HashSet<(String, String, String)> = HashSet::new();
        let filters: &[OpFilter] = if opts.full {
            &[OpFilter::Finished]
        } else {
            &[
                OpFilter::Unverified { purged: false },
                OpFilter::Unverified { purged: true },
            ]
        };
        let mut done = 0;
        for filter in filters {
            let mut pages = OpPages::new(*filter, page);
            while let Some(rows) = self.next_ops(&mut pages).await? {
                if let Some(l) = lease {
                    self.renew_lease(l).await?;
                }
                for r in &rows {
                    let op = OpRecord::from_row(r)?;
                    self.examine_op(report, &op, repair, &mut read).await?;
                    seen.insert(op.op_id.clone());
                    examined.push((op.op_id, op.key));
                }
                tell("moves", &mut done, rows.len(), report);
            }
        }
        // Every operation of a key the last pass found something on.
        let keys = js
            .query(&q.unclean_keys())
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        for (i, k) in keys.iter().enumerate() {
            if i % page == 0
                && let Some(l) = lease
            {
                self.renew_lease(l).await?;
            }
            let key = crate::journal::text(k, "mkey")?;
            let ops = js
                .query(&q.ops_for_key(&key))
                .await
                .map_err(|e| MigrationError::shard(jname, e))?;
            let mut n = 0;
            for r in &ops {
                let op = OpRecord::from_row(r)?;
                if !op.state.is_terminal() || seen.contains(&op.op_id) {
                    continue;
                }
                self.examine_op(report, &op, repair, &mut read).await?;
                seen.insert(op.op_id.clone());
                examined.push((op.op_id, op.key));
                n += 1;
            }
            tell("moves", &mut done, n, report);
        }
        if opts.full {
            self.scan_tombstones(report, repair, page, lease, &read, progress)
                .await?;
        }
        Ok(examined)
    }

    /// One finished operation: its tombstones on its source and its
    /// destination, then its stranded copy (aborted) or its mapping
    /// (retired).
    async fn examine_op(
        &self,
        report: &mut VerifyReport,
        op: &OpRecord,
        repair: bool,
        read: &mut HashSet<(String, String, String)>,
    ) -> Result<()> {
        for shard_name in op_shards(op) {
            let Some(rows) = self.op_tombstones(shard_name, op).await? else {
                continue;
            };
            read.insert((shard_name.to_owned(), op.op_id.clone(), op.key.clone()));
            for r in &rows {
                let t = Tomb::from_row(r)?;
                if t.digest == names::IN_FLIGHT {
                    if !t.superseded {
                        self.check_marker(report, shard_name, &t, op, repair)
                            .await?;
                    }
                    continue;
                }
                self.check_tomb_of(report, shard_name, &t, op, repair)
                    .await?;
            }
        }
        match op.state {
            MoveState::Aborted => self.check_stranded_copy(report, op, repair).await,
            MoveState::Retired => self.check_mapping(report, op, repair).await,
            _ => Ok(()),
        }
    }

    /// A live in-flight marker of the finished operation `op` on
    /// `shard_name` (see [`VerifyReport::leftover_markers`]).
    ///
    /// Repair removes it, with the row of the key under it, only for an
    /// aborted move whose key does not live on that shard (by its mapping
    /// or the journal) and has no claim held: the row under it is then a
    /// late copy of the aborted move (no routed write lands under a
    /// marker). Anything else is left: under a retired move's marker (or
    /// one on a shard the key lives on) is either the key's live row (a
    /// stalled mover's stale copy batch landed after the move finished and
    /// changed nothing but the marker) or a row the application deleted,
    /// brought back by that batch (the seed's
    /// undetectable case), and nothing stored tells the two apart; the
    /// operator's procedure is in `docs::verify`, "The undetectable case".
    async fn check_marker(
        &self,
        report: &mut VerifyReport,
        shard_name: &str,
        t: &Tomb,
        op: &OpRecord,
        repair: bool,
    ) -> Result<()> {
        if repair
            && op.state == MoveState::Aborted
            && let Some(spec) = self.tables.get(&t.table).cloned()
            && !self.lives_on(&op.key, shard_name).await?
            && !self.claim_held(&op.key).await?
        {
            let (name, shard) = self.shard_named(shard_name)?;
            let d = shard.dialect();
            let stmts = [
                d.delete_marked(&spec.name, &spec.key_col, &op.key, &op.op_id),
                d.in_flight_clear(&op.op_id, &op.key),
            ];
            shard
                .batch(&stmts)
                .await
                .map_err(|e| MigrationError::shard(name, e))?;
            push_counted(
                &mut report.repaired,
                &mut report.repaired_count,
                format!(
                    "removed a late copy's in-flight marker {shard_name}:{}:{} ({})",
                    t.table, op.key, op.op_id
                ),
            );
            return Ok(());
        }
        report.flag(&op.key);
        push_counted(
            &mut report.leftover_markers,
            &mut report.leftover_marker_count,
            Leftover {
                shard: shard_name.to_owned(),
                table: t.table.clone(),
                key: op.key.clone(),
                op_id: op.op_id.clone(),
            },
        );
        Ok(())
    }

    /// A full pass's scan of every tombstone on every shard, skipping the
    /// ones examined already (`read`: shard, op id, key): finds tombstones
    /// without a journal record, or on a shard or key their operation does
    /// not name.
    async fn scan_tombstones(
        &self,
        report: &mut VerifyReport,
        repair: bool,
        page: usize,
        lease: Option<&crate::recovery::Lease>,
        read: &HashSet<(String, String, String)>,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<()> {
        let mut done = 0u64;
        for shard_name in self.shards.keys() {
            let (name, shard) = self.shard_named(shard_name)?;
            let d = shard.dialect();
            if !d.is_proven() {
                continue;
            }
            // Keyset pages in the table's key order (mkey, op_id, tname).
            let (mut after_k, mut after_op, mut after_t) =
                (String::new(), String::new(), String::new());
            loop {
                if let Some(l) = lease {
                    self.renew_lease(l).await?;
                }
                let page_query = d.tombstone_page(&self.scope, &after_k, &after_op, &after_t, page);
                let rows = shard
                    .query(&page_query)
                    .await
                    .map_err(|e| MigrationError::shard(name, e))?;
                if rows.is_empty() {
                    break;
                }
                for r in &rows {
                    let t = Tomb::from_row(r)?;
                    after_k.clone_from(&t.key);
                    after_op.clone_from(&t.op_id);
                    after_t.clone_from(&t.table);
                    // An in-flight marker fences a move's copy until its
                    // publish (the move holds the key's claim): no tombstone.
                    if t.digest == names::IN_FLIGHT
                        || read.contains(&(shard_name.clone(), t.op_id.clone(), t.key.clone()))
                    {
                        continue;
                    }
                    self.check_tomb(report, shard_name, &t, repair).await?;
                }
                done += rows.len() as u64;
                progress(Progress {
                    phase: "tombstones",
                    done,
                    changed: report.repaired_count,
                });
            }
        }
        Ok(())
    }

    /// Whether `op` is its key's newest finished move and the mapping names
    /// its target; with `repair`, publishes the target again when not.
    async fn check_mapping(
        &self,
        report: &mut VerifyReport,
        op: &OpRecord,
        repair: bool,
    ) -> Result<()> {
        let Home::At { op_id, target } = self.journal_home(&op.key).await? else {
            return Ok(()); // an active move (reported as dangling)
        };
        if op_id != op.op_id {
            return Ok(()); // checked at the key's newest finished move
        }
        let found = self.mapping_fresh(&op.key).await?;
        if found.as_deref() == Some(target.as_str()) {
            return Ok(());
        }
        if repair && self.checks(crate::config::Check::Republish) {
            self.republish(&op.key, &op_id, &target, found.as_deref())
                .await?;
            push_counted(
                &mut report.repaired,
                &mut report.repaired_count,
                format!(
                    "republished mapping {} -> {} (was {}; {})",
                    op.key,
                    target,
                    found.as_deref().unwrap_or("none"),
                    op_id
                ),
            );
        } else {
            report.flag(&op.key);
            push_counted(
                &mut report.mapping_mismatches,
                &mut report.mapping_mismatch_count,
                MappingMismatch {
                    key: op.key.clone(),
                    op_id,
                    expected: target,
                    found,
                },
            );
        }
        Ok(())
    }

    async fn check_tomb(
        &self,
        report: &mut VerifyReport,
        shard_name: &str,
        t: &Tomb,
        repair: bool,
    ) -> Result<()> {
        let leftover = t.leftover(shard_name);
        let Some(op) = self.load_op(&t.op_id).await? else {
            report.flag(&t.key);
            push_counted(
                &mut report.stranded_archives,
                &mut report.stranded_archive_count,
                leftover,
            );
            return Ok(());
        };
        self.check_tomb_of(report, shard_name, t, &op, repair).await
    }

    /// Whether `key` lives on `shard` by either record: its mapping names
    /// the shard, or the journal's newest finished move of the key put it
    /// there (the mapping lost that move's publish: absent, or naming a
    /// shard the key left). A repair that deletes a row as a leftover of an
    /// aborted move asks this first: a row on the shard the key lives on
    /// may be the key's own, equal to the aborted move's snapshot because
    /// it did not change since.
    async fn lives_on(&self, key: &str, shard: &str) -> Result<bool> {
        if self.mapping_fresh(key).await?.as_deref() == Some(shard) {
            return Ok(true);
        }
        Ok(matches!(
            self.journal_home(key).await?,
            Home::At { target, .. } if target == shard
        ))
    }

    /// [`Self::check_tomb`] with the tombstone's operation at hand.
    async fn check_tomb_of(
        &self,
        report: &mut VerifyReport,
        shard_name: &str,
        t: &Tomb,
        op: &OpRecord,
        repair: bool,
    ) -> Result<()> {
        let leftover = t.leftover(shard_name);
        if !op.state.is_terminal() {
            return Ok(()); // reported as dangling
        }
        let Some(spec) = self.tables.get(&t.table).cloned() else {
            return Ok(());
        };
        let (name, shard) = self.shard_named(shard_name)?;
        let d = shard.dialect();
        let live = self.read_row((shard_name, &spec), &t.key).await?;
        if op.state == MoveState::Aborted {
            if t.superseded || self.claim_held(&t.key).await? {
                return Ok(());
            }
            let newest = self.get_migration_status(&t.key, &t.table).await?;
            let restorable = newest.is_some_and(|n| n.op_id == op.op_id)
                && t.payload.is_some()
                && live.is_none();
            if repair && restorable {
                let row = value::decode_row(t.payload.as_deref().unwrap_or_default())?;
                let lift = d.tombstone_lift_one(&t.key, &t.op_id, &t.table);
                let stmts = vec![d.insert_row(&spec.name, &row_idents(&row)?), lift];
                shard
                    .batch(&stmts)
                    .await
                    .map_err(|e| MigrationError::shard(name, e))?;
                tracing::info!(
                    event = "durability.migration.stale_cutover_restored",
                    op_id = %t.op_id,
                    key = %t.key,
                    "stale cutover restored"
                );
                report.repaired(format!(
                    "restored {}:{}:{} ({})",
                    shard_name, t.table, t.key, t.op_id
                ));
            } else {
                report.flag(&t.key);
                push_counted(
                    &mut report.stale_cutovers,
                    &mut report.stale_cutover_count,
                    StaleCutover {
                        leftover,
                        restorable,
                    },
                );
            }
            return Ok(());
        }
        if t.superseded {
            return Ok(());
        }
        if let Some(row) = live {
            // A move of the key in flight (reported as dangling): the row
            // may be its copy on a shard the key is moving back to, equal to
            // the archived payload behind the old tombstone. Not a ghost.
            if self.claim_held(&t.key).await? {
                return Ok(());
            }
            let provable = t.payload.is_some() && value::digest(Some(&row)) == t.digest;
            if repair && provable {
                let st = self.repair_delete(
                    shard_name,
                    &spec,
                    &t.key,
                    &row_idents(&row)?,
                    Some((&t.op_id, &t.table)),
                )?;
                shard
                    .execute(&st)
                    .await
                    .map_err(|e| MigrationError::shard(name, e))?;
                report.repaired(format!(
                    "removed ghost {}:{}:{} ({})",
                    shard_name, t.table, t.key, t.op_id
                ));
            } else {
                report.flag(&t.key);
                push_counted(&mut report.ghosts, &mut report.ghost_count, leftover);
            }
        }
        Ok(())
    }

    async fn check_stranded_copy(
        &self,
        report: &mut VerifyReport,
        op: &OpRecord,
        repair: bool,
    ) -> Result<()> {
        let Ok((name, shard)) = self.shard_named(&op.target) else {
            return Ok(());
        };
        let mut lives_there: Option<bool> = None;
        for (table, digest) in &op.digests {
            if digest == "-" {
                continue;
            }
            let Some(spec) = self.tables.get(table).cloned() else {
                continue;
            };
            let Some(row) = self.read_row((name, &spec), &op.key).await? else {
                continue;
            };
            if &value::digest(Some(&row)) != digest {
                continue;
            }
            // The key's own row, equal to the aborted move's snapshot, on a
            // shard the key lives on again: not a copy.
            let there = match lives_there {
                Some(t) => t,
                None => *lives_there.insert(self.lives_on(&op.key, &op.target).await?),
            };
            if there {
                continue;
            }
            // A later move of the key in flight: the row may be its copy.
            if self.claim_held(&op.key).await? {
                continue;
            }
            let leftover = Leftover {
                shard: op.target.clone(),
                table: table.clone(),
                key: op.key.clone(),
                op_id: op.op_id.clone(),
            };
            if repair {
                let st =
                    self.repair_delete(&op.target, &spec, &op.key, &row_idents(&row)?, None)?;
                shard
                    .execute(&st)
                    .await
                    .map_err(|e| MigrationError::shard(name, e))?;
                report.repaired(format!(
                    "removed stranded copy {}:{}:{} ({})",
                    op.target, table, op.key, op.op_id
                ));
            } else {
                report.flag(&op.key);
                push_counted(
                    &mut report.stranded_copies,
                    &mut report.stranded_copy_count,
                    leftover,
                );
            }
        }
        Ok(())
    }

    /// See [`Router::purge_retired`](crate::Router::purge_retired).
    pub(crate) async fn purge_retired(&self) -> Result<PurgeReport> {
        let (jname, js, q) = self.journal()?;
        let now = self.now();
        let mut report = PurgeReport::default();
        // Examined operations first, then those no pass examined (each
        // refused): one range of the history index each, in id order.
        for filter in [
            OpFilter::Unpurged { verified: true },
            OpFilter::Unpurged { verified: false },
        ] {
            let mut pages = OpPages::new(filter, 500);
            while let Some(rows) = self.next_ops(&mut pages).await? {
                for r in &rows {
                    let op = OpRecord::from_row(r)?;
                    let refused = if op.retire_at_ms.is_none_or(|t| t > now) {
                        Some(MigrationError::RetentionNotElapsed(op.op_id.clone()))
                    } else if !op.verified {
                        Some(MigrationError::NotVerified(op.op_id.clone()))
                    } else {
                        None
                    };
                    if let Some(error) = refused {
                        report.refused_count += 1;
                        push_capped(
                            &mut report.refused,
                            Refusal {
                                op_id: op.op_id.clone(),
                                error,
                            },
                        );
                        continue;
                    }
                    let (sname, shard) = self.shard_named(&op.source)?;
                    let purge = shard.dialect().archive_purge(&op.key, &op.op_id);
                    shard
                        .execute(&purge)
                        .await
                        .map_err(|e| MigrationError::shard(sname, e))?;
                    js.execute(&q.mark_purged(&op.op_id))
                        .await
                        .map_err(|e| MigrationError::shard(jname, e))?;
                    report.purged_count += 1;
                    push_capped(&mut report.purged, op.op_id.clone());
                    report.compacted_count += self.compact_key(&op.key).await?;
                }
            }
        }
        report.compacted_count += self.compact_aborted(now).await?;
        Ok(report)
    }

    /// Deletes the journal rows of aborted operations that are done with:
    /// a verification pass examined them after they finished (their
    /// `verified` mark), their retention elapsed since they finished, and
    /// no tombstone or in-flight marker of theirs is left on their source
    /// or destination. Reads never look at an aborted operation (the key's
    /// newest operation that is not aborted says where it lives), so only
    /// [`Router::get_migration_status`](crate::Router::get_migration_status) sees one go. Returns the rows
    /// deleted.
    async fn compact_aborted(&self, now: i64) -> Result<u64> {
        let mut deleted = 0;
        let mut pages = OpPages::new(OpFilter::State(MoveState::Aborted), 500);
        while let Some(rows) = self.next_ops(&mut pages).await? {
            for r in &rows {
                let op = OpRecord::from_row(r)?;
                let done_at = op
                    .finished_ms
                    .map(|f| f.saturating_add(op.retain_ms.max(0)));
                if !op.verified
                    || done_at.is_none_or(|t| t > now)
                    || self.has_tombstones(&op).await?
                {
                    continue;
                }
                self.journal_execute(|q| q.delete_aborted_op(&op.op_id))
                    .await?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Compacts `key`'s history (see [`Router::purge_retired`](crate::Router::purge_retired)): first
    /// the purged tombstones that no longer fence, on every shard, then the
    /// purged operations left without tombstones that a newer retired
    /// operation covers. Each step is idempotent and a crash between them
    /// leaves an operation without tombstones, never a tombstone without
    /// its operation. Returns the operations deleted.
    async fn compact_key(&self, key: &str) -> Result<u64> {
        for (name, shard) in &self.shards {
            let d = shard.dialect();
            if !d.is_proven() {
                continue;
            }
            // The key's lifted fences, newest first per table: the newest
            // stays (a write that met the fence just before it was lifted
            // finds it and retries), purged older ones go.
            let rows = shard
                .query(&d.lifted_fences(key, &self.scope))
                .await
                .map_err(|e| MigrationError::shard(name, e))?;
            let mut newest_of: Option<String> = None;
            for r in &rows {
                let table = crate::journal::text(r, "tname")?;
                if newest_of.as_deref() != Some(table.as_str()) {
                    newest_of = Some(table);
                    continue;
                }
                if crate::journal::int(r, "purged")? == 0 {
                    continue;
                }
                let op_id = crate::journal::text(r, "op_id")?;
                shard
                    .execute(&d.lifted_fence_delete(key, &op_id, &table))
                    .await
                    .map_err(|e| MigrationError::shard(name, e))?;
            }
        }
        // Newest first.
        let ops = self.key_ops(key).await?;
        let mut deleted = 0;
        let mut covered: BTreeSet<&str> = BTreeSet::new();
        for op in &ops {
            if op.state != MoveState::Retired {
                continue;
            }
            let covers_all = op.tables.iter().all(|t| covered.contains(t.as_str()));
            covered.extend(op.tables.iter().map(String::as_str));
            if !covers_all || !op.purged || self.has_tombstones(op).await? {
                continue;
            }
            self.journal_execute(|q| q.delete_op(&op.op_id)).await?;
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Whether `op` still has a tombstone (or marker) on its source or its
    /// destination.
    async fn has_tombstones(&self, op: &OpRecord) -> Result<bool> {
        for shard_name in op_shards(op) {
            if self
                .op_tombstones(shard_name, op)
                .await?
                .is_some_and(|rows| !rows.is_empty())
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// `op`'s tombstones and markers on `shard_name` (its key, its id), or
    /// `None` for a shard this router does not know or of an unproven
    /// dialect (which keeps none).
    async fn op_tombstones(
        &self,
        shard_name: &str,
        op: &OpRecord,
    ) -> Result<Option<Vec<value::Row>>> {
        let Ok((name, shard)) = self.shard_named(shard_name) else {
            return Ok(None);
        };
        let d = shard.dialect();
        if !d.is_proven() {
            return Ok(None);
        }
        shard
            .query(&d.op_tombstones(&op.key, &op.op_id))
            .await
            .map(Some)
            .map_err(|e| MigrationError::shard(name, e))
    }
}
