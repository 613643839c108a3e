//! Seed 004 branches that worked without a test (issue 32 item 17), on
//! SQLite, PostgreSQL and MariaDB shards: the source row deleted during a
//! live move and before a recovery (from `prepared` and from
//! `cutover_pending`), a stale cutover reported `restorable: false` and
//! left as it is, and a custom retention period. Without a server a test
//! prints that it skipped, unless `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use crate::shards::{
    Env, Hook, SAME, Write, clean_verify, env, hooked, op_of, router_replacing, router_with_user,
};
use durability_migration::conformance::FaultMode;
use durability_migration::conformance::harness::{repair, user};
use durability_migration::{
    BackendError, MoveOptions, MoveState, Retire, Router, Statement, Value, VerifyOptions,
};

/// `u1` with one row on `shard`, mapped there.
async fn key_on(e: &Env, shard: &str) -> Router {
    router_with_user(e, "u1", shard, user("ann", 1)).await
}

/// Runs `sql` on `shard` directly (bypassing every fence).
async fn raw(e: &Env, shard: &str, sql: &str) -> u64 {
    e.shard(shard).execute(&Statement::new(sql)).await.unwrap()
}

/// Just before the source's cutover batch, the application deletes the
/// key with a routed delete (acknowledged).
struct DeleteBeforeCutover {
    e: OnceLock<Arc<Env>>,
    deleted: Mutex<Option<u64>>,
}

impl Hook for DeleteBeforeCutover {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        if !w.is_cutover() || self.deleted.lock().unwrap().is_some() {
            return Ok(());
        }
        let e = self.e.get().ok_or("no env")?;
        let n = e
            .router()
            .await
            .delete("u1", "users")
            .await
            .map_err(|e| e.to_string())?;
        *self.deleted.lock().unwrap() = Some(n);
        Ok(())
    }
}

/// A live move whose source row is deleted (an acknowledged routed delete)
/// between its snapshot and its cutover: the cutover matches nothing, the
/// move ends `aborted` without moving anything, its copy is dropped, and
/// the key stays deleted everywhere.
#[tokio::test]
async fn a_live_move_whose_source_row_is_deleted_aborts_and_the_delete_holds() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let e = Arc::new(e);
        let r = key_on(&e, "s1").await;
        let hook = DeleteBeforeCutover {
            e: OnceLock::new(),
            deleted: Mutex::new(None),
        };
        let hooked = hooked(&e, "s1", hook);
        let _ = hooked.hook.e.set(Arc::clone(&e));
        let mover = router_replacing(&e, "s1", hooked.clone()).await;
        let err = mover.reassign_shard("u1", "s0", "users").await.unwrap_err();
        assert_eq!(
            *hooked.hook.deleted.lock().unwrap(),
            Some(1),
            "{kinds:?}: the delete was acknowledged"
        );
        assert!(
            ["MIGRATION_ABORTED", "MIGRATION_ROW_NOT_FOUND"].contains(&err.code()),
            "{kinds:?}: {err}"
        );
        let op = op_of(&r, "u1", "users").await;
        assert_eq!(op.state, MoveState::Aborted, "{kinds:?}");
        assert!(e.live("users", "id", "u1").await.is_empty(), "{kinds:?}");
        let fresh = e.router().await;
        assert_eq!(fresh.get("u1", "users").await.unwrap(), None, "{kinds:?}");
        clean_verify(&fresh).await;
    }
}

