//! Regression tests of the review's smaller items (issue 13, item 15), on
//! SQLite, PostgreSQL and MariaDB shards. Without a server a test prints
//! that it skipped, unless `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::shards::{
    Env, Hook, Kind, SAME, Write, env, hooked, op_of, router_on, router_replacing, router_with_user,
};
use durability_migration::conformance::FaultMode;
use durability_migration::conformance::harness::user;
use durability_migration::{
    BackendError, BackendFuture, Clock, MOVE_LIVENESS_MS, ManualClock, MigrationError, MoveState,
    RECOVERY_LEASE_MS, Router, Shard, Statement, Value, VerifyOptions,
};

/// A text column's bytes (MariaDB keys are `VARBINARY`, read as bytes).
fn bytes(v: Option<&Value>) -> &[u8] {
    match v {
        Some(Value::Text(t)) => t.as_bytes(),
        Some(Value::Blob(b)) => b,
        other => panic!("not text: {other:?}"),
    }
}

fn is_copy(stmts: &[Statement]) -> bool {
    stmts
        .iter()
        .any(|s| s.sql.starts_with("INSERT INTO durability_retired"))
}

/// On the first copy batch to the destination, the recovery that runs it
/// stalls past its lease: meanwhile another router's recovery takes over,
/// finishes the move, and the application deletes the key (acknowledged).
/// Then the stalled batch runs.
struct StaleCopy {
    e: OnceLock<Arc<Env>>,
    other: OnceLock<Arc<Router>>,
    fired: AtomicBool,
    seen: Mutex<Vec<String>>,
}

impl Hook for StaleCopy {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        if !w.once(is_copy(w.stmts), &self.fired) {
            return Ok(());
        }
        let e = self.e.get().ok_or("no env")?;
        let b = self.other.get().ok_or("no router")?;
        // The stalled recovery's lease (60 s) and its claim on the
        // operation (30 s) both lapse.
        e.clock.advance(61_000);
        let rep = b.recover_migrations().await.map_err(|e| e.to_string())?;
        let deleted = b.delete("u1", "users").await.map_err(|e| e.to_string())?;
        self.seen
            .lock()
            .unwrap()
            .push(format!("committed {:?}, deleted {deleted}", rep.committed));
        Ok(())
    }
}

