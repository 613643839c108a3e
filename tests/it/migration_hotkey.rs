//! Issue 13 item 10: a key under constant writes moves in bounded time. When
//! a cutover misses because a write changed the row after the snapshot, the
//! mover holds the key's writes on the source (routed writes there fail with
//! the retryable `MIGRATION_CUTOVER_PENDING`) for at most the configured
//! `cutover_hold_ms` on the injected clock while it copies the final delta.
//! On SQLite, PostgreSQL and MariaDB shards: a writer that updates the key
//! before every cutover batch, a steady concurrent writer, a mover that dies
//! inside the window, and a crash at every write of the new path. Without a
//! server a test prints that it skipped, unless
//! `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::shards::{
    Env, Hook, Kind, OnWrite, Write, clean_verify, env, router_on, router_with_user,
};
use durability_migration::conformance::FaultMode;
use durability_migration::conformance::harness::{HookedShard, user};
use durability_migration::{
    BackendError, Clock, DEFAULT_CUTOVER_HOLD_MS, MAX_CUTOVER_HOLD_MS, ManualClock, MappingStore,
    MemoryMappingStore, MigrationConfig, MigrationError, Router, Row, Shard, Statement, Value,
};

use Kind::{MySql, Postgres, Sqlite};

const SAME: [[Kind; 2]; 3] = [[Sqlite, Sqlite], [Postgres, Postgres], [MySql, MySql]];

/// On the move's source: a routed update of `k` through another router just
/// before every cutover batch (a writer that always wins the race without
/// a hold). Records the last acknowledged value and the refused writes.
/// With `die_after_hold`, the first source write after the hold is taken
/// fails without applying (the mover dies inside the window).
#[derive(Default)]
struct HotWriter {
    writer: OnceLock<Arc<Router>>,
    next: AtomicI64,
    acked: AtomicI64,
    refused: AtomicU64,
    die_after_hold: bool,
    held: AtomicBool,
    died: AtomicBool,
}

impl HotWriter {
    async fn write(&self) -> Result<(), BackendError> {
        let w = self.writer.get().ok_or("no writer")?;
        let i = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        match w.update("k", "users", user(&format!("w{i}"), i)).await {
            Ok(1) => {
                self.acked.store(i, Ordering::SeqCst);
                Ok(())
            }
            Ok(n) => Err(format!("the hot write changed {n} rows").into()),
            Err(e) if e.code() == "MIGRATION_CUTOVER_PENDING" => {
                assert!(e.is_retryable());
                self.refused.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => Err(e.to_string().into()),
        }
    }
}

impl Hook for HotWriter {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        if self.die_after_hold {
            if w.has("INSERT INTO durability_write_hold") {
                self.held.store(true, Ordering::SeqCst);
            } else if self.held.load(Ordering::SeqCst) && !self.died.swap(true, Ordering::SeqCst) {
                return Err("the mover died inside the window".into());
            }
        }
        if w.is_cutover() {
            self.write().await?;
        }
        Ok(())
    }
}

/// `k` on `s0` with an acknowledged `users` row (`name` = `w0`).
async fn seed(e: &Env) -> Router {
    router_with_user(e, "k", "s0", user("w0", 0)).await
}

/// A mover over `e` (faulty or not) whose source `s0` runs `hook`, and the
/// hook's writer (a plain router).
async fn hooked_mover(
    e: &Env,
    faulty: bool,
    hold_ms: Option<u64>,
    hook: HotWriter,
) -> (Router, Arc<HookedShard<OnWrite<HotWriter>>>) {
    hooked_mover_with(e, faulty, hook, |c| match hold_ms {
        Some(ms) => c.cutover_hold_ms(ms),
        None => c,
    })
    .await
}

/// [`hooked_mover`] with its configuration changed by `configure`.
async fn hooked_mover_with(
    e: &Env,
    faulty: bool,
    hook: HotWriter,
    configure: impl FnOnce(MigrationConfig) -> MigrationConfig,
) -> (Router, Arc<HookedShard<OnWrite<HotWriter>>>) {
    let base = e.config(faulty, 30_000);
    let s0 = base_shard(e, faulty);
    let hooked = Arc::new(HookedShard::new(s0, OnWrite(hook)));
    let mover = Router::new(configure(base.shard("s0", hooked.clone()))).unwrap();
    mover.init().await.unwrap();
    let writer = e.router().await;
    let _ = hooked.hook.writer.set(Arc::new(writer));
    (mover, hooked)
}

