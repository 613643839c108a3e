//! The public API of [`Router`]: every method delegates to the router's
//! private core (`router::Core`), where the modules implement it.

use std::sync::Arc;

use crate::router::{Core, Router};
use crate::{
    AbortReport, Manifest, MigrateOptions, MigrationConfig, MoveOptions, MoveOutcome, OpRecord,
    Placement, Progress, PruneOptions, PruneReport, PurgeReport, ReadOptions, RebalanceOptions,
    RebalanceReport, ReconcileOptions, ReconcileReport, RecoveryReport, Result, Row, Statement,
    StatusOptions, StatusReport, VerifyOptions, VerifyReport,
};

// ---- routing, reads and writes (`router.rs`) ----

impl Router {
    /// Builds a router from a validated configuration. Does no I/O.
    ///
    /// # Errors
    /// `INVALID_JOURNAL_SHARD`, `INVALID_CONFIG`, `INVALID_IDENTIFIER`.
    pub fn new(config: MigrationConfig) -> Result<Self> {
        Core::new(config).map(|core| Self { core })
    }

    /// Creates the crate's tables: the tombstone table on every shard of a
    /// proven dialect when a journal shard is set, and the journal tables on
    /// the journal shard. Idempotent.
    ///
    /// # Errors
    /// `SHARD_UNAVAILABLE` when a shard fails.
    pub async fn init(&self) -> Result<()> {
        self.core.init().await
    }

    /// The placement this router was configured with.
    pub fn placement_mode(&self) -> Placement {
        self.core.placement_mode()
    }

    /// The journal scope.
    pub fn journal_scope(&self) -> &str {
        self.core.journal_scope()
    }

    /// This router's instance id (owner of the moves it runs):
    /// `<clock domain>/<uuid>` with a configured clock domain, else a uuid.
    pub fn instance_id(&self) -> &str {
        self.core.instance_id()
    }

    /// The configured shard names.
    pub fn shard_names(&self) -> Vec<&str> {
        self.core.shard_names()
    }

    /// Drops this router's cached mapping of `key`.
    pub fn invalidate(&self, key: &str) {
        self.core.invalidate(key)
    }

    /// The shard `key` is routed to, if it has a mapping (never allocates).
    ///
    /// # Errors
    /// `INVALID_KEY`, `MAPPING_UNAVAILABLE`.
    pub async fn route(&self, key: &str) -> Result<Option<String>> {
        self.core.route(key).await
    }

    /// The shard the strategy places an unmapped key on.
    pub fn placement(&self, key: &str) -> Option<String> {
        self.core.placement(key)
    }

    /// The owner computed placement gives a key with no mapping (the newest
    /// epoch's owner). `None` under mapped placement, where a key has no
    /// owner until its first write allocates a mapping.
    ///
    /// Uses the cached manifest (see [`Router::manifest`]); `None` until a
    /// manifest was loaded (by `init` or any routed call).
    pub fn computed_owner(&self, key: &str) -> Option<String> {
        self.core.computed_owner(key)
    }

    /// Reads the key's row of `table`, following tombstones (default options).
    ///
    /// # Errors
    /// See [`Router::get_with`].
    pub async fn get(&self, key: &str, table: &str) -> Result<Option<Row>> {
        self.core.get(key, table).await
    }

    /// Reads the key's row of `table`. A key with no mapping reads as absent
    /// and allocates nothing, unless (mapped placement with a journal shard)
    /// the journal moved it: its mapping was lost, and the target of its
    /// newest finished move is published again and read (one journal query
    /// for a key with no mapping). A miss on a shard that holds a tombstone
    /// for the key follows `moved_to`, up to four hops (only with a journal
    /// shard). A move's destination copy is not read before the move
    /// publishes it (unless its source was cut over): the read finds the
    /// key on the move's source.
    ///
    /// # Errors
    /// `INVALID_KEY`, `UNKNOWN_TABLE`, `MIGRATION_LOOKUP_UNAVAILABLE` (also
    /// when the journal cannot be read for a key with no mapping),
    /// `MIGRATION_CHAIN_EXCEEDED` (unless `best_effort`), `SHARD_UNAVAILABLE`,
    /// `MAPPING_UNAVAILABLE`.
    pub async fn get_with(&self, key: &str, table: &str, opts: ReadOptions) -> Result<Option<Row>> {
        self.core.get_with(key, table, opts).await
    }