/// The seed's undetectable case: a stale destination insert (the copy of a
/// recovery that stalled past its lease) lands after the new lease holder
/// committed the move and an acknowledged delete removed the key. The key's
/// row is back on the destination, under the stale copy's in-flight marker;
/// verification reports the leftover markers but cannot tell the row was
/// deleted, so repair leaves it. The stalled recovery ends with
/// `RECOVERY_FENCED` (its next journal write is refused), which is the only
/// trace. This pins that behaviour; see `durability_migration::docs::verify`,
/// "The undetectable case".
#[tokio::test]
async fn stale_copy_after_commit_and_acknowledged_delete_is_reported_not_repaired() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let e = Arc::new(e);
        let r = router_with_user(&e, "u1", "s0", user("ann", 1)).await;
        // The move crashes before its copy (write 2): journaled `prepared`.
        e.interrupt_move("u1", "s1", "users", 2, FaultMode::Before)
            .await;
        let hook = StaleCopy {
            e: OnceLock::new(),
            other: OnceLock::new(),
            fired: AtomicBool::new(false),
            seen: Mutex::new(Vec::new()),
        };
        let hooked = hooked(&e, "s1", hook);
        let a = router_replacing(&e, "s1", hooked.clone()).await;
        let _ = hooked.hook.e.set(Arc::clone(&e));
        let _ = hooked.hook.other.set(Arc::new(e.router().await));
        let err = a.recover_migrations().await.unwrap_err();
        assert_eq!(err.code(), "RECOVERY_FENCED", "{kinds:?}: {err}");
        assert!(hooked.hook.fired.load(Ordering::SeqCst), "{kinds:?}");
        let seen = hooked.hook.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{kinds:?}: {seen:?}");
        assert!(seen[0].ends_with("deleted 1"), "{kinds:?}: {seen:?}");
        let op = op_of(&r, "u1", "users").await;
        assert_eq!(op.state, MoveState::Retired, "{kinds:?}: the move finished");
        // The deleted row is back, on the destination only.
        let live = e.live("users", "id", "u1").await;
        assert_eq!(live.len(), 1, "{kinds:?}: {live:?}");
        assert_eq!(live[0].0, "s1", "{kinds:?}");
        assert_eq!(
            live[0].1.get("name"),
            Some(&Value::from("ann")),
            "{kinds:?}"
        );
        let fresh = e.router().await;
        // Reads return the deleted row (the marker's own cutover tombstone
        // on the source leads to it); writes are held by the stale marker.
        let got = fresh.get("u1", "users").await.unwrap().unwrap();
        assert_eq!(got.get("name"), Some(&Value::from("ann")), "{kinds:?}");
        for res in [
            fresh.update("u1", "users", user("x", 2)).await,
            fresh.insert("u1", "users", user("x", 2)).await,
            fresh.delete("u1", "users").await,
        ] {
            assert_eq!(
                res.unwrap_err().code(),
                "MIGRATION_CUTOVER_PENDING",
                "{kinds:?}"
            );
        }
        // Verification reports the markers the stale batch left (one per
        // configured table), and repair leaves them and the row (nothing
        // tells a deleted row from a live one); recovery finds nothing.
        for repair in [false, true] {
            let rep = fresh
                .verify_migrations(VerifyOptions {
                    repair,
                    ..VerifyOptions::default()
                })
                .await
                .unwrap();
            assert!(!rep.clean, "{kinds:?}: {rep:?}");
            assert_eq!(rep.leftover_marker_count, 4, "{kinds:?}: {rep:?}");
            assert!(
                rep.leftover_markers
                    .iter()
                    .all(|l| l.shard == "s1" && l.key == "u1"),
                "{kinds:?}: {rep:?}"
            );
            assert_eq!(rep.repaired_count, 0, "{kinds:?}: {rep:?}");
        }
        assert_eq!(e.live("users", "id", "u1").await.len(), 1, "{kinds:?}");
        let rep = fresh.recover_migrations().await.unwrap();
        assert!(rep.examined.is_empty(), "{kinds:?}: {rep:?}");
        // The operator's way out (`durability_migration::docs::verify`): the
        // in-flight markers of finished operations name the key; the
        // application's record says it was deleted; delete the row and the
        // marker on that shard.
        let markers = fresh
            .raw_query(
                "s1",
                &Statement::new(
                    "SELECT mkey, op_id FROM durability_retired WHERE digest = 'in-flight'",
                ),
            )
            .await
            .unwrap();
        // One marker per configured table (a move fences every table).
        assert_eq!(markers.len(), 4, "{kinds:?}: {markers:?}");
        for m in &markers {
            assert_eq!(bytes(m.get("mkey")), b"u1", "{kinds:?}");
            assert_eq!(
                bytes(m.get("op_id")),
                op.op_id.as_bytes(),
                "{kinds:?}: the marker names the finished operation"
            );
        }
        let d = e.shard("s1").dialect();
        let id = durability_migration::Ident::new("id").unwrap();
        let users = durability_migration::Ident::new("users").unwrap();
        assert_eq!(
            fresh
                .raw_execute("s1", &d.delete_key(&users, &id, "u1"))
                .await
                .unwrap(),
            1
        );
        let mut clear = durability_migration::Sql::new(&d);
        clear
            .raw("DELETE FROM durability_retired WHERE mkey = ")
            .bind("u1")
            .raw(" AND op_id = ")
            .bind(op.op_id.as_str())
            .raw(" AND digest = 'in-flight'");
        assert_eq!(fresh.raw_execute("s1", &clear.finish()).await.unwrap(), 4);
        assert_eq!(fresh.get("u1", "users").await.unwrap(), None, "{kinds:?}");
        assert_eq!(
            fresh.insert("u1", "users", user("new", 3)).await.unwrap(),
            1,
            "{kinds:?}: writes land again"
        );
    }
}

/// Where the winning move runs inside the losing one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WinnerRuns {
    /// Right after the loser read the key's mapping (before its claim
    /// check and snapshot).
    AfterMappingRead,
    /// Right before the loser's claim insert (after its snapshot).
    BeforeClaim,
}

/// Runs the winner's whole move of `u1` to `target`, then an acknowledged
/// update of the moved row, once.
struct Winner {
    router: OnceLock<Arc<Router>>,
    target: &'static str,
    fired: AtomicBool,
    seen: Mutex<Option<String>>,
}

impl Winner {
    fn new(target: &'static str) -> Self {
        Self {
            router: OnceLock::new(),
            target,
            fired: AtomicBool::new(false),
            seen: Mutex::new(None),
        }
    }

