//! The journal's statements: its schema and upgrade, and every statement
//! on the operation rows and the recovery lease ([`JournalSql`]).

use super::retired::key_op;
use super::verify::claim;
use super::{Dialect, Ident, Sql, names};
use crate::journal::{Change, Guard, MoveState, OpFilter, OpRecord, encode_digests};
use crate::shard::Statement;
use crate::value::Value;

/// The journal's history index (see [`Dialect::journal_history_indexes`]).
const HISTORY_INDEX: &str = "durability_migration_ops_history";

/// The history indexes of journals written before [`HISTORY_INDEX`].
const OLD_HISTORY_INDEXES: [&str; 2] = [
    "durability_migration_ops_unverified",
    "durability_migration_ops_unpurged",
];

impl Dialect {
    /// The column a journal written before verification marks lacks, and
    /// the statement adding it (run when the column query misses it).
    pub(crate) fn journal_upgrade(&self) -> (&'static str, Statement) {
        (
            "verified",
            Statement::new(format!(
                "ALTER TABLE {o} ADD COLUMN verified {i} NOT NULL DEFAULT 0",
                o = names::OPS,
                i = self.int_type()
            )),
        )
    }

    /// The index that finds the finished operations no pass examined yet
    /// and the retired ones not purged yet, so a pass and a purge read what
    /// is new, not the history (created after [`Self::journal_upgrade`]):
    /// one index on `(scope, verified, purged, op_id)` serves both, a
    /// range per (verified, purged) pair read in id order, so a claim
    /// writes one history index entry, not two. Then the two indexes an
    /// older journal kept for them (one per mark) are dropped.
    pub(crate) fn journal_history_indexes(&self) -> Vec<Statement> {
        let mut out = vec![Statement::new(format!(
            "CREATE INDEX IF NOT EXISTS {HISTORY_INDEX} ON {o} (scope, verified, purged, op_id)",
            o = names::OPS
        ))];
        for old in OLD_HISTORY_INDEXES {
            out.push(Statement::new(match self {
                Self::MySql => format!("DROP INDEX IF EXISTS {old} ON {o}", o = names::OPS),
                _ => format!("DROP INDEX IF EXISTS {old}"),
            }));
        }
        out
    }

    /// `CREATE TABLE IF NOT EXISTS` statements of the journal tables.
    pub fn journal_schema(&self) -> Vec<Statement> {
        let (k, t, i) = (self.text_key_type(), self.text_type(), self.int_type());
        let mk = self.mkey_type();
        vec![
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {o} (op_id {k} PRIMARY KEY, scope {k} NOT NULL, \
                 mkey {mk} NOT NULL, tables {t} NOT NULL, source {t} NOT NULL, target {t} NOT NULL, \
                 state {t} NOT NULL, attempts {i} NOT NULL, digests {t} NOT NULL, owner {t} NOT NULL, \
                 live_until_ms {i} NOT NULL, retain_ms {i} NOT NULL, retire_at_ms {i}, \
                 created_ms {i} NOT NULL, updated_ms {i} NOT NULL, finished_ms {i}, \
                 purged {i} NOT NULL DEFAULT 0, error {t}, claim {mk}, \
                 verified {i} NOT NULL DEFAULT 0){w}",
                o = names::OPS,
                w = self.keyed_table_suffix()
            )),
            Statement::new(format!(
                "CREATE INDEX IF NOT EXISTS durability_migration_ops_key ON {o} (scope, mkey)",
                o = names::OPS
            )),
            // The claim: an active operation holds its key in `claim`; the
            // terminal state's write sets it to NULL. Unique per scope, so a
            // key has at most one active operation. Partial where the
            // dialect has partial indexes (only active operations are
            // indexed); MySQL/MariaDB keep NULLs, which never collide.
            Statement::new(format!(
                "CREATE UNIQUE INDEX IF NOT EXISTS durability_migration_ops_claim ON {o} (scope, claim){p}",
                o = names::OPS,
                p = match self {
                    Self::MySql => "",
                    _ => " WHERE claim IS NOT NULL",
                }
            )),
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {l} (scope {k} PRIMARY KEY, holder {t} NOT NULL, \
                 generation {i} NOT NULL, expires_ms {i} NOT NULL)",
                l = names::LEASE
            )),
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {m} (scope {k} PRIMARY KEY, last_clean_verify_ms {i} NOT NULL)",
                m = names::META
            )),
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {p} (scope {k} PRIMARY KEY, started_ms {i} NOT NULL)",
                p = names::PASS
            )),
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {u} (scope {k} NOT NULL, mkey {mk} NOT NULL, \
                 PRIMARY KEY (scope, mkey)){w}",
                u = names::UNCLEAN,
                w = self.keyed_table_suffix()
            )),
            self.sightings_schema(),
        ]
    }
}

