//! Computed placement on SQLite, PostgreSQL and MariaDB shards: the epoch
//! manifest and its compare-and-swap, generation fences and stale routers,
//! write probes, placement exceptions, epoch pruning, and a crash at every
//! write of epoch creation, pruning (with its fence raising) and a move,
//! followed by a fresh process finishing the work. Without a server a test
//! prints that it skipped, unless `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::shards::{Env, Hook, Kind, Write, clean_verify, env, hooked};
use durability_migration::conformance::{FaultMappingStore, FaultMode, FaultPlan};
use durability_migration::{
    BackendError, Ident, MANIFEST_COPY_PREFIX, Manifest, MigrationConfig, Placement, PruneOptions,
    Router, Row, Shard, Sql, Statement, Value, row,
};

use Kind::{MySql, Postgres, Sqlite};

/// Shard kinds of `s0`, `s1`, `s2` (the journal is `s0`).
const SETS: [[Kind; 3]; 4] = [
    [Sqlite, Sqlite, Sqlite],
    [Postgres, Postgres, Postgres],
    [MySql, MySql, MySql],
    [Sqlite, Postgres, MySql],
];

fn user(n: i64) -> Row {
    row([("name", Value::from("u")), ("n", Value::from(n))])
}

fn computed_config(e: &Env, faulty: bool, refresh_ms: u64) -> MigrationConfig {
    e.config(faulty, 30_000)
        .placement(Placement::Computed)
        .manifest_refresh_ms(refresh_ms)
}

async fn computed(e: &Env, faulty: bool, refresh_ms: u64) -> Router {
    let r = Router::new(computed_config(e, faulty, refresh_ms)).unwrap();
    r.init().await.unwrap();
    r
}

fn key(i: usize) -> String {
    format!("k{i}")
}

/// The shard holding the key's live `users` row (exactly one).
async fn home(e: &Env, k: &str) -> String {
    let live = e.live("users", "id", k).await;
    assert_eq!(live.len(), 1, "one live row of {k}: {live:?}");
    live[0].0.clone()
}

fn n_of(r: &Row) -> Option<i64> {
    r.get("n").and_then(Value::as_integer)
}

/// Sets the fence of `shard` directly (a raw statement).
async fn set_fence(e: &Env, shard: &str, generation: i64) {
    let s = e.shard(shard);
    let d = s.dialect();
    let mut q = Sql::new(&d);
    q.raw("UPDATE durability_topology SET min_generation = ")
        .bind(generation);
    s.execute(&q.finish()).await.unwrap();
}

fn all_tables() -> PruneOptions {
    let mut o = PruneOptions {
        tables: vec!["users".into(), "docs".into(), "orgs".into()],
        ..PruneOptions::default()
    };
    o.key_columns.insert("orgs".into(), "org_id".into());
    o
}