    async fn run_once(&self) -> Result<(), BackendError> {
        if self.fired.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let w = self.router.get().ok_or("no winner")?;
        let out = w
            .reassign_shard("u1", self.target, "users")
            .await
            .map_err(|e| e.to_string())?;
        let n = w
            .update("u1", "users", user("after", 2))
            .await
            .map_err(|e| e.to_string())?;
        *self.seen.lock().unwrap() = Some(format!("{} moved, updated {n}", out.op_id));
        Ok(())
    }
}

/// A mapping store that runs the winner after it answers the loser's first
/// read of `u1`.
struct RaceMapping {
    inner: Arc<dyn durability_migration::MappingStore>,
    winner: Arc<Winner>,
    armed: AtomicBool,
}

impl durability_migration::MappingStore for RaceMapping {
    fn get<'a>(&'a self, key: &'a str) -> BackendFuture<'a, Option<String>> {
        Box::pin(async move {
            let got = self.inner.get(key).await?;
            if key == "u1" && self.armed.load(Ordering::SeqCst) {
                self.winner.run_once().await?;
            }
            Ok(got)
        })
    }
    fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()> {
        self.inner.put(key, shard)
    }
    crate::shards::mapping_passthrough!();
}

/// Runs the winner before the loser's claim insert on the journal shard.
struct BeforeClaim(Arc<Winner>);

impl Hook for BeforeClaim {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        if w.has("INSERT INTO durability_migration_ops") {
            self.0.run_once().await?;
        }
        Ok(())
    }
}