/// When [`JournalSql::take_over`] takes an operation over from its owner.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TakeOver {
    /// Recovery, from a mover that is no longer live (its liveness
    /// deadline passed on this clock).
    Expired,
    /// Recovery, from an owner outside its clock domain whose row it saw
    /// unchanged for the liveness period: only while the row is still
    /// exactly as seen (no clock reading of another host is compared).
    Unchanged,
    /// An operator's abort, from its owner live or not, only while it has
    /// not reached `cutover_pending` (so no cutover can have run): the
    /// owner's next journal write is then fenced.
    Uncut,
}

/// The journal statements of one scope on the journal shard's dialect.
pub(crate) struct JournalSql<'a> {
    pub(crate) d: Dialect,
    pub(crate) scope: &'a str,
}

impl JournalSql<'_> {
    /// `{head}{table} WHERE scope = ?` bound to this scope: the start of
    /// every statement that reads or deletes the scope's rows.
    pub(super) fn scoped(&self, head: &str, table: &str) -> Sql<'_> {
        self.d.scoped(head, table, self.scope)
    }

    pub(super) fn push_lease_guard(&self, s: &mut Sql<'_>, g: &Guard, now: i64) {
        if let Some((scope, generation)) = &g.lease {
            let eqs = [
                ("scope", scope.as_str().into()),
                ("generation", (*generation).into()),
            ];
            s.exists_open(" AND EXISTS ", names::LEASE, &eqs)
                .raw(" AND expires_ms > ")
                .bind(now)
                .raw(")");
        }
    }

    /// The claim and `prepared` in one statement: inserts the operation
    /// holding its key in `claim`, unless an active operation of the key
    /// holds it already (then it inserts nothing; a racing claim that slips
    /// past the check trips the unique claim index instead).
    ///
    /// `unmoved`: the moved tables, when the journal shares the source's
    /// database: the statement then also requires that no other
    /// operation left a live tombstone of the key there (the check
    /// [`MoveCtx::moved_away`](crate::moves::MoveCtx::moved_away) makes
    /// after the claim otherwise), atomically with the claim.
    pub(crate) fn insert_op(&self, op: &OpRecord, unmoved: Option<&[&Ident]>) -> Statement {
        let mut s = Sql::new(&self.d);
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
        s.join(vals, ", ", |s, v| {
            s.bind(v);
        })
        .dual()
        .exists_open(
            " WHERE NOT EXISTS ",
            names::OPS,
            &claim(self.scope, &op.key),
        )
        .raw(")");
        if let Some(tables) = unmoved {
            s.raw(" AND NOT EXISTS (SELECT 1 FROM ")
                .raw(names::RETIRED)
                .raw(" WHERE ");
            Dialect::push_foreign_tombstones(&mut s, tables, &op.key, &op.op_id);
            s.raw(")");
        }
        s.finish()
    }

    /// The operation holding `key`'s claim, if any.
    pub(crate) fn claim_holder(&self, key: &str) -> Statement {
        let mut s = self.scoped("SELECT op_id FROM ", names::OPS);
        s.raw(" AND claim = ").bind(key);
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
        let mut s = Sql::new(&self.d);
        s.raw("UPDATE ").raw(names::OPS).raw(" SET state = ");
        match &change.committed_if_archived {
            Some(key) => {
                s.exists_open("CASE WHEN EXISTS ", names::RETIRED, &key_op(key, op_id))
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
        s.raw(" WHERE ")
            .eqs(&[("op_id", op_id.into()), ("owner", g.owner.as_str().into())]);
        self.push_lease_guard(&mut s, g, now);
        s.finish()
    }

    /// Takes `op` over for `g` from its recorded owner when `when` holds,
    /// under the lease guard.
    pub(crate) fn take_over(
        &self,
        op: &OpRecord,
        g: &Guard,
        (now, live_until): (i64, i64),
        when: TakeOver,
    ) -> Statement {
        let mut s = self.d.update(
            names::OPS,
            &[
                ("owner", g.owner.as_str().into()),
                ("live_until_ms", live_until.into()),
            ],
            &[
                ("op_id", op.op_id.as_str().into()),
                ("owner", op.owner.as_str().into()),
            ],
        );
        match when {
            TakeOver::Expired => {
                s.raw(" AND live_until_ms <= ").bind(now);
            }
            TakeOver::Unchanged => {
                s.raw(" AND ").eqs(&[
                    ("state", op.state.as_str().into()),
                    ("attempts", op.attempts.into()),
                    ("updated_ms", op.updated_ms.into()),
                    ("live_until_ms", op.live_until_ms.into()),
                ]);
            }
            TakeOver::Uncut => {
                s.raw(" AND state IN ('prepared', 'copied', 'verified')");
            }
        }
        self.push_lease_guard(&mut s, g, now);
        s.finish()
    }

    pub(crate) fn load_op(&self, op_id: &str) -> Statement {
        self.d
            .matching("SELECT * FROM ", names::OPS, &[("op_id", op_id.into())])
            .finish()
    }

    pub(crate) fn ops_for_key(&self, key: &str) -> Statement {
        let mut s = self.scoped("SELECT * FROM ", names::OPS);
        s.raw(" AND mkey = ")
            .bind(key)
            .raw(" ORDER BY created_ms DESC, op_id DESC");
        s.finish()
    }

    /// A page of operations after `after` (by id); `active` selects
    /// non-terminal ones, otherwise `state` selects one state.
    pub(crate) fn ops_page(&self, after: &str, limit: usize, filter: OpFilter) -> Statement {
        let mut s = self.scoped("SELECT * FROM ", names::OPS);
        s.raw(" AND op_id > ").bind(after);
        match filter {
            OpFilter::Active => {
                // Every active operation holds its claim: the claim index
                // finds them without reading the finished history.
                s.raw(" AND claim IS NOT NULL AND state NOT IN ('retired', 'aborted')");
            }
            OpFilter::State(st) => {
                s.raw(" AND state = ").bind(st.as_str());
            }
            // One range of the history index each.
            OpFilter::Unpurged { verified } => {
                s.raw(" AND verified = ")
                    .raw(if verified { "1" } else { "0" })
                    .raw(" AND purged = 0 AND state = 'retired'");
            }
            OpFilter::Unverified { purged } => {
                s.raw(" AND verified = 0 AND purged = ")
                    .raw(if purged { "1" } else { "0" })
                    .raw(" AND state IN ('retired', 'aborted')");
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
        let mut s = self.scoped("SELECT op_id FROM ", names::OPS);
        s.raw(" AND claim IS NOT NULL AND state IN ('retired', 'aborted')");
        s.finish()
    }

    /// Releases a finished operation's leftover claim (under the lease).
    pub(crate) fn release_claim(&self, op_id: &str, g: &Guard, now: i64) -> Statement {
        let mut s = Sql::new(&self.d);
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
    /// walk the scope's whole history index instead).
    pub(crate) fn mark_verified(&self, op_ids: &[String]) -> Statement {
        let mut s = Sql::new(&self.d);
        s.raw("UPDATE ")
            .raw(names::OPS)
            .raw(" SET verified = 1 WHERE op_id IN (")
            .join(op_ids, ", ", |s, op| {
                s.bind(op.as_str());
            })
            .raw(")");
        s.finish()
    }

    /// Every key the last finished verification pass found something on.
    pub(crate) fn unclean_keys(&self) -> Statement {
        let mut s = self.scoped("SELECT mkey FROM ", names::UNCLEAN);
        s.raw(" ORDER BY mkey");
        s.finish()
    }

    /// Deletes a compacted operation's row (see `Router::purge_retired`).
    pub(crate) fn delete_op(&self, op_id: &str) -> Statement {
        self.delete_op_if(op_id, "state = 'retired' AND purged = 1")
    }

    /// Deletes an aborted operation's row once a pass examined it (see
    /// `Router::purge_retired`).
    pub(crate) fn delete_aborted_op(&self, op_id: &str) -> Statement {
        self.delete_op_if(op_id, "state = 'aborted' AND verified = 1")
    }

    /// Deletes operation `op_id`'s row while `condition` holds.
    fn delete_op_if(&self, op_id: &str, condition: &str) -> Statement {
        let mut s = self.scoped("DELETE FROM ", names::OPS);
        s.raw(" AND op_id = ")
            .bind(op_id)
            .raw(" AND ")
            .raw(condition);
        s.finish()
    }

    pub(crate) fn mark_purged(&self, op_id: &str) -> Statement {
        self.d
            .update(
                names::OPS,
                &[("purged", 1i64.into())],
                &[("op_id", op_id.into())],
            )
            .finish()
    }

    pub(crate) fn lease_get(&self) -> Statement {
        self.scoped("SELECT holder, generation, expires_ms FROM ", names::LEASE)
            .finish()
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

    /// Takes the lease over at the next generation, only if it is still as
    /// seen (generation `old_gen`, deadline `seen_expires`).
    pub(crate) fn lease_take(
        &self,
        holder: &str,
        old_gen: i64,
        seen_expires: i64,
        expires: i64,
    ) -> Statement {
        self.d
            .update(
                names::LEASE,
                &[
                    ("holder", holder.into()),
                    ("generation", (old_gen + 1).into()),
                    ("expires_ms", expires.into()),
                ],
                &[
                    ("scope", self.scope.into()),
                    ("generation", old_gen.into()),
                    ("expires_ms", seen_expires.into()),
                ],
            )
            .finish()
    }

    pub(crate) fn lease_renew(
        &self,
        holder: &str,
        generation: i64,
        now: i64,
        expires: i64,
    ) -> Statement {
        let mut s = self.d.update(
            names::LEASE,
            &[("expires_ms", expires.into())],
            &[
                ("scope", self.scope.into()),
                ("generation", generation.into()),
                ("holder", holder.into()),
            ],
        );
        s.raw(" AND expires_ms > ").bind(now);
        s.finish()
    }

    pub(crate) fn meta_get(&self) -> Statement {
        self.scoped("SELECT last_clean_verify_ms FROM ", names::META)
            .finish()
    }

    pub(crate) fn meta_set(&self, now: i64) -> Vec<Statement> {
        self.d.upsert(
            names::META,
            &[
                ("scope", self.scope.into()),
                ("last_clean_verify_ms", now.into()),
            ],
            1,
        )
    }
}

impl JournalSql<'_> {
    /// The start time of the last finished verification pass.
    pub(crate) fn pass_get(&self) -> Statement {
        self.scoped("SELECT started_ms FROM ", names::PASS).finish()
    }

    /// Records a finished verification pass that started at `started` and
    /// found something on exactly `keys` (one batch: the previous pass's
    /// keys are replaced).
    pub(crate) fn pass_set<'k>(
        &self,
        started: i64,
        keys: impl IntoIterator<Item = &'k String>,
    ) -> Vec<Statement> {
        let del = self.scoped("DELETE FROM ", names::UNCLEAN);
        let mut out = vec![del.finish()];
        for k in keys {
            let mut ins = Sql::new(&self.d);
            ins.raw("INSERT INTO ")
                .raw(names::UNCLEAN)
                .raw(" (scope, mkey) VALUES (")
                .bind(self.scope)
                .raw(", ")
                .bind(k.as_str())
                .raw(")");
            out.push(ins.finish());
        }
        out.extend(self.d.upsert(
            names::PASS,
            &[("scope", self.scope.into()), ("started_ms", started.into())],
            1,
        ));
        out
    }

    /// The number of operations per state in the scope (the status report).
    pub(crate) fn state_counts(&self) -> Statement {
        let mut s = self.scoped("SELECT state, COUNT(*) AS n FROM ", names::OPS);
        s.raw(" GROUP BY state");
        s.finish()
    }
}