async fn routes_reads_and_writes(kinds: [Kind; 3]) {
    let Some(e) = env(&kinds).await else { return };
    let r = computed(&e, false, 60_000).await;
    let m = r.manifest_from_journal().await.unwrap();
    assert_eq!((m.epochs.len(), m.generation, m.revision), (1, 1, 1));
    assert_eq!(m.epochs[0].shards, ["s0", "s1", "s2"]);
    for i in 0..30 {
        assert_eq!(r.insert(&key(i), "users", user(i as i64)).await.unwrap(), 1);
        assert_eq!(home(&e, &key(i)).await, m.owner(&key(i)).unwrap());
    }
    let mapped = e.mapping.scan(None, 100).await.unwrap();
    assert!(
        mapped
            .iter()
            .all(|(k, _)| k.starts_with(MANIFEST_COPY_PREFIX)),
        "computed placement allocates no mapping: {mapped:?}"
    );
    assert_eq!(r.get("nobody", "users").await.unwrap(), None);

    // A router that cached generation 1 and will not refresh on its own.
    let stale = computed(&e, false, 600_000).await;
    let mut before = Vec::new();
    for i in 0..30 {
        before.push(home(&e, &key(i)).await);
    }

    let m2 = r.add_epoch(&["s0", "s1"]).await.unwrap();
    assert_eq!((m2.epochs.len(), m2.generation), (2, 2));
    assert_eq!(m2.epochs[0].number, 2);
    for s in ["s0", "s1", "s2"] {
        assert_eq!(r.fence(s).await.unwrap(), 2, "fence of {s}");
    }
    // Reads find every key through older epochs; keys found off their
    // newest owner are recorded as placement exceptions.
    for (i, was) in before.iter().enumerate() {
        let k = key(i);
        let got = r.get(&k, "users").await.unwrap().unwrap();
        assert_eq!(n_of(&got), Some(i as i64), "{kinds:?} {k}");
        let newest = m2.owner(&k).unwrap();
        let mapped = e.mapping.get(&k).await.unwrap();
        if was == newest {
            assert_eq!(mapped, None, "{k} on its newest owner needs no exception");
        } else {
            assert_eq!(mapped.as_deref(), Some(was.as_str()), "{k} exception");
        }
    }
    // Writes land where the row is.
    for (i, was) in before.iter().enumerate() {
        let k = key(i);
        assert_eq!(
            r.update(&k, "users", user(100 + i as i64)).await.unwrap(),
            1
        );
        assert_eq!(&home(&e, &k).await, was, "{k} stays where it is");
    }
    // The stale router's write is refused by the fence, reloads once and
    // lands on the newest owner: it never writes a stale row.
    let fresh_key = (0..)
        .map(|i| format!("new{i}"))
        .find(|k| m.owner(k) == Some("s2"))
        .unwrap();
    assert_eq!(stale.insert(&fresh_key, "users", user(7)).await.unwrap(), 1);
    assert_eq!(home(&e, &fresh_key).await, m2.owner(&fresh_key).unwrap());
    assert_eq!(stale.manifest().await.unwrap().generation, 2, "reloaded");
    for i in 0..30 {
        let got = stale.get(&key(i), "users").await.unwrap().unwrap();
        assert_eq!(n_of(&got), Some(100 + i as i64), "stale router converged");
    }
    // A fence above every manifest the journal holds: STALE_TOPOLOGY,
    // nothing written.
    for s in ["s0", "s1", "s2"] {
        set_fence(&e, s, 99).await;
    }
    let err = r.insert("late", "users", user(1)).await.unwrap_err();
    assert_eq!(err.code(), "STALE_TOPOLOGY", "{err}");
    assert!(e.live("users", "id", "late").await.is_empty());
    let err = r.update(&key(0), "users", user(5)).await.unwrap_err();
    assert_eq!(err.code(), "STALE_TOPOLOGY");
    assert_eq!(
        n_of(&r.get(&key(0), "users").await.unwrap().unwrap()),
        Some(100),
        "refused update changed nothing"
    );
}

#[tokio::test]
async fn epochs_route_reads_and_writes_on_every_dialect() {
    for kinds in SETS {
        routes_reads_and_writes(kinds).await;
    }
}

/// A write hook for the journal shard: while `racing`, before each manifest
/// swap, another writer swaps first (a legitimate compare-and-swap that
/// bumps the revision).
struct Racing {
    racing: AtomicBool,
}

impl Racing {
    async fn race(inner: &Arc<dyn Shard>) -> Result<(), BackendError> {
        let d = inner.dialect();
        let mut q = Sql::new(&d);
        q.raw("SELECT revision, body FROM durability_manifest");
        let rows = inner.query(&q.finish()).await?;
        let r = rows.first().ok_or("no manifest")?;
        let body = r.get("body").and_then(Value::as_text).ok_or("no body")?;
        let mut m: Manifest = serde_json::from_str(body)?;
        let old = m.revision;
        m.revision += 1;
        let mut u = Sql::new(&d);
        u.raw("UPDATE durability_manifest SET revision = ")
            .bind(m.revision)
            .raw(", body = ")
            .bind(serde_json::to_string(&m)?)
            .raw(" WHERE revision = ")
            .bind(old);
        inner.execute(&u.finish()).await?;
        Ok(())
    }
}

