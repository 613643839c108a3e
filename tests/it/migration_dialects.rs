//! Migration on real PostgreSQL and MariaDB shards, alone and mixed with
//! SQLite: routed reads and writes, journaled moves between dialects,
//! table-set moves, a crash at every write of a move followed by recovery
//! and verification, concurrent writers, batch rollback per dialect, and
//! statements keyed on a non-key column. Each shard lives in a schema or
//! database of its own; without a server a test prints that it skipped,
//! unless `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::shards::{Env, Kind, clean_verify, env, op_of, router_with_user};
use durability_migration::conformance::FaultMode;
use durability_migration::conformance::harness::user;
use durability_migration::{Ident, MoveState, Value, VerifyOptions, row};

use Kind::{MySql, Postgres, Sqlite};

/// Source → destination pairs every move test runs.
const PAIRS: [[Kind; 2]; 5] = [
    [Sqlite, Postgres],
    [Postgres, MySql],
    [MySql, Sqlite],
    [Postgres, Postgres],
    [MySql, MySql],
];

async fn routed_reads_and_writes(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let r = e.router().await;
    assert_eq!(r.get("nobody", "users").await.unwrap(), None);
    assert_eq!(r.update("nobody", "users", user("x", 1)).await.unwrap(), 0);
    assert!(
        e.mapping.scan(None, 10).await.unwrap().is_empty(),
        "no allocation"
    );
    for (i, k) in ["u1", "u2", "u3", "u4"].iter().enumerate() {
        let n = i64::try_from(i).unwrap();
        assert_eq!(r.insert(k, "users", user("ann", n)).await.unwrap(), 1);
        let got = r.get(k, "users").await.unwrap().unwrap();
        assert_eq!(got.get("name"), Some(&Value::from("ann")), "{kinds:?}");
        assert_eq!(got.get("n"), Some(&Value::Integer(n)));
        assert_eq!(r.update(k, "users", user("bob", 2)).await.unwrap(), 1);
        // Same values again: still one matched row (found rows on MariaDB).
        assert_eq!(r.update(k, "users", user("bob", 2)).await.unwrap(), 1);
        let n = r.upsert(k, "users", user("cy", 3)).await.unwrap();
        assert!(n >= 1, "{kinds:?}: upsert of an existing row changed {n}");
        assert_eq!(
            r.get(k, "users").await.unwrap().unwrap().get("name"),
            Some(&Value::from("cy"))
        );
        assert_eq!(e.live("users", "id", k).await.len(), 1);
        assert_eq!(r.delete(k, "users").await.unwrap(), 1);
        assert_eq!(r.get(k, "users").await.unwrap(), None);
        assert_eq!(r.upsert(k, "users", user("dee", 4)).await.unwrap(), 1);
    }
    // Hostile values are data on every dialect.
    let hostile = "'; DROP TABLE users; -- \u{1F600}";
    r.insert("h", "users", user(hostile, i64::MIN))
        .await
        .unwrap();
    let got = r.get("h", "users").await.unwrap().unwrap();
    assert_eq!(got.get("name"), Some(&Value::from(hostile)));
    assert_eq!(got.get("n"), Some(&Value::Integer(i64::MIN)));
}

#[tokio::test]
async fn routed_reads_and_writes_postgres_and_mariadb() {
    routed_reads_and_writes([Postgres, Postgres]).await;
    routed_reads_and_writes([MySql, MySql]).await;
    routed_reads_and_writes([Postgres, MySql]).await;
}