/// `s0` as a router over `e` sees it: wrapped in the crash plan when
/// `faulty`.
fn base_shard(e: &Env, faulty: bool) -> Arc<dyn Shard> {
    let s0 = Arc::clone(e.shard("s0"));
    if faulty {
        Arc::new(durability_migration::conformance::FaultShard::new(
            s0,
            Arc::clone(&e.plan),
        ))
    } else {
        s0
    }
}

async fn users_row(r: &Router) -> Row {
    r.get("k", "users").await.unwrap().unwrap()
}

fn name_of(i: i64) -> Value {
    Value::from(format!("w{i}").as_str())
}

/// Seeds `k` and runs a move of it to `s1` by a mover (its configuration
/// changed by `configure`) that dies inside the write-hold window: the move
/// fails with `SHARD_UNAVAILABLE`. Returns the source's hook (its writer's
/// acknowledged writes).
async fn mover_dies_inside_the_window(
    e: &Env,
    kinds: [Kind; 2],
    configure: impl FnOnce(MigrationConfig) -> MigrationConfig,
) -> Arc<HookedShard<OnWrite<HotWriter>>> {
    seed(e).await;
    let hook = HotWriter {
        die_after_hold: true,
        ..HotWriter::default()
    };
    let (mover, hooked) = hooked_mover_with(e, false, hook, configure).await;
    let err = mover.reassign_shard("k", "s1", "users").await.unwrap_err();
    assert_eq!(err.code(), "SHARD_UNAVAILABLE", "{kinds:?}: {err}");
    assert!(hooked.hook.died.load(Ordering::SeqCst));
    hooked
}

/// Asserts that a routed write of `k` through `r` is held (refused with
/// the retryable `MIGRATION_CUTOVER_PENDING`, nothing written); returns
/// the refusal.
async fn assert_held(r: &Router, ctx: &str) -> MigrationError {
    let err = r.update("k", "users", user("held", 1)).await.unwrap_err();
    assert_eq!(err.code(), "MIGRATION_CUTOVER_PENDING", "{ctx}: {err}");
    err
}

/// A writer that updates the key before every cutover batch makes every
/// cutover without a hold miss: with the hold off (`cutover_hold_ms(0)`,
/// the behaviour before item 10) the move aborts after its re-copies; with
/// the default hold it commits, the writes inside the window were refused
/// with `MIGRATION_CUTOVER_PENDING`, and the last acknowledged write is the
/// moved row.
#[tokio::test]
async fn a_key_written_before_every_cutover_moves_with_the_hold() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        seed(&e).await;
        // Baseline: no hold.
        let (mover, hooked) = hooked_mover(&e, false, Some(0), HotWriter::default()).await;
        let err = mover.reassign_shard("k", "s1", "users").await.unwrap_err();
        assert_eq!(err.code(), "MIGRATION_ABORTED", "{kinds:?}: {err}");
        assert_eq!(hooked.hook.refused.load(Ordering::SeqCst), 0);
        let acked = hooked.hook.acked.load(Ordering::SeqCst);
        assert!(
            acked >= 4,
            "{kinds:?}: every cutover missed ({acked} writes)"
        );
        let live = e.live("users", "id", "k").await;
        assert_eq!(live.len(), 1, "{kinds:?}: {live:?}");
        assert_eq!(live[0].0, "s0", "{kinds:?}: the aborted move left k home");
        assert_eq!(live[0].1.get("name"), Some(&name_of(acked)));
        // The default hold.
        let hook = HotWriter::default();
        hook.next.store(acked, Ordering::SeqCst);
        let (mover, hooked) = hooked_mover(&e, false, None, hook).await;
        let out = mover.reassign_shard("k", "s1", "users").await.unwrap();
        assert!(out.recopies >= 1, "{kinds:?}: the first cutover missed");
        assert!(
            hooked.hook.refused.load(Ordering::SeqCst) >= 1,
            "{kinds:?}: a write inside the window was refused"
        );
        let last = hooked.hook.acked.load(Ordering::SeqCst);
        assert!(last > acked, "{kinds:?}: a write before the hold landed");
        let live = e.live("users", "id", "k").await;
        assert_eq!(live.len(), 1, "{kinds:?}: {live:?}");
        assert_eq!(live[0].0, "s1", "{kinds:?}: moved");
        let fresh = e.router().await;
        assert_eq!(
            users_row(&fresh).await.get("name"),
            Some(&name_of(last)),
            "{kinds:?}: the last acknowledged write is readable"
        );
        // The hold ended with the cutover: writes land at once.
        assert_eq!(
            fresh.update("k", "users", user("after", 9)).await.unwrap(),
            1
        );
        let holds = e
            .shard("s0")
            .query(&Statement::new("SELECT mkey FROM durability_write_hold"))
            .await
            .unwrap();
        assert!(holds.is_empty(), "{kinds:?}: no hold left: {holds:?}");
        clean_verify(&fresh).await;
    }
}

