//! Verification cost and retired history (issue 13, item 14), on SQLite,
//! PostgreSQL and MariaDB shards: a pass examines the moves no pass has
//! examined yet (and the keys the last pass found something on), a full
//! pass everything; purge needs a pass that read the move after it
//! finished; purge compacts a key's history to what still fences or says
//! where the key lives.

use std::sync::{Arc, Mutex};

use crate::shards::{Env, Kind, clean_verify, env, op_of, router_with_user};
use durability_migration::conformance::FaultMode;
use durability_migration::conformance::harness::{purge_expect, user};
use durability_migration::{MoveOptions, Retire, Router, Statement, Value, VerifyOptions, row};

use Kind::{MySql, Postgres, Sqlite};

const SAME: [[Kind; 2]; 3] = [[Sqlite, Sqlite], [Postgres, Postgres], [MySql, MySql]];

const NOW: MoveOptions = MoveOptions {
    retire: Retire::Immediate,
};

/// A pass and the most finished operations it reported examining.
async fn pass(r: &Router, full: bool, repair: bool) -> (durability_migration::VerifyReport, u64) {
    let moves = Arc::new(Mutex::new(0u64));
    let seen = Arc::clone(&moves);
    let progress = move |p: durability_migration::Progress| {
        if p.phase == "moves" {
            let mut m = seen.lock().unwrap();
            *m = (*m).max(p.done);
        }
    };
    let rep = r
        .verify_migrations_observed(
            VerifyOptions {
                full,
                repair,
                ..VerifyOptions::default()
            },
            &progress,
        )
        .await
        .unwrap();
    let n = *moves.lock().unwrap();
    (rep, n)
}

async fn count(e: &Env, shard: &str, sql: &str) -> usize {
    e.shard(shard)
        .query(&Statement::new(sql))
        .await
        .unwrap()
        .len()
}

/// Moves `key` (mapped on `from`) to the other shard of two.
fn other(shard: &str) -> &'static str {
    if shard == "s0" { "s1" } else { "s0" }
}

#[tokio::test]
async fn a_pass_examines_only_the_moves_since_the_last_pass() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let r = e.router().await;
        for i in 0..20 {
            let k = format!("k{i}");
            e.mapping.put(&k, "s0").await.unwrap();
            r.insert(&k, "users", user("ann", i)).await.unwrap();
            r.reassign_shard(&k, "s1", "users").await.unwrap();
        }
        let (rep, n) = pass(&r, false, false).await;
        assert!(rep.clean, "{kinds:?}: {rep:?}");
        assert_eq!(n, 20, "{kinds:?}: the first pass examines every move");
        for i in 0..3 {
            r.reassign_shard(&format!("k{i}"), "s0", "users")
                .await
                .unwrap();
        }
        let (rep, n) = pass(&r, false, false).await;
        assert!(rep.clean, "{kinds:?}: {rep:?}");
        assert_eq!(n, 3, "{kinds:?}: only the three moves since the last pass");
        let (_, n) = pass(&r, false, false).await;
        assert_eq!(n, 0, "{kinds:?}: nothing new");
        let (rep, n) = pass(&r, true, false).await;
        assert!(rep.clean, "{kinds:?}: {rep:?}");
        assert_eq!(n, 23, "{kinds:?}: a full pass examines every move");

        // A row written behind k5's tombstone on s0 by a writer that
        // bypasses the router: the move was examined already, so only a
        // full pass finds it; the next pass examines the key again.
        e.shard("s0")
            .execute(&Statement::new(
                "INSERT INTO users (id, name, n) VALUES ('k5', 'ghost', 5)",
            ))
            .await
            .unwrap();
        let (rep, _) = pass(&r, false, false).await;
        assert_eq!(rep.ghost_count, 0, "{kinds:?}: the limit of a pass");
        let (rep, _) = pass(&r, true, false).await;
        assert_eq!(rep.ghost_count, 1, "{kinds:?}: {rep:?}");
        assert_eq!(rep.ghosts[0].key, "k5");
        let (rep, n) = pass(&r, false, false).await;
        assert_eq!(
            (rep.ghost_count, n),
            (1, 1),
            "{kinds:?}: a key the last pass flagged is examined again"
        );
        e.shard("s0")
            .execute(&Statement::new("DELETE FROM users WHERE id = 'k5'"))
            .await
            .unwrap();
        let (rep, n) = pass(&r, false, false).await;
        assert!(rep.clean && n == 1, "{kinds:?}: {rep:?}");
        clean_verify(&r).await;
    }
}

/// Item 9 under the verified mark: purge needs a pass that read the move
/// after it finished; a pass before it does not count.
#[tokio::test]
async fn purge_needs_a_pass_that_read_the_finished_move() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let r = router_with_user(&e, "u1", "s0", user("ann", 1)).await;
        let (rep, _) = pass(&r, false, false).await;
        assert!(rep.clean);
        r.reassign_shard_with("u1", "s1", "users", NOW)
            .await
            .unwrap();
        e.clock.advance(1);
        let purge = purge_expect(&r, (0, 1), &format!("{kinds:?}")).await;
        assert_eq!(purge.refused[0].error.code(), "NOT_VERIFIED");
        let (rep, n) = pass(&r, false, false).await;
        assert!(rep.clean && n == 1, "{kinds:?}: {rep:?}");
        purge_expect(&r, (1, 0), &format!("{kinds:?}")).await;
    }
}

