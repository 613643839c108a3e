//! The crash/fault harness the migration suites of every backend share:
//! named shards `s0`, `s1`, … (of any dialects) with one mapping store, one
//! manual clock and one crash plan, routers built over them with or without
//! fault injection, and the crash scenario of a move (crash at the n-th
//! write, optionally crash the first recovery, then a fresh process
//! recovers).
//!
//! The harness sets up, injects and recovers; the suites keep their own
//! assertions on what a scenario leaves behind.

use std::any::Any;
use std::sync::Arc;

use super::{FaultMappingStore, FaultMode, FaultPlan, FaultShard};
use crate::{
    BackendFuture, BatchSupport, Dialect, Ident, ManualClock, MappingStore, MigrationConfig,
    MigrationError, PurgeReport, RecoveryReport, Router, Row, Shard, Statement, Value,
    VerifyOptions, VerifyReport, row,
};

/// The time the harness's clock starts at.
pub const START_MS: i64 = 1_700_000_000_000;

/// Named shards of any dialects sharing one mapping store, one clock and one
/// crash plan, and the tables routers over them know.
pub struct Harness {
    /// The clock every router of the harness uses.
    pub clock: ManualClock,
    /// The shards, named `s0`, `s1`, … by convention.
    pub shards: Vec<(String, Arc<dyn Shard>)>,
    /// The mapping store every router uses.
    pub mapping: Arc<dyn MappingStore>,
    /// The crash plan faulty routers share.
    pub plan: Arc<FaultPlan>,
    /// The shard holding the journal (`s0` unless changed).
    pub journal: &'static str,
    /// The clock domain of every router of the harness (they all read
    /// [`Harness::clock`]); unique per harness.
    pub clock_domain: String,
    tables: Vec<(&'static str, Option<&'static str>)>,
    _guards: Vec<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field(
                "shards",
                &self.shards.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("journal", &self.journal)
            .finish_non_exhaustive()
    }
}

impl Harness {
    /// A harness over `shards` and `mapping`, the clock at [`START_MS`], the
    /// journal on `s0`, no tables yet.
    pub fn new(shards: Vec<(String, Arc<dyn Shard>)>, mapping: Arc<dyn MappingStore>) -> Self {
        Self {
            clock: ManualClock::new(START_MS),
            shards,
            mapping,
            plan: FaultPlan::new(),
            journal: "s0",
            clock_domain: format!("harness-{}", uuid::Uuid::now_v7()),
            tables: Vec::new(),
            _guards: Vec::new(),
        }
    }

    /// Keeps `guard` (a temporary directory, a server process) alive as long
    /// as the harness.
    #[must_use]
    pub fn holding(mut self, guard: impl Any + Send + Sync) -> Self {
        self._guards.push(Box::new(guard));
        self
    }

    /// Adds a routed table keyed by `id` (tables are registered in the order
    /// they are added).
    #[must_use]
    pub fn table(mut self, table: &'static str) -> Self {
        self.tables.push((table, None));
        self
    }

    /// Adds a routed table keyed by `column`.
    #[must_use]
    pub fn table_with_key_column(mut self, table: &'static str, column: &'static str) -> Self {
        self.tables.push((table, Some(column)));
        self
    }

    /// A router configuration over every shard and the mapping store; with
    /// `faulty`, every shard and the mapping store go through the crash plan.
    pub fn config(&self, faulty: bool, ttl: u64) -> MigrationConfig {
        let mapping: Arc<dyn MappingStore> = if faulty {
            Arc::new(FaultMappingStore::new(
                Arc::clone(&self.mapping),
                Arc::clone(&self.plan),
            ))
        } else {
            Arc::clone(&self.mapping)
        };
        let mut c = MigrationConfig::new(mapping)
            .journal_shard(self.journal)
            .mapping_cache_ttl_ms(ttl)
            .clock(Arc::new(self.clock.clone()))
            .clock_domain(self.clock_domain.clone());
        for (table, column) in &self.tables {
            c = match column {
                None => c.table(*table),
                Some(column) => c.table_with_key_column(*table, *column),
            };
        }
        for (name, s) in &self.shards {
            let shard: Arc<dyn Shard> = if faulty {
                Arc::new(FaultShard::new(Arc::clone(s), Arc::clone(&self.plan)))
            } else {
                Arc::clone(s)
            };
            c = c.shard(name.clone(), shard);
        }
        c
    }