async fn journaled_move(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let r = router_with_user(&e, "u1", "s0", user("ann", 1)).await;
    let out = r.reassign_shard("u1", "s1", "users").await.unwrap();
    assert_eq!((out.source.as_str(), out.target.as_str()), ("s0", "s1"));
    let st = op_of(&r, "u1", "users").await;
    assert_eq!(st.state, MoveState::Retired, "{kinds:?}");
    let live = e.live("users", "id", "u1").await;
    assert_eq!((live.len(), live[0].0.as_str()), (1, "s1"), "{kinds:?}");
    assert_eq!(live[0].1.get("name"), Some(&Value::from("ann")));
    assert_eq!(live[0].1.get("n"), Some(&Value::Integer(1)));
    // The source's fence refuses a stale routed insert.
    let inserted = stale_insert_on_s0(&e, "users", "u1").await;
    assert_eq!(inserted, 0, "{kinds:?}");
    assert_eq!(r.update("u1", "users", user("bob", 2)).await.unwrap(), 1);
    // Move back: the old fence on s0 is lifted.
    r.reassign_shard("u1", "s0", "users").await.unwrap();
    assert_eq!(r.update("u1", "users", user("cy", 3)).await.unwrap(), 1);
    let live = e.live("users", "id", "u1").await;
    assert_eq!((live.len(), live[0].0.as_str()), (1, "s0"), "{kinds:?}");
    assert_eq!(live[0].1.get("name"), Some(&Value::from("cy")));
    clean_verify(&r).await;
}

#[tokio::test]
async fn journaled_moves_between_dialects() {
    for kinds in PAIRS {
        journaled_move(kinds).await;
    }
}

async fn table_set_move(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let r = e.router().await;
    e.mapping.put("org1", "s0").await.unwrap();
    r.insert("org1", "orgs", row([("title", "Acme")]))
        .await
        .unwrap();
    r.insert("org1", "users", user("boss", 1)).await.unwrap();
    r.reassign_keys("org1", "s1", &["orgs", "users", "docs"])
        .await
        .unwrap();
    for (t, c) in [("orgs", "org_id"), ("users", "id")] {
        let live = e.live(t, c, "org1").await;
        assert_eq!((live.len(), live[0].0.as_str()), (1, "s1"), "{kinds:?} {t}");
        let st = op_of(&r, "org1", t).await;
        assert_eq!(st.state, MoveState::Retired);
    }
    assert_eq!(
        r.get("org1", "orgs").await.unwrap().unwrap().get("title"),
        Some(&Value::from("Acme"))
    );
    // docs had no row: a stale insert on the source is still fenced.
    let inserted = stale_insert_on_s0(&e, "docs", "org1").await;
    assert_eq!(inserted, 0, "{kinds:?}");
    clean_verify(&r).await;
}

#[tokio::test]
async fn table_set_moves_between_dialects() {
    for kinds in PAIRS {
        table_set_move(kinds).await;
    }
}

/// One crash scenario over shards of `kinds` (`s2` holds the journal when
/// there are three): crash the move at write `n`, then a fresh process
/// recovers and verifies. Returns whether the crash point was reached, or
/// `None` when a server is unreachable.
async fn crash_case(kinds: &[Kind], tables: &[&str], n: u64, mode: FaultMode) -> Option<bool> {
    Some(crash_case_with(kinds, tables, n, mode, None).await?.0)
}

/// [`crash_case`], optionally crashing the first recovery at its write `m`
/// before a fresh recovery; returns whether each crash point was reached.
async fn crash_case_with(
    kinds: &[Kind],
    tables: &[&str],
    n: u64,
    mode: FaultMode,
    recovery_crash: Option<(u64, FaultMode)>,
) -> Option<(bool, bool)> {
    let mut e = env(kinds).await?;
    if kinds.len() > 2 {
        e.journal = "s2";
    }
    let run = e.crash_move(tables, n, mode, recovery_crash).await;
    run.check(&e, tables, &format!("{kinds:?} n={n} {mode:?}"))
        .await;
    Some((run.tripped, run.recovery_tripped))
}

/// The rows a fenced insert of `key` (its `id` only) into `table` on
/// `s0` wrote: 0 where `s0` holds the key's fence.
async fn stale_insert_on_s0(e: &Env, table: &str, key: &str) -> u64 {
    let st = e.shard("s0").dialect().fenced_insert(
        &Ident::new(table).unwrap(),
        key,
        &[(Ident::new("id").unwrap(), Value::from(key))],
        None,
    );
    e.shard("s0").execute(&st).await.unwrap()
}