    /// Inserts the key's row (the key column is set to `key`).
    ///
    /// # Errors
    /// See [`Router::update`].
    pub async fn insert(&self, key: &str, table: &str, row: Row) -> Result<u64> {
        self.core.insert(key, table, row).await
    }

    /// Inserts or replaces the key's row.
    ///
    /// # Errors
    /// See [`Router::update`].
    pub async fn upsert(&self, key: &str, table: &str, row: Row) -> Result<u64> {
        self.core.upsert(key, table, row).await
    }

    /// Updates columns of the key's row; returns the changed-row count.
    ///
    /// Every routed write is fenced: on a shard holding a live tombstone for
    /// the key (or the in-flight marker of a move's copy there) it changes
    /// nothing. Then the router consults the journal: when
    /// the move is published it re-routes; otherwise the write fails with
    /// `MIGRATION_CUTOVER_PENDING` and was not applied. When the mapping
    /// still names the fenced shard (or nothing) although the move finished,
    /// the mapping store lost its publish: the target of the key's newest
    /// finished move is published again and the write goes there. Under
    /// mapped placement with a journal shard, a write of a key with no
    /// mapping first asks the journal the same (one query), so a key whose
    /// mapping was lost is never allocated a second home.
    ///
    /// A move's write hold of the key on the shard (its write-blocking
    /// cutover, [`crate::MigrationConfig::cutover_hold_ms`]) also makes the
    /// write change nothing: while the hold lasts the write fails with the
    /// retryable `MIGRATION_CUTOVER_PENDING`; an expired hold is deleted and
    /// the write runs again. A hold's deadline is compared with this
    /// router's clock only when its mover is in this router's clock domain;
    /// a hold taken elsewhere has expired once this router saw it unchanged
    /// for the hold's window of its own clock.
    ///
    /// Under computed placement the write binds the manifest generation it
    /// routed with: a shard whose fence is above it changes nothing, the
    /// router reloads the manifest from the journal once and routes again.
    ///
    /// # Errors
    /// `INVALID_KEY`, `UNKNOWN_TABLE`, `UNKNOWN_KEY_COLUMN`, `UNKNOWN_COLUMN`,
    /// `INVALID_IDENTIFIER`, `MIGRATION_CUTOVER_PENDING`, `SHARD_UNAVAILABLE`,
    /// `MAPPING_UNAVAILABLE`, `MIGRATION_LOOKUP_UNAVAILABLE` (a key with no
    /// mapping whose journal could not be read; nothing written),
    /// `DUPLICATE_KEY` (an insert of a key whose row
    /// exists: definite, nothing written), `ROW_REJECTED` (the shard
    /// refused the row's data: a NOT NULL, CHECK or foreign-key constraint,
    /// a value its column cannot hold; definite, nothing written, naming the
    /// column when the shard does); under computed placement also
    /// `PLACEMENT_UNVERIFIED`, `STALE_TOPOLOGY` and `WRITE_UNRESOLVED` (none
    /// of which applied the write).
    pub async fn update(&self, key: &str, table: &str, changes: Row) -> Result<u64> {
        self.core.update(key, table, changes).await
    }

    /// Deletes the key's row.
    ///
    /// # Errors
    /// See [`Router::update`].
    pub async fn delete(&self, key: &str, table: &str) -> Result<u64> {
        self.core.delete(key, table).await
    }

    /// Executes a raw statement on a named shard.
    ///
    /// Raw statements bypass routing and every fence: nothing stops them from
    /// writing a row on a shard the key moved away from.
    ///
    /// # Errors
    /// `UNKNOWN_SHARD`, `SHARD_UNAVAILABLE`.
    pub async fn raw_execute(&self, shard: &str, stmt: &Statement) -> Result<u64> {
        self.core.raw_execute(shard, stmt).await
    }

    /// Runs a raw query on a named shard (bypasses routing and fences).
    ///
    /// # Errors
    /// `UNKNOWN_SHARD`, `SHARD_UNAVAILABLE`.
    pub async fn raw_query(&self, shard: &str, stmt: &Statement) -> Result<Vec<Row>> {
        self.core.raw_query(shard, stmt).await
    }
}

// ---- moves (`moves.rs`) ----