/// A task updating the key in a loop until the move finishes: the move
/// commits, and the last acknowledged write is readable after.
async fn steady_writer(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let e = Arc::new(e);
    seed(&e).await;
    let writer = Arc::new(e.router().await);
    let mover = e.router().await;
    let done = Arc::new(AtomicBool::new(false));
    let task = {
        let (writer, done) = (Arc::clone(&writer), Arc::clone(&done));
        tokio::spawn(async move {
            let (mut acked, mut refused, mut i) = (0i64, 0u64, 0i64);
            while !done.load(Ordering::SeqCst) {
                i += 1;
                match writer.update("k", "users", user(&format!("w{i}"), i)).await {
                    Ok(1) => acked = i,
                    Ok(n) => panic!("a write changed {n} rows"),
                    Err(e) if e.code() == "MIGRATION_CUTOVER_PENDING" => refused += 1,
                    Err(e) => panic!("{e}"),
                }
                tokio::task::yield_now().await;
            }
            (acked, refused, i)
        })
    };
    let mut moves = Vec::new();
    for to in ["s1", "s0", "s1"] {
        moves.push(mover.reassign_shard("k", to, "users").await);
    }
    done.store(true, Ordering::SeqCst);
    let (acked, refused, tried) = task.await.unwrap();
    for (i, m) in moves.iter().enumerate() {
        assert!(
            m.is_ok(),
            "{kinds:?}: move {i} under a steady writer: {m:?}"
        );
    }
    eprintln!(
        "{kinds:?}: 3 of 3 moves committed; {tried} writes, {refused} refused, recopies {:?}",
        moves
            .iter()
            .map(|m| m.as_ref().unwrap().recopies)
            .collect::<Vec<_>>()
    );
    let live = e.live("users", "id", "k").await;
    assert_eq!(live.len(), 1, "{kinds:?}: {live:?}");
    assert_eq!(live[0].0, "s1");
    let fresh = e.router().await;
    assert_eq!(
        users_row(&fresh).await.get("name"),
        Some(&name_of(acked)),
        "{kinds:?}: the last acknowledged write is readable"
    );
    clean_verify(&fresh).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_under_a_steady_writer_moves_sqlite() {
    steady_writer([Sqlite, Sqlite]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_under_a_steady_writer_moves_postgres() {
    steady_writer([Postgres, Postgres]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_under_a_steady_writer_moves_mariadb() {
    steady_writer([MySql, MySql]).await;
}

/// A mover that dies inside the window leaves the key readable, its writes
/// refused only until the hold's deadline on the injected clock (the next
/// routed write removes the expired hold), and recovery settles the move
/// with the last acknowledged write kept.
#[tokio::test]
async fn a_mover_that_dies_inside_the_window_blocks_writes_only_until_the_deadline() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let hooked = mover_dies_inside_the_window(&e, kinds, |c| c).await;
        let acked = hooked.hook.acked.load(Ordering::SeqCst);
        let fresh = e.router().await;
        // Readable, writes held.
        assert_eq!(users_row(&fresh).await.get("name"), Some(&name_of(acked)));
        let ctx = format!("{kinds:?}");
        assert!(assert_held(&fresh, &ctx).await.is_retryable());
        e.clock
            .advance(i64::try_from(DEFAULT_CUTOVER_HOLD_MS).unwrap() - 1);
        assert_held(&fresh, &ctx).await;
        // At the deadline the hold is over.
        e.clock.advance(1);
        assert_eq!(
            fresh.update("k", "users", user("free", 2)).await.unwrap(),
            1,
            "{kinds:?}: the expired hold released the key"
        );
        assert_eq!(
            users_row(&fresh).await.get("name"),
            Some(&Value::from("free"))
        );
        // Recovery after the mover's liveness settles the move.
        e.clock.advance(31_000);
        let rep = fresh.recover_migrations().await.unwrap();
        assert!(rep.failed.is_empty(), "{kinds:?}: {rep:?}");
        let after = e.router().await;
        assert_eq!(
            users_row(&after).await.get("name"),
            Some(&Value::from("free")),
            "{kinds:?}: the last acknowledged write survives recovery"
        );
        assert_eq!(after.update("k", "users", user("x", 3)).await.unwrap(), 1);
        clean_verify(&after).await;
    }
}

/// A write hold's deadline is compared only on its mover's clock. The
/// mover (host A) dies inside the window. A writer on host B, whose clock
/// runs ten windows ahead, does not remove the live-looking hold at once
/// (before, it did: its clock was past the deadline), and a writer on host
/// C, ten windows behind, does not wait out the skew (before, it waited ten
/// windows): each removes the dead mover's hold once it saw it unchanged for
/// the hold's window of its own clock.
#[tokio::test]
async fn a_hold_is_judged_on_its_movers_clock_only() {
    let window = i64::try_from(DEFAULT_CUTOVER_HOLD_MS).unwrap();
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let _hooked = mover_dies_inside_the_window(&e, kinds, |c| c.clock_domain("host-a")).await;
        let ahead = ManualClock::new(e.clock.now_ms() + 10 * window);
        let behind = ManualClock::new(e.clock.now_ms() - 10 * window);
        let (b, c) = (
            router_on(&e, &ahead, "host-b", false).await,
            router_on(&e, &behind, "host-c", false).await,
        );
        let held = async |r: &Router, what: &str| {
            assert_held(r, &format!("{kinds:?} {what}")).await;
        };
        held(&b, "ahead, first sight").await;
        held(&c, "behind, first sight").await;
        ahead.advance(window - 1);
        behind.advance(window - 1);
        held(&b, "ahead, short of the window").await;
        held(&c, "behind, short of the window").await;
        behind.advance(1);
        assert_eq!(
            c.update("k", "users", user("c", 2)).await.unwrap(),
            1,
            "{kinds:?}: host C saw the hold stand for its window"
        );
        assert_eq!(b.update("k", "users", user("b", 3)).await.unwrap(), 1);
        // Host A's recovery settles the move after its liveness.
        e.clock.advance(31_000);
        let fresh = router_on(&e, &e.clock, "host-a", false).await;
        let rep = fresh.recover_migrations().await.unwrap();
        assert!(
            rep.failed.is_empty() && rep.skipped.is_empty(),
            "{kinds:?}: {rep:?}"
        );
        assert_eq!(users_row(&fresh).await.get("name"), Some(&Value::from("b")));
        clean_verify(&fresh).await;
    }
}

/// A write-hold table created before holds named their mover gains the
/// columns at `init`; an old hold (no mover, no window) counts as a mover's
/// on another clock holding for the longest window.
#[tokio::test]
async fn an_old_hold_table_is_upgraded_and_its_holds_end() {
    let max = i64::try_from(MAX_CUTOVER_HOLD_MS).unwrap();
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let s0 = Arc::clone(e.shard("s0"));
        let old = match kinds[0] {
            Sqlite => {
                "CREATE TABLE durability_write_hold (mkey TEXT NOT NULL, op_id TEXT NOT NULL, \
                       scope TEXT NOT NULL, until_ms INTEGER NOT NULL, PRIMARY KEY (mkey, op_id)) WITHOUT ROWID"
            }
            Postgres => {
                "CREATE TABLE durability_write_hold (mkey TEXT NOT NULL, op_id TEXT NOT NULL, \
                         scope TEXT NOT NULL, until_ms BIGINT NOT NULL, PRIMARY KEY (mkey, op_id))"
            }
            MySql => {
                "CREATE TABLE durability_write_hold (mkey VARBINARY(512) NOT NULL, \
                      op_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
                      scope VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
                      until_ms BIGINT NOT NULL, PRIMARY KEY (mkey, op_id))"
            }
        };
        s0.execute(&Statement::new(old)).await.unwrap();
        let r = seed(&e).await;
        let p = |n| s0.dialect().placeholder(n);
        s0.execute(&Statement::with_params(
            format!(
                "INSERT INTO durability_write_hold (mkey, op_id, scope, until_ms) \
                 VALUES ({}, {}, {}, {})",
                p(1),
                p(2),
                p(3),
                p(4)
            ),
            vec![
                "k".into(),
                "old-op".into(),
                "default".into(),
                Value::Integer(0),
            ],
        ))
        .await
        .unwrap();
        let ctx = format!("{kinds:?}");
        assert_held(&r, &ctx).await;
        e.clock.advance(max - 1);
        assert_held(&r, &ctx).await;
        e.clock.advance(1);
        assert_eq!(
            r.update("k", "users", user("x", 1)).await.unwrap(),
            1,
            "{kinds:?}"
        );
    }
}

