//! Issue 13 item 2: under computed placement a move's destination copy is
//! fenced from the copy until the publish. The copy sits on the key's newest
//! owner, where every router without a mapping probes first; before the fix
//! a second router's write landed on the copy and was acknowledged, then a
//! re-copy overwrote it (recovery) or an abort left two diverged live rows.
//! Now the copy carries an in-flight marker (written in the copy's batch,
//! deleted in the publish batch or with the copy at abort): probes and reads
//! skip the copy and find the source, and a write routed onto the copy is
//! refused with `MIGRATION_CUTOVER_PENDING`. On SQLite, PostgreSQL and
//! MariaDB shards; without a server a test prints that it skipped, unless
//! `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::shards::{Env, Hook, Kind, Write, clean_verify, env, hooked, op_of};
use durability_migration::conformance::FaultMode;
use durability_migration::{
    BackendError, MOVE_LIVENESS_MS, MigrationConfig, Placement, Router, Row, Shard, Statement,
    Value, row,
};

use Kind::{MySql, Postgres, Sqlite};

const SETS: [[Kind; 2]; 3] = [[Sqlite, Sqlite], [Postgres, Postgres], [MySql, MySql]];

fn user(n: i64) -> Row {
    row([("name", Value::from("u")), ("n", Value::from(n))])
}

fn n_of(r: &Row) -> Option<i64> {
    r.get("n").and_then(Value::as_integer)
}

fn computed_config(e: &Env, faulty: bool) -> MigrationConfig {
    e.config(faulty, 30_000)
        .placement(Placement::Computed)
        .manifest_refresh_ms(0)
}

/// A fresh router (no cached mapping, manifest confirmed on every call).
async fn fresh(e: &Env) -> Router {
    let r = Router::new(computed_config(e, false)).unwrap();
    r.init().await.unwrap();
    r
}

/// A computed router over `e` whose shard `name` is `shard` instead.
async fn replacing(e: &Env, name: &str, shard: Arc<dyn Shard>) -> Router {
    let r = Router::new(computed_config(e, false).shard(name, shard)).unwrap();
    r.init().await.unwrap();
    r
}

/// The seed's "move keys to their current owners" set-up: key `k` written
/// under epoch 1 (`s0`, `s1`) on `s0`, then an epoch of `s1` alone, so its
/// newest owner is `s1` and its row is on `s0`.
async fn placed(e: &Env) -> String {
    let r = fresh(e).await;
    let k = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| r.computed_owner(k).as_deref() == Some("s0"))
        .unwrap();
    assert_eq!(r.insert(&k, "users", user(1)).await.unwrap(), 1);
    r.add_epoch(&["s1"]).await.unwrap();
    assert_eq!(r.computed_owner(&k).as_deref(), Some("s1"));
    assert_eq!(e.live("users", "id", &k).await[0].0, "s0");
    k
}

fn is_cutover(stmts: &[Statement]) -> bool {
    stmts.iter().any(|s| {
        s.sql.starts_with("INSERT INTO durability_retired")
            && s.sql.contains("durability_migration_ops")
    })
}

fn is_publish(stmts: &[Statement]) -> bool {
    stmts.iter().any(|s| {
        s.sql
            .starts_with("UPDATE durability_retired SET superseded = 1")
    })
}

/// Fails the source's cutover batch once (not applied): the move stops
/// between copy and cutover, its operation left `prepared`.
struct StopAtCutover {
    fired: AtomicBool,
}

impl Hook for StopAtCutover {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        if w.once(is_cutover(w.stmts), &self.fired) {
            return Err("stopped before the cutover".into());
        }
        Ok(())
    }
}

/// Leaves a move of `k` from `s0` to `s1` stopped after its copy, before
/// its cutover; returns its operation id.
async fn stopped_after_copy(e: &Env, k: &str) -> String {
    stopped_after_copy_of(e, k, &["users"]).await
}