impl Hook for Racing {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        // The router swaps the manifest in a statement of its own.
        if self.racing.load(Ordering::SeqCst) && w.has("UPDATE durability_manifest") {
            Self::race(w.inner).await?;
        }
        Ok(())
    }
}

async fn epoch_limits(kinds: [Kind; 3]) {
    let Some(e) = env(&kinds).await else { return };
    let racing = hooked(
        &e,
        "s0",
        Racing {
            racing: AtomicBool::new(false),
        },
    );
    let mut c = MigrationConfig::new(e.mapping.clone())
        .journal_shard("s0")
        .placement(Placement::Computed)
        .clock(Arc::new(e.clock.clone()))
        .clock_domain(e.clock_domain.clone())
        .table("users")
        .shard("s0", racing.clone())
        .shard("s1", Arc::clone(e.shard("s1")))
        .shard("s2", Arc::clone(e.shard("s2")));
    c = c.manifest_refresh_ms(0);
    let r = Router::new(c).unwrap();
    r.init().await.unwrap();
    let sets: [&[&str]; 2] = [&["s0", "s1"], &["s1", "s2"]];
    for i in 0..7 {
        let m = r.add_epoch(sets[i % 2]).await.unwrap();
        assert_eq!(m.epochs.len(), i + 2);
    }
    let full = r.manifest_from_journal().await.unwrap();
    assert_eq!(full.epochs.len(), 8);
    let err = r.add_epoch(&["s0", "s2"]).await.unwrap_err();
    assert_eq!(err.code(), "TOO_MANY_EPOCHS", "{err}");
    assert_eq!(
        r.manifest_from_journal().await.unwrap(),
        full,
        "nothing changed"
    );
    // The same set as the newest epoch is a no-op, even when full.
    r.add_epoch(&["s1", "s0"]).await.unwrap();
    assert_eq!(r.manifest_from_journal().await.unwrap(), full);

    // Five lost swaps in a row.
    racing.hook.racing.store(true, Ordering::SeqCst);
    let mut opts = all_tables();
    opts.tables = vec!["users".into()];
    let err = r.prune_epochs(opts.clone()).await.unwrap_err();
    assert_eq!(err.code(), "PLACEMENT_CONFLICT", "{err}");
    let after = r.manifest_from_journal().await.unwrap();
    assert_eq!(after.revision, full.revision + 5, "only the racer swapped");
    assert_eq!(
        (after.epochs, after.generation),
        (full.epochs, full.generation)
    );
    racing.hook.racing.store(false, Ordering::SeqCst);

    // Bad input changes nothing.
    for bad in [&[][..], &["nope"][..]] {
        let err = r.add_epoch(bad).await.unwrap_err();
        assert!(
            matches!(err.code(), "INVALID_CONFIG" | "UNKNOWN_SHARD"),
            "{err}"
        );
    }
    let mut hostile = opts.clone();
    hostile.tables = vec!["users; DROP TABLE users".into()];
    assert_eq!(
        r.prune_epochs(hostile).await.unwrap_err().code(),
        "INVALID_IDENTIFIER"
    );
    let mut empty = opts.clone();
    empty.tables.clear();
    assert_eq!(
        r.prune_epochs(empty).await.unwrap_err().code(),
        "INVALID_CONFIG"
    );
    assert_eq!(
        r.manifest_from_journal().await.unwrap().revision,
        full.revision + 5
    );
    assert_eq!(
        r.insert("nul\0", "users", user(1))
            .await
            .unwrap_err()
            .code(),
        "INVALID_KEY"
    );
    assert_eq!(
        r.insert("\u{1}durability.manifest/default", "users", user(1))
            .await
            .unwrap_err()
            .code(),
        "INVALID_KEY",
        "the manifest copy's key is reserved"
    );
}

#[tokio::test]
async fn epoch_limit_compare_and_swap_and_bad_input() {
    for kinds in &SETS[..3] {
        epoch_limits(*kinds).await;
    }
}