impl Router {
    /// Moves one table's row of `key` to `target` through the journal.
    ///
    /// # Errors
    /// See [`Router::reassign_keys_with`].
    pub async fn reassign_shard(
        &self,
        key: &str,
        target: &str,
        table: &str,
    ) -> Result<MoveOutcome> {
        self.reassign_keys_with(key, target, &[table], MoveOptions::default())
            .await
    }

    /// [`Router::reassign_shard`] with options.
    ///
    /// # Errors
    /// See [`Router::reassign_keys_with`].
    pub async fn reassign_shard_with(
        &self,
        key: &str,
        target: &str,
        table: &str,
        opts: MoveOptions,
    ) -> Result<MoveOutcome> {
        self.reassign_keys_with(key, target, &[table], opts).await
    }

    /// Moves the key's rows in a set of tables as one journaled operation.
    ///
    /// # Errors
    /// See [`Router::reassign_keys_with`].
    pub async fn reassign_keys(
        &self,
        key: &str,
        target: &str,
        tables: &[&str],
    ) -> Result<MoveOutcome> {
        self.reassign_keys_with(key, target, tables, MoveOptions::default())
            .await
    }

    /// Moves the key's rows in `tables` to `target` as one journaled
    /// operation. Everything is validated before the first write.
    ///
    /// A move must include every configured table that holds a row of the
    /// key on its source: the key's mapping moves as a whole, so a row left
    /// behind in another table would no longer be routed to (reads `None`,
    /// updates changing nothing, inserts creating a second row). Such a
    /// move is refused with `MIGRATION_PARTIAL_MOVE` naming those tables.
    /// Every other configured table that exists on both shards moves too
    /// (its row of the key absent): the cutover fences it on the source and
    /// the publish lifts its old fence on the destination, so a router whose
    /// cache still names the source (or a write between the cutover and the
    /// publish) cannot leave a row there that the mapping no longer routes
    /// to; a row that appears in one of them before the cutover makes the
    /// cutover miss and moves with the key on the next copy. A configured
    /// table missing on the destination stays outside the move: the cutover
    /// requires it still empty on the source, and a move that finds a row
    /// appeared there meanwhile aborts.
    ///
    /// A key has one active operation at a time. When this router's own
    /// earlier call stopped on an error and left its operation active, the
    /// same call (same key and target, naming tables the operation moves)
    /// resumes that operation from its journaled state at once; any other
    /// move of the key gets
    /// `MIGRATION_ALREADY_ACTIVE` until the operation ends or recovery
    /// settles it (after its mover's liveness lapses).
    ///
    /// # Errors
    /// `INVALID_KEY`, `UNKNOWN_TABLE`, `UNKNOWN_KEY_COLUMN`, `UNKNOWN_SHARD`,
    /// `JOURNAL_NOT_CONFIGURED`, `MIGRATION_UNSUPPORTED_DIALECT`,
    /// `MIGRATION_NO_BATCH`, `MIGRATION_NO_ATOMIC_BATCH`, `MAPPING_NOT_FOUND`,
    /// `MIGRATION_SAME_SHARD`, `MIGRATION_ROW_NOT_FOUND`, `MIGRATION_PARTIAL_MOVE`,
    /// `MIGRATION_ALREADY_ACTIVE`, `MIGRATION_ABORTED`, `MIGRATION_TAKEN_OVER`,
    /// `MIGRATION_COPY_REJECTED` (the destination definitely refused the
    /// copy: a value its dialect cannot hold, refused before any write, or a
    /// refusal its shard reports as [`crate::DataRejected`] /
    /// [`crate::UniqueViolation`]; the move was aborted, the key stays on
    /// its source), `SHARD_UNAVAILABLE` (outcome unknown: the operation
    /// stays active, for this call to resume, recovery to settle or
    /// [`Router::abort_operation`]), `MAPPING_UNAVAILABLE`.
    ///
    /// Each call counts once in `durability_migration_moves_total` by
    /// outcome and records its duration on the router's clock (see
    /// ARCHITECTURE.md, "Metrics"), inside a `durability.migration.move`
    /// span naming the scope, key and target.
    pub async fn reassign_keys_with(
        &self,
        key: &str,
        target: &str,
        tables: &[&str],
        opts: MoveOptions,
    ) -> Result<MoveOutcome> {
        self.core
            .reassign_keys_with(key, target, tables, opts)
            .await
    }

