//! A seeded, randomized concurrent workload over routed shards with a model
//! of what every key must read (issue 13, "Proof"), on SQLite, PostgreSQL
//! and MariaDB shard sets, under mapped and computed placement.
//!
//! Every shard call yields one to four times first (a seeded pace; an
//! embedded SQLite shard never yields by itself) and every mapping lookup
//! or publish once, and each operation of a step starts after a seeded
//! random number of yields, so the operations of a step interleave on
//! every dialect at varying relative speeds. Every key a move of a step
//! acknowledged is read back right after the step.
//!
//! Each seed drives five routers over three shards (two with the default
//! mapping cache TTL, one with TTL 0, one with a one-day TTL that routes
//! stale, one whose shards and mapping store go through the harness's crash
//! plan) through steps of one to three operations run concurrently
//! (`join_all` on one task, so they interleave at every backend call):
//! routed insert / update / upsert / delete of a few keys in `users` and
//! `orgs` (whose `title` folds case on every dialect, and every title
//! written differs from the others only in case), reads, single-table moves and table-set moves (every table the
//! model says may hold a row of the key), rebalances onto random shard
//! subsets, incremental and full verification with and without repair,
//! `purge_retired` (most moves retire immediately; the clock advances so
//! purge and history compaction happen), recovery, and faults: the crash
//! plan armed at a random write of the faulty router's write, move,
//! recovery or repair (an interrupted move is then finished by its own
//! router's retry or another router's recovery), a mapping publish that is
//! acknowledged but lost, and a moved key's mapping deleted or reverted
//! behind the routers' backs. Time is the harness's manual clock.
//!
//! The model keeps, per (key, table), the values the row may hold: an
//! acknowledged write defines it, a write whose error is
//! `is_outcome_unknown()` adds its value to the old ones, a definite
//! refusal changes nothing; a routed result that contradicts the model
//! (an update that changed one row of a key the model says has none, an
//! insert acknowledged over a row that must exist) is a violation, and a
//! read narrows the model to what it saw. At the end the faults are
//! disarmed, the clock passes every lease, a fresh router recovers and runs
//! a full repairing verification (which must be clean, and a second full
//! pass must find and repair nothing), and a fresh router reads every key:
//! each reads a value the model allows and has exactly one live row per
//! table that holds it (none where it holds nothing).
//!
//! Size: `DURABILITY_MIGRATION_MODEL_SEEDS` (how many seeds, from
//! `DURABILITY_MIGRATION_MODEL_FIRST_SEED`, default 1; default 2) and
//! `DURABILITY_MIGRATION_MODEL_OPS` (operations per seed; default
//! 150); `DURABILITY_MIGRATION_MODEL_SEED=n` runs seed `n` only (a failure
//! prints its seed and the operations that led to it). `cargo xtask verify`
//! runs a larger campaign. Without a server a test prints that it skipped,
//! unless `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use futures::future::join_all;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::shards::{
    Env, Hook, Kind, Write, coarse_key_ddl, env, env_with, hooked, router_with_user,
};
use durability_migration::conformance::FaultMode;
use durability_migration::conformance::harness::repair;
use durability_migration::conformance::safety::SafetyCheck;
use durability_migration::{
    BackendError, BackendFuture, MappingStore, MemoryMappingStore, MigrationConfig, MigrationError,
    MoveOptions, MoveOutcome, Placement, PurgeReport, RebalanceOptions, RebalanceReport,
    RecoveryReport, Retire, Router, Row, Shard, Statement, Value, VerifyOptions, VerifyReport, row,
};

use Kind::{MySql, Postgres, Sqlite};

/// The routed tables the workload writes: (table, key column).
const TABLES: [(&str, &str); 2] = [("users", "id"), ("orgs", "org_id")];
/// Keys the workload touches.
const KEYS: usize = 8;
const SHARDS: [&str; 3] = ["s0", "s1", "s2"];
/// Router roles (indexes into `World::routers`): 0 and 1 cache mappings for
/// 30 s, 2 for 0 ms, 3 for a day (stale); the faulty one goes through the
/// crash plan.
const FAULTY: usize = 4;
const PLAIN_ROUTERS: usize = 4;
/// The stale router's mapping cache TTL: one day.
const STALE_TTL_MS: u64 = 86_400_000;

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a count")),
        Err(_) => default,
    }
}

/// The seeds to run: `DURABILITY_MIGRATION_MODEL_SEED` alone, else
/// `DURABILITY_MIGRATION_MODEL_SEEDS` seeds from
/// `DURABILITY_MIGRATION_MODEL_FIRST_SEED` (a campaign that explores new
/// seeds).
fn seeds() -> Vec<u64> {
    if let Ok(v) = std::env::var("DURABILITY_MIGRATION_MODEL_SEED") {
        return vec![v.parse().expect("DURABILITY_MIGRATION_MODEL_SEED is a u64")];
    }
    let first = env_usize("DURABILITY_MIGRATION_MODEL_FIRST_SEED", 1) as u64;
    let n = env_usize("DURABILITY_MIGRATION_MODEL_SEEDS", 2) as u64;
    (first..first + n).collect()
}

fn ops() -> usize {
    env_usize("DURABILITY_MIGRATION_MODEL_OPS", 150)
}

/// A mapping store that loses the next `put` of one chosen key: it is
/// acknowledged and not applied (a failover that lost an acknowledged
/// publish). Everything else goes to the inner store.
#[derive(Default)]
struct LossyMapping {
    inner: MemoryMappingStore,
    lose_put_of: Mutex<Option<String>>,
    lost: AtomicU64,
}

impl MappingStore for LossyMapping {
    fn get<'a>(&'a self, key: &'a str) -> BackendFuture<'a, Option<String>> {
        // Yields first, like the shards (see `Yielding`).
        Box::pin(async move {
            tokio::task::yield_now().await;
            self.inner.get(key).await
        })
    }
    fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()> {
        let lose = {
            let mut armed = self.lose_put_of.lock().unwrap();
            if armed.as_deref() == Some(key) {
                *armed = None;
                true
            } else {
                false
            }
        };
        if lose {
            self.lost.fetch_add(1, Ordering::SeqCst);
            return Box::pin(async { Ok(()) });
        }
        Box::pin(async move {
            tokio::task::yield_now().await;
            self.inner.put(key, shard).await
        })
    }
    crate::shards::mapping_passthrough!();
}

/// A shard that yields to the other operations of its step before every
/// call. An embedded SQLite shard answers without ever returning
/// `Pending`, so without it the operations `join_all` runs together would
/// run one after the other on SQLite shards instead of interleaving at
/// every backend call.
struct Yielding {
    inner: Arc<dyn Shard>,
    pace: Arc<Pace>,
}

/// How many times a shard call yields before it runs: one to four, drawn
/// from the seed's own random stream (reseeded by `World::run`), so the
/// operations of a step run at varying relative speeds and a whole short
/// operation can fit between two calls of a long one.
struct Pace(Mutex<StdRng>);

impl Pace {
    async fn wait(&self) {
        let n = self.0.lock().unwrap().random_range(1..=4);
        for _ in 0..n {
            tokio::task::yield_now().await;
        }
    }
}