    /// An initialised router over [`Harness::config`].
    pub async fn router_with(&self, faulty: bool, ttl: u64) -> Router {
        let r = Router::new(self.config(faulty, ttl)).unwrap();
        r.init().await.unwrap();
        r
    }

    /// An initialised router without faults, mapping cache TTL 30 s.
    pub async fn router(&self) -> Router {
        self.router_with(false, 30_000).await
    }

    /// The shard named `name`.
    ///
    /// # Panics
    /// When there is none.
    pub fn shard(&self, name: &str) -> &Arc<dyn Shard> {
        &self.shards.iter().find(|(n, _)| n == name).unwrap().1
    }

    /// Live rows of (table, key column, key) on every shard.
    pub async fn live(&self, table: &str, col: &str, key: &str) -> Vec<(String, Row)> {
        let mut out = Vec::new();
        for (name, s) in &self.shards {
            let st =
                s.dialect()
                    .select_row(&Ident::new(table).unwrap(), &Ident::new(col).unwrap(), key);
            for r in s.query(&st).await.unwrap() {
                out.push((name.clone(), r));
            }
        }
        out
    }

    /// The one live row of (table, key column, key), with its shard.
    ///
    /// # Panics
    /// When the key has no row or rows on several shards.
    pub async fn only_row(&self, table: &str, col: &str, key: &str) -> (String, Row) {
        let mut live = self.live(table, col, key).await;
        assert_eq!(live.len(), 1, "{table}.{key} lives once: {live:?}");
        live.remove(0)
    }

    /// Maps `u1` to `s0` and inserts its `users` row (`ann`, 1) through
    /// `r`: the one-key start of most scenarios.
    pub async fn seed_ann(&self, r: &Router) {
        self.mapping.put("u1", "s0").await.unwrap();
        r.insert("u1", "users", user("ann", 1)).await.unwrap();
    }

    /// Leaves an interrupted move of `key` to `to` over `table`: a faulty
    /// router crashes it at write `n` (`mode`), then the clock passes the
    /// mapping TTL.
    pub async fn interrupt_move(&self, key: &str, to: &str, table: &str, n: u64, mode: FaultMode) {
        let rf = self.router_with(true, 30_000).await;
        self.plan.arm(n, mode);
        assert!(rf.reassign_shard(key, to, table).await.is_err());
        self.plan.disarm();
        self.clock.advance(31_000);
    }

    /// The crash scenario of a move of key `k` (on `s0`, with a `users` row,
    /// an `orgs` row when `tables` moves `orgs` (a move must include every
    /// table holding a row of the key), and an acknowledged update) to `s1`
    /// over `tables`: the
    /// move crashes at write `n` (`mode`); after the mapping TTL a first
    /// recovery optionally crashes at its write `m`; then a fresh router
    /// recovers. The suite asserts on the returned [`CrashRun`].
    pub async fn crash_move(
        &self,
        tables: &[&str],
        n: u64,
        mode: FaultMode,
        recovery_crash: Option<(u64, FaultMode)>,
    ) -> CrashRun {
        let setup = self.router().await;
        self.mapping.put("k", "s0").await.unwrap();
        setup.insert("k", "users", user("ann", 1)).await.unwrap();
        if tables.contains(&"orgs") {
            setup
                .insert("k", "orgs", row([("title", "Acme")]))
                .await
                .unwrap();
        }
        // An acknowledged write before the move.
        assert_eq!(
            setup.update("k", "users", user("acked", 2)).await.unwrap(),
            1
        );
        let r = self.router_with(true, 30_000).await;
        self.plan.arm(n, mode);
        let res = r.reassign_keys("k", "s1", tables).await;
        let tripped = self.plan.tripped();
        if !tripped {
            res.unwrap();
        }
        drop(r);
        self.plan.disarm();
        self.clock.advance(31_000);
        let mut recovery_tripped = false;
        if let Some((m, rmode)) = recovery_crash {
            let rc = self.router_with(true, 30_000).await;
            self.plan.arm(m, rmode);
            let _ = rc.recover_migrations().await;
            recovery_tripped = self.plan.tripped();
            self.plan.disarm();
            drop(rc);
            self.clock.advance(61_000);
        }
        let fresh = self.router().await;
        let report = fresh.recover_migrations().await.unwrap();
        CrashRun {
            fresh,
            report,
            tripped,
            recovery_tripped,
        }
    }
}