#[tokio::test]
async fn purge_compacts_a_bouncing_keys_history() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let r = router_with_user(&e, "b1", "s0", user("ann", 0)).await;
        let mut at = "s0";
        let mut compacted = 0;
        for round in 1..=8 {
            r.reassign_shard_with("b1", other(at), "users", NOW)
                .await
                .unwrap();
            at = other(at);
            r.update("b1", "users", row([("n", Value::from(round))]))
                .await
                .unwrap();
            e.clock.advance(1);
            let (rep, _) = pass(&r, false, false).await;
            assert!(rep.clean, "{kinds:?}: {rep:?}");
            let purge = r.purge_retired().await.unwrap();
            assert_eq!(purge.purged_count, 1, "{kinds:?} round {round}");
            compacted += purge.compacted_count;
            let ops = count(
                &e,
                "s0",
                "SELECT op_id FROM durability_migration_ops WHERE mkey = 'b1'",
            )
            .await;
            // A move fences every configured table: each table's
            // tombstones are bounded alike.
            let mut tombs = 0;
            for t in ["users", "orgs", "docs", "bkeys"] {
                let q = format!(
                    "SELECT op_id FROM durability_retired WHERE mkey = 'b1' AND tname = '{t}'"
                );
                tombs = count(&e, "s0", &q).await + count(&e, "s1", &q).await;
                // What fences (the live tombstone), the newest lifted fence
                // on each shard, and the newest move: never more than three.
                assert!(
                    ops <= 3 && tombs <= 3,
                    "{kinds:?} round {round}: {ops} operations, {tombs} tombstones of {t}"
                );
            }
            assert!(tombs > 0, "{kinds:?} round {round}: bkeys is fenced too");
        }
        assert_eq!(compacted, 5, "{kinds:?}: 8 moves, 3 kept");
        let got = r.get("b1", "users").await.unwrap().unwrap();
        assert_eq!(got.get("n"), Some(&Value::from(8)), "{kinds:?}");
        // The compacted key still moves, and a router routing by a stale
        // mapping to the shard the key left is refused by the fence.
        let stale = e.router_with(false, 3_600_000).await;
        assert_eq!(stale.route("b1").await.unwrap().as_deref(), Some(at));
        r.reassign_shard("b1", other(at), "users").await.unwrap();
        let stale_write = stale
            .update("b1", "users", row([("n", Value::from(-1))]))
            .await;
        let expected = match &stale_write {
            Ok(1) => -1,
            Ok(n) => panic!("{kinds:?}: the stale update reported {n} rows"),
            Err(e) => {
                assert_eq!(e.code(), "MIGRATION_CUTOVER_PENDING", "{kinds:?}: {e}");
                8
            }
        };
        let live = e.live("users", "id", "b1").await;
        assert_eq!(live.len(), 1, "{kinds:?}: one live row");
        assert_eq!(live[0].0, other(at), "{kinds:?}");
        assert_eq!(
            live[0].1.get("n"),
            Some(&Value::from(expected)),
            "{kinds:?}: {stale_write:?}"
        );
        clean_verify(&r).await;
    }
}

/// Aborted operations are history too: purge deletes an aborted
/// operation's journal row once a pass examined it and its retention
/// elapsed (its abort left no tombstone or marker), not before; the key
/// still moves and reads afterwards.
#[tokio::test]
async fn purge_compacts_examined_aborted_operations() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let r = router_with_user(&e, "a1", "s0", user("ann", 1)).await;
        // Stopped after its copy to s1, then aborted by the operator.
        e.interrupt_move("a1", "s1", "users", 3, FaultMode::Before)
            .await;
        let stuck = op_of(&r, "a1", "users").await;
        r.abort_operation(&stuck.op_id).await.unwrap();
        let ops = "SELECT op_id FROM durability_migration_ops WHERE mkey = 'a1'";
        let purge = r.purge_retired().await.unwrap();
        assert_eq!(purge.compacted_count, 0, "{kinds:?}: not examined yet");
        assert_eq!(count(&e, "s0", ops).await, 1, "{kinds:?}");
        let (rep, _) = pass(&r, false, false).await;
        assert!(rep.clean, "{kinds:?}: {rep:?}");
        let purge = r.purge_retired().await.unwrap();
        assert_eq!(purge.compacted_count, 0, "{kinds:?}: retention not elapsed");
        assert_eq!(count(&e, "s0", ops).await, 1, "{kinds:?}");
        e.clock
            .advance(i64::try_from(durability_migration::DEFAULT_RETENTION_MS).unwrap());
        let purge = r.purge_retired().await.unwrap();
        assert_eq!(purge.compacted_count, 1, "{kinds:?}: {purge:?}");
        assert_eq!(count(&e, "s0", ops).await, 0, "{kinds:?}");
        assert!(
            r.get_migration_status("a1", "users")
                .await
                .unwrap()
                .is_none()
        );
        r.reassign_shard_with("a1", "s1", "users", NOW)
            .await
            .unwrap();
        let got = r.get("a1", "users").await.unwrap().unwrap();
        assert_eq!(got.get("n"), Some(&Value::from(1)), "{kinds:?}");
        clean_verify(&r).await;
    }
}