    /// The latest recorded operation that moved `table`'s row of `key`, or
    /// `None` when there is none.
    ///
    /// # Errors
    /// `INVALID_KEY`, `JOURNAL_NOT_CONFIGURED`, `SHARD_UNAVAILABLE`, `CORRUPT_RECORD`.
    pub async fn get_migration_status(&self, key: &str, table: &str) -> Result<Option<OpRecord>> {
        self.core.get_migration_status(key, table).await
    }
}

// ---- recovery (`recovery.rs`) ----

impl Router {
    /// Finishes or aborts every interrupted move of this journal scope.
    ///
    /// Takes the scope's lease row first (60 s without renewal). A lease
    /// held outside this router's clock domain is taken over only once this
    /// router saw it unchanged for
    /// [`RECOVERY_LEASE_MS`](crate::RECOVERY_LEASE_MS) of its own clock (a
    /// released lease at once), and a move owned outside the domain is
    /// settled only once this router saw its journal row unchanged for
    /// [`MOVE_LIVENESS_MS`](crate::MOVE_LIVENESS_MS) (so a first call
    /// skips it; see [`crate::MigrationConfig::clock_domain`]). "Saw
    /// unchanged" is measured on this router's clock in its memory, or on
    /// the journal database's own clock from the first sighting any router
    /// persisted in the journal (`durability_migration_sightings`), so a
    /// router built fresh for every call (a cron job, the one-shot CLI)
    /// takes a crashed recovery's lease over at a higher generation, and
    /// settles a dead mover's operation, on its first call after the
    /// sighting is a period old; whichever judgement lapses first counts.
    /// Call it after any deploy or crash that may have interrupted a move;
    /// a scheduler calling it on every tick treats `RECOVERY_IN_PROGRESS`
    /// as success. A journal created before sightings gains their table at
    /// [`Router::init`]; until then a sighting that cannot be written is
    /// logged (`durability.migration.sighting_failed`) and only this
    /// router's memory judges.
    ///
    /// # Errors
    /// `JOURNAL_NOT_CONFIGURED`, `RECOVERY_IN_PROGRESS` while another
    /// recovery's lease is live, `RECOVERY_FENCED` when this recovery lost
    /// its lease (it made no further journal writes), `SHARD_UNAVAILABLE`.
    pub async fn recover_migrations(&self) -> Result<RecoveryReport> {
        self.core.recover_migrations().await
    }
}

// ---- verification and purge (`verify.rs`) ----

impl Router {
    /// Reports leftovers of stalled writers; with `repair: true` runs
    /// recovery first (taking the lease) and repairs what can be proven:
    /// a ghost only when it equals the archived payload, a stranded copy by
    /// the abort's digest proof, a stale cutover only when its operation is
    /// the newest on the key, the archive still holds the payload and the
    /// shard has no row. A key's mapping is checked against the journal
    /// (the target of the key's newest finished move); repair publishes
    /// that target again.
    ///
    /// A pass examines every active operation, every finished operation
    /// no pass has examined yet (its tombstones on its source and
    /// destination, its copy, its mapping) and every operation of a key the
    /// last pass found something on, so its cost follows the moves since
    /// the last pass, not the history. [`VerifyOptions::full`] examines
    /// every finished operation and every tombstone on every shard: run it
    /// after restoring a shard or the mapping store, or when writers that
    /// bypass the router's fences may have written to a shard a key left.
    ///
    /// At the end, each finished operation the pass read after it finished
    /// and found nothing on (or repaired) is marked verified; purge requires
    /// that mark, so a move that finished while a pass ran and was not read
    /// by it stays unpurgeable until a later pass, and one stuck operation
    /// blocks only its own key. Every pass is also recorded with its start
    /// time and the keys it found something on; a clean pass also as clean.
    ///
    /// # Errors
    /// `JOURNAL_NOT_CONFIGURED`, `RECOVERY_IN_PROGRESS`, `RECOVERY_FENCED`
    /// (with `repair`), `SHARD_UNAVAILABLE`, `MAPPING_UNAVAILABLE`,
    /// `CORRUPT_RECORD`.
    pub async fn verify_migrations(&self, opts: VerifyOptions) -> Result<VerifyReport> {
        self.core.verify_migrations(opts).await
    }