/// [`stopped_after_copy`] of a move over `tables`.
async fn stopped_after_copy_of(e: &Env, k: &str, tables: &[&str]) -> String {
    let hooked = hooked(
        e,
        "s0",
        StopAtCutover {
            fired: AtomicBool::new(false),
        },
    );
    let mover = replacing(e, "s0", hooked.clone()).await;
    let err = mover.reassign_keys(k, "s1", tables).await.unwrap_err();
    assert!(hooked.hook.fired.load(Ordering::SeqCst), "stopped: {err}");
    assert_eq!(err.code(), "SHARD_UNAVAILABLE", "{err}");
    let live = e.live("users", "id", k).await;
    assert_eq!(live.len(), 2, "source row and destination copy: {live:?}");
    op_of(&mover, k, "users").await.op_id
}

/// A second router reads and writes the key while its move is stopped
/// between copy and cutover; returns the acknowledged value.
async fn second_router_writes(e: &Env, k: &str, kinds: [Kind; 2]) -> i64 {
    let other = fresh(e).await;
    let got = other.get(k, "users").await.unwrap().unwrap();
    assert_eq!(n_of(&got), Some(1), "{kinds:?}: reads the key's value");
    assert_eq!(other.update(k, "users", user(42)).await.unwrap(), 1);
    let got = other.get(k, "users").await.unwrap().unwrap();
    assert_eq!(n_of(&got), Some(42), "{kinds:?}: reads its own write");
    42
}

/// The key has one live row, holding `n`, read alike by a fresh router.
async fn one_row_holding(e: &Env, k: &str, n: i64, ctx: &str) {
    let live = e.live("users", "id", k).await;
    assert_eq!(live.len(), 1, "{ctx}: one live row: {live:?}");
    assert_eq!(n_of(&live[0].1), Some(n), "{ctx}: {live:?}");
    let r = fresh(e).await;
    let got = r.get(k, "users").await.unwrap().unwrap();
    assert_eq!(n_of(&got), Some(n), "{ctx}: read through a fresh router");
    assert_eq!(r.update(k, "users", user(n + 1)).await.unwrap(), 1, "{ctx}");
    let got = r.get(k, "users").await.unwrap().unwrap();
    assert_eq!(n_of(&got), Some(n + 1), "{ctx}: writable afterwards");
    clean_verify(&r).await;
}

async fn recopy_keeps_acknowledged_write(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let k = placed(&e).await;
    stopped_after_copy(&e, &k).await;
    let acked = second_router_writes(&e, &k, kinds).await;
    let before_recovery = e.live("users", "id", &k).await;
    // The mover is gone; recovery starts the move over from a fresh
    // snapshot and finishes it.
    e.clock
        .advance(i64::try_from(MOVE_LIVENESS_MS).unwrap() + 1_000);
    let rep = fresh(&e).await.recover_migrations().await.unwrap();
    assert_eq!(rep.committed.len(), 1, "{kinds:?}: {rep:?}");
    one_row_holding(
        &e,
        &k,
        acked,
        &format!("{kinds:?} recopy: before recovery {before_recovery:?}"),
    )
    .await;
    assert_eq!(e.live("users", "id", &k).await[0].0, "s1", "{kinds:?}");
    // The second router's write had landed on the key's row (the source),
    // not on the destination copy.
    let on = |s: &str| {
        before_recovery
            .iter()
            .find(|(n, _)| n == s)
            .and_then(|(_, r)| n_of(r))
    };
    assert_eq!(on("s0"), Some(42), "{kinds:?}: {before_recovery:?}");
    assert_eq!(
        on("s1"),
        Some(1),
        "{kinds:?}: copy untouched: {before_recovery:?}"
    );
}

async fn abort_leaves_one_row(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let k = placed(&e).await;
    let op_id = stopped_after_copy(&e, &k).await;
    let acked = second_router_writes(&e, &k, kinds).await;
    let rep = fresh(&e).await.abort_operation(&op_id).await.unwrap();
    one_row_holding(&e, &k, acked, &format!("{kinds:?} abort")).await;
    assert_eq!(rep.copies_dropped, 1, "{kinds:?}: {rep:?}");
    assert_eq!(e.live("users", "id", &k).await[0].0, "s0", "{kinds:?}");
}