/// Keys `k0..k{n}` in `users` (and `docs` for even keys), written under
/// epoch 2 = {s0, s1}; then epoch 3 = every shard. Epoch 1 has no rows.
async fn three_epochs(e: &Env, n: usize) -> Router {
    let r = computed(e, false, 0).await;
    r.add_epoch(&["s0", "s1"]).await.unwrap();
    for i in 0..n {
        r.insert(&key(i), "users", user(i as i64)).await.unwrap();
        if i % 2 == 0 {
            r.insert(&key(i), "docs", row([("w0", 1i64)]))
                .await
                .unwrap();
        }
    }
    r.add_epoch(&["s0", "s1", "s2"]).await.unwrap();
    r
}

async fn prune(kinds: [Kind; 3]) {
    let Some(e) = env(&kinds).await else { return };
    let r = three_epochs(&e, 40).await;
    let m = r.manifest_from_journal().await.unwrap();
    let fences = [r.fence("s0").await.unwrap(), r.fence("s2").await.unwrap()];

    let mut dry = all_tables();
    dry.dry_run = true;
    dry.page_size = 7;
    let plan = r.prune_epochs(dry).await.unwrap();
    assert_eq!(plan.scanned, 60, "40 users + 20 docs, over every page");
    let off_newest = (0..40)
        .filter(|i| m.owner(&key(*i)) != m.epochs[1].owner(&key(*i)))
        .count() as u64;
    let docs_off = (0..40)
        .step_by(2)
        .filter(|i| m.owner(&key(*i)) != m.epochs[1].owner(&key(*i)))
        .count() as u64;
    assert_eq!(plan.dependents[&1], 0);
    assert_eq!(plan.dependents[&2], off_newest + docs_off);
    assert_eq!(plan.dependents[&3], 60 - off_newest - docs_off);
    assert_eq!(plan.retained, [2, 3]);
    assert!(plan.removed.is_empty());
    assert_eq!(
        r.manifest_from_journal().await.unwrap(),
        m,
        "dry run changes nothing"
    );
    assert_eq!(
        [r.fence("s0").await.unwrap(), r.fence("s2").await.unwrap()],
        fences
    );

    let rep = r.prune_epochs(all_tables()).await.unwrap();
    assert_eq!(rep.removed, [1]);
    assert_eq!(rep.retained, [2, 3]);
    let m2 = r.manifest_from_journal().await.unwrap();
    assert_eq!(m2.epochs.len(), 2);
    assert_eq!(m2.generation, m.generation + 1);
    for s in ["s0", "s1", "s2"] {
        assert_eq!(r.fence(s).await.unwrap(), m2.generation);
    }
    // Move every key to its newest owner; then epoch 2 goes too.
    for i in 0..40 {
        let k = key(i);
        let owner = m2.owner(&k).unwrap();
        if home(&e, &k).await != owner {
            let tables: &[&str] = if i % 2 == 0 {
                &["users", "docs"]
            } else {
                &["users"]
            };
            r.reassign_keys(&k, owner, tables).await.unwrap();
        }
    }
    let rep = r.prune_epochs(all_tables()).await.unwrap();
    assert_eq!(rep.removed, [2], "{rep:?}");
    assert_eq!(rep.retained, [3]);
    for i in 0..40 {
        let got = r.get(&key(i), "users").await.unwrap().unwrap();
        assert_eq!(n_of(&got), Some(i as i64));
        assert_eq!(r.update(&key(i), "users", user(1)).await.unwrap(), 1);
    }
    clean_verify(&r).await;

    // PRUNE_REFUSED when the exception set cannot be read.
    let j = e.shard("s0");
    j.execute(&Statement::new(
        "DROP TABLE durability_placement_exceptions",
    ))
    .await
    .unwrap();
    let before = r.manifest_from_journal().await.unwrap();
    let err = r.prune_epochs(all_tables()).await.unwrap_err();
    assert_eq!(err.code(), "PRUNE_REFUSED", "{err}");
    assert_eq!(r.manifest_from_journal().await.unwrap(), before);
}

#[tokio::test]
async fn prune_epochs_counts_dependents_on_every_dialect() {
    for kinds in SETS {
        prune(kinds).await;
    }
}