/// Two routers move `u1` from `from` to `to` at once (the journal is on
/// s0); the winner's whole move (and an acknowledged update of the moved
/// row) runs at `at` inside the loser's. The loser gets
/// `MIGRATION_ALREADY_ACTIVE` and changes nothing: the key keeps one live
/// row, on `to`, with the update.
async fn losing_move(kinds: [Kind; 2], at: WinnerRuns, (from, to): (&str, &'static str)) {
    let Some(e) = env(&kinds).await else { return };
    let r = router_with_user(&e, "u1", from, user("ann", 1)).await;
    let winner = Arc::new(Winner::new(to));
    let _ = winner.router.set(Arc::new(e.router().await));
    let mapping = Arc::new(RaceMapping {
        inner: Arc::clone(&e.mapping),
        winner: Arc::clone(&winner),
        armed: AtomicBool::new(false),
    });
    let s0: Arc<dyn Shard> = match at {
        WinnerRuns::AfterMappingRead => Arc::clone(e.shard("s0")),
        WinnerRuns::BeforeClaim => hooked(&e, "s0", BeforeClaim(Arc::clone(&winner))),
    };
    let cfg = durability_migration::MigrationConfig::new(mapping.clone())
        .journal_shard("s0")
        .mapping_cache_ttl_ms(0)
        .clock(Arc::new(e.clock.clone()))
        .clock_domain(e.clock_domain.clone())
        .table("users")
        .shard("s0", s0)
        .shard("s1", Arc::clone(e.shard("s1")));
    let loser = Router::new(cfg).unwrap();
    loser.init().await.unwrap();
    mapping
        .armed
        .store(at == WinnerRuns::AfterMappingRead, Ordering::SeqCst);
    let err = loser.reassign_shard("u1", to, "users").await.unwrap_err();
    let seen = winner.seen.lock().unwrap().clone();
    assert!(seen.is_some(), "{kinds:?} {at:?}: the winner ran");
    let live = e.live("users", "id", "u1").await;
    assert_eq!(live.len(), 1, "{kinds:?} {at:?}: {live:?} ({err})");
    assert_eq!(live[0].0, to, "{kinds:?} {at:?}");
    assert_eq!(
        live[0].1.get("name"),
        Some(&Value::from("after")),
        "{kinds:?} {at:?}: the acknowledged update stays ({err})"
    );
    assert_eq!(
        r.get("u1", "users").await.unwrap().unwrap().get("n"),
        Some(&Value::Integer(2)),
        "{kinds:?} {at:?}"
    );
    assert_eq!(
        err.code(),
        "MIGRATION_ALREADY_ACTIVE",
        "{kinds:?} {at:?}: {err} (winner: {seen:?})"
    );
    assert_eq!(
        r.update("u1", "users", user("later", 3)).await.unwrap(),
        1,
        "{kinds:?} {at:?}: writes land"
    );
    crate::shards::clean_verify(&r).await;
}

/// A move that loses to a concurrent move of the key, which finished after
/// the loser read the key's mapping, gets the conflict code, not
/// `MIGRATION_ROW_NOT_FOUND` (the loser's snapshot finds the row gone from
/// the source).
#[tokio::test]
async fn a_move_losing_after_its_mapping_read_gets_the_conflict_code() {
    for kinds in SAME {
        losing_move(kinds, WinnerRuns::AfterMappingRead, ("s0", "s1")).await;
    }
}

/// A move whose snapshot was taken before a concurrent move of the key
/// finished gets the conflict code once its claim lands, and writes
/// nothing to the destination (where the winner's row lives): from the
/// journal's shard (the claim's statement checks for the winner's
/// tombstone) and from another shard (a check right after the claim).
#[tokio::test]
async fn a_move_losing_before_its_claim_gets_the_conflict_code() {
    for kinds in SAME {
        for route in [("s0", "s1"), ("s1", "s0")] {
            losing_move(kinds, WinnerRuns::BeforeClaim, route).await;
        }
    }
}

/// Host A's router starts a move of `u1` to s1 whose copy fails (write 2,
/// before it runs): the operation stays `prepared`, owned by host A.
async fn interrupted_on_host_a(e: &Env) -> (Router, String) {
    let r = router_with_user(e, "u1", "s0", user("ann", 1)).await;
    let mover = router_on(e, &e.clock, "host-a", true).await;
    e.plan.arm(2, FaultMode::Before);
    assert!(mover.reassign_shard("u1", "s1", "users").await.is_err());
    e.plan.disarm();
    let op = op_of(&r, "u1", "users").await;
    assert_eq!(op.state, MoveState::Prepared);
    assert_eq!(op.owner, mover.instance_id());
    (mover, op.op_id)
}

/// A recovery on a host whose clock is ahead of the mover's by more than
/// the liveness period does not take the live move for dead: it skips it,
/// and the mover, calling again, finishes its own move.
#[tokio::test]
async fn a_recovery_on_a_clock_ahead_leaves_a_live_move_alone() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let (mover, op_id) = interrupted_on_host_a(&e).await;
        let ahead = ManualClock::new(e.clock.now_ms() + 2 * MOVE_LIVENESS_MS as i64);
        let judge = router_on(&e, &ahead, "host-b", false).await;
        let rep = judge.recover_migrations().await.unwrap();
        assert_eq!(rep.skipped, vec![op_id.clone()], "{kinds:?}: {rep:?}");
        assert!(
            rep.committed.is_empty() && rep.aborted.is_empty(),
            "{kinds:?}"
        );
        let out = mover.reassign_shard("u1", "s1", "users").await.unwrap();
        assert_eq!(
            out.op_id, op_id,
            "{kinds:?}: the mover resumed its own move"
        );
        let rep = judge.recover_migrations().await.unwrap();
        assert!(rep.examined.is_empty(), "{kinds:?}: {rep:?}");
        let live = e.live("users", "id", "u1").await;
        assert_eq!(live.len(), 1, "{kinds:?}: {live:?}");
        assert_eq!(live[0].0, "s1", "{kinds:?}");
        crate::shards::clean_verify(&judge).await;
    }
}

/// A move whose owner is on another clock is settled once the recovering
/// router saw its journal row unchanged for the liveness period of its own
/// clock; a step of the owner in between starts the period again.
#[tokio::test]
async fn a_move_owned_on_another_clock_is_settled_after_its_row_stood_still() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let (mover, op_id) = interrupted_on_host_a(&e).await;
        // Host B's clock is far behind host A's: its own deadline reading
        // would never lapse.
        let behind = ManualClock::new(e.clock.now_ms() - 10 * MOVE_LIVENESS_MS as i64);
        let judge = router_on(&e, &behind, "host-b", false).await;
        let liveness = MOVE_LIVENESS_MS as i64;
        assert_eq!(
            judge.recover_migrations().await.unwrap().skipped,
            vec![op_id.clone()],
            "{kinds:?}: first sight"
        );
        behind.advance(liveness - 1);
        assert_eq!(
            judge.recover_migrations().await.unwrap().skipped,
            vec![op_id.clone()],
            "{kinds:?}: not yet a full period"
        );
        // The owner steps (its retry's claim insert finds its own claim
        // held and inserts nothing, it journals a fresh snapshot, then its
        // copy fails again).
        e.clock.advance(1_000);
        e.plan.arm(3, FaultMode::Before);
        assert!(mover.reassign_shard("u1", "s1", "users").await.is_err());
        e.plan.disarm();
        behind.advance(1);
        assert_eq!(
            judge.recover_migrations().await.unwrap().skipped,
            vec![op_id.clone()],
            "{kinds:?}: the row changed, the period starts again"
        );
        behind.advance(liveness);
        let rep = judge.recover_migrations().await.unwrap();
        assert_eq!(rep.committed, vec![op_id.clone()], "{kinds:?}: {rep:?}");
        let live = e.live("users", "id", "u1").await;
        assert_eq!(live.len(), 1, "{kinds:?}: {live:?}");
        assert_eq!(live[0].0, "s1", "{kinds:?}");
        crate::shards::clean_verify(&judge).await;
    }
}