/// A table-set move (`users` with a row, `orgs` without) stopped after its
/// copy: a second router's insert of the key's `orgs` row lands with the
/// key's other row on the source (not beside the fenced copy, where an
/// abort would strand it), and the recovered move takes it along.
async fn table_set_insert_joins_the_key(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let k = placed(&e).await;
    stopped_after_copy_of(&e, &k, &["users", "orgs"]).await;
    let other = fresh(&e).await;
    assert_eq!(
        other
            .insert(&k, "orgs", row([("title", "Acme")]))
            .await
            .unwrap(),
        1
    );
    let orgs = e.live("orgs", "org_id", &k).await;
    assert_eq!(orgs.len(), 1, "{kinds:?}: {orgs:?}");
    assert_eq!(orgs[0].0, "s0", "{kinds:?}: with the key's users row");
    e.clock
        .advance(i64::try_from(MOVE_LIVENESS_MS).unwrap() + 1_000);
    let rep = fresh(&e).await.recover_migrations().await.unwrap();
    assert_eq!(rep.committed.len(), 1, "{kinds:?}: {rep:?}");
    let orgs = e.live("orgs", "org_id", &k).await;
    assert_eq!(orgs.len(), 1, "{kinds:?}: {orgs:?}");
    assert_eq!(orgs[0].0, "s1", "{kinds:?}: moved with the key");
    let got = fresh(&e).await.get(&k, "orgs").await.unwrap().unwrap();
    assert_eq!(got.get("title"), Some(&Value::from("Acme")), "{kinds:?}");
    one_row_holding(&e, &k, 1, &format!("{kinds:?} table set")).await;
}

/// On the destination, just before the publish batch (the source is cut
/// over): a second router's write is refused, and its read finds the copy.
struct BeforePublish {
    fired: AtomicBool,
    key: OnceLock<String>,
    env_router: OnceLock<Arc<Router>>,
    seen: Mutex<Vec<String>>,
}

impl Hook for BeforePublish {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        if !w.once(is_publish(w.stmts), &self.fired) {
            return Ok(());
        }
        let other = self.env_router.get().ok_or("no router")?;
        let k = self.key.get().ok_or("no key")?;
        let mut seen = self.seen.lock().unwrap().clone();
        match other.update(k, "users", user(7)).await {
            Ok(n) => seen.push(format!("update Ok({n})")),
            Err(e) => seen.push(format!("update {}", e.code())),
        }
        match other.get(k, "users").await {
            Ok(r) => seen.push(format!("get {:?}", r.as_ref().and_then(n_of))),
            Err(e) => seen.push(format!("get {}", e.code())),
        }
        *self.seen.lock().unwrap() = seen;
        Ok(())
    }
}

async fn cut_over_copy_refuses_writes(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let k = placed(&e).await;
    let hooked = hooked(
        &e,
        "s1",
        BeforePublish {
            fired: AtomicBool::new(false),
            key: OnceLock::new(),
            env_router: OnceLock::new(),
            seen: Mutex::new(Vec::new()),
        },
    );
    let _ = hooked.hook.key.set(k.clone());
    let _ = hooked.hook.env_router.set(Arc::new(fresh(&e).await));
    let mover = replacing(&e, "s1", hooked.clone()).await;
    mover.reassign_shard(&k, "s1", "users").await.unwrap();
    assert!(hooked.hook.fired.load(Ordering::SeqCst), "{kinds:?}");
    let seen = hooked.hook.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        ["update MIGRATION_CUTOVER_PENDING", "get Some(1)"],
        "{kinds:?}"
    );
    one_row_holding(&e, &k, 1, &format!("{kinds:?} publish")).await;
}