/// What [`Harness::crash_move`] leaves: the fresh router and its recovery
/// report, and whether each crash point was reached.
pub struct CrashRun {
    /// The router of the fresh process, after its recovery.
    pub fresh: Router,
    /// The fresh process's recovery report.
    pub report: RecoveryReport,
    /// Whether the move reached its crash point.
    pub tripped: bool,
    /// Whether the first recovery reached its crash point.
    pub recovery_tripped: bool,
}

durability_time::debug_fields!(CrashRun {
    tripped,
    recovery_tripped
});

impl CrashRun {
    /// Checks what the crash scenario of [`Harness::crash_move`] over
    /// `tables` must leave on `h`: nothing failed, a clean verification, one
    /// live `users` row of `k` and one `orgs` row when the move included
    /// `orgs` (readable through the router), none when it did not, the
    /// acknowledged write kept, and `k`
    /// writable and readable afterwards. `ctx` names the case in messages.
    ///
    /// # Panics
    /// On the first broken rule, naming it.
    pub async fn check(&self, h: &Harness, tables: &[&str], ctx: &str) {
        let fresh = &self.fresh;
        assert!(self.report.failed.is_empty(), "{ctx}: {:?}", self.report);
        clean_verify(fresh).await;
        for (t, c) in [("users", "id"), ("orgs", "org_id")] {
            let live = h.live(t, c, "k").await;
            if tables.contains(&t) {
                assert_eq!(live.len(), 1, "{ctx}: one live row of {t}: {live:?}");
                let got = fresh.get("k", t).await.unwrap().unwrap();
                assert_eq!(got, live[0].1, "{ctx}: readable through the router");
            } else {
                assert!(live.is_empty(), "{ctx}: no row of {t} appeared: {live:?}");
            }
        }
        let got = fresh.get("k", "users").await.unwrap().unwrap();
        assert_eq!(
            got.get("name"),
            Some(&Value::from("acked")),
            "{ctx}: acknowledged write kept"
        );
        assert_eq!(
            fresh.update("k", "users", user("after", 3)).await.unwrap(),
            1,
            "{ctx}: writable after recovery"
        );
        assert_eq!(
            fresh.get("k", "users").await.unwrap().unwrap().get("name"),
            Some(&Value::from("after")),
            "{ctx}: the write after recovery reads back"
        );
    }
}

/// Runs `before_write` before every write (`execute` or `batch`) of the
/// shard it wraps, and delegates everything else: the way a suite stalls,
/// races or injects work at a chosen write.
pub trait BeforeWrite: Send + Sync {
    /// Called with the statements of each write before it reaches the inner
    /// shard; an error is the write's error.
    fn before_write<'a>(
        &'a self,
        inner: &'a Arc<dyn Shard>,
        stmts: &'a [Statement],
    ) -> BackendFuture<'a, ()>;
}

/// A shard that runs its [`BeforeWrite`] hook before each write of `inner`.
pub struct HookedShard<H> {
    /// The wrapped shard.
    pub inner: Arc<dyn Shard>,
    /// The hook.
    pub hook: H,
}

impl<H> std::fmt::Debug for HookedShard<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedShard").finish_non_exhaustive()
    }
}

impl<H: BeforeWrite> HookedShard<H> {
    /// `inner` with `hook`.
    pub fn new(inner: Arc<dyn Shard>, hook: H) -> Self {
        Self { inner, hook }
    }
}

