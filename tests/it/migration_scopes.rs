//! Two journal scopes sharing one set of databases (issue 32 item 15), on
//! SQLite, PostgreSQL and MariaDB shards: set `a` keys `users`, set `b`
//! keys `orgs`, each with its own mapping store and journal scope on the
//! same journal shard. A write hold is per key, not per table, so it must
//! fence only its own scope's writes; journals, recovery leases,
//! recovery and verification stay apart. Without a server a test prints
//! that it skipped, unless `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use crate::shards::{Env, SAME, env, op_of};
use durability_migration::conformance::FaultMode;
use durability_migration::{
    Clock as _, MappingStore, MemoryMappingStore, MigrationConfig, MoveState, Router, Row,
    Statement, Value, VerifyOptions, row,
};

/// Set `a`: the harness's mapping store, scope `a`, table `users`.
fn config_a(e: &Env) -> MigrationConfig {
    scoped(e, MigrationConfig::new(Arc::clone(&e.mapping)), "a").table("users")
}

/// Set `b`: its own mapping store, scope `b`, table `orgs`.
fn config_b(e: &Env, mapping: &Arc<MemoryMappingStore>) -> MigrationConfig {
    scoped(e, MigrationConfig::new(mapping.clone()), "b").table_with_key_column("orgs", "org_id")
}

fn scoped(e: &Env, c: MigrationConfig, scope: &str) -> MigrationConfig {
    c.shard("s0", Arc::clone(e.shard("s0")))
        .shard("s1", Arc::clone(e.shard("s1")))
        .journal_shard("s0")
        .journal_scope(scope)
        .clock(Arc::new(e.clock.clone()))
        .clock_domain("scopes")
}

/// Router `a` (scope `a`, `users`, on the environment's mapping) and
/// router `b` (scope `b`, `orgs`, on a mapping store of its own), both
/// opened on `e`, with key `a_key` mapped to `s0` and a `users` row
/// inserted by `a`, and key `b_key` mapped to `s0` and an `orgs` row
/// inserted by `b`.
async fn open_a_and_b(e: &Env, a_key: &str, b_key: &str) -> (Router, Router) {
    let a = open(config_a(e)).await;
    let b_mapping = Arc::new(MemoryMappingStore::new());
    let b = open(config_b(e, &b_mapping)).await;
    e.mapping.put(a_key, "s0").await.unwrap();
    b_mapping.put(b_key, "s0").await.unwrap();
    a.insert(a_key, "users", user(1)).await.unwrap();
    b.insert(b_key, "orgs", org("acme")).await.unwrap();
    (a, b)
}

async fn open(c: MigrationConfig) -> Router {
    let r = Router::new(c).unwrap();
    r.init().await.unwrap();
    r
}

fn user(n: i64) -> Row {
    row([("name", Value::from("u")), ("n", Value::from(n))])
}

fn org(title: &str) -> Row {
    row([("title", Value::from(title))])
}

/// Before, a write hold of set `a`'s mover on key `k` failed every routed
/// write of `k` on that shard with `MIGRATION_CUTOVER_PENDING`, set `b`'s
/// too, in a table `a` does not even know: holds were looked up by key
/// alone. Now a hold fences its own scope only.
#[tokio::test]
async fn a_write_hold_fences_only_its_own_journal_scope() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let (a, b) = open_a_and_b(&e, "k", "k").await;
        // Set `a`'s mover holds `k` on s0 (its cutover missed), far into
        // the future of its own clock.
        let s0 = e.shard("s0");
        let p = |n| s0.dialect().placeholder(n);
        let hold = Statement::with_params(
            format!(
                "INSERT INTO durability_write_hold (mkey, op_id, scope, until_ms, owner, hold_ms) \
                 VALUES ({}, {}, {}, {}, {}, {})",
                p(1),
                p(2),
                p(3),
                p(4),
                p(5),
                p(6)
            ),
            vec![
                "k".into(),
                "op-of-a".into(),
                "a".into(),
                Value::Integer(e.clock.now_ms() + 5_000),
                a.instance_id().into(),
                Value::Integer(5_000),
            ],
        );
        s0.execute(&hold).await.unwrap();
        let err = a.update("k", "users", user(2)).await.unwrap_err();
        assert_eq!(err.code(), "MIGRATION_CUTOVER_PENDING", "{kinds:?}: {err}");
        assert_eq!(
            b.update("k", "orgs", org("acme-2")).await.unwrap(),
            1,
            "{kinds:?}: another scope's hold does not fence b"
        );
        assert_eq!(b.delete("k", "orgs").await.unwrap(), 1, "{kinds:?}");
        assert_eq!(b.insert("k", "orgs", org("acme-3")).await.unwrap(), 1);
        // Its own mover's hold still ends for `a` at its deadline.
        e.clock.advance(5_000);
        assert_eq!(
            a.update("k", "users", user(3)).await.unwrap(),
            1,
            "{kinds:?}"
        );
    }
}