#[tokio::test]
async fn prune_needs_an_explicit_journal_shard() {
    let Some(e) = env(&[Sqlite]).await else {
        return;
    };
    let c = MigrationConfig::new(e.mapping.clone())
        .shard("s0", Arc::clone(e.shard("s0")))
        .placement(Placement::Computed)
        .table("users");
    let r = Router::new(c).unwrap();
    r.init().await.unwrap();
    let err = r.prune_epochs(all_tables()).await.unwrap_err();
    assert_eq!(err.code(), "JOURNAL_NOT_CONFIGURED");
    // Several shards and no journal: computed placement has nowhere to
    // keep its manifest.
    let Some(e2) = env(&[Sqlite, Sqlite]).await else {
        return;
    };
    let c = MigrationConfig::new(e2.mapping.clone())
        .shard("s0", Arc::clone(e2.shard("s0")))
        .shard("s1", Arc::clone(e2.shard("s1")))
        .placement(Placement::Computed);
    assert_eq!(Router::new(c).unwrap_err().code(), "JOURNAL_NOT_CONFIGURED");
}

async fn unresolved_and_unverified(kinds: [Kind; 3]) {
    let Some(e) = env(&kinds).await else { return };
    // The mapping store goes down (every call fails) and comes back.
    let down = FaultPlan::new();
    let flaky = Arc::new(FaultMappingStore::new(e.mapping.clone(), down.clone()));
    let mut c = MigrationConfig::new(flaky)
        .journal_shard("s0")
        .placement(Placement::Computed)
        .manifest_refresh_ms(1_000)
        .clock(Arc::new(e.clock.clone()))
        .clock_domain(e.clock_domain.clone())
        .table("users")
        .table("docs");
    for (n, s) in &e.shards {
        c = c.shard(n.clone(), Arc::clone(s));
    }
    let r = Router::new(c).unwrap();
    r.init().await.unwrap();
    let m1 = r.manifest_from_journal().await.unwrap();
    r.add_epoch(&["s0", "s1"]).await.unwrap();
    let m = r.manifest_from_journal().await.unwrap();
    // A key placed on s2 by epoch 1 and on s0/s1 now.
    let k = (0..)
        .map(|i| format!("w{i}"))
        .find(|k| m1.owner(k) == Some("s2"))
        .unwrap();
    r.insert(&k, "users", user(1)).await.unwrap();
    assert_eq!(home(&e, &k).await, m.owner(&k).unwrap());
    // A probe that cannot run: WRITE_UNRESOLVED, nothing written (a key
    // with no row anywhere, so the probe reaches s2; `k`'s rows are found on
    // its newest owner first, where its docs row would join them).
    let k2 = (0..)
        .map(|i| format!("w{i}"))
        .filter(|x| m1.owner(x) == Some("s2"))
        .find(|x| *x != k)
        .unwrap();
    e.shard("s2")
        .execute(&Statement::new("DROP TABLE docs"))
        .await
        .unwrap();
    let err = r
        .insert(&k2, "docs", row([("w0", 1i64)]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "WRITE_UNRESOLVED", "{err}");
    for s in ["s0", "s1"] {
        let st = e.shard(s).dialect().select_row(
            &Ident::new("docs").unwrap(),
            &Ident::new("id").unwrap(),
            &k2,
        );
        assert!(
            e.shard(s).query(&st).await.unwrap().is_empty(),
            "nothing on {s}"
        );
    }
    // The mapping store is down and the cached manifest is due for
    // confirmation: writes refuse, reads use the cached manifest.
    e.clock.advance(2_000);
    down.crash_now();
    let err = r.update(&k, "users", user(2)).await.unwrap_err();
    assert_eq!(err.code(), "PLACEMENT_UNVERIFIED", "{err}");
    assert!(err.is_retryable());
    down.disarm();
    assert_eq!(n_of(&r.get(&k, "users").await.unwrap().unwrap()), Some(1));
    down.crash_now();
    e.clock.advance(2_000);
    assert_eq!(
        n_of(&r.get(&k, "users").await.unwrap().unwrap()),
        Some(1),
        "a read uses the cached manifest"
    );
    down.disarm();
    assert_eq!(r.update(&k, "users", user(3)).await.unwrap(), 1);
}

#[tokio::test]
async fn write_unresolved_and_placement_unverified() {
    for kinds in [SETS[0], SETS[1], SETS[2]] {
        unresolved_and_unverified(kinds).await;
    }
}

async fn moved_key_exception(kinds: [Kind; 3]) {
    let Some(e) = env(&kinds).await else { return };
    let r = computed(&e, false, 0).await;
    let other = computed(&e, false, 600_000).await;
    let m = r.manifest_from_journal().await.unwrap();
    let k = "mover";
    r.insert(k, "users", user(1)).await.unwrap();
    let owner = m.owner(k).unwrap().to_owned();
    let target = ["s0", "s1", "s2"]
        .into_iter()
        .find(|s| *s != owner)
        .unwrap();
    assert_eq!(
        other.get(k, "users").await.unwrap().map(|r| n_of(&r)),
        Some(Some(1))
    );
    r.reassign_shard(k, target, "users").await.unwrap();
    let after = r.manifest_from_journal().await.unwrap();
    assert_eq!(
        after.exception_version,
        m.exception_version + 1,
        "move off owner bumps"
    );
    assert_eq!(home(&e, k).await, target);
    // The other router reads the fresh mapping (it had cached none).
    assert_eq!(
        n_of(&other.get(k, "users").await.unwrap().unwrap()),
        Some(1)
    );
    assert_eq!(other.update(k, "users", user(2)).await.unwrap(), 1);
    assert_eq!(home(&e, k).await, target);
    // A router that confirms the manifest on every call caches the key's
    // mapping (its exception) for its mapping cache TTL.
    let confirming = computed(&e, false, 0).await;
    assert_eq!(
        n_of(&confirming.get(k, "users").await.unwrap().unwrap()),
        Some(2)
    );
    assert_eq!(confirming.route(k).await.unwrap().as_deref(), Some(target));
    // Moving back to the computed owner deletes the exception and bumps
    // the exception version (before, it deleted it without a bump, and
    // every other router kept routing the key to the shard it left, one
    // extra hop per call, until its mapping cache expired).
    r.reassign_shard(k, &owner, "users").await.unwrap();
    let back = r.manifest_from_journal().await.unwrap();
    assert_eq!(
        back.exception_version,
        after.exception_version + 1,
        "deleting the exception bumps"
    );
    confirming.manifest().await.unwrap();
    assert_eq!(
        confirming.route(k).await.unwrap().as_deref(),
        Some(owner.as_str()),
        "the other router dropped its cached mapping of the key"
    );
    assert_eq!(
        n_of(&other.get(k, "users").await.unwrap().unwrap()),
        Some(2)
    );
    clean_verify(&r).await;
}

#[tokio::test]
async fn moves_under_computed_placement_record_exceptions() {
    for kinds in SETS {
        moved_key_exception(kinds).await;
    }
}

// ---- crashes ----

#[derive(Debug, Clone, Copy)]
enum Step {
    AddEpoch,
    Prune,
    Move,
}

/// Crashes `step` at write `n`; a fresh process finishes the work. Returns
/// whether the crash point was reached (`None`: a server is unreachable).
async fn crash_case(kinds: [Kind; 3], step: Step, n: u64, mode: FaultMode) -> Option<bool> {
    let e = env(&kinds).await?;
    let setup = three_epochs(&e, 12).await;
    let m = setup.manifest_from_journal().await.unwrap();
    // The key to move: one whose row is off its newest owner.
    let mut off = None;
    for i in 0..12 {
        if home(&e, &key(i)).await != m.owner(&key(i)).unwrap() {
            off = Some(i);
            break;
        }
    }
    let off = off.unwrap();
    let faulty = computed(&e, true, 0).await;
    e.plan.arm(n, mode);
    let res = match step {
        Step::AddEpoch => faulty.add_epoch(&["s1", "s2"]).await.map(|_| ()),
        Step::Prune => faulty.prune_epochs(all_tables()).await.map(|_| ()),
        // A move includes every table holding a row of the key (even keys
        // also have a docs row).
        Step::Move => {
            let tables: &[&str] = if off % 2 == 0 {
                &["users", "docs"]
            } else {
                &["users"]
            };
            faulty
                .reassign_keys(&key(off), m.owner(&key(off)).unwrap(), tables)
                .await
                .map(|_| ())
        }
    };
    let tripped = e.plan.tripped();
    if !tripped {
        res.unwrap();
    }
    drop(faulty);
    e.plan.disarm();
    e.clock.advance(61_000);
    let fresh = computed(&e, false, 0).await;
    let ctx = format!("{kinds:?} {step:?} n={n} {mode:?}");
    match step {
        Step::AddEpoch => {
            let m2 = fresh.add_epoch(&["s1", "s2"]).await.unwrap();
            assert_eq!(m2.epochs.len(), 4, "{ctx}: one new epoch");
        }
        Step::Prune => {
            fresh.prune_epochs(all_tables()).await.unwrap();
            let m2 = fresh.manifest_from_journal().await.unwrap();
            let numbers: Vec<u32> = m2.epochs.iter().map(|e| e.number).collect();
            assert_eq!(numbers, [3, 2], "{ctx}");
        }
        Step::Move => {
            let rep = fresh.recover_migrations().await.unwrap();
            assert!(rep.failed.is_empty(), "{ctx}: {rep:?}");
        }
    }
    let m2 = fresh.manifest_from_journal().await.unwrap();
    for s in ["s0", "s1", "s2"] {
        assert!(fresh.fence(s).await.unwrap() <= m2.generation, "{ctx}");
    }
    if !matches!(step, Step::Move) {
        for s in ["s0", "s1", "s2"] {
            assert_eq!(fresh.fence(s).await.unwrap(), m2.generation, "{ctx}: {s}");
        }
    }
    clean_verify(&fresh).await;
    for i in 0..12 {
        let k = key(i);
        home(&e, &k).await;
        let got = fresh.get(&k, "users").await.unwrap();
        assert_eq!(got.as_ref().and_then(n_of), Some(i as i64), "{ctx}: {k}");
        assert_eq!(
            fresh.update(&k, "users", user(50)).await.unwrap(),
            1,
            "{ctx}"
        );
    }
    assert_eq!(
        fresh.insert("brand-new", "users", user(9)).await.unwrap(),
        1
    );
    assert_eq!(home(&e, "brand-new").await, m2.owner("brand-new").unwrap());
    Some(tripped)
}

/// Every crash point of `step` in both modes; returns how many were tried.
async fn crash_points(kinds: [Kind; 3], step: Step) -> Option<u64> {
    let mut tried = 0;
    for mode in [FaultMode::Before, FaultMode::After] {
        let mut n = 1;
        while crash_case(kinds, step, n, mode).await? {
            tried += 1;
            n += 1;
        }
    }
    eprintln!("{kinds:?} {step:?}: {tried} crash points tried");
    Some(tried)
}

async fn crash_all(kinds: [Kind; 3]) {
    for step in [Step::AddEpoch, Step::Prune, Step::Move] {
        if let Some(tried) = crash_points(kinds, step).await {
            assert!(tried >= 4, "{kinds:?} {step:?}: {tried} crash points");
        }
    }
}

#[tokio::test]
async fn crash_at_every_write_under_computed_placement_sqlite() {
    crash_all(SETS[0]).await;
}

#[tokio::test]
async fn crash_at_every_write_under_computed_placement_postgres() {
    crash_all(SETS[1]).await;
}

#[tokio::test]
async fn crash_at_every_write_under_computed_placement_mariadb() {
    crash_all(SETS[2]).await;
}

/// The key column types of the census test per dialect: integer, text and
/// binary (`(table, type)`).
fn typed_key_tables(kind: Kind) -> [(&'static str, &'static str); 3] {
    match kind {
        Sqlite => [("ikeys", "INTEGER"), ("tkeys", "TEXT"), ("xkeys", "BLOB")],
        Postgres => [("ikeys", "BIGINT"), ("tkeys", "TEXT"), ("xkeys", "BYTEA")],
        MySql => [
            ("ikeys", "BIGINT"),
            ("tkeys", "VARCHAR(255)"),
            ("xkeys", "VARBINARY(255)"),
        ],
    }
}

/// The stored key value of `k` in a table of `table`'s key type.
fn typed_key(table: &str, k: &str) -> Value {
    match table {
        "ikeys" => Value::Integer(k.parse().unwrap()),
        "tkeys" => Value::from(k),
        _ => Value::Blob(k.as_bytes().to_vec()),
    }
}

async fn census_typed_keys(kind: Kind) {
    let Some(e) = env(&[kind, kind, kind]).await else {
        return;
    };
    let r = computed(&e, false, 0).await;
    let m1 = r.manifest_from_journal().await.unwrap();
    let mut keys: Vec<(&str, Vec<String>)> = vec![
        ("ikeys", (-8..=8).map(|i: i64| i.to_string()).collect()),
        ("tkeys", (0..12).map(|i| format!("t{i}")).collect()),
        ("xkeys", (0..12).map(|i| format!("b{i}")).collect()),
    ];
    keys[0].1.push(i64::MIN.to_string());
    for (name, _) in &e.shards {
        for (table, ty) in typed_key_tables(kind) {
            let ddl = format!("CREATE TABLE {table} (id {ty} PRIMARY KEY, n BIGINT)");
            e.shard(name).execute(&Statement::new(ddl)).await.unwrap();
        }
    }
    // Every row on its epoch-1 owner, written before epoch 2 exists.
    for (table, ks) in &keys {
        for k in ks {
            let s = e.shard(m1.owner(k).unwrap());
            let d = s.dialect();
            let mut q = Sql::new(&d);
            q.raw("INSERT INTO ")
                .ident(&Ident::new(table).unwrap())
                .raw(" (id, n) VALUES (")
                .bind(typed_key(table, k))
                .raw(", 1)");
            assert_eq!(s.execute(&q.finish()).await.unwrap(), 1);
        }
    }
    r.add_epoch(&["s0", "s1"]).await.unwrap();
    let m = r.manifest_from_journal().await.unwrap();
    for (table, ks) in &keys {
        let on_epoch_1 = ks.iter().filter(|k| m.owner(k) != m1.owner(k)).count() as u64;
        assert!(
            on_epoch_1 > 0,
            "{kind:?} {table}: some row depends on epoch 1"
        );
        let plan = r
            .prune_epochs(PruneOptions {
                tables: vec![(*table).to_owned()],
                dry_run: true,
                page_size: 3,
                ..PruneOptions::default()
            })
            .await
            .unwrap();
        assert_eq!(plan.scanned, ks.len() as u64, "{kind:?} {table}: {plan:?}");
        assert_eq!(plan.unplaced, 0, "{kind:?} {table}: {plan:?}");
        assert_eq!(
            plan.dependents[&1], on_epoch_1,
            "{kind:?} {table}: {plan:?}"
        );
        assert_eq!(
            plan.dependents[&2],
            ks.len() as u64 - on_epoch_1,
            "{kind:?} {table}: {plan:?}"
        );
    }
    let rep = r
        .prune_epochs(PruneOptions {
            tables: keys.iter().map(|(t, _)| (*t).to_owned()).collect(),
            page_size: 4,
            ..PruneOptions::default()
        })
        .await
        .unwrap();
    assert!(rep.removed.is_empty(), "{kind:?}: {rep:?}");
    assert_eq!(rep.retained, [1, 2], "{kind:?}: epoch 1 keeps its rows");
    assert_eq!(r.manifest_from_journal().await.unwrap().epochs.len(), 2);
}

/// The pruning census pages through integer (negative and `i64::MIN`
/// included), text and binary key columns with a cursor of the column's own
/// type and no lower bound on the first page, so every row is counted and no
/// epoch a row depends on is pruned (issue 13 item 4).
#[tokio::test]
async fn prune_census_counts_integer_text_and_binary_keys_on_every_dialect() {
    for kind in [Sqlite, Postgres, MySql] {
        census_typed_keys(kind).await;
    }
}