/// Crashes the move at each of its writes in turn, in both modes; returns
/// how many crash points were tried (`None`: a server is unreachable).
async fn crash_points(kinds: &[Kind], tables: &[&str]) -> Option<u64> {
    let mut tried = 0;
    for mode in [FaultMode::Before, FaultMode::After] {
        let mut n = 1;
        loop {
            match crash_case(kinds, tables, n, mode).await {
                None => return None,
                Some(false) => break,
                Some(true) => {
                    tried += 1;
                    n += 1;
                }
            }
        }
    }
    eprintln!("{kinds:?} {tables:?}: {tried} crash points tried");
    Some(tried)
}

/// [`crash_points`] of `users` over shards `[source, other]` (the journal
/// on the source): at least 10; then of `users` and `orgs` over shards
/// `[third, source, source]` (the journal on a third shard): at least 14.
async fn crash_at_every_write(source: Kind, other: Kind, third: Kind) {
    let Some(tried) = crash_points(&[source, other], &["users"]).await else {
        return;
    };
    assert!(tried >= 10, "{tried} crash points");
    let tried = crash_points(&[third, source, source], &["users", "orgs"]).await;
    assert!(tried.unwrap() >= 14, "{tried:?} crash points");
}

#[tokio::test]
async fn crash_at_every_write_of_a_move_postgres() {
    // Journal on the Postgres source: `committed` joins the cutover batch;
    // then on a third shard.
    crash_at_every_write(Postgres, Sqlite, Sqlite).await;
}

#[tokio::test]
async fn crash_at_every_write_of_a_move_mariadb() {
    crash_at_every_write(MySql, Postgres, Postgres).await;
}

/// A crash at every write of a Postgres → MariaDB move, then a crash at
/// every write of its recovery, then a clean recovery. Only crashes after
/// the write applied (outcome unknown, the harder case for recovery), to
/// keep the test short; both modes run in the tests above.
#[tokio::test]
async fn crash_during_recovery_postgres_to_mariadb() {
    let kinds = [Postgres, MySql];
    let (mut moves, mut recoveries) = (0, 0);
    let mode = FaultMode::After;
    let mut n = 1;
    loop {
        let Some((true, _)) = crash_case_with(&kinds, &["users"], n, mode, None).await else {
            break;
        };
        moves += 1;
        let mut m = 1;
        while let Some((_, true)) =
            crash_case_with(&kinds, &["users"], n, mode, Some((m, mode))).await
        {
            recoveries += 1;
            m += 1;
        }
        n += 1;
    }
    eprintln!("{moves} move crash points, {recoveries} recovery crash points tried");
    assert!(moves == 0 || recoveries > moves, "{moves} {recoveries}");
}