/// A crash at every write of a computed move (before and after the write
/// applies); a second router writes the key between the crash and the
/// recovery; a fresh process recovers. Every acknowledged write is read
/// back and the key has one live row.
async fn crash_at_every_write(kinds: [Kind; 2]) {
    for mode in [FaultMode::Before, FaultMode::After] {
        for n in 1.. {
            let Some(e) = env(&kinds).await else { return };
            let ctx = format!("{kinds:?} {mode:?} write {n}");
            let k = placed(&e).await;
            let faulty = Router::new(computed_config(&e, true)).unwrap();
            faulty.init().await.unwrap();
            e.plan.arm(n, mode);
            let res = faulty.reassign_shard(&k, "s1", "users").await;
            let tripped = e.plan.tripped();
            e.plan.disarm();
            drop(faulty);
            if !tripped {
                res.unwrap();
                one_row_holding(&e, &k, 1, &ctx).await;
                // Claim, copy, cutover, publish batch, mapping, exception,
                // retire: every one was crashed at.
                assert!(n > 5, "{ctx}: only {} writes", n - 1);
                break;
            }
            let other = fresh(&e).await;
            let acked = match other.update(&k, "users", user(100)).await {
                Ok(1) => 100,
                Ok(other) => panic!("{ctx}: update changed {other} rows"),
                Err(err) => {
                    assert_eq!(err.code(), "MIGRATION_CUTOVER_PENDING", "{ctx}: {err}");
                    1
                }
            };
            e.clock
                .advance(i64::try_from(MOVE_LIVENESS_MS).unwrap() + 1_000);
            let rep = fresh(&e).await.recover_migrations().await.unwrap();
            assert!(rep.failed.is_empty(), "{ctx}: {rep:?}");
            one_row_holding(&e, &k, acked, &ctx).await;
        }
    }
}

#[tokio::test]
async fn recopy_keeps_acknowledged_write_sqlite() {
    recopy_keeps_acknowledged_write(SETS[0]).await;
}

#[tokio::test]
async fn recopy_keeps_acknowledged_write_postgres() {
    recopy_keeps_acknowledged_write(SETS[1]).await;
}

#[tokio::test]
async fn abort_leaves_one_row_sqlite() {
    abort_leaves_one_row(SETS[0]).await;
}

#[tokio::test]
async fn abort_leaves_one_row_postgres() {
    abort_leaves_one_row(SETS[1]).await;
}

#[tokio::test]
async fn cut_over_copy_refuses_writes_sqlite() {
    cut_over_copy_refuses_writes(SETS[0]).await;
}

#[tokio::test]
async fn cut_over_copy_refuses_writes_postgres() {
    cut_over_copy_refuses_writes(SETS[1]).await;
}

#[tokio::test]
async fn crash_at_every_write_sqlite() {
    crash_at_every_write(SETS[0]).await;
}

#[tokio::test]
async fn crash_at_every_write_postgres() {
    crash_at_every_write(SETS[1]).await;
}

#[tokio::test]
async fn recopy_keeps_acknowledged_write_mariadb() {
    recopy_keeps_acknowledged_write(SETS[2]).await;
}

#[tokio::test]
async fn abort_leaves_one_row_mariadb() {
    abort_leaves_one_row(SETS[2]).await;
}

#[tokio::test]
async fn cut_over_copy_refuses_writes_mariadb() {
    cut_over_copy_refuses_writes(SETS[2]).await;
}

#[tokio::test]
async fn crash_at_every_write_mariadb() {
    crash_at_every_write(SETS[2]).await;
}

#[tokio::test]
async fn table_set_insert_joins_the_key_sqlite() {
    table_set_insert_joins_the_key(SETS[0]).await;
}

#[tokio::test]
async fn table_set_insert_joins_the_key_postgres() {
    table_set_insert_joins_the_key(SETS[1]).await;
}

#[tokio::test]
async fn table_set_insert_joins_the_key_mariadb() {
    table_set_insert_joins_the_key(SETS[2]).await;
}