/// Two scopes on one journal shard keep their journals, recovery leases,
/// recoveries and verification passes apart: `b` neither waits on `a`'s
/// crashed recovery nor touches `a`'s interrupted move; `a` finishes it;
/// a full verification of either scope reads only its own tombstones.
#[tokio::test]
async fn journal_scopes_keep_moves_leases_recovery_and_verification_apart() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let (a, b) = open_a_and_b(&e, "u1", "o1").await;
        // `b` moves its key; `a`'s move is interrupted after `prepared`,
        // and `a`'s next recovery dies holding `a`'s lease.
        b.reassign_shard("o1", "s1", "orgs").await.unwrap();
        let faulty_a = open(
            config_a(&e)
                .shard(
                    "s0",
                    Arc::new(durability_migration::conformance::FaultShard::new(
                        Arc::clone(e.shard("s0")),
                        e.plan.clone(),
                    )),
                )
                .shard(
                    "s1",
                    Arc::new(durability_migration::conformance::FaultShard::new(
                        Arc::clone(e.shard("s1")),
                        e.plan.clone(),
                    )),
                ),
        )
        .await;
        e.plan.arm(2, FaultMode::Before);
        assert!(faulty_a.reassign_shard("u1", "s1", "users").await.is_err());
        e.plan.arm(1, FaultMode::After);
        assert!(faulty_a.recover_migrations().await.is_err());
        e.plan.disarm();
        let op = op_of(&a, "u1", "users").await;
        assert_eq!(op.state, MoveState::Prepared, "{kinds:?}");
        assert_eq!(op.scope, "a", "{kinds:?}");
        // `b`'s recovery is not held by `a`'s lease and sees no operation.
        let rep = b.recover_migrations().await.unwrap();
        assert!(rep.examined.is_empty(), "{kinds:?}: {rep:?}");
        assert_eq!(rep.generation, 1, "{kinds:?}: b's own lease");
        let err = a.recover_migrations().await.unwrap_err();
        assert_eq!(err.code(), "RECOVERY_IN_PROGRESS", "{kinds:?}: {err}");
        assert_eq!(
            b.get_migration_status("u1", "users").await.unwrap(),
            None,
            "{kinds:?}: a's operation is not in b's journal"
        );
        // After a's lease and its mover's liveness lapse, a recovers.
        e.clock.advance(61_000);
        let rep = a.recover_migrations().await.unwrap();
        assert_eq!(rep.committed, vec![op.op_id.clone()], "{kinds:?}: {rep:?}");
        let full = VerifyOptions {
            full: true,
            ..VerifyOptions::default()
        };
        for r in [&a, &b] {
            let rep = r.verify_migrations(full).await.unwrap();
            assert!(rep.clean, "{kinds:?}: {rep:?}");
        }
        assert_eq!(
            a.get("u1", "users").await.unwrap().unwrap().get("n"),
            Some(&Value::from(1)),
            "{kinds:?}"
        );
        assert_eq!(
            b.get("o1", "orgs").await.unwrap().unwrap().get("title"),
            Some(&Value::from("acme")),
            "{kinds:?}"
        );
    }
}