/// A crash (process kill) at every write of a move whose cutover misses and
/// takes the hold (the hold, the copy under it, the cutover that releases
/// it, the abort that releases it), in both modes: after the mover's
/// liveness a fresh router recovers, the key is readable with its latest
/// acknowledged value, writable, and verification is clean.
async fn crash_hot(kinds: [Kind; 2]) -> Option<u64> {
    let mut tried = 0;
    for mode in [FaultMode::Before, FaultMode::After] {
        for n in 1.. {
            let e = env(&kinds).await?;
            seed(&e).await;
            let (mover, hooked) = hooked_mover(&e, true, None, HotWriter::default()).await;
            e.plan.arm(n, mode);
            let res = mover.reassign_shard("k", "s1", "users").await;
            let tripped = e.plan.tripped();
            e.plan.disarm();
            drop(mover);
            if !tripped {
                res.unwrap();
                break;
            }
            tried += 1;
            let acked = hooked.hook.acked.load(Ordering::SeqCst);
            let ctx = format!("{kinds:?} n={n} {mode:?}");
            let fresh = e.router().await;
            assert_eq!(
                users_row(&fresh).await.get("name"),
                Some(&name_of(acked)),
                "{ctx}: readable at once"
            );
            e.clock.advance(31_000);
            let fresh = e.router().await;
            let rep = fresh.recover_migrations().await.unwrap();
            assert!(rep.failed.is_empty(), "{ctx}: {rep:?}");
            let live = e.live("users", "id", "k").await;
            assert_eq!(live.len(), 1, "{ctx}: {live:?}");
            assert_eq!(
                users_row(&fresh).await.get("name"),
                Some(&name_of(acked)),
                "{ctx}: the latest acknowledged write after recovery"
            );
            assert_eq!(
                fresh.update("k", "users", user("after", 1)).await.unwrap(),
                1,
                "{ctx}: writable after recovery"
            );
            clean_verify(&fresh).await;
        }
    }
    eprintln!("{kinds:?}: {tried} crash points of the hot-key move tried");
    Some(tried)
}