impl<H: BeforeWrite> Shard for HookedShard<H> {
    fn dialect(&self) -> Dialect {
        self.inner.dialect()
    }
    fn batch_support(&self) -> BatchSupport {
        self.inner.batch_support()
    }
    fn execute<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, u64> {
        Box::pin(async move {
            self.hook
                .before_write(&self.inner, std::slice::from_ref(stmt))
                .await?;
            self.inner.execute(stmt).await
        })
    }
    fn query<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, Vec<Row>> {
        self.inner.query(stmt)
    }
    fn batch<'a>(&'a self, stmts: &'a [Statement]) -> BackendFuture<'a, Vec<u64>> {
        Box::pin(async move {
            self.hook.before_write(&self.inner, stmts).await?;
            self.inner.batch(stmts).await
        })
    }
}

/// An insert of `(id, n)` into the table `t (id, n)` with `shard`'s
/// placeholders.
pub fn insert_t(shard: &dyn Shard, id: &str, n: Value) -> Statement {
    let d = shard.dialect();
    Statement::with_params(
        format!(
            "INSERT INTO t (id, n) VALUES ({}, {})",
            d.placeholder(1),
            d.placeholder(2)
        ),
        vec![Value::from(id), n],
    )
}

/// A failing batch rolls back every statement: on the caller's empty table
/// `t (id, n BIGINT NOT NULL)`, each of `bads` comes last in a batch after
/// two inserts that succeed, the batch fails and `t` stays empty; then a
/// batch of two inserts commits (the backend still works after failed
/// transactions).
///
/// # Panics
/// On the first broken rule, naming it.
pub async fn failed_batches_roll_back(shard: &dyn Shard, bads: Vec<Statement>) {
    for bad in bads {
        let stmts = vec![
            insert_t(shard, "x", 1i64.into()),
            insert_t(shard, "y", 2i64.into()),
            bad,
        ];
        assert!(shard.batch(&stmts).await.is_err(), "the batch fails");
        let rows = shard
            .query(&Statement::new("SELECT count(*) AS c FROM t"))
            .await
            .unwrap();
        assert_eq!(rows[0].get("c"), Some(&Value::Integer(0)), "rolled back");
    }
    let counts = shard
        .batch(&[
            insert_t(shard, "x", 1i64.into()),
            insert_t(shard, "y", 2i64.into()),
        ])
        .await
        .unwrap();
    assert_eq!(counts, vec![1, 1], "works after failed transactions");
}

/// A `users` row.
pub fn user(name: &str, n: i64) -> Row {
    row([("name", Value::from(name)), ("n", Value::from(n))])
}

/// A repairing verification is clean, and a second one repairs nothing.
pub async fn clean_verify(r: &Router) {
    let rep = repair(r).await.unwrap();
    assert!(rep.clean, "repairing verification is clean: {rep:?}");
    let rep = r
        .verify_migrations(VerifyOptions {
            full: true,
            ..VerifyOptions::default()
        })
        .await
        .unwrap();
    assert!(
        rep.clean && rep.repaired.is_empty(),
        "second verification is clean: {rep:?}"
    );
}

/// Purges through `r`, asserting that it purged `purged` moves and refused
/// `refused` (`ctx` names the case); returns the report.
///
/// # Panics
/// When the purge fails or counts otherwise.
pub async fn purge_expect(r: &Router, (purged, refused): (u64, u64), ctx: &str) -> PurgeReport {
    let purge = r.purge_retired().await.unwrap();
    assert_eq!(
        (purge.purged_count, purge.refused_count),
        (purged, refused),
        "{ctx}: {purge:?}"
    );
    purge
}

/// A full repairing verification (every finished operation and every
/// tombstone).
///
/// # Errors
/// The router's error.
pub async fn repair(r: &Router) -> Result<VerifyReport, MigrationError> {
    r.verify_migrations(VerifyOptions {
        repair: true,
        full: true,
        ..VerifyOptions::default()
    })
    .await
}