/// Host A's recovery dies holding the scope's recovery lease: its lease
/// write applies, then the process is gone (nothing releases it).
async fn lease_left_on_host_a(e: &Env) {
    let a = router_on(e, &e.clock, "host-a", true).await;
    e.plan.arm(1, FaultMode::After);
    assert!(a.recover_migrations().await.is_err());
    assert!(e.plan.tripped());
    e.plan.disarm();
}

fn in_progress(r: Result<durability_migration::RecoveryReport, MigrationError>) -> bool {
    matches!(r, Err(e) if e.code() == "RECOVERY_IN_PROGRESS")
}

/// The recovery lease's deadline is compared only on its holder's clock. A
/// recovery on a host whose clock runs far ahead does not take a live lease
/// over (before, it took it at once and fenced the live holder): it takes it
/// once it saw the lease unchanged for the lease's period of its own clock,
/// and a change of the lease (the holder's host took it over itself)
/// starts that period again. A host whose clock runs far behind does not
/// wait out the skew (before, it waited ten periods), and a released lease
/// is free at once on any clock.
#[tokio::test]
async fn a_recovery_lease_is_judged_on_its_holders_clock_only() {
    let period = RECOVERY_LEASE_MS as i64;
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        lease_left_on_host_a(&e).await;
        let ahead = ManualClock::new(e.clock.now_ms() + 10 * period);
        let b = router_on(&e, &ahead, "host-b", false).await;
        assert!(
            in_progress(b.recover_migrations().await),
            "{kinds:?}: first sight"
        );
        ahead.advance(period - 1);
        assert!(
            in_progress(b.recover_migrations().await),
            "{kinds:?}: short of a period"
        );
        // Host A's next recovery takes its own lapsed lease over and dies
        // again: the lease changed, so host B's period starts again.
        e.clock.advance(period);
        lease_left_on_host_a(&e).await;
        ahead.advance(1);
        assert!(
            in_progress(b.recover_migrations().await),
            "{kinds:?}: the lease changed"
        );
        ahead.advance(period - 1);
        assert!(in_progress(b.recover_migrations().await), "{kinds:?}");
        ahead.advance(1);
        let rep = b.recover_migrations().await.unwrap();
        assert_eq!(
            rep.generation, 3,
            "{kinds:?}: taken over after a full period"
        );

        // Host C, far behind, takes a dead holder's lease after one period
        // of its own clock.
        lease_left_on_host_a(&e).await;
        let behind = ManualClock::new(e.clock.now_ms() - 10 * period);
        let c = router_on(&e, &behind, "host-c", false).await;
        assert!(
            in_progress(c.recover_migrations().await),
            "{kinds:?}: first sight"
        );
        behind.advance(period - 1);
        assert!(in_progress(c.recover_migrations().await), "{kinds:?}");
        behind.advance(1);
        let rep = c.recover_migrations().await.unwrap();
        assert_eq!(rep.generation, 5, "{kinds:?}");
        // C released it: free at once for host B's clock.
        let rep = b.recover_migrations().await.unwrap();
        assert_eq!(rep.generation, 6, "{kinds:?}: a released lease is free");
    }
}

/// Starts the winner's move, crashing it after its claim (write 2, its
/// copy, fails before it runs), before the loser's claim insert.
struct ClaimTaken {
    e: OnceLock<Arc<Env>>,
    fired: AtomicBool,
}

impl Hook for ClaimTaken {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        if !w.once(w.has("INSERT INTO durability_migration_ops"), &self.fired) {
            return Ok(());
        }
        let e = self.e.get().ok_or("no env")?;
        let w = e.router_with(true, 30_000).await;
        e.plan.arm(2, FaultMode::Before);
        let res = w.reassign_shard("u1", "s1", "users").await;
        e.plan.disarm();
        if res.is_ok() {
            return Err("the winner's move was to stop after its claim".into());
        }
        Ok(())
    }
}