    /// [`Router::verify_migrations`], calling `progress` after each page it
    /// examines (phases `operations`, `moves`, `tombstones`;
    /// see [`Progress`]). The callback runs on the verifying task: keep it
    /// short.
    ///
    /// # Errors
    /// As [`Router::verify_migrations`].
    pub async fn verify_migrations_observed(
        &self,
        opts: VerifyOptions,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<VerifyReport> {
        self.core.verify_migrations_observed(opts, progress).await
    }

    /// Clears the archived payload of every retired operation whose
    /// retention elapsed and that a verification pass examined after it
    /// finished and found nothing on its key (its `verified` mark), then
    /// compacts the key's history: tombstones that no longer fence (a
    /// later move brought the key back to their shard) and whose payload
    /// is purged are deleted, except the newest of each table on each
    /// shard, and so is a purged operation's journal row
    /// once it has no tombstone left and a newer retired operation of the
    /// key covers all its tables. What remains per key is what fences
    /// stale writers and says where the key lives, so history stays
    /// bounded by the keys and the shards they left, not by the moves.
    /// Tombstones that fence stay, so stale writers remain refused.
    /// Aborted operations go too once a pass examined them, their retention
    /// elapsed and nothing of theirs is left on a shard.
    ///
    /// # Errors
    /// `JOURNAL_NOT_CONFIGURED`, `SHARD_UNAVAILABLE`, `CORRUPT_RECORD`.
    /// Per-operation refusals (`RETENTION_NOT_ELAPSED`, `NOT_VERIFIED`) are
    /// listed in the report.
    pub async fn purge_retired(&self) -> Result<PurgeReport> {
        self.core.purge_retired().await
    }
}
// ---- abort (`abort.rs`) ----

impl Router {
    /// Aborts the operation `op_id` of this journal scope when it has not
    /// cut over: its destination copies are dropped, it is journaled
    /// `aborted` (reason "aborted by an operator") and its claim released,
    /// so the key stays on its source and may be moved again. Idempotent:
    /// an operation already aborted is reported as such.
    ///
    /// Takes the scope's recovery lease for the call. A live mover of the
    /// operation loses it (its next step fails with `MIGRATION_TAKEN_OVER`).
    ///
    /// # Errors
    /// `JOURNAL_NOT_CONFIGURED`, `RECOVERY_IN_PROGRESS` while a recovery (or
    /// another abort) holds the lease, `MIGRATION_OPERATION_NOT_FOUND`,
    /// `MIGRATION_NOT_ABORTABLE` for an operation in `cutover_pending`,
    /// `committed`, `published` or `retired` (settle `cutover_pending` with
    /// `recover_migrations`), `MIGRATION_ALREADY_ACTIVE` when the operation
    /// kept changing owner, `RECOVERY_FENCED` when the lease was lost,
    /// `SHARD_UNAVAILABLE` and `MAPPING_UNAVAILABLE` (the abort may have
    /// stopped part-way: call it again), `UNKNOWN_TABLE` /
    /// `UNKNOWN_SHARD` when the operation's tables or shards are no longer
    /// configured.
    pub async fn abort_operation(&self, op_id: &str) -> Result<AbortReport> {
        self.core.abort_operation(op_id).await
    }
}

// ---- status (`status.rs`) ----

impl Router {
    /// Reads the journal of this scope without changing anything: the
    /// exact number of operations per state, the operations `opts` selects
    /// (first [`StatusOptions::limit`] in id order), the recovery lease and
    /// the last verification passes. Each part is one query on the journal
    /// shard; the parts are not one snapshot (a move running meanwhile may
    /// be counted in one state and listed in the next).
    ///
    /// # Errors
    /// `JOURNAL_NOT_CONFIGURED`, `INVALID_KEY` for a bad key filter,
    /// `SHARD_UNAVAILABLE` (also when the journal tables were never created:
    /// [`Router::init`] creates them), `CORRUPT_RECORD`.
    pub async fn migration_status(&self, opts: &StatusOptions) -> Result<StatusReport> {
        self.core.migration_status(opts).await
    }
}

// ---- computed placement: the manifest and epochs (`placement/manifest.rs`) ----

impl Router {
    /// The manifest as the journal shard holds it (the authority).
    ///
    /// # Errors
    /// `JOURNAL_NOT_CONFIGURED`, `SHARD_UNAVAILABLE`, `CORRUPT_RECORD`,
    /// `INVALID_CONFIG` (placement is not computed, or `init` never ran).
    pub async fn manifest_from_journal(&self) -> Result<Manifest> {
        self.core.manifest_from_journal().await
    }