/// A move interrupted at `prepared` (its copy never ran) whose source row
/// is deleted before recovery: recovery's fresh snapshot is empty, so it
/// aborts; nothing is left on either shard.
#[tokio::test]
async fn recovery_aborts_a_prepared_move_whose_source_row_is_gone() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let r = key_on(&e, "s0").await;
        e.interrupt_move("u1", "s1", "users", 2, FaultMode::Before)
            .await;
        let op = op_of(&r, "u1", "users").await;
        assert_eq!(op.state, MoveState::Prepared, "{kinds:?}");
        assert_eq!(raw(&e, "s0", "DELETE FROM users WHERE id = 'u1'").await, 1);
        let rep = e.router().await.recover_migrations().await.unwrap();
        assert_eq!(rep.aborted, vec![op.op_id.clone()], "{kinds:?}: {rep:?}");
        assert!(rep.failed.is_empty(), "{kinds:?}: {rep:?}");
        let after = op_of(&r, "u1", "users").await;
        assert_eq!(after.state, MoveState::Aborted, "{kinds:?}");
        assert!(e.live("users", "id", "u1").await.is_empty(), "{kinds:?}");
        clean_verify(&e.router().await).await;
    }
}

/// A move interrupted at `cutover_pending` (its copy landed, the source's
/// cutover batch never ran) whose source row is deleted before recovery:
/// the cutover check finds the row gone and no archive of the operation,
/// so the move aborts and drops its destination copy.
#[tokio::test]
async fn recovery_aborts_a_cutover_pending_move_whose_source_row_is_gone() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        // The source is not the journal's shard, so `cutover_pending` is
        // journaled before the source's batch (write 4).
        let r = key_on(&e, "s1").await;
        e.interrupt_move("u1", "s0", "users", 4, FaultMode::Before)
            .await;
        let op = op_of(&r, "u1", "users").await;
        assert_eq!(op.state, MoveState::CutoverPending, "{kinds:?}");
        assert_eq!(raw(&e, "s1", "DELETE FROM users WHERE id = 'u1'").await, 1);
        let live = e.live("users", "id", "u1").await;
        assert_eq!(live.len(), 1, "{kinds:?}: the copy: {live:?}");
        assert_eq!(live[0].0, "s0", "{kinds:?}");
        let rep = e.router().await.recover_migrations().await.unwrap();
        assert_eq!(rep.aborted, vec![op.op_id.clone()], "{kinds:?}: {rep:?}");
        let after = op_of(&r, "u1", "users").await;
        assert_eq!(after.state, MoveState::Aborted, "{kinds:?}");
        assert!(
            e.live("users", "id", "u1").await.is_empty(),
            "{kinds:?}: the copy was dropped"
        );
        clean_verify(&e.router().await).await;
    }
}

/// Just before the mover's cutover batch on the source, a write changes
/// the row and another router's recovery (the mover looks dead) aborts the
/// move for it; then the row is written back to the snapshot's value, so
/// the stale batch's "unchanged" predicate holds and it archives and
/// deletes the row after the abort: a stale cutover.
struct StaleCutover {
    e: OnceLock<Arc<Env>>,
    fired: AtomicBool,
    aborted: Mutex<Vec<String>>,
}

impl Hook for StaleCutover {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        if !w.once(w.is_cutover(), &self.fired) {
            return Ok(());
        }
        let e = self.e.get().ok_or("no env")?;
        let set = |name: &str| {
            Statement::new(format!("UPDATE users SET name = '{name}' WHERE id = 'u1'"))
        };
        w.inner.execute(&set("bob")).await?;
        e.clock.advance(31_000);
        let rep = e
            .router()
            .await
            .recover_migrations()
            .await
            .map_err(|e| e.to_string())?;
        self.aborted.lock().unwrap().extend(rep.aborted);
        w.inner.execute(&set("ann")).await?;
        Ok(())
    }
}