#[tokio::test]
async fn crash_at_every_write_of_a_held_cutover() {
    for kinds in [[Sqlite, Postgres], [Postgres, MySql], [MySql, Sqlite]] {
        let Some(tried) = crash_hot(kinds).await else {
            return;
        };
        // Both modes: the claim, copies, journal steps, the hold, the
        // cutovers, the publish and the release.
        assert!(tried >= 16, "{kinds:?}: {tried} crash points");
    }
}

/// The window is validated: above the maximum is `INVALID_CONFIG` and no
/// router is built.
#[tokio::test]
async fn a_bad_cutover_hold_is_a_typed_error() {
    let Some(e) = env(&[Sqlite, Sqlite]).await else {
        return;
    };
    let err = Router::new(
        e.config(false, 30_000)
            .cutover_hold_ms(MAX_CUTOVER_HOLD_MS + 1),
    )
    .unwrap_err();
    assert_eq!(err.code(), "INVALID_CONFIG");
    assert!(Router::new(e.config(false, 30_000).cutover_hold_ms(MAX_CUTOVER_HOLD_MS)).is_ok());
}

/// Issue 13 item 15: a router without an explicit journal shard (one
/// shard, the journal implied) does not report a write its fence refused
/// as a real zero-row result: the key moved away (a live tombstone there)
/// is `MIGRATION_CUTOVER_PENDING`, nothing written; a key with no row stays
/// `Ok(0)`.
#[tokio::test]
async fn a_fenced_write_without_an_explicit_journal_is_not_a_silent_zero() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let a = seed(&e).await;
        a.reassign_shard("k", "s1", "users").await.unwrap();
        let mapping = Arc::new(MemoryMappingStore::new());
        mapping.put("k", "s0").await.unwrap();
        mapping.put("absent", "s0").await.unwrap();
        let b = Router::new(
            MigrationConfig::new(mapping)
                .shard("s0", Arc::clone(e.shard("s0")))
                .table("users")
                .clock(Arc::new(e.clock.clone()))
                .clock_domain(e.clock_domain.clone()),
        )
        .unwrap();
        b.init().await.unwrap();
        assert_held(&b, &format!("{kinds:?}")).await;
        assert_eq!(
            b.update("absent", "users", user("x", 1)).await.unwrap(),
            0,
            "{kinds:?}: a real zero-row result"
        );
        assert_eq!(users_row(&a).await.get("name"), Some(&name_of(0)));
        let live = e.live("users", "id", "k").await;
        assert_eq!(live.len(), 1, "{kinds:?}: {live:?}");
        assert_eq!(live[0].0, "s1");
    }
}