    /// The manifest a read routes with: the cached one while it is fresh,
    /// else the mapping store's copy; when that cannot be read, a cached
    /// manifest of any age.
    ///
    /// # Errors
    /// `INVALID_CONFIG` (not computed), `MAPPING_UNAVAILABLE` or
    /// `SHARD_UNAVAILABLE` when no manifest was ever cached.
    pub async fn manifest(&self) -> Result<Arc<Manifest>> {
        self.core.manifest().await
    }

    /// Adds an epoch over `shards` as the newest, bumps the generation and
    /// raises every shard's fence to it. Adding the shard set the newest
    /// epoch already has changes nothing but re-raises the fences, so a
    /// call interrupted by a crash is finished by calling it again.
    ///
    /// # Errors
    /// `INVALID_CONFIG` (not computed, empty set), `UNKNOWN_SHARD`,
    /// `MIGRATION_UNSUPPORTED_DIALECT`, `JOURNAL_NOT_CONFIGURED`,
    /// `TOO_MANY_EPOCHS`, `PLACEMENT_CONFLICT`, `SHARD_UNAVAILABLE`,
    /// `MAPPING_UNAVAILABLE`.
    pub async fn add_epoch(&self, shards: &[&str]) -> Result<Arc<Manifest>> {
        self.core.add_epoch(shards).await
    }
}

// ---- computed placement: fences (`placement/fence.rs`) ----

impl Router {
    /// The generation fence of a shard (0 when none was raised).
    ///
    /// # Errors
    /// `UNKNOWN_SHARD`, `SHARD_UNAVAILABLE`, `CORRUPT_RECORD`.
    pub async fn fence(&self, shard: &str) -> Result<i64> {
        self.core.fence(shard).await
    }
}

// ---- computed placement: pruning (`placement/prune.rs`) ----

impl Router {
    /// Drops every epoch no row depends on.
    ///
    /// A run reads the exception set, bumps the manifest generation and
    /// raises every shard's fence to it (so writers holding an older
    /// manifest cannot place a row under an epoch being counted), counts the
    /// rows depending on each epoch over every page of every listed table on
    /// every shard, and publishes the manifest without the epochs nothing
    /// depends on, by the same compare-and-swap. The newest epoch always
    /// stays. A row depends on the newest epoch whose owner is the shard the
    /// row sits on; a key with a placement exception whose mapping points at
    /// that shard depends on the exception's epoch instead. A mapping alone
    /// keeps no epoch.
    ///
    /// With `dry_run` it reports the dependents and changes nothing.
    ///
    /// # Errors
    /// `JOURNAL_NOT_CONFIGURED`, `INVALID_CONFIG` (not computed, no tables,
    /// bad page size or concurrency), `INVALID_IDENTIFIER`, `PRUNE_REFUSED`
    /// (the exception set cannot be read), `PLACEMENT_CONFLICT`,
    /// `SHARD_UNAVAILABLE`, `MAPPING_UNAVAILABLE`.
    pub async fn prune_epochs(&self, opts: PruneOptions) -> Result<PruneReport> {
        self.core.prune_epochs(opts).await
    }
}

// ---- rebalancing (`rebalance.rs`) ----

impl Router {
    /// Plans (and unless `dry_run`, runs) the moves that place every mapped
    /// key on its hash owner among the target shards.
    ///
    /// # Errors
    /// `UNKNOWN_SHARD`, `UNKNOWN_TABLE`, `JOURNAL_NOT_CONFIGURED` (not for a
    /// dry run), `MAPPING_UNAVAILABLE`. Per-key failures are in the report.
    pub async fn rebalance(&self, opts: RebalanceOptions) -> Result<RebalanceReport> {
        self.core.rebalance(opts).await
    }