durability_time::debug_fields!(Yielding {});

impl Shard for Yielding {
    crate::shards::shard_passthrough!();
    fn execute<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, u64> {
        Box::pin(async move {
            self.pace.wait().await;
            self.inner.execute(stmt).await
        })
    }
    fn batch<'a>(&'a self, stmts: &'a [Statement]) -> BackendFuture<'a, Vec<u64>> {
        Box::pin(async move {
            self.pace.wait().await;
            self.inner.batch(stmts).await
        })
    }
    fn query<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, Vec<Row>> {
        Box::pin(async move {
            self.pace.wait().await;
            self.inner.query(stmt).await
        })
    }
}

/// Letters of an `orgs.title`: the write token in their case, one bit per
/// letter (a set bit is upper case).
const TITLE_LETTERS: u32 = 24;

/// The `orgs.title` of write token `tok`: the same letters whatever the
/// token, only their case differs. `orgs.title` compares case-insensitively
/// on every dialect of the workload (see `fold_case_title`), so any two
/// writes of a title are equal to the column's collation and differ only
/// in their bytes.
fn title(tok: i64) -> String {
    (0..TITLE_LETTERS)
        .map(|bit| {
            let c = char::from(b'a' + u8::try_from(bit % 26).unwrap());
            if (tok >> bit) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect()
}

/// The write token an `orgs.title` holds.
fn title_token(t: &str) -> Option<i64> {
    if t.len() != TITLE_LETTERS as usize || !t.eq_ignore_ascii_case(&title(0)) {
        return None;
    }
    Some(
        t.bytes()
            .enumerate()
            .filter(|(_, b)| b.is_ascii_uppercase())
            .map(|(bit, _)| 1i64 << bit)
            .sum(),
    )
}

/// The row a write of `tok` puts in `table`.
fn value_row(table: usize, tok: i64) -> Row {
    match table {
        0 => row([
            ("name", Value::from(format!("w{tok}"))),
            ("n", Value::from(tok)),
        ]),
        _ => row([("title", Value::from(title(tok)))]),
    }
}

/// The write token a row of `table` holds.
fn token(table: usize, r: &Row) -> Option<i64> {
    match table {
        0 => r.get("n").and_then(Value::as_integer),
        _ => r
            .get("title")
            .and_then(Value::as_text)
            .and_then(title_token),
    }
}

/// Makes `orgs.title` compare case-insensitively on `kind`'s shard (it
/// holds no row yet): SQLite `NOCASE`, MariaDB `utf8mb4_general_ci`,
/// PostgreSQL a nondeterministic ICU collation. The crate must decide
/// equality of its values by their bytes.
async fn fold_case_title(s: &Arc<dyn Shard>, kind: Kind) {
    let ddl: &[&str] = match kind {
        Sqlite => &[
            "DROP TABLE orgs",
            "CREATE TABLE orgs (org_id TEXT PRIMARY KEY, title TEXT COLLATE NOCASE)",
        ],
        Postgres => &[
            "CREATE COLLATION IF NOT EXISTS fold_case (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
            "ALTER TABLE orgs ALTER COLUMN title TYPE TEXT COLLATE fold_case",
        ],
        MySql => &[
            "ALTER TABLE orgs MODIFY title LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci",
        ],
    };
    for stmt in ddl {
        s.execute(&Statement::new(*stmt)).await.unwrap();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WKind {
    Insert,
    Update,
    Upsert,
    Delete,
}

/// One operation of a step.
#[derive(Debug, Clone)]
enum Act {
    Write {
        r: usize,
        key: usize,
        table: usize,
        kind: WKind,
        tok: i64,
    },
    Read {
        r: usize,
        key: usize,
        table: usize,
    },
    Move {
        r: usize,
        key: usize,
        to: &'static str,
        tables: Vec<usize>,
        retire: Retire,
    },
    Rebalance {
        r: usize,
        targets: Vec<String>,
        retire: Retire,
    },
    Verify {
        r: usize,
        full: bool,
        repair: bool,
    },
    Purge {
        r: usize,
    },
    Recover {
        r: usize,
    },
}

impl Act {
    /// The key the operation is about, when it is about one.
    fn key(&self) -> Option<usize> {
        match self {
            Act::Write { key, .. } | Act::Read { key, .. } | Act::Move { key, .. } => Some(*key),
            _ => None,
        }
    }

    fn router(&self) -> usize {
        match self {
            Act::Write { r, .. }
            | Act::Read { r, .. }
            | Act::Move { r, .. }
            | Act::Rebalance { r, .. }
            | Act::Verify { r, .. }
            | Act::Purge { r }
            | Act::Recover { r } => *r,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Act::Write { kind, .. } => match kind {
                WKind::Insert => "insert",
                WKind::Update => "update",
                WKind::Upsert => "upsert",
                WKind::Delete => "delete",
            },
            Act::Read { .. } => "read",
            Act::Move { tables, .. } if tables.len() == 1 => "move_one",
            Act::Move { .. } => "move_set",
            Act::Rebalance { .. } => "rebalance",
            Act::Verify { full: true, .. } => "verify_full",
            Act::Verify { .. } => "verify",
            Act::Purge { .. } => "purge",
            Act::Recover { .. } => "recover",
        }
    }
}

/// What an operation returned.
#[derive(Debug)]
enum Res {
    Count(Result<u64, MigrationError>),
    Row(Result<Option<Row>, MigrationError>),
    Move(Result<MoveOutcome, MigrationError>),
    Rebalance(Result<RebalanceReport, MigrationError>),
    Verify(Box<Result<VerifyReport, MigrationError>>),
    Purge(Result<PurgeReport, MigrationError>),
    Recover(Result<RecoveryReport, MigrationError>),
}

fn outcome<T>(r: &Result<T, MigrationError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(e) => e.code(),
    }
}

impl Res {
    fn code(&self) -> &'static str {
        match self {
            Res::Count(r) => outcome(r),
            Res::Row(r) => outcome(r),
            Res::Move(r) => outcome(r),
            Res::Rebalance(r) => outcome(r),
            Res::Verify(r) => outcome(r.as_ref()),
            Res::Purge(r) => outcome(r),
            Res::Recover(r) => outcome(r),
        }
    }
}

/// The values a (key, table) may hold: `None` is no row.
type Poss = BTreeSet<Option<i64>>;

/// One workload run: the shards, the routers and the model.
struct World {
    e: Env,
    lossy: Arc<LossyMapping>,
    /// The shards' pace (see `Pace`).
    pace: Arc<Pace>,
    routers: Vec<Router>,
    computed: bool,
    keys: Vec<String>,
    /// (key, table) → the values it may hold.
    model: BTreeMap<(usize, usize), Poss>,
    /// Keys a move was acknowledged for → that move's source.
    moved: BTreeMap<usize, String>,
    log: Vec<String>,
    violations: Vec<String>,
    ops: BTreeMap<&'static str, u64>,
    codes: BTreeMap<String, u64>,
    faults: BTreeMap<&'static str, u64>,
    checks: BTreeMap<&'static str, u64>,
    /// The safety check every router of this world skips (the proof that
    /// the checker notices its absence), or none.
    disabled: Option<SafetyCheck>,
}

fn config(e: &Env, computed: bool, faulty: bool, ttl: u64) -> MigrationConfig {
    let c = e.config(faulty, ttl);
    if computed {
        c.placement(Placement::Computed)
    } else {
        c
    }
}

async fn router_without(
    e: &Env,
    computed: bool,
    faulty: bool,
    ttl: u64,
    disabled: Option<SafetyCheck>,
) -> Router {
    let mut c = config(e, computed, faulty, ttl);
    if let Some(check) = disabled {
        c = c.without_safety_check(check);
    }
    let r = Router::new(c).unwrap();
    r.init().await.unwrap();
    r
}

/// The workload's setup check: a key column with a coarse collation is
/// refused (`KEY_COLUMN_NOT_BYTEWISE`), so the workload cannot include one.
async fn coarse_key_column_is_refused(e: &Env, kind: Kind, computed: bool) {
    let s = e.shard("s0");
    for ddl in coarse_key_ddl(kind) {
        s.execute(&Statement::new(ddl)).await.unwrap();
    }
    let r = Router::new(config(e, computed, false, 30_000).table("ckeys")).unwrap();
    r.init().await.unwrap();
    // A key placed on s0, where the coarse table is.
    let key = (0..)
        .map(|i| format!("c{i}"))
        .find(|k| {
            let owner = if computed {
                r.computed_owner(k)
            } else {
                r.placement(k)
            };
            owner.as_deref() == Some("s0")
        })
        .unwrap();
    let err = r
        .insert(&key, "ckeys", row([("n", 1i64)]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "KEY_COLUMN_NOT_BYTEWISE", "{kind:?}: {err}");
}

impl World {
    async fn new(kinds: &[Kind], computed: bool, disabled: Option<SafetyCheck>) -> Option<Self> {
        let lossy = Arc::new(LossyMapping::default());
        let mut e = env_with(kinds, Arc::clone(&lossy) as Arc<dyn MappingStore>).await?;
        let pace = Arc::new(Pace(Mutex::new(StdRng::seed_from_u64(0))));
        for ((_, s), kind) in e.shards.iter_mut().zip(kinds) {
            fold_case_title(s, *kind).await;
            *s = Arc::new(Yielding {
                inner: Arc::clone(s),
                pace: Arc::clone(&pace),
            });
        }
        let mut routers = Vec::new();
        for (faulty, ttl) in [
            (false, 30_000),
            (false, 30_000),
            (false, 0),
            (false, STALE_TTL_MS),
            (true, 30_000),
        ] {
            routers.push(router_without(&e, computed, faulty, ttl, disabled).await);
        }
        let mut model = BTreeMap::new();
        for k in 0..KEYS {
            for t in 0..TABLES.len() {
                model.insert((k, t), Poss::from([None]));
            }
        }
        Some(Self {
            e,
            lossy,
            pace,
            routers,
            computed,
            keys: (0..KEYS).map(|k| format!("k{k}")).collect(),
            model,
            moved: BTreeMap::new(),
            log: Vec::new(),
            violations: Vec::new(),
            ops: BTreeMap::new(),
            codes: BTreeMap::new(),
            faults: BTreeMap::new(),
            checks: BTreeMap::new(),
            disabled,
        })
    }

    fn count(map: &mut BTreeMap<&'static str, u64>, what: &'static str) {
        *map.entry(what).or_default() += 1;
    }

    fn violation(&mut self, step: usize, what: String) {
        self.violations.push(format!("step {step}: {what}"));
    }

    /// The tables the model says may hold a row of `key`.
    fn tables_of(&self, key: usize) -> Vec<usize> {
        (0..TABLES.len())
            .filter(|t| self.model[&(key, *t)].iter().any(Option::is_some))
            .collect()
    }

    async fn exec(&self, a: &Act) -> Res {
        let r = &self.routers[a.router()];
        match a {
            Act::Write {
                key,
                table,
                kind,
                tok,
                ..
            } => {
                let (k, t) = (self.keys[*key].as_str(), TABLES[*table].0);
                let v = value_row(*table, *tok);
                Res::Count(match kind {
                    WKind::Insert => r.insert(k, t, v).await,
                    WKind::Update => r.update(k, t, v).await,
                    WKind::Upsert => r.upsert(k, t, v).await,
                    WKind::Delete => r.delete(k, t).await,
                })
            }
            Act::Read { key, table, .. } => {
                Res::Row(r.get(&self.keys[*key], TABLES[*table].0).await)
            }
            Act::Move {
                key,
                to,
                tables,
                retire,
                ..
            } => {
                let names: Vec<&str> = tables.iter().map(|t| TABLES[*t].0).collect();
                Res::Move(
                    r.reassign_keys_with(
                        &self.keys[*key],
                        to,
                        &names,
                        MoveOptions { retire: *retire },
                    )
                    .await,
                )
            }
            Act::Rebalance {
                targets, retire, ..
            } => Res::Rebalance(
                r.rebalance(RebalanceOptions {
                    target_shards: Some(targets.clone()),
                    tables: TABLES.iter().map(|(t, _)| (*t).to_owned()).collect(),
                    move_options: MoveOptions { retire: *retire },
                    ..RebalanceOptions::default()
                })
                .await,
            ),
            Act::Verify { full, repair, .. } => Res::Verify(Box::new(
                r.verify_migrations(VerifyOptions {
                    full: *full,
                    repair: *repair,
                    ..VerifyOptions::default()
                })
                .await,
            )),
            Act::Purge { .. } => Res::Purge(r.purge_retired().await),
            Act::Recover { .. } => Res::Recover(r.recover_migrations().await),
        }
    }

    /// Folds an operation's result into the model, recording violations.
    fn apply(&mut self, step: usize, a: &Act, res: &Res) {
        *self.codes.entry(res.code().to_owned()).or_default() += 1;
        match (a, res) {
            (
                Act::Write {
                    key,
                    table,
                    kind,
                    tok,
                    r,
                },
                Res::Count(result),
            ) => {
                let cell = (*key, *table);
                let poss = self.model[&cell].clone();
                let present = poss.iter().any(Option::is_some);
                let absent = poss.contains(&None);
                let ctx = format!(
                    "{} of {}/{} ({tok}) via router {r}: {result:?}, model {poss:?}",
                    a.kind(),
                    self.keys[*key],
                    TABLES[*table].0
                );
                let next: Poss = match (kind, result) {
                    (WKind::Insert, Ok(1)) if absent => [Some(*tok)].into(),
                    (WKind::Insert, Err(e)) if e.code() == "DUPLICATE_KEY" && present => {
                        poss.iter().filter(|p| p.is_some()).copied().collect()
                    }
                    (WKind::Upsert, Ok(n)) if *n >= 1 => [Some(*tok)].into(),
                    (WKind::Update, Ok(1)) if present => [Some(*tok)].into(),
                    (WKind::Update, Ok(0)) if absent => [None].into(),
                    (WKind::Delete, Ok(1)) if present => [None].into(),
                    (WKind::Delete, Ok(0)) if absent => [None].into(),
                    (_, Ok(_)) => {
                        self.violation(step, format!("result contradicts the model: {ctx}"));
                        return;
                    }
                    (WKind::Insert, Err(e)) if e.code() == "DUPLICATE_KEY" => {
                        self.violation(
                            step,
                            format!("duplicate of a row that cannot exist: {ctx}"),
                        );
                        return;
                    }
                    (_, Err(e)) if e.is_outcome_unknown() => {
                        let mut next = poss.clone();
                        match kind {
                            WKind::Insert if absent => {
                                next.insert(Some(*tok));
                            }
                            WKind::Upsert => {
                                next.insert(Some(*tok));
                            }
                            WKind::Update if present => {
                                next.insert(Some(*tok));
                            }
                            WKind::Delete if present => {
                                next.insert(None);
                            }
                            _ => {}
                        }
                        next
                    }
                    (_, Err(_)) => poss.clone(),
                };
                self.model.insert(cell, next);
            }
            (Act::Read { key, table, r }, Res::Row(result)) => {
                let cell = (*key, *table);
                let poss = &self.model[&cell];
                let seen = match result {
                    Ok(Some(row)) => match token(*table, row) {
                        Some(t) => Some(Some(t)),
                        None => {
                            let what = format!("unreadable row {row:?}");
                            self.violation(step, what);
                            return;
                        }
                    },
                    Ok(None) => Some(None),
                    Err(_) => None,
                };
                if let Some(seen) = seen {
                    Self::count(&mut self.checks, "reads");
                    if poss.contains(&seen) {
                        self.model.insert(cell, [seen].into());
                    } else {
                        let what = format!(
                            "read of {}/{} via router {r} saw {seen:?}, model allows {poss:?}",
                            self.keys[*key], TABLES[*table].0
                        );
                        self.violation(step, what);
                    }
                }
            }
            (Act::Move { key, .. }, Res::Move(Ok(out))) => {
                self.moved.insert(*key, out.source.clone());
            }
            (Act::Rebalance { .. }, Res::Rebalance(Ok(rep))) => {
                for _ in 0..rep.moved {
                    Self::count(&mut self.checks, "rebalance_moves");
                }
            }
            (Act::Verify { .. }, Res::Verify(v)) if v.is_ok() => {
                let rep = v.as_ref().as_ref().unwrap();
                Self::count(
                    &mut self.checks,
                    if rep.clean {
                        "verify_clean"
                    } else {
                        "verify_unclean"
                    },
                );
            }
            (Act::Purge { .. }, Res::Purge(Ok(rep))) => {
                for _ in 0..rep.purged_count {
                    Self::count(&mut self.checks, "purged");
                }
                for _ in 0..rep.compacted_count {
                    Self::count(&mut self.checks, "compacted");
                }
            }
            _ => {}
        }
    }

    /// Picks a step's operations.
    fn pick(&self, rng: &mut StdRng, next_tok: &mut i64) -> Vec<Act> {
        let n = rng.random_range(1..=3);
        let mut acts = Vec::new();
        // Keys a write or read of this step touches (one per key: the model
        // orders each key's writes and reads).
        let mut written = BTreeSet::new();
        let mut faulty_used = false;
        for _ in 0..n {
            // At most one operation per step goes through the crash plan.
            let faulty = !faulty_used && rng.random_bool(0.15);
            let r = if faulty {
                faulty_used = true;
                FAULTY
            } else {
                rng.random_range(0..PLAIN_ROUTERS)
            };
            // Half the time the key of the step's previous operation: a
            // write or read racing a move of the same key is the case
            // that matters.
            let key = match acts.last().and_then(Act::key) {
                Some(k) if rng.random_bool(0.5) => k,
                _ => rng.random_range(0..KEYS),
            };
            let roll = rng.random_range(0..100);
            let a = match roll {
                0..45 => {
                    if written.contains(&key) {
                        continue;
                    }
                    written.insert(key);
                    *next_tok += 1;
                    let kind = match rng.random_range(0..10) {
                        0..3 => WKind::Insert,
                        3..6 => WKind::Update,
                        6..8 => WKind::Upsert,
                        _ => WKind::Delete,
                    };
                    Act::Write {
                        r,
                        key,
                        table: if rng.random_bool(0.7) { 0 } else { 1 },
                        kind,
                        tok: *next_tok,
                    }
                }
                45..55 => {
                    if written.contains(&key) {
                        continue;
                    }
                    // Read alone: no write of the key runs beside it.
                    written.insert(key);
                    Act::Read {
                        r,
                        key,
                        table: rng.random_range(0..TABLES.len()),
                    }
                }
                55..80 => {
                    let mut tables = self.tables_of(key);
                    if tables.is_empty() || rng.random_bool(0.1) {
                        tables = vec![0];
                    }
                    if tables.len() == 1 && rng.random_bool(0.3) {
                        // A table set naming both tables, one maybe empty.
                        tables = vec![0, 1];
                    }
                    Act::Move {
                        r,
                        key,
                        to: SHARDS[rng.random_range(0..SHARDS.len())],
                        tables,
                        retire: retire(rng),
                    }
                }
                80..84 => {
                    let mut targets: Vec<String> = SHARDS
                        .iter()
                        .filter(|_| rng.random_bool(0.6))
                        .map(|s| (*s).to_owned())
                        .collect();
                    if targets.is_empty() {
                        targets.push(SHARDS[rng.random_range(0..SHARDS.len())].to_owned());
                    }
                    Act::Rebalance {
                        r,
                        targets,
                        retire: retire(rng),
                    }
                }
                84..92 => Act::Verify {
                    r,
                    full: rng.random_bool(0.3),
                    repair: rng.random_bool(0.6),
                },
                92..96 => Act::Purge { r },
                _ => Act::Recover { r },
            };
            acts.push(a);
        }
        acts
    }

    /// Faults and time between steps.
    async fn between(&mut self, rng: &mut StdRng, step: usize) {
        let roll = rng.random_range(0..100);
        match roll {
            0..12 => {
                let ms = match rng.random_range(0..4) {
                    0 => rng.random_range(100..5_000),
                    1 => rng.random_range(5_000..31_000),
                    2 => 31_000,
                    _ => 61_000,
                };
                self.e.clock.advance(ms);
                Self::count(&mut self.ops, "clock_advance");
                self.log.push(format!("step {step}: clock +{ms} ms"));
            }
            12..16 => {
                // The next publish of a key is acknowledged and lost.
                let key = rng.random_range(0..KEYS);
                *self.lossy.lose_put_of.lock().unwrap() = Some(self.keys[key].clone());
                self.log.push(format!(
                    "step {step}: the next put of {} is lost",
                    self.keys[key]
                ));
            }
            16..19 => {
                // A moved key's mapping is deleted or reverted to a shard it
                // left (a restored mapping store).
                let moved: Vec<_> = self.moved.iter().map(|(k, s)| (*k, s.clone())).collect();
                if moved.is_empty() {
                    return;
                }
                let (key, source) = moved[rng.random_range(0..moved.len())].clone();
                let k = self.keys[key].clone();
                if rng.random_bool(0.5) {
                    self.lossy.inner.remove(&k).await.unwrap();
                    Self::count(&mut self.faults, "mapping_removed");
                    self.log
                        .push(format!("step {step}: mapping of {k} removed"));
                } else {
                    self.lossy.inner.put(&k, &source).await.unwrap();
                    Self::count(&mut self.faults, "mapping_reverted");
                    self.log
                        .push(format!("step {step}: mapping of {k} reverted to {source}"));
                }
            }
            _ => {}
        }
    }

    async fn run(&mut self, seed: u64, ops: usize) {
        let mut rng = StdRng::seed_from_u64(seed);
        *self.pace.0.lock().unwrap() = StdRng::seed_from_u64(seed.wrapping_add(0x9e37_79b9));
        let mut next_tok = 0i64;
        let mut done = 0;
        let mut step = 0;
        while done < ops {
            step += 1;
            self.between(&mut rng, step).await;
            let acts = self.pick(&mut rng, &mut next_tok);
            if acts.is_empty() {
                continue;
            }
            let armed = acts.iter().any(|a| a.router() == FAULTY);
            if armed {
                let n = rng.random_range(1..=10);
                let mode = if rng.random_bool(0.5) {
                    FaultMode::Before
                } else {
                    FaultMode::After
                };
                self.e.plan.arm(n, mode);
                self.log.push(format!(
                    "step {step}: crash plan armed at write {n} ({mode:?})"
                ));
            }
            // Each operation starts after a random number of yields, so a
            // short one (a write) can land anywhere inside a long one (a
            // move), not only before its first few backend calls.
            let delays: Vec<u32> = acts.iter().map(|_| rng.random_range(0..40)).collect();
            self.log
                .push(format!("step {step}: start delays (yields) {delays:?}"));
            let lost_before = self.lossy.lost.load(Ordering::SeqCst);
            let results = {
                let this = &*self;
                join_all(acts.iter().zip(&delays).map(|(a, d)| async move {
                    for _ in 0..*d {
                        tokio::task::yield_now().await;
                    }
                    this.exec(a).await
                }))
                .await
            };
            if armed {
                if self.e.plan.tripped() {
                    Self::count(&mut self.faults, "crash_plan_tripped");
                }
                self.e.plan.disarm();
            }
            if self.lossy.lost.load(Ordering::SeqCst) > lost_before {
                Self::count(&mut self.faults, "publish_lost");
                self.log.push(format!("step {step}: a put was lost"));
            }
            *self.lossy.lose_put_of.lock().unwrap() = None;
            for (a, res) in acts.iter().zip(&results) {
                done += 1;
                Self::count(&mut self.ops, a.kind());
                self.log.push(format!(
                    "step {step}: {a:?} -> {}",
                    match res {
                        Res::Count(Ok(n)) => format!("ok {n}"),
                        Res::Row(Ok(r)) => format!("ok {r:?}"),
                        Res::Move(Ok(o)) => format!("ok {} {}->{}", o.op_id, o.source, o.target),
                        r => r.code().to_owned(),
                    }
                ));
                self.apply(step, a, res);
            }
            // Every key a move of this step acknowledged is read back at
            // once (through the router without a mapping cache), before
            // a later verification could repair what the move broke.
            let moved: BTreeSet<usize> = acts
                .iter()
                .zip(&results)
                .filter_map(|(a, res)| match (a, res) {
                    (Act::Move { key, .. }, Res::Move(Ok(_))) => Some(*key),
                    _ => None,
                })
                .collect();
            for key in moved {
                for table in 0..TABLES.len() {
                    let read = Act::Read { r: 2, key, table };
                    let res = self.exec(&read).await;
                    Self::count(&mut self.checks, "reads_after_move");
                    self.log.push(format!(
                        "step {step}: read after the move {read:?} -> {}",
                        res.code()
                    ));
                    self.apply(step, &read, &res);
                }
            }
            if !self.violations.is_empty() {
                // Stop at the first violation: the log ends where it
                // happened, with what every key's rows look like.
                self.dump().await;
                return;
            }
        }
        self.finish(step + 1).await;
    }

    /// Appends every key's mapping, live rows, tombstones and journal rows
    /// to the log.
    async fn dump(&mut self) {
        for k in self.keys.clone() {
            let mapping = self.lossy.inner.get(&k).await;
            self.log.push(format!("state {k}: mapping {mapping:?}"));
            for (t, c) in TABLES {
                let live = self.e.live(t, c, &k).await;
                self.log.push(format!("state {k}: live {t} {live:?}"));
            }
            for (name, s) in &self.e.shards {
                let d = s.dialect();
                let mut q = durability_migration::Sql::new(&d);
                q.raw("SELECT op_id, tname, moved_to, digest, superseded, purged FROM durability_retired WHERE mkey = ")
                    .bind(k.as_str());
                let rows = s.query(&q.finish()).await;
                self.log
                    .push(format!("state {k}: retired on {name} {rows:?}"));
            }
            let s = self.e.shard(self.e.journal);
            let d = s.dialect();
            let mut q = durability_migration::Sql::new(&d);
            q.raw("SELECT op_id, source, target, state, tables, claim FROM durability_migration_ops WHERE mkey = ")
                .bind(k.as_str());
            let rows = s.query(&q.finish()).await;
            self.log.push(format!("state {k}: journal {rows:?}"));
        }
    }

    /// Recovers, repairs with a fresh router, and checks every key through
    /// another fresh router against the model.
    async fn finish(&mut self, step: usize) {
        self.e.plan.disarm();
        *self.lossy.lose_put_of.lock().unwrap() = None;
        // Past every mover's liveness and every recovery lease.
        self.e.clock.advance(200_000);
        let fixer = router_without(&self.e, self.computed, false, 30_000, self.disabled).await;
        match fixer.recover_migrations().await {
            Ok(rep) if rep.failed.is_empty() && rep.skipped.is_empty() => {}
            other => self.violation(step, format!("final recovery: {other:?}")),
        }
        match repair(&fixer).await {
            Ok(rep) if rep.clean => {}
            other => self.violation(step, format!("final repairing verify: {other:?}")),
        }
        match fixer
            .verify_migrations(VerifyOptions {
                full: true,
                ..VerifyOptions::default()
            })
            .await
        {
            Ok(rep) if rep.clean && rep.repaired.is_empty() => {}
            other => self.violation(step, format!("second full verify: {other:?}")),
        }
        Self::count(&mut self.checks, "final_verify");
        let fresh = router_without(&self.e, self.computed, false, 0, self.disabled).await;
        for key in 0..KEYS {
            for (table, (t, col)) in TABLES.iter().enumerate() {
                let k = self.keys[key].clone();
                let poss = self.model[&(key, table)].clone();
                let live = self.e.live(t, col, &k).await;
                Self::count(&mut self.checks, "final_live");
                let got = fresh.get(&k, t).await;
                Self::count(&mut self.checks, "final_reads");
                let seen: Option<i64> = match &got {
                    Ok(Some(r)) => match token(table, r) {
                        Some(tok) => Some(tok),
                        None => {
                            self.violation(step, format!("final read of {k}/{t}: {r:?}"));
                            continue;
                        }
                    },
                    Ok(None) => None,
                    Err(e) => {
                        self.violation(step, format!("final read of {k}/{t}: {e}"));
                        continue;
                    }
                };
                if !poss.contains(&seen) {
                    self.violation(
                        step,
                        format!("final read of {k}/{t} saw {got:?}, model allows {poss:?}"),
                    );
                }
                let want = usize::from(seen.is_some());
                if live.len() != want {
                    self.violation(
                        step,
                        format!(
                            "{k}/{t} has {} live rows (read {got:?}, model {poss:?}): {live:?}",
                            live.len()
                        ),
                    );
                } else if let (Some(tok), Some((_, r))) = (seen, live.first())
                    && token(table, r) != Some(tok)
                {
                    self.violation(
                        step,
                        format!("{k}/{t}: the live row {live:?} is not the one read ({tok})"),
                    );
                }
                // Every key is writable again once recovery ran: rewriting
                // the value read leaves the model as it is.
                if let Some(tok) = seen {
                    Self::count(&mut self.checks, "final_writes");
                    if let Err(e) = fresh.upsert(&k, t, value_row(table, tok)).await {
                        self.violation(step, format!("final rewrite of {k}/{t}: {e}"));
                    }
                }
            }
        }
    }
}

fn retire(rng: &mut StdRng) -> Retire {
    if rng.random_bool(0.7) {
        Retire::Immediate
    } else {
        Retire::default()
    }
}

fn summary(m: &BTreeMap<impl std::fmt::Display, u64>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs every seed over a fresh set of `kinds` shards; panics with the seed,
/// the violations and the operations before them on the first failing seed.
async fn campaign(name: &str, kinds: [Kind; 3], computed: bool) {
    let ops = ops();
    for (i, seed) in seeds().into_iter().enumerate() {
        let Some(mut w) = World::new(&kinds, computed, None).await else {
            eprintln!("{name}: skipped (no server for {kinds:?})");
            return;
        };
        if i == 0 {
            coarse_key_column_is_refused(&w.e, kinds[0], computed).await;
        }
        w.run(seed, ops).await;
        eprintln!(
            "{name} seed={seed} ops: {} | faults: {} | checks: {} | results: {}",
            summary(&w.ops),
            summary(&w.faults),
            summary(&w.checks),
            summary(&w.codes),
        );
        if !w.violations.is_empty() {
            let path = std::env::temp_dir().join(format!("{name}-seed{seed}.log"));
            let _ = std::fs::write(&path, w.log.join("\n"));
            eprintln!("{name} seed={seed}: every operation in {}", path.display());
            let tail = w.log.len().saturating_sub(80);
            panic!(
                "{name} seed={seed} ({kinds:?}, computed={computed}): {} violations:\n{}\n\
                 operations (last 80 of {}):\n{}\n\
                 rerun: DURABILITY_MIGRATION_MODEL_SEED={seed} DURABILITY_MIGRATION_MODEL_OPS={ops}",
                w.violations.len(),
                w.violations.join("\n"),
                w.log.len(),
                w.log[tail..].join("\n"),
            );
        }
    }
}

/// One `#[tokio::test]` per campaign, named as its campaign: its shard
/// kinds and whether the keys are computed.
macro_rules! campaigns {
    ($($name:ident: $kinds:expr, $computed:expr;)*) => {$(
        #[tokio::test]
        async fn $name() {
            campaign(stringify!($name), $kinds, $computed).await;
        }
    )*};
}

campaigns! {
    migration_model_mapped_sqlite: [Sqlite; 3], false;
    migration_model_mapped_postgres: [Postgres; 3], false;
    migration_model_mapped_mariadb: [MySql; 3], false;
    migration_model_mapped_mixed: [Sqlite, Postgres, MySql], false;
    migration_model_computed_sqlite: [Sqlite; 3], true;
    migration_model_computed_postgres: [Postgres; 3], true;
    migration_model_computed_mariadb: [MySql; 3], true;
}

// ---- Regressions the model found ----

/// Shard kinds of the two-shard regressions.
const PAIRS: [[Kind; 2]; 3] = [[Sqlite, Sqlite], [Postgres, Postgres], [MySql, MySql]];

fn org(title: &str) -> Row {
    row([("title", Value::from(title))])
}

/// After a write of `k`'s `orgs` row that `res` acknowledged (or not), a
/// fresh router reads it, there is one live row, verification is clean, and
/// a fresh insert is refused as a duplicate.
async fn acknowledged_org_is_kept(e: &Env, res: Result<u64, MigrationError>, ctx: &str) {
    let fresh = e.router_with(false, 0).await;
    let fixer = e.router().await;
    e.clock.advance(200_000);
    let rep = fixer.recover_migrations().await.unwrap();
    assert!(rep.failed.is_empty(), "{ctx}: {rep:?}");
    let got = fresh.get("k", "orgs").await.unwrap();
    let live = e.live("orgs", "org_id", "k").await;
    match &res {
        Ok(1) => {
            assert_eq!(
                got.as_ref().and_then(|r| r.get("title")),
                Some(&Value::from("late")),
                "{ctx}: the acknowledged orgs write reads back (live rows {live:?})"
            );
            assert_eq!(live.len(), 1, "{ctx}: one live orgs row: {live:?}");
        }
        Err(err) if !err.is_outcome_unknown() => {
            assert_eq!(got, None, "{ctx}: a refused write left nothing ({err})");
            assert!(live.is_empty(), "{ctx}: {live:?}");
        }
        other => panic!("{ctx}: unexpected result {other:?}"),
    }
    crate::shards::clean_verify(&fixer).await;
    let again = fresh.insert("k", "orgs", org("again")).await;
    let live = e.live("orgs", "org_id", "k").await;
    assert!(live.len() <= 1, "{ctx}: after {again:?}: {live:?}");
}

/// Found by the model (seed 1, 1,000 operations, mapped SQLite: an `orgs`
/// move of a key with no `users` row, then a stale router's `users` upsert
/// on the source, then an insert on the new home: two live rows). A move
/// of some tables fences only those: a router whose cache still names the
/// source writes a row of another table there, unfenced, and the mapping
/// now routes every reader elsewhere (the acknowledged write reads as
/// absent; an insert on the new home makes a second live row).
#[tokio::test]
async fn model_regression_a_stale_write_to_a_table_outside_a_move() {
    for kinds in PAIRS {
        let Some(e) = env(&kinds).await else {
            return;
        };
        let mover = e.router().await;
        let stale = e.router_with(false, STALE_TTL_MS).await;
        e.mapping.put("k", "s0").await.unwrap();
        mover.insert("k", "users", value_row(0, 1)).await.unwrap();
        // The stale router caches k → s0.
        assert_eq!(stale.get("k", "orgs").await.unwrap(), None);
        mover.reassign_shard("k", "s1", "users").await.unwrap();
        let res = stale.insert("k", "orgs", org("late")).await;
        acknowledged_org_is_kept(&e, res, &format!("{kinds:?}")).await;
    }
}

/// The same defect without a stale cache: a move of `users` interrupted at
/// each of its writes (the crash plan, before the write), then a routed
/// insert of the key's `orgs` row, then recovery. Between the cutover and
/// the publish the mapping still names the source, which holds no `orgs`
/// fence.
#[tokio::test]
async fn model_regression_a_write_to_a_table_outside_an_interrupted_move() {
    for kinds in PAIRS {
        for n in 1..=7 {
            let Some(e) = env(&kinds).await else {
                return;
            };
            let _r = router_with_user(&e, "k", "s0", value_row(0, 1)).await;
            let faulty = e.router_with(true, 30_000).await;
            e.plan.arm(n, FaultMode::Before);
            let moved = faulty.reassign_shard("k", "s1", "users").await;
            e.plan.disarm();
            let writer = e.router_with(false, 0).await;
            let res = writer.insert("k", "orgs", org("late")).await;
            let ctx = format!("{kinds:?} crash before write {n} (move {moved:?})");
            acknowledged_org_is_kept(&e, res, &ctx).await;
        }
    }
}

/// Found by the model (seed 5, 1,000 operations, mapped SQLite: a faulty
/// router's move whose copy applied and reported failure, an acknowledged
/// delete of the key's `users` row, recovery, and later an update of the
/// deleted row that changed one row). A move copied again from a fresh
/// snapshot left the earlier attempt's copy of a table whose row was
/// deleted since on the destination, and the publish made it live: the
/// acknowledged delete was undone.
#[tokio::test]
async fn model_regression_a_recopy_drops_the_copy_of_a_row_deleted_since() {
    for kinds in PAIRS {
        for resume in [false, true] {
            let Some(e) = env(&kinds).await else { return };
            let r = router_with_user(&e, "k", "s0", value_row(0, 1)).await;
            r.insert("k", "orgs", org("kept")).await.unwrap();
            // Write 1 claims the key, write 2 is the copy: it applies and
            // reports failure.
            let faulty = e.router_with(true, 30_000).await;
            e.plan.arm(2, FaultMode::After);
            let first = faulty.reassign_keys("k", "s1", &["users", "orgs"]).await;
            assert!(first.is_err(), "{kinds:?}: {first:?}");
            e.plan.disarm();
            assert_eq!(r.delete("k", "users").await.unwrap(), 1, "{kinds:?}");
            let ctx = format!("{kinds:?} resume={resume}");
            if resume {
                // The router that started the move resumes it.
                faulty
                    .reassign_keys("k", "s1", &["users", "orgs"])
                    .await
                    .unwrap();
            } else {
                e.clock.advance(31_000);
                let rep = e.router().await.recover_migrations().await.unwrap();
                assert_eq!(rep.committed.len(), 1, "{ctx}: {rep:?}");
            }
            let fresh = e.router_with(false, 0).await;
            assert_eq!(fresh.route("k").await.unwrap().as_deref(), Some("s1"));
            let live = e.live("users", "id", "k").await;
            assert!(
                live.is_empty(),
                "{ctx}: the deleted row came back: {live:?}"
            );
            assert_eq!(fresh.get("k", "users").await.unwrap(), None, "{ctx}");
            assert_eq!(
                fresh.update("k", "users", value_row(0, 2)).await.unwrap(),
                0,
                "{ctx}: nothing to update"
            );
            let orgs = fresh.get("k", "orgs").await.unwrap().unwrap();
            assert_eq!(orgs.get("title"), Some(&Value::from("kept")), "{ctx}");
            crate::shards::clean_verify(&fresh).await;
        }
    }
}

/// Found by the model (seed 21, 1,000 operations, mapped SQLite: a faulty
/// rebalance's move of `k1` back to a shard it had left crashed after its
/// copy, both rows of `k1` were deleted on the source, the mapping was
/// restored to that shard, recovery aborted the move, and a routed update
/// of the deleted `orgs` row then changed one row). The abort kept the
/// copy because the mapping named the destination, though the copy was
/// still under the operation's in-flight marker: the acknowledged delete
/// was undone for every read routed there.
#[tokio::test]
async fn model_regression_an_abort_drops_its_marked_copy_whatever_the_mapping() {
    for kinds in PAIRS {
        let Some(e) = env(&kinds).await else { return };
        let r = router_with_user(&e, "k", "s1", value_row(0, 1)).await;
        r.insert("k", "orgs", org("kept")).await.unwrap();
        r.reassign_keys("k", "s0", &["users", "orgs"])
            .await
            .unwrap();
        assert_eq!(r.delete("k", "users").await.unwrap(), 1);
        // The move back copies (write 2 applies, then fails).
        let faulty = e.router_with(true, 30_000).await;
        e.plan.arm(2, FaultMode::After);
        let first = faulty.reassign_keys("k", "s1", &["users", "orgs"]).await;
        e.plan.disarm();
        assert!(first.is_err(), "{kinds:?}: {first:?}");
        assert_eq!(r.delete("k", "orgs").await.unwrap(), 1, "{kinds:?}");
        // A mapping store restored to before the first move.
        e.mapping.put("k", "s1").await.unwrap();
        e.clock.advance(31_000);
        let rep = e.router().await.recover_migrations().await.unwrap();
        assert_eq!(
            rep.aborted.len(),
            1,
            "{kinds:?}: the source rows are gone: {rep:?}"
        );
        let fresh = e.router_with(false, 0).await;
        for (t, c) in TABLES {
            let live = e.live(t, c, "k").await;
            assert!(
                live.is_empty(),
                "{kinds:?}: a deleted {t} row is live: {live:?}"
            );
            assert_eq!(fresh.get("k", t).await.unwrap(), None, "{kinds:?} {t}");
        }
        assert_eq!(fresh.update("k", "orgs", org("again")).await.unwrap(), 0);
        crate::shards::clean_verify(&fresh).await;
    }
}

/// A source shard whose second read of `sql` first runs a whole move of
/// `k` to `s2` through another router (the race of two moves of one key:
/// the other move runs between this move's snapshots, before its claim).
struct MoveOnSecondRead {
    inner: Arc<dyn Shard>,
    sql: String,
    seen: AtomicU64,
    mover: OnceLock<Router>,
    moved: Mutex<Option<String>>,
}

durability_time::debug_fields!(MoveOnSecondRead {});

impl Shard for MoveOnSecondRead {
    crate::shards::shard_passthrough!();
    fn execute<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, u64> {
        self.inner.execute(stmt)
    }
    fn batch<'a>(&'a self, stmts: &'a [Statement]) -> BackendFuture<'a, Vec<u64>> {
        self.inner.batch(stmts)
    }
    fn query<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, Vec<Row>> {
        Box::pin(async move {
            if stmt.sql == self.sql && self.seen.fetch_add(1, Ordering::SeqCst) + 1 == 2 {
                let m = self.mover.get().ok_or("no mover")?;
                let out = m.reassign_shard("k", "s2", "users").await;
                *self.moved.lock().unwrap() = Some(format!("{out:?}"));
            }
            self.inner.query(stmt).await
        })
    }
}

/// Found by the model (seed 3, 1,000 operations, mixed shards: a rebalance
/// and a move of `k1` in one step; the rebalance's move published `k1` on a
/// shard holding none of its rows), in the first version of the fix that
/// widens a move to every configured table. A move takes a second snapshot after it
/// widened its tables (every configured table moves); when another move
/// took the key away between the two, the second snapshot is empty and a
/// move of nothing cut over where the key no longer lived and published its
/// target: every row of the key was routed away from.
#[tokio::test]
async fn model_regression_a_move_raced_away_between_its_snapshots() {
    for kinds in [[Sqlite; 3], [Postgres; 3], [MySql; 3]] {
        let Some(e) = env(&kinds).await else { return };
        let _r = router_with_user(&e, "k", "s0", value_row(0, 1)).await;
        let s0 = Arc::clone(e.shard("s0"));
        let sql = s0
            .dialect()
            .select_row(
                &durability_migration::Ident::new("users").unwrap(),
                &durability_migration::Ident::new("id").unwrap(),
                "k",
            )
            .sql;
        let hooked = Arc::new(MoveOnSecondRead {
            inner: s0,
            sql,
            seen: AtomicU64::new(0),
            mover: OnceLock::new(),
            moved: Mutex::new(None),
        });
        let racer = Router::new(e.config(false, 30_000).shard("s0", hooked.clone())).unwrap();
        racer.init().await.unwrap();
        hooked.mover.set(e.router().await).unwrap();
        let res = racer.reassign_shard("k", "s1", "users").await;
        let moved = hooked.moved.lock().unwrap().clone();
        let ctx = format!("{kinds:?}: the other move {moved:?}, this one {res:?}");
        assert!(
            moved.as_deref().is_some_and(|m| m.starts_with("Ok")),
            "{ctx}"
        );
        // The losing move gets the conflict code, not "no such row".
        assert_eq!(
            res.as_ref().err().map(MigrationError::code),
            Some("MIGRATION_ALREADY_ACTIVE"),
            "{ctx}"
        );
        let live = e.live("users", "id", "k").await;
        assert_eq!(live.len(), 1, "{ctx}: {live:?}");
        let fresh = e.router_with(false, 0).await;
        assert_eq!(
            fresh.route("k").await.unwrap().as_deref(),
            Some(live[0].0.as_str()),
            "{ctx}: the mapping names where the row lives"
        );
        let got = fresh.get("k", "users").await.unwrap();
        assert_eq!(got.as_ref().and_then(|r| token(0, r)), Some(1), "{ctx}");
        crate::shards::clean_verify(&fresh).await;
    }
}

/// Runs a whole move of `k` from `s1` to `s0` through another router just
/// before the first write of the shard it wraps (the claim of a move that
/// read the key's source and snapshot before that other move finished).
struct MoveBeforeFirstWrite {
    mover: OnceLock<Router>,
    moved: Mutex<Option<String>>,
}

impl Hook for MoveBeforeFirstWrite {
    async fn before(&self, _w: Write<'_>) -> Result<(), BackendError> {
        if self.moved.lock().unwrap().is_some() {
            return Ok(());
        }
        // Armed once the mover is set (after the router's `init`).
        let Some(m) = self.mover.get() else {
            return Ok(());
        };
        let out = m.reassign_shard("k", "s0", "users").await;
        // An acknowledged write on the key's new home.
        let wrote = m.update("k", "users", value_row(0, 2)).await;
        *self.moved.lock().unwrap() = Some(format!("{out:?} then {wrote:?}"));
        Ok(())
    }
}

/// Found by the model (seed 7, 1,500 operations, mixed shards: two moves of
/// `k2` to one shard in one step; the `orgs` row was gone afterwards). A
/// move reads the key's source and snapshot before it claims the key; when
/// another move of the key to the same destination finished in between,
/// the copy replaced the key's live rows there with the old snapshot (an
/// update acknowledged there since was lost), the cutover on the old source
/// missed, and the abort kept the copy (the mapping named the destination;
/// with the abort fix above it dropped it: every row was lost). The move
/// now reads the source again once it holds the claim and ends before any
/// shard write when the key has left it.
#[tokio::test]
async fn model_regression_a_move_claiming_after_another_finished() {
    for kinds in [[Sqlite; 3], [Postgres; 3], [MySql; 3]] {
        let Some(e) = env(&kinds).await else { return };
        let _r = router_with_user(&e, "k", "s1", value_row(0, 1)).await;
        let hooked = hooked(
            &e,
            "s0",
            MoveBeforeFirstWrite {
                mover: OnceLock::new(),
                moved: Mutex::new(None),
            },
        );
        let racer = Router::new(e.config(false, 30_000).shard("s0", hooked.clone())).unwrap();
        racer.init().await.unwrap();
        hooked.hook.mover.set(e.router().await).unwrap();
        let res = racer.reassign_shard("k", "s0", "users").await;
        let moved = hooked.hook.moved.lock().unwrap().clone();
        let ctx = format!("{kinds:?}: the other move {moved:?}, this one {res:?}");
        assert!(
            moved
                .as_deref()
                .is_some_and(|m| m.starts_with("Ok") && m.ends_with("Ok(1)")),
            "{ctx}"
        );
        let live = e.live("users", "id", "k").await;
        assert_eq!(live.len(), 1, "{ctx}: {live:?}");
        assert_eq!(live[0].0, "s0", "{ctx}");
        let fresh = e.router_with(false, 0).await;
        let got = fresh.get("k", "users").await.unwrap();
        assert_eq!(
            got.as_ref().and_then(|r| token(0, r)),
            Some(2),
            "{ctx}: the write acknowledged on the new home is kept"
        );
        crate::shards::clean_verify(&fresh).await;
    }
}

/// The proof that the checker would notice a missing safety check: each
/// named check off in turn (every router of the world skips it), seeds run
/// until one reports a violation; a check whose absence no seed of the
/// budget exposes fails the test. Prints what each found.
#[tokio::test]
async fn migration_model_reports_each_disabled_safety_check() {
    const SEED_BUDGET: u64 = 8;
    let ops = ops();
    let mut unnoticed = Vec::new();
    for check in SafetyCheck::ALL {
        let mut found = None;
        for seed in 1..=SEED_BUDGET {
            let Some(mut w) = World::new(&[Sqlite; 3], false, Some(check)).await else {
                eprintln!("skipped (no SQLite shards)");
                return;
            };
            w.run(seed, ops).await;
            eprintln!(
                "{} disabled, seed={seed} ops: {} | faults: {} | checks: {} | results: {}",
                check.name(),
                summary(&w.ops),
                summary(&w.faults),
                summary(&w.checks),
                summary(&w.codes),
            );
            if let Some(first) = w.violations.first() {
                found = Some((seed, first.clone(), summary(&w.faults)));
                break;
            }
        }
        let Some((seed, first, faults)) = found else {
            unnoticed.push(check.name());
            continue;
        };
        eprintln!(
            "safety check {} disabled: seed {seed} found a violation (faults: {faults}): {first}",
            check.name()
        );
    }
    assert!(
        unnoticed.is_empty(),
        "with {unnoticed:?} disabled, no seed of 1..={SEED_BUDGET} ({ops} operations) reported a violation"
    );
}