/// A move whose claim insert comes after a concurrent move of the key
/// claimed it gets the conflict code; the
/// winner's operation keeps the claim and the row stays on the source.
#[tokio::test]
async fn a_move_losing_the_claim_itself_gets_the_conflict_code() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let e = Arc::new(e);
        let r = router_with_user(&e, "u1", "s0", user("ann", 1)).await;
        let hook = ClaimTaken {
            e: OnceLock::new(),
            fired: AtomicBool::new(false),
        };
        let hooked = hooked(&e, "s0", hook);
        let loser = router_replacing(&e, "s0", hooked.clone()).await;
        let _ = hooked.hook.e.set(Arc::clone(&e));
        let err = loser.reassign_shard("u1", "s1", "users").await.unwrap_err();
        assert!(hooked.hook.fired.load(Ordering::SeqCst), "{kinds:?}");
        assert_eq!(err.code(), "MIGRATION_ALREADY_ACTIVE", "{kinds:?}: {err}");
        let op = op_of(&r, "u1", "users").await;
        assert_eq!(op.state, MoveState::Prepared, "{kinds:?}: the winner's");
        assert_ne!(op.owner, loser.instance_id(), "{kinds:?}");
        let live = e.live("users", "id", "u1").await;
        assert_eq!(live.len(), 1, "{kinds:?}: {live:?}");
        assert_eq!(live[0].0, "s0", "{kinds:?}");
    }
}

/// Issue 32 item 11: routers built fresh for every call (a cron job, the
/// one-shot CLI), each on another clock domain than the crashed recovery
/// and the dead mover, take the lease over at a higher generation and then
/// settle the move, once the sightings they persisted in the journal are a
/// period old on the journal database's clock (PostgreSQL
/// `clock_timestamp()`, MariaDB `NOW(6)`, SQLite the machine's clock). The
/// test ages the sightings instead of waiting. Before, every fresh router
/// got `RECOVERY_IN_PROGRESS` forever; their own clocks (here frozen, one
/// far ahead) never matter.
#[tokio::test]
async fn fresh_routers_take_a_crashed_recovery_over_on_the_journals_clock() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let (_mover, op_id) = interrupted_on_host_a(&e).await;
        lease_left_on_host_a(&e).await;
        let fresh = |offset: i64| {
            let clock = ManualClock::new(e.clock.now_ms() + offset);
            let e = &e;
            async move { router_on(e, &clock, "cron", false).await }
        };
        for offset in [0, 600_000, -600_000, 0, 0] {
            assert!(
                in_progress(fresh(offset).await.recover_migrations().await),
                "{kinds:?}: a fresh router at {offset} ms"
            );
        }
        let age = |ms: i64| {
            Statement::new(format!(
                "UPDATE durability_migration_sightings SET since_ms = since_ms - {ms}"
            ))
        };
        let journal = e.shard("s0");
        // Short of a period on the journal's clock: still in progress.
        assert_eq!(
            journal
                .execute(&age(RECOVERY_LEASE_MS as i64 - 10_000))
                .await
                .unwrap(),
            1
        );
        assert!(in_progress(fresh(0).await.recover_migrations().await));
        journal.execute(&age(10_000)).await.unwrap();
        let rep = fresh(0).await.recover_migrations().await.unwrap();
        assert_eq!(rep.generation, 2, "{kinds:?}: taken over");
        assert_eq!(rep.skipped, vec![op_id.clone()], "{kinds:?}: first sight");
        assert_eq!(
            journal
                .execute(&age(MOVE_LIVENESS_MS as i64))
                .await
                .unwrap(),
            2,
            "{kinds:?}: the lease's and the move's sightings"
        );
        let rep = fresh(0).await.recover_migrations().await.unwrap();
        assert_eq!(rep.generation, 3, "{kinds:?}");
        assert_eq!(rep.committed, vec![op_id.clone()], "{kinds:?}: {rep:?}");
        let live = e.live("users", "id", "u1").await;
        assert_eq!(live.len(), 1, "{kinds:?}: {live:?}");
        assert_eq!(live[0].0, "s1", "{kinds:?}");
        // The finished operation's sighting is gone with it.
        let left = journal
            .query(&Statement::new(
                "SELECT kind FROM durability_migration_sightings",
            ))
            .await
            .unwrap();
        assert_eq!(left.len(), 1, "{kinds:?}: only the lease's: {left:?}");
        crate::shards::clean_verify(&fresh(0).await).await;
    }
}