    /// [`Router::rebalance`], calling `progress` after each mapping it
    /// examines (phase `keys`; `changed` counts committed moves). The
    /// callback runs on the rebalancing task: keep it short.
    ///
    /// # Errors
    /// As [`Router::rebalance`].
    pub async fn rebalance_observed(
        &self,
        opts: RebalanceOptions,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<RebalanceReport> {
        self.core.rebalance_observed(opts, progress).await
    }
}

// ---- allocation reconciliation (`reconcile/`) ----

impl Router {
    /// Compares the coordinator's allocation ledger with routing, page by
    /// page, and reports the result. The mapping store is the record and the
    /// ledger is advisory.
    ///
    /// For each ledger row `(key, ledger_shard)`, routing is the key's
    /// mapping (read fresh from the mapping store, never from the cache) or,
    /// with none, [`Router::computed_owner`]. The row agrees when routing
    /// names the ledger shard; otherwise it is reported as disagreeing and
    /// left alone — neither the mapping nor the ledger row is changed.
    ///
    /// With [`ReconcileOptions::verify_records`], the key is probed (a
    /// `SELECT` of the key column, the key a bound parameter) in each listed
    /// table on the shard routing names, or on the ledger shard when the key
    /// is unrouted. Each row then counts as exactly one of verified (a listed
    /// table holds the key), missing (no listed table does, every probe ran)
    /// or unchecked (the shard is not configured, the table list is empty, or
    /// a probe failed and no other table held the key). A probe failure does
    /// not stop the run. With a journal, a move's destination copy under
    /// its in-flight marker is not counted (it is not the key's row until
    /// the move publishes it). A row found on a shard is not proof it is the
    /// authoritative copy: a shard holding a tombstone can keep a retained
    /// row, and for moved keys the journal is the authority.
    ///
    /// Nothing is written unless a flag asks for it:
    /// - `repair` maps (`put_if_absent`) each unrouted key to its ledger
    ///   shard, only when the probe found the row there, the key is valid
    ///   ([`crate::validate_key`]) and, with a journal, the journal is not
    ///   moving the key and did not move it to another shard (one journal
    ///   query per such key). A mapping another writer created first is
    ///   kept and the key is not counted as repaired.
    /// - `prune_verified` removes (`remove_if`, so a row re-recorded meanwhile
    ///   stays) each ledger row that agrees with an explicit mapping and,
    ///   with `verify_records`, was verified. Rows that match only computed
    ///   placement stay.
    ///
    /// The ledger is walked in key order with a cursor, so rows pruned by the
    /// run and rows recorded concurrently behind the cursor do not disturb
    /// it. `limit` stops the run early; [`ReconcileReport::resume_after`]
    /// then tells where to continue.
    ///
    /// Every option is checked before any I/O.
    ///
    /// # Errors
    /// `COORDINATOR_NOT_CONFIGURED` without a coordinator;
    /// `RECONCILE_VERIFY_REQUIRED` for `repair` without `verify_records`;
    /// `INVALID_CONFIG` for a page size outside `1..=10_000` or a zero
    /// limit; `INVALID_IDENTIFIER` for a bad table or key column name;
    /// under computed placement, the errors of [`Router::manifest`] when no
    /// manifest can be confirmed or was ever cached;
    /// `MAPPING_UNAVAILABLE` when the mapping store fails (for a repair
    /// write the outcome is unknown); `COORDINATOR_UNAVAILABLE` when the ledger fails (for a prune the
    /// outcome is unknown); `CORRUPT_RECORD` when a ledger page is not in
    /// strictly increasing key order. Rows handled before an error keep
    /// their writes.
    pub async fn reconcile_allocations(&self, opts: &ReconcileOptions) -> Result<ReconcileReport> {
        self.core.reconcile_allocations(opts).await
    }
}

// ---- record migration (`record.rs`) ----

impl Router {
    /// Copies `table`'s row of `key` from `source` to `target`, then deletes
    /// the source row (only if unchanged since the copy). Writes no journal,
    /// updates no mapping and is **not crash-safe**.
    ///
    /// # Errors
    /// `INVALID_KEY`, `UNKNOWN_TABLE`, `UNKNOWN_KEY_COLUMN`, `UNKNOWN_SHARD`,
    /// `MIGRATION_SAME_SHARD`, `MIGRATION_ROW_NOT_FOUND`,
    /// `DESTINATION_CONFLICT`, `ROW_REJECTED` (the destination refused the
    /// row's data; nothing was copied), `SHARD_UNAVAILABLE`.
    pub async fn migrate_record(
        &self,
        source: &str,
        target: &str,
        key: &str,
        table: &str,
        opts: MigrateOptions,
    ) -> Result<()> {
        self.core
            .migrate_record(source, target, key, table, opts)
            .await
    }
}