async fn concurrent_writers(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let e = Arc::new(e);
    let r = Arc::new(e.router().await);
    e.mapping.put("d", "s0").await.unwrap();
    r.insert(
        "d",
        "docs",
        row([("w0", 0i64), ("w1", 0), ("w2", 0), ("w3", 0)]),
    )
    .await
    .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let r = Arc::clone(&r);
        let done = Arc::clone(&done);
        writers.push(tokio::spawn(async move {
            let (mut acked, mut j) = (0i64, 0i64);
            while !done.load(Ordering::SeqCst) || j < 30 {
                j += 1;
                match r.update("d", "docs", row([(format!("w{w}"), j)])).await {
                    Ok(1) => acked = j,
                    Ok(n) => panic!("write changed {n} rows"),
                    Err(e) if e.code() == "MIGRATION_CUTOVER_PENDING" => {}
                    Err(e) => panic!("{e}"),
                }
                tokio::task::yield_now().await;
            }
            acked
        }));
    }
    let mut moved = 0;
    for i in 0..6 {
        let to = if i % 2 == 0 { "s1" } else { "s0" };
        match r.reassign_shard("d", to, "docs").await {
            Ok(_) => moved += 1,
            Err(err)
                if err.code() == "MIGRATION_ABORTED" || err.code() == "MIGRATION_SAME_SHARD" => {}
            Err(err) => panic!("{kinds:?}: {err}"),
        }
    }
    done.store(true, Ordering::SeqCst);
    let mut acked = Vec::new();
    for w in writers {
        acked.push(w.await.unwrap());
    }
    // With a pool, writers interleave with every copy, so most moves under
    // this load miss their cutover and abort; once the load stops a move
    // commits. Either way no acknowledged write is lost.
    eprintln!("{kinds:?}: {moved} of 6 moves committed under load");
    let home = r.route("d").await.unwrap().unwrap();
    let to = if home == "s0" { "s1" } else { "s0" };
    r.reassign_shard("d", to, "docs").await.unwrap();
    let live = e.live("docs", "id", "d").await;
    assert_eq!(
        (live.len(), live[0].0.as_str()),
        (1, to),
        "{kinds:?}: one live row"
    );
    for (w, a) in acked.iter().enumerate() {
        assert_eq!(
            live[0].1.get(&format!("w{w}")),
            Some(&Value::Integer(*a)),
            "{kinds:?} writer {w}: last acknowledged write is in the row"
        );
    }
    clean_verify(&r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_lose_no_acknowledged_write_postgres() {
    concurrent_writers([Postgres, Postgres]).await;
    concurrent_writers([Sqlite, Postgres]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_lose_no_acknowledged_write_mariadb() {
    concurrent_writers([MySql, MySql]).await;
    concurrent_writers([Postgres, MySql]).await;
}

/// The seed's unproven case: an atomic batch rolls back on each dialect,
/// here the router's own cutover batch failing at its last statement.
#[tokio::test]
async fn atomic_batch_rolls_back_on_every_dialect() {
    for kind in [Sqlite, Postgres, MySql] {
        let Some(e) = env(&[kind]).await else { return };
        let r = e.router().await;
        r.insert("u1", "users", user("ann", 1)).await.unwrap();
        let s = e.shard("s0");
        let d = s.dialect();
        let users = Ident::new("users").unwrap();
        let id = Ident::new("id").unwrap();
        let mut stmts = vec![
            d.delete_key(&users, &id, "u1"),
            d.insert_row(
                &users,
                &[
                    (id.clone(), Value::from("u2")),
                    (Ident::new("n").unwrap(), Value::Integer(5)),
                ],
            ),
        ];
        // A duplicate key fails the batch after two applied statements.
        stmts.push(stmts[1].clone());
        assert!(s.batch(&stmts).await.is_err(), "{kind:?}");
        assert_eq!(
            e.live("users", "id", "u1").await.len(),
            1,
            "{kind:?}: delete undone"
        );
        assert!(
            e.live("users", "id", "u2").await.is_empty(),
            "{kind:?}: insert undone"
        );
    }
}

/// The seed's other unproven case: a statement keyed on a non-key column.
/// The router routes and fences by the key column only; a statement keyed
/// on another column is a raw statement (`raw_execute`), which bypasses
/// routing and every fence. After a move it matches nothing on the source
/// (the row is gone) and the moved row on the destination; a raw insert on
/// the source lands behind the tombstone and verification reports it as a
/// ghost, so it never goes unnoticed.
async fn non_key_statement(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let r = router_with_user(&e, "u1", "s0", user("ann", 1)).await;
    r.reassign_shard("u1", "s1", "users").await.unwrap();
    let by_name = |shard: &Env, name: &str| {
        let d = shard.shard(name).dialect();
        let mut s = durability_migration::Sql::new(&d);
        s.raw("UPDATE ")
            .ident(&Ident::new("users").unwrap())
            .raw(" SET ")
            .ident(&Ident::new("n").unwrap())
            .raw(" = ")
            .bind(9i64)
            .raw(" WHERE ")
            .ident(&Ident::new("name").unwrap())
            .raw(" = ")
            .bind("ann");
        s.finish()
    };
    assert_eq!(
        r.raw_execute("s0", &by_name(&e, "s0")).await.unwrap(),
        0,
        "{kinds:?}"
    );
    assert_eq!(
        r.raw_execute("s1", &by_name(&e, "s1")).await.unwrap(),
        1,
        "{kinds:?}"
    );
    assert_eq!(
        r.get("u1", "users").await.unwrap().unwrap().get("n"),
        Some(&Value::Integer(9))
    );
    // A raw insert bypasses the source's fence: a ghost verification reports.
    let d = e.shard("s0").dialect();
    let ghost = d.insert_row(
        &Ident::new("users").unwrap(),
        &[
            (Ident::new("id").unwrap(), Value::from("u1")),
            (Ident::new("name").unwrap(), Value::from("stale")),
        ],
    );
    assert_eq!(r.raw_execute("s0", &ghost).await.unwrap(), 1);
    let rep = r.verify_migrations(VerifyOptions::default()).await.unwrap();
    assert!(!rep.clean && rep.ghosts.len() == 1, "{kinds:?}: {rep:?}");
    // Routed reads still follow the mapping, not the ghost.
    assert_eq!(
        r.get("u1", "users").await.unwrap().unwrap().get("n"),
        Some(&Value::Integer(9))
    );
}

#[tokio::test]
async fn statement_keyed_on_a_non_key_column() {
    non_key_statement([Postgres, MySql]).await;
    non_key_statement([MySql, Postgres]).await;
}

async fn padded_and_long_keys(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let r = e.router().await;
    let long = "x".repeat(durability_migration::MAX_KEY_BYTES);
    let keys = ["k", "k ", long.as_str()];
    for (i, k) in keys.iter().enumerate() {
        e.mapping.put(k, "s0").await.unwrap();
        let n = i64::try_from(i).unwrap();
        let row = row([("n", Value::from(n))]);
        assert_eq!(r.insert(k, "bkeys", row).await.unwrap(), 1, "{kinds:?}");
    }
    // Moving "k" leaves "k " where it is, unfenced.
    r.reassign_shard("k", "s1", "bkeys").await.unwrap();
    assert_eq!(
        r.update("k ", "bkeys", row([("n", Value::from(10i64))]))
            .await
            .unwrap(),
        1,
        "{kinds:?}: \"k \" is not fenced by the tombstone of \"k\""
    );
    r.reassign_shard(&long, "s1", "bkeys").await.unwrap();
    for (k, shard, n) in [
        ("k", "s1", 0i64),
        ("k ", "s0", 10),
        (long.as_str(), "s1", 2),
    ] {
        let live = e.live("bkeys", "id", k).await;
        assert_eq!(live.len(), 1, "{kinds:?} {k:?}: {live:?}");
        assert_eq!(live[0].0, shard, "{kinds:?} {k:?}");
        let got = r.get(k, "bkeys").await.unwrap().unwrap();
        assert_eq!(got.get("n"), Some(&Value::Integer(n)), "{kinds:?} {k:?}");
    }
    let status = op_of(&r, &long, "bkeys").await;
    assert_eq!(status.key, long, "the journal keeps the whole key");
    assert_eq!(status.state, MoveState::Retired);
    clean_verify(&r).await;
}

/// Keys that differ only by trailing spaces, and keys of the longest length,
/// stay distinct and whole in the crate's tables on every dialect (MariaDB's
/// `utf8mb4_bin` is PAD SPACE; the crate keys its own tables byte-wise).
#[tokio::test]
async fn padded_and_longest_keys_stay_distinct_on_every_dialect() {
    padded_and_long_keys([Sqlite, Sqlite]).await;
    padded_and_long_keys([Postgres, Postgres]).await;
    padded_and_long_keys([MySql, MySql]).await;
}