/// The journal's history indexes, by name.
async fn history_indexes(e: &Env, kind: Kind) -> Vec<String> {
    let sql = match kind {
        Sqlite => {
            "SELECT name FROM sqlite_master WHERE type = 'index' \
             AND tbl_name = 'durability_migration_ops' AND name LIKE '%_ops_%' ORDER BY name"
        }
        Postgres => {
            "SELECT indexname AS name FROM pg_indexes WHERE schemaname = current_schema() \
             AND tablename = 'durability_migration_ops' AND indexname LIKE '%_ops_%' ORDER BY indexname"
        }
        MySql => {
            "SELECT DISTINCT index_name AS name FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = 'durability_migration_ops' \
             AND index_name LIKE '%_ops_%' ORDER BY index_name"
        }
    };
    e.shard("s0")
        .query(&Statement::new(sql))
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("name").and_then(Value::as_text).unwrap().to_owned())
        .filter(|n| n.contains("unverified") || n.contains("unpurged") || n.contains("history"))
        .collect()
}

/// A journal created before the verified mark gains it at `init`; its
/// finished operations count as unexamined, those purged before the mark
/// existed too. A journal with the two history indexes of before (one per
/// mark) gets the one index of both marks and loses them.
#[tokio::test]
async fn an_older_journal_gains_the_verified_mark_and_one_history_index() {
    for kinds in SAME {
        let kind = kinds[0];
        let Some(e) = env(&kinds).await else { return };
        let r = e.router().await;
        assert_eq!(
            history_indexes(&e, kind).await,
            ["durability_migration_ops_history"],
            "{kind:?}"
        );
        // u1's move purged (a pass read it, its retention elapsed), u2's not.
        for k in ["u1", "u2"] {
            e.mapping.put(k, "s0").await.unwrap();
            r.insert(k, "users", user("ann", 1)).await.unwrap();
        }
        r.reassign_shard("u1", "s1", "users").await.unwrap();
        clean_verify(&r).await;
        e.clock
            .advance(i64::try_from(durability_migration::DEFAULT_RETENTION_MS).unwrap());
        let purge = r.purge_retired().await.unwrap();
        assert_eq!(purge.purged_count, 1, "{kind:?}: {purge:?}");
        r.reassign_shard("u2", "s1", "users").await.unwrap();
        // The journal as an older version wrote it.
        let drop_new = match kind {
            MySql => "DROP INDEX durability_migration_ops_history ON durability_migration_ops",
            _ => "DROP INDEX durability_migration_ops_history",
        };
        for ddl in [
            drop_new,
            "ALTER TABLE durability_migration_ops DROP COLUMN verified",
            "CREATE INDEX durability_migration_ops_unpurged ON durability_migration_ops (scope, purged, op_id)",
        ] {
            e.shard("s0").execute(&Statement::new(ddl)).await.unwrap();
        }
        assert_eq!(
            history_indexes(&e, kind).await,
            ["durability_migration_ops_unpurged"],
            "{kind:?}"
        );
        let r = e.router().await;
        assert_eq!(
            history_indexes(&e, kind).await,
            ["durability_migration_ops_history"],
            "{kind:?}: the older index is dropped"
        );
        let (rep, n) = pass(&r, false, false).await;
        assert!(rep.clean, "{kind:?}: {rep:?}");
        assert_eq!(
            n, 2,
            "{kind:?}: both moves made before the upgrade are examined, the purged one too"
        );
        let (_, n) = pass(&r, false, false).await;
        assert_eq!(n, 0, "{kind:?}");
        // Purge reads both ranges: u2's move is purged now, and u1's was.
        e.clock
            .advance(i64::try_from(durability_migration::DEFAULT_RETENTION_MS).unwrap());
        purge_expect(&r, (1, 0), &format!("{kind:?}")).await;
    }
}

/// Purge refuses the moves no pass examined and purges the examined ones,
/// with exact counts over both ranges of the history index.
#[tokio::test]
async fn purge_counts_examined_and_unexamined_moves_exactly() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let r = e.router().await;
        for i in 0..6 {
            let k = format!("k{i}");
            e.mapping.put(&k, "s0").await.unwrap();
            r.insert(&k, "users", user("ann", i)).await.unwrap();
            r.reassign_shard_with(&k, "s1", "users", NOW).await.unwrap();
            if i == 3 {
                // k0..k3 examined, k4 and k5 not.
                clean_verify(&r).await;
            }
        }
        let purge = purge_expect(&r, (4, 2), &format!("{kinds:?}")).await;
        assert!(
            purge
                .refused
                .iter()
                .all(|f| f.error.code() == "NOT_VERIFIED"),
            "{kinds:?}: {purge:?}"
        );
        purge_expect(&r, (0, 2), &format!("{kinds:?}")).await;
    }
}