/// A stale cutover (a tombstone with the archived row whose operation the
/// journal ended `aborted`) is reported `restorable: true` while the
/// operation is the key's newest, the archive holds the row and the shard
/// has none; once a row of the key is on that shard it is reported
/// `restorable: false`, and repair leaves it (row and tombstone) as it is.
#[tokio::test]
async fn a_stale_cutover_with_a_live_row_is_not_restorable_and_repair_leaves_it() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let e = Arc::new(e);
        key_on(&e, "s1").await;
        let hook = StaleCutover {
            e: OnceLock::new(),
            fired: AtomicBool::new(false),
            aborted: Mutex::new(Vec::new()),
        };
        let hooked = hooked(&e, "s1", hook);
        let _ = hooked.hook.e.set(Arc::clone(&e));
        let mover = router_replacing(&e, "s1", hooked.clone()).await;
        assert!(mover.reassign_shard("u1", "s0", "users").await.is_err());
        assert_eq!(hooked.hook.aborted.lock().unwrap().len(), 1, "{kinds:?}");
        assert!(
            e.live("users", "id", "u1").await.is_empty(),
            "{kinds:?}: the stale cutover archived the row"
        );
        let r = e.router().await;
        let users = |rep: &durability_migration::VerifyReport| {
            rep.stale_cutovers
                .iter()
                .filter(|s| s.leftover.table == "users")
                .map(|s| (s.leftover.shard.clone(), s.restorable))
                .collect::<Vec<_>>()
        };
        let rep = r.verify_migrations(VerifyOptions::default()).await.unwrap();
        assert_eq!(users(&rep), [("s1".to_owned(), true)], "{kinds:?}: {rep:?}");
        // A row of the key lands on the shard (raw: the tombstone fences
        // routed writes there).
        raw(
            &e,
            "s1",
            "INSERT INTO users (id, name, n) VALUES ('u1', 'cy', 3)",
        )
        .await;
        let rep = r.verify_migrations(VerifyOptions::default()).await.unwrap();
        assert_eq!(
            users(&rep),
            [("s1".to_owned(), false)],
            "{kinds:?}: {rep:?}"
        );
        assert!(!rep.clean, "{kinds:?}");
        let rep = repair(&r).await.unwrap();
        assert_eq!(
            users(&rep),
            [("s1".to_owned(), false)],
            "{kinds:?}: {rep:?}"
        );
        assert!(
            !rep.repaired.iter().any(|x| x.contains("users")),
            "{kinds:?}: nothing restored: {rep:?}"
        );
        let live = e.live("users", "id", "u1").await;
        assert_eq!(live.len(), 1, "{kinds:?}: {live:?}");
        assert_eq!(live[0].1.get("name"), Some(&Value::from("cy")), "{kinds:?}");
    }
}

/// `retire: After(ms)` sets the retention: purge refuses the move with
/// `RETENTION_NOT_ELAPSED` until `ms` of the clock passed since it
/// finished (after a pass examined it), then clears its archive.
#[tokio::test]
async fn a_custom_retention_period_holds_the_archive_exactly_that_long() {
    const RETAIN_MS: u64 = 90_000;
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let r = key_on(&e, "s0").await;
        let op_id = r
            .reassign_shard_with(
                "u1",
                "s1",
                "users",
                MoveOptions {
                    retire: Retire::After(RETAIN_MS),
                },
            )
            .await
            .unwrap()
            .op_id;
        let rep = r.verify_migrations(VerifyOptions::default()).await.unwrap();
        assert!(rep.clean, "{kinds:?}: {rep:?}");
        e.clock.advance(RETAIN_MS as i64 - 1);
        let rep = r.purge_retired().await.unwrap();
        assert!(rep.purged.is_empty(), "{kinds:?}: {rep:?}");
        let codes: Vec<(&str, &str)> = rep
            .refused
            .iter()
            .map(|x| (x.op_id.as_str(), x.error.code()))
            .collect();
        assert_eq!(
            codes,
            [(op_id.as_str(), "RETENTION_NOT_ELAPSED")],
            "{kinds:?}"
        );
        e.clock.advance(1);
        let rep = r.purge_retired().await.unwrap();
        assert_eq!(rep.purged, vec![op_id.clone()], "{kinds:?}: {rep:?}");
        assert!(rep.refused.is_empty(), "{kinds:?}: {rep:?}");
        assert_eq!(
            r.get("u1", "users").await.unwrap().unwrap().get("name"),
            Some(&Value::from("ann")),
            "{kinds:?}"
        );
    }
}
