//! Migration on SQLite file shards: routing, journaled moves, recovery,
//! verification, purge, rebalance, crash injection and concurrent writers.

#![cfg(feature = "migration")]
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use durability_migration::conformance::FaultMode;
use durability_migration::conformance::harness::{
    BeforeWrite, Harness, HookedShard, clean_verify, repair, user,
};
use durability_migration::{
    BackendError, BoxFuture, Clock, Cutover, CutoverTable, Dialect, Ident, MigrateOptions,
    MigrationConfig, MigrationError, MoveOptions, MoveState, OnConflict, OpRecord, ReadOptions,
    RebalanceOptions, Retire, Router, Row, Shard, Statement, Value, VerifyOptions, digest,
    encode_row, row,
};
use durability_storage_sqlite::migration::{SqliteMappingStore, SqliteShard};
use tempfile::TempDir;

const SCHEMA: &str = "
CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT, n INTEGER);
CREATE TABLE orgs (org_id TEXT PRIMARY KEY, title TEXT);
CREATE TABLE docs (id TEXT PRIMARY KEY, w0 INTEGER, w1 INTEGER, w2 INTEGER, w3 INTEGER);
";

/// SQLite file shards `s0`, `s1`, … with the test tables and a SQLite
/// mapping store on the migration crate's crash harness (which holds their
/// directory).
fn env(n: usize) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let shards = (0..n)
        .map(|i| {
            let s = SqliteShard::open(dir.path().join(format!("s{i}.db"))).unwrap();
            s.execute_sync(SCHEMA).unwrap();
            (format!("s{i}"), Arc::new(s) as Arc<dyn Shard>)
        })
        .collect();
    let mapping = Arc::new(SqliteMappingStore::open(dir.path().join("map.db")).unwrap());
    Harness::new(shards, mapping)
        .table("users")
        .table("docs")
        .table_with_key_column("orgs", "org_id")
        .holding(dir)
}

/// [`env`] with `u1` on `s0` ([`Harness::seed_ann`]) and a router over it
/// (on the crash plan's faulty shards when `faulty`).
async fn seeded(n: usize, faulty: bool) -> (Harness, Router) {
    let e = env(n);
    let r = e.router_with(faulty, 30_000).await;
    e.seed_ann(&r).await;
    (e, r)
}

/// The operation of `key`'s newest move of `table`, as `r` reads it (it
/// must exist).
async fn op_of(r: &Router, key: &str, table: &str) -> OpRecord {
    r.get_migration_status(key, table).await.unwrap().unwrap()
}

/// Columns `cols` of the `users` tombstones on `s0`.
async fn users_tombstones(e: &Harness, cols: &str) -> Vec<Row> {
    let sql = format!("SELECT {cols} FROM durability_retired WHERE tname = 'users'");
    e.shard("s0").query(&Statement::new(sql)).await.unwrap()
}

/// `u1`'s live `users` row on `shard` (it must exist).
async fn user_row_on(e: &Harness, shard: &str) -> Row {
    let live = e.live("users", "id", "u1").await;
    live.into_iter().find(|(s, _)| s == shard).unwrap().1
}

/// A row as the column list of a statement.
fn columns(row: &Row) -> Vec<(Ident, Value)> {
    row.iter()
        .map(|(k, v)| (Ident::new(k).unwrap(), v.clone()))
        .collect()
}

/// Everything stored: every table of every shard, and the mapping.
async fn dump(e: &Harness) -> Vec<String> {
    let mut out = Vec::new();
    for (name, s) in &e.shards {
        for t in [
            "users",
            "orgs",
            "docs",
            "durability_retired",
            "durability_migration_ops",
            "durability_migration_lease",
        ] {
            let rows = s
                .query(&Statement::new(format!("SELECT * FROM {t}")))
                .await
                .unwrap_or_default();
            out.push(format!("{name}.{t}: {rows:?}"));
        }
    }
    out.push(format!(
        "{:?}",
        e.mapping.scan(None, 1_000_000).await.unwrap()
    ));
    out
}

/// A file shard with the test tables, as `env(1)` opens `s0`.
fn file_shard() -> (SqliteShard, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteShard::open(dir.path().join("s0.db")).unwrap();
    s.execute_sync(SCHEMA).unwrap();
    (s, dir)
}

durability_migration::shard_conformance!(sqlite_shard_conforms, "conf_t", async {
    Some(file_shard())
});

durability_migration::shard_conformance!(sqlite_memory_shard_conforms, "conf_t", async {
    Some((SqliteShard::open_in_memory().unwrap(), ()))
});

durability_migration::mapping_store_conformance!(sqlite_mapping_store_conforms, "c:", async {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteMappingStore::open(dir.path().join("map.db")).unwrap();
    Some((store, dir))
});

durability_migration::mapping_store_conformance!(
    sqlite_memory_mapping_store_conforms,
    "c:",
    async { Some((SqliteMappingStore::open_in_memory().unwrap(), ())) }
);

#[tokio::test]
async fn routed_reads_and_writes() {
    let e = env(2);
    let r = e.router().await;
    assert_eq!(
        r.get("nobody", "users").await.unwrap(),
        None,
        "unknown key reads as absent"
    );
    assert!(
        e.mapping.scan(None, 10).await.unwrap().is_empty(),
        "reads never allocate"
    );
    assert_eq!(r.update("nobody", "users", user("x", 1)).await.unwrap(), 0);
    assert!(
        e.mapping.scan(None, 10).await.unwrap().is_empty(),
        "updates never allocate"
    );
    assert_eq!(r.insert("u1", "users", user("ann", 1)).await.unwrap(), 1);
    let placed = r.route("u1").await.unwrap().unwrap();
    assert_eq!(
        Some(placed.clone()),
        r.placement("u1"),
        "hash strategy places new keys"
    );
    let got = r.get("u1", "users").await.unwrap().unwrap();
    assert_eq!(got.get("name"), Some(&Value::from("ann")));
    assert_eq!(r.update("u1", "users", user("bob", 2)).await.unwrap(), 1);
    assert_eq!(r.upsert("u1", "users", user("cy", 3)).await.unwrap(), 1);
    assert_eq!(
        r.get("u1", "users").await.unwrap().unwrap().get("n"),
        Some(&Value::from(3i64))
    );
    assert_eq!(e.live("users", "id", "u1").await.len(), 1);
    assert_eq!(r.delete("u1", "users").await.unwrap(), 1);
    assert_eq!(r.get("u1", "users").await.unwrap(), None);
}

#[tokio::test]
async fn single_shard_default_journal() {
    let e = env(1);
    let r = e.router().await;
    let r1 = Router::new(
        MigrationConfig::new(e.mapping.clone())
            .shard("only", e.shard("s0").clone())
            .table("users"),
    )
    .unwrap();
    r1.init().await.unwrap();
    assert!(
        r1.recover_migrations().await.is_ok(),
        "single shard journals on itself"
    );
    drop(r);
}

#[tokio::test]
async fn journaled_move_and_status() {
    let (e, r) = seeded(2, false).await;
    assert_eq!(r.get_migration_status("u1", "users").await.unwrap(), None);
    let out = r.reassign_shard("u1", "s1", "users").await.unwrap();
    assert_eq!(
        (out.source.as_str(), out.target.as_str(), out.recopies),
        ("s0", "s1", 0)
    );
    let st = op_of(&r, "u1", "users").await;
    assert_eq!(st.state, MoveState::Retired);
    assert_eq!(st.op_id, out.op_id);
    assert_eq!(
        r.route("u1").await.unwrap().as_deref(),
        Some("s1"),
        "mover routes at once"
    );
    assert_eq!(e.only_row("users", "id", "u1").await.0, "s1");
    assert_eq!(
        r.get("u1", "users").await.unwrap().unwrap().get("name"),
        Some(&Value::from("ann"))
    );
    // The source holds the tombstone; a fenced write there lands nowhere.
    let t = users_tombstones(&e, "moved_to, payload").await;
    assert_eq!(t[0].get("moved_to"), Some(&Value::from("s1")));
    assert!(matches!(t[0].get("payload"), Some(Value::Blob(_))));
    assert_eq!(r.update("u1", "users", user("bob", 2)).await.unwrap(), 1);
    assert_eq!(e.live("users", "id", "u1").await.len(), 1);
    // Move back: the old fence on s0 is lifted.
    r.reassign_shard("u1", "s0", "users").await.unwrap();
    assert_eq!(r.update("u1", "users", user("cy", 3)).await.unwrap(), 1);
    let live = e.only_row("users", "id", "u1").await;
    assert_eq!(live.0, "s0");
    assert_eq!(live.1.get("name"), Some(&Value::from("cy")));
    clean_verify(&r).await;
}

#[tokio::test]
async fn other_router_follows_within_ttl() {
    let e = env(2);
    let a = e.router().await;
    let b = e.router().await;
    let zero = e.router_with(false, 0).await;
    e.seed_ann(&a).await;
    assert_eq!(
        b.route("u1").await.unwrap().as_deref(),
        Some("s0"),
        "b caches s0"
    );
    a.reassign_shard("u1", "s1", "users").await.unwrap();
    assert_eq!(a.route("u1").await.unwrap().as_deref(), Some("s1"));
    assert_eq!(
        zero.route("u1").await.unwrap().as_deref(),
        Some("s1"),
        "ttl 0 reads every call"
    );
    assert_eq!(
        b.route("u1").await.unwrap().as_deref(),
        Some("s0"),
        "b keeps its entry within the TTL"
    );
    // b still reads (tombstone) and writes (fence, then re-route) correctly.
    assert_eq!(
        b.get("u1", "users").await.unwrap().unwrap().get("name"),
        Some(&Value::from("ann"))
    );
    e.clock.advance(1);
    assert_eq!(b.route("u1").await.unwrap().as_deref(), Some("s0"));
    e.clock.advance(30_000);
    assert_eq!(
        b.route("u1").await.unwrap().as_deref(),
        Some("s1"),
        "after the TTL b reads the mapping"
    );
    let c = e.router().await;
    c.route("u1").await.unwrap();
    a.reassign_shard("u1", "s0", "users").await.unwrap();
    assert_eq!(
        c.update("u1", "users", user("bob", 2)).await.unwrap(),
        1,
        "stale router's write is re-routed"
    );
    assert_eq!(
        c.route("u1").await.unwrap().as_deref(),
        Some("s0"),
        "and its cache is refreshed"
    );
    let live = e.only_row("users", "id", "u1").await;
    assert_eq!(live.0, "s0");
    assert_eq!(live.1.get("name"), Some(&Value::from("bob")));
}

#[tokio::test]
async fn table_set_move_with_key_columns() {
    let e = env(2);
    let r = e.router().await;
    e.mapping.put("org1", "s0").await.unwrap();
    r.insert("org1", "orgs", row([("title", "Acme")]))
        .await
        .unwrap();
    r.insert("org1", "users", user("boss", 1)).await.unwrap();
    let out = r
        .reassign_keys("org1", "s1", &["orgs", "users", "docs"])
        .await
        .unwrap();
    assert_eq!(out.target, "s1");
    for (t, c) in [("orgs", "org_id"), ("users", "id")] {
        let live = e.only_row(t, c, "org1").await;
        assert_eq!(live.0, "s1", "{t} moved");
        assert_eq!(op_of(&r, "org1", t).await.state, MoveState::Retired);
    }
    assert_eq!(
        r.get("org1", "orgs").await.unwrap().unwrap().get("title"),
        Some(&Value::from("Acme"))
    );
    // docs had no row: after the move, a stale insert on s0 is still fenced.
    let st = Dialect::Sqlite.fenced_insert(
        &Ident::new("docs").unwrap(),
        "org1",
        &[(Ident::new("id").unwrap(), Value::from("org1"))],
        None,
    );
    assert_eq!(e.shard("s0").execute(&st).await.unwrap(), 0);
    clean_verify(&r).await;
}

#[tokio::test]
async fn bad_input_is_refused_before_any_write() {
    let (e, r) = seeded(2, false).await;
    let before = dump(&e).await;
    let big = "k".repeat(513);
    let cases: Vec<(MigrationError, &str)> = vec![
        (
            r.reassign_shard("u1", "nope", "users").await.unwrap_err(),
            "UNKNOWN_SHARD",
        ),
        (
            r.reassign_shard("u1", "s1", "nope").await.unwrap_err(),
            "UNKNOWN_TABLE",
        ),
        (
            r.reassign_shard("u1", "s1", "users; DROP TABLE users")
                .await
                .unwrap_err(),
            "UNKNOWN_TABLE",
        ),
        (
            r.reassign_shard(&big, "s1", "users").await.unwrap_err(),
            "INVALID_KEY",
        ),
        (
            r.reassign_shard("", "s1", "users").await.unwrap_err(),
            "INVALID_KEY",
        ),
        (
            r.reassign_shard("ghost", "s1", "users").await.unwrap_err(),
            "MAPPING_NOT_FOUND",
        ),
        (
            r.reassign_shard("u1", "s0", "users").await.unwrap_err(),
            "MIGRATION_SAME_SHARD",
        ),
        (
            r.insert(&big, "users", user("x", 1)).await.unwrap_err(),
            "INVALID_KEY",
        ),
        (
            r.insert("u2", "users", row([("bogus", 1i64)]))
                .await
                .unwrap_err(),
            "UNKNOWN_COLUMN",
        ),
        (
            r.update("u1", "users", row([("na\"me", 1i64)]))
                .await
                .unwrap_err(),
            "INVALID_IDENTIFIER",
        ),
        (r.get("u1", "nope").await.unwrap_err(), "UNKNOWN_TABLE"),
        (
            r.migrate_record("s0", "nope", "u1", "users", MigrateOptions::default())
                .await
                .unwrap_err(),
            "UNKNOWN_SHARD",
        ),
        (
            r.raw_execute("nope", &Statement::new("SELECT 1"))
                .await
                .unwrap_err(),
            "UNKNOWN_SHARD",
        ),
    ];
    for (err, code) in &cases {
        assert_eq!(err.code(), *code, "{err}");
    }
    // A configured table that lacks its key column, or does not exist.
    let cfg = e
        .config(false, 30_000)
        .table_with_key_column("orgs", "missing")
        .table("absent");
    let r2 = Router::new(cfg).unwrap();
    for (router, table, code) in [
        (&r2, "orgs", "UNKNOWN_KEY_COLUMN"),
        (&r2, "absent", "UNKNOWN_TABLE"),
        (&r, "orgs", "MIGRATION_ROW_NOT_FOUND"),
    ] {
        let err = router.reassign_shard("u1", "s1", table).await.unwrap_err();
        assert_eq!(err.code(), code, "{table}");
    }
    assert_eq!(before, dump(&e).await, "stored state unchanged");
    let hostile = "'; DROP TABLE users; --";
    r.insert(hostile, "users", user(hostile, 1)).await.unwrap();
    assert_eq!(
        r.get(hostile, "users").await.unwrap().unwrap().get("name"),
        Some(&Value::from(hostile))
    );
}

#[tokio::test]
async fn second_move_of_active_key_is_refused() {
    let (e, r) = seeded(3, true).await;
    e.plan.arm(2, FaultMode::Before); // claim lands, the copy crashes
    assert!(r.reassign_shard("u1", "s1", "users").await.is_err());
    e.plan.disarm();
    let r2 = e.router().await;
    let err = r2.reassign_shard("u1", "s2", "users").await.unwrap_err();
    assert_eq!(err.code(), "MIGRATION_ALREADY_ACTIVE");
    let st = op_of(&r2, "u1", "users").await;
    assert_eq!(st.state, MoveState::Prepared);
    // The crashed mover is still live: recovery skips it until its liveness ends.
    let rep = r2.recover_migrations().await.unwrap();
    assert_eq!(rep.skipped.len(), 1);
    e.clock.advance(31_000);
    let rep = r2.recover_migrations().await.unwrap();
    assert_eq!((rep.examined.len(), rep.committed.len()), (1, 1), "{rep:?}");
    assert_eq!(r2.route("u1").await.unwrap().as_deref(), Some("s1"));
    r2.reassign_shard("u1", "s2", "users").await.unwrap();
    clean_verify(&r2).await;
}

#[tokio::test]
async fn crash_after_cutover_blocks_writes_until_recovery() {
    let (e, r) = seeded(2, true).await;
    // Journal on the source: claim(1) copy(2) then one batch with
    // copied+verified+cutover_pending, the cutover and committed (3): crash after it applies.
    e.plan.arm(3, FaultMode::After);
    assert!(r.reassign_shard("u1", "s1", "users").await.is_err());
    assert!(e.plan.tripped());
    e.plan.disarm();
    let r2 = e.router().await;
    let err = r2.update("u1", "users", user("bob", 2)).await.unwrap_err();
    assert_eq!(err.code(), "MIGRATION_CUTOVER_PENDING");
    assert!(err.is_retryable());
    assert_eq!(
        r2.get("u1", "users").await.unwrap().unwrap().get("name"),
        Some(&Value::from("ann")),
        "readable"
    );
    e.clock.advance(31_000);
    let rep = r2.recover_migrations().await.unwrap();
    assert_eq!(rep.committed.len(), 1, "{rep:?}");
    assert_eq!(r2.update("u1", "users", user("bob", 2)).await.unwrap(), 1);
    let live = e.only_row("users", "id", "u1").await;
    assert_eq!(live.0, "s1");
}

async fn tomb(s: &Arc<dyn Shard>, op: &str, key: &str, to: &str) {
    let st = Statement::with_params(
        "INSERT INTO durability_retired (op_id, tname, mkey, scope, moved_to, payload, digest, retired_ms) VALUES (?1, 'users', ?2, 'default', ?3, NULL, '-', 1)",
        vec![op.into(), key.into(), to.into()],
    );
    s.execute(&st).await.unwrap();
}

/// Maps `key` to `s0` with tombstones `s0 -> s1 -> … -> s{hops}` (op ids
/// `{op}{i}`) and its `users` row, named `name`, on `s{hops}`.
async fn chain(e: &Harness, key: &str, op: &str, hops: usize, name: &str) {
    for i in 0..hops {
        tomb(
            e.shard(&format!("s{i}")),
            &format!("{op}{i}"),
            key,
            &format!("s{}", i + 1),
        )
        .await;
    }
    e.mapping.put(key, "s0").await.unwrap();
    e.shard(&format!("s{hops}"))
        .execute(&Statement::with_params(
            "INSERT INTO users (id, name) VALUES (?1, ?2)",
            vec![key.into(), name.into()],
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn reads_follow_tombstones_up_to_four_hops() {
    let e = env(6);
    let r = e.router_with(false, 0).await;
    // chain s0 -> s1 -> s2 -> s3 -> s4 with the row on s4: four hops.
    chain(&e, "k4", "op", 4, "far").await;
    assert_eq!(
        r.get("k4", "users").await.unwrap().unwrap().get("name"),
        Some(&Value::from("far"))
    );
    // five hops
    chain(&e, "k5", "op5", 5, "too far").await;
    assert_eq!(
        r.get("k5", "users").await.unwrap_err().code(),
        "MIGRATION_CHAIN_EXCEEDED"
    );
    let be = ReadOptions { best_effort: true };
    assert_eq!(r.get_with("k5", "users", be).await.unwrap(), None);
    // a cycle
    tomb(e.shard("s0"), "c0", "kc", "s1").await;
    tomb(e.shard("s1"), "c1", "kc", "s0").await;
    e.mapping.put("kc", "s0").await.unwrap();
    assert_eq!(
        r.get("kc", "users").await.unwrap_err().code(),
        "MIGRATION_CHAIN_EXCEEDED"
    );
    // an unconfigured shard
    tomb(e.shard("s0"), "u0", "ku", "nowhere").await;
    e.mapping.put("ku", "s0").await.unwrap();
    assert_eq!(
        r.get("ku", "users").await.unwrap_err().code(),
        "MIGRATION_LOOKUP_UNAVAILABLE"
    );
    assert_eq!(r.get_with("ku", "users", be).await.unwrap(), None);
    // a failed lookup
    e.mapping.put("kf", "s5").await.unwrap();
    e.shard("s5")
        .execute(&Statement::new("DROP TABLE durability_retired"))
        .await
        .unwrap();
    assert_eq!(
        r.get("kf", "users").await.unwrap_err().code(),
        "MIGRATION_LOOKUP_UNAVAILABLE"
    );
    assert_eq!(r.get_with("kf", "users", be).await.unwrap(), None);
}

#[tokio::test]
async fn recovery_lease_in_progress_takeover_and_fence() {
    let (e, r) = seeded(2, false).await;
    // A live lease held by someone else.
    e.shard("s0")
        .execute(&Statement::with_params(
            "INSERT INTO durability_migration_lease (scope, holder, generation, expires_ms) VALUES ('default', 'other', 7, ?1)",
            vec![Value::Integer(e.clock.now_ms() + 60_000)],
        ))
        .await
        .unwrap();
    let err = r.recover_migrations().await.unwrap_err();
    assert_eq!(err.code(), "RECOVERY_IN_PROGRESS");
    let err = repair(&r).await.unwrap_err();
    assert_eq!(err.code(), "RECOVERY_IN_PROGRESS", "repair takes the lease");
    assert!(
        r.verify_migrations(VerifyOptions::default()).await.is_ok(),
        "plain verify does not"
    );
    e.clock.advance(60_001);
    let rep = r.recover_migrations().await.unwrap();
    assert_eq!(rep.generation, 8, "takeover at a higher generation");
    // A stalled recovery: leave an interrupted move, then stall recovery A.
    e.interrupt_move("u1", "s1", "users", 3, FaultMode::Before)
        .await;
    // Its second write advances the clock past the recovery lease (a
    // recovery that stalls between its lease check and a write).
    let clock = e.clock.clone();
    let stall: Hook = Box::new(move || {
        clock.advance(61_000);
        Box::pin(async {})
    });
    let stall: Arc<dyn Shard> = Arc::new(hook_shard(e.shard("s0").clone(), 2, Some(stall), false));
    let cfg = hooked_config(&e, stall)
        // The tables every router of the harness knows (the interrupted
        // move fences them all).
        .table("docs")
        .table_with_key_column("orgs", "org_id");
    let a = Router::new(cfg).unwrap();
    let before_gen = 8;
    let err = a.recover_migrations().await.unwrap_err();
    assert_eq!(err.code(), "RECOVERY_FENCED", "{err}");
    let b = e.router().await;
    e.clock.advance(31_000);
    let rep = b.recover_migrations().await.unwrap();
    assert!(
        rep.generation > before_gen + 1,
        "b took over after a: {}",
        rep.generation
    );
    assert_eq!(rep.committed.len(), 1, "{rep:?}");
    assert_eq!(e.live("users", "id", "u1").await.len(), 1);
    clean_verify(&b).await;
}

#[tokio::test]
async fn racing_recoveries_never_overlap() {
    let (e, a) = seeded(2, false).await;
    let b = e.router().await;
    e.interrupt_move("u1", "s1", "users", 3, FaultMode::Before)
        .await;
    let mut oks = 0;
    for _ in 0..10 {
        let (x, y) = tokio::join!(a.recover_migrations(), b.recover_migrations());
        for res in [x, y] {
            match res {
                Ok(_) => oks += 1,
                Err(e) => assert_eq!(e.code(), "RECOVERY_IN_PROGRESS"),
            }
        }
    }
    assert!(oks >= 10);
    assert_eq!(e.live("users", "id", "u1").await.len(), 1);
    assert_eq!(op_of(&a, "u1", "users").await.state, MoveState::Retired);
}

#[tokio::test]
async fn retention_purge_and_tombstones() {
    let e = env(2);
    let r = e.router().await;
    e.mapping.put("u1", "s0").await.unwrap();
    e.mapping.put("u2", "s0").await.unwrap();
    r.insert("u1", "users", user("ann", 1)).await.unwrap();
    r.insert("u2", "users", user("bob", 1)).await.unwrap();
    let m1 = r.reassign_shard("u1", "s1", "users").await.unwrap();
    let m2 = r
        .reassign_shard_with(
            "u2",
            "s1",
            "users",
            MoveOptions {
                retire: Retire::Immediate,
            },
        )
        .await
        .unwrap();
    let rep = r.purge_retired().await.unwrap();
    let codes: BTreeMap<String, &str> = rep
        .refused
        .iter()
        .map(|f| (f.op_id.clone(), f.error.code()))
        .collect();
    assert_eq!(codes.get(&m1.op_id), Some(&"RETENTION_NOT_ELAPSED"));
    assert_eq!(codes.get(&m2.op_id), Some(&"NOT_VERIFIED"));
    assert!(rep.purged.is_empty());
    assert!(
        r.verify_migrations(VerifyOptions::default())
            .await
            .unwrap()
            .clean
    );
    let rep = r.purge_retired().await.unwrap();
    assert_eq!(rep.purged, vec![m2.op_id.clone()]);
    e.clock.advance(7 * 24 * 3600 * 1000);
    let rep = r.purge_retired().await.unwrap();
    assert_eq!(rep.purged, vec![m1.op_id.clone()]);
    let t = users_tombstones(&e, "payload, purged").await;
    assert_eq!(t.len(), 2, "tombstones stay after a purge");
    assert!(t.iter().all(|r| r.get("payload") == Some(&Value::Null)));
    let st = Dialect::Sqlite.fenced_update(
        &Ident::new("users").unwrap(),
        &Ident::new("id").unwrap(),
        "u1",
        &[(Ident::new("n").unwrap(), Value::Integer(5))],
    );
    e.shard("s0")
        .execute(&Statement::new(
            "INSERT INTO users (id, name) VALUES ('u1', 'stale')",
        ))
        .await
        .unwrap();
    assert_eq!(
        e.shard("s0").execute(&st).await.unwrap(),
        0,
        "stale writers stay refused"
    );
    let rep = repair(&r).await.unwrap();
    assert_eq!(
        rep.ghosts.len(),
        1,
        "a purged archive cannot prove a ghost: {rep:?}"
    );
}

#[tokio::test]
async fn verify_finds_and_repairs_leftovers() {
    // Journal on its own shard, so the cutover is a separate write.
    let mut e = env(3);
    e.journal = "s2";
    let r = e.router_with(true, 30_000).await;
    e.mapping.put("u1", "s0").await.unwrap();
    e.mapping.put("u2", "s0").await.unwrap();
    r.insert("u1", "users", user("ann", 1)).await.unwrap();
    r.insert("u2", "users", user("bob", 1)).await.unwrap();
    // Ghost: the archived row reappears on the source (a stale raw write).
    r.reassign_shard("u2", "s1", "users").await.unwrap();
    e.shard("s0")
        .execute(&Statement::new(
            "INSERT INTO users (id, name, n) VALUES ('u2', 'bob', 1)",
        ))
        .await
        .unwrap();
    // An aborted move: claim(1) copy(2) copied..cutover_pending(3), crash
    // before the cutover (4), then the source changes.
    e.plan.arm(4, FaultMode::Before);
    assert!(r.reassign_shard("u1", "s1", "users").await.is_err());
    e.plan.disarm();
    let original = user_row_on(&e, "s0").await;
    assert_eq!(
        r.update("u1", "users", user("ann2", 2)).await.unwrap(),
        1,
        "no fence before the cutover"
    );
    e.clock.advance(31_000);
    let rep = r.recover_migrations().await.unwrap();
    assert_eq!(rep.aborted.len(), 1, "{rep:?}");
    let op = op_of(&r, "u1", "users").await;
    assert_eq!(op.state, MoveState::Aborted);
    assert_eq!(
        e.live("users", "id", "u1").await.len(),
        1,
        "abort dropped the copy"
    );
    // A stale destination insert lands late: a stranded copy.
    e.shard("s1")
        .execute(&Dialect::Sqlite.insert_row(&Ident::new("users").unwrap(), &columns(&original)))
        .await
        .unwrap();
    // A stale cutover lands late on the source.
    let current = user_row_on(&e, "s0").await;
    let tables = [CutoverTable {
        table: Ident::new("users").unwrap(),
        key_col: Ident::new("id").unwrap(),
        row: Some(columns(&current)),
        payload: Some(encode_row(&current)),
        digest: digest(Some(&current)),
    }];
    let c = Cutover {
        op_id: &op.op_id,
        scope: "default",
        key: "u1",
        moved_to: "s1",
        now_ms: 1,
        tables: &tables,
        journal_owner: None,
    };
    e.shard("s0")
        .batch(&Dialect::Sqlite.cutover_batch(&c))
        .await
        .unwrap();
    // A tombstone no journal knows.
    tomb(e.shard("s1"), "unknown-op", "zz", "s0").await;
    // Written behind the router's back: a full pass finds them all.
    let full = VerifyOptions {
        full: true,
        ..VerifyOptions::default()
    };
    let rep = r.verify_migrations(full).await.unwrap();
    assert!(!rep.clean);
    assert_eq!(rep.ghosts.len(), 1, "{rep:?}");
    assert_eq!(rep.stranded_copies.len(), 1, "{rep:?}");
    assert_eq!(rep.stale_cutovers.len(), 1, "{rep:?}");
    assert!(rep.stale_cutovers[0].restorable);
    assert_eq!(rep.stranded_archives.len(), 1, "{rep:?}");
    assert!(rep.dangling_ops.is_empty());
    let rep = repair(&r).await.unwrap();
    assert_eq!(rep.repaired.len(), 3, "{rep:?}");
    assert_eq!(
        rep.stranded_archives.len(),
        1,
        "stranded archives are reported, never repaired"
    );
    assert!(!rep.clean);
    e.shard("s1")
        .execute(&Statement::new(
            "DELETE FROM durability_retired WHERE op_id = 'unknown-op'",
        ))
        .await
        .unwrap();
    clean_verify(&r).await;
    for k in ["u1", "u2"] {
        assert_eq!(e.live("users", "id", k).await.len(), 1, "{k}");
    }
    assert_eq!(
        r.get("u1", "users").await.unwrap().unwrap().get("name"),
        Some(&Value::from("ann2"))
    );
    assert_eq!(
        r.update("u1", "users", user("ann3", 3)).await.unwrap(),
        1,
        "restored row is writable"
    );
}

#[tokio::test]
async fn migrate_record_conflicts() {
    let e = env(2);
    let r = e.router().await;
    let ins = |s: &str, name: &str| {
        Statement::new(format!(
            "INSERT INTO users (id, name) VALUES ('{s}', '{name}')"
        ))
    };
    e.shard("s0").execute(&ins("a", "x")).await.unwrap();
    e.shard("s1").execute(&ins("a", "y")).await.unwrap();
    let err = r
        .migrate_record("s0", "s1", "a", "users", MigrateOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "DESTINATION_CONFLICT");
    assert_eq!(e.live("users", "id", "a").await.len(), 2, "nothing changed");
    r.migrate_record(
        "s0",
        "s1",
        "a",
        "users",
        MigrateOptions {
            on_conflict: OnConflict::Replace,
        },
    )
    .await
    .unwrap();
    let live = e.only_row("users", "id", "a").await;
    assert_eq!(live.0, "s1");
    assert_eq!(live.1.get("name"), Some(&Value::from("x")));
    e.shard("s0").execute(&ins("b", "same")).await.unwrap();
    e.shard("s1").execute(&ins("b", "same")).await.unwrap();
    r.migrate_record("s0", "s1", "b", "users", MigrateOptions::default())
        .await
        .unwrap();
    assert_eq!(
        e.live("users", "id", "b").await.len(),
        1,
        "identical row counts as a retried copy"
    );
    assert_eq!(
        r.migrate_record("s0", "s1", "zz", "users", MigrateOptions::default())
            .await
            .unwrap_err()
            .code(),
        "MIGRATION_ROW_NOT_FOUND"
    );
}

#[tokio::test]
async fn rebalance_plans_and_moves() {
    let e = env(3);
    let r = e.router().await;
    for i in 0..60 {
        let k = format!("key{i:03}");
        e.mapping.put(&k, "s0").await.unwrap();
        r.insert(&k, "users", user(&k, i)).await.unwrap();
    }
    let dry = r
        .rebalance(RebalanceOptions {
            dry_run: true,
            tables: vec!["users".into()],
            page_size: 7,
            ..RebalanceOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(dry.examined, 60);
    assert!(dry.planned > 20 && dry.moved == 0, "{dry:?}");
    assert!(
        e.mapping
            .scan(None, 100)
            .await
            .unwrap()
            .iter()
            .all(|(_, s)| s == "s0"),
        "dry run changes nothing"
    );
    let rep = r
        .rebalance(RebalanceOptions {
            tables: vec!["users".into()],
            page_size: 7,
            ..RebalanceOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(rep.moved, dry.planned, "{rep:?}");
    let names = ["s0", "s1", "s2"];
    for i in 0..60 {
        let k = format!("key{i:03}");
        let owner = durability_migration::hash_owner(&k, &names).unwrap();
        let live = e.only_row("users", "id", &k).await;
        assert_eq!(live.0, owner, "{k}");
        assert_eq!(
            r.get(&k, "users").await.unwrap().unwrap().get("n"),
            Some(&Value::from(i))
        );
    }
    let again = r
        .rebalance(RebalanceOptions {
            dry_run: true,
            ..RebalanceOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(again.planned, 0);
    clean_verify(&r).await;
    // Verification pages through every tombstone: a ghost behind the last
    // tombstone on s0 is found with pages of three.
    let last_moved = (0..60)
        .map(|i| format!("key{i:03}"))
        .filter(|k| durability_migration::hash_owner(k, &names) != Some("s0"))
        .max()
        .unwrap();
    r.raw_execute(
        "s0",
        &Statement::with_params(
            "INSERT INTO users (id, name, n) VALUES (?1, 'ghost', 0)",
            vec![Value::from(last_moved.as_str())],
        ),
    )
    .await
    .unwrap();
    let rep = r
        .verify_migrations(VerifyOptions {
            page_size: 3,
            full: true,
            ..VerifyOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(rep.ghosts.len(), 1, "{rep:?}");
    assert_eq!(
        (rep.ghosts[0].shard.as_str(), rep.ghosts[0].key.as_str()),
        ("s0", last_moved.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_lose_no_acknowledged_write() {
    let e = Arc::new(env(2));
    let r = Arc::new(e.router().await);
    e.mapping.put("d", "s0").await.unwrap();
    r.insert(
        "d",
        "docs",
        row([("w0", 0i64), ("w1", 0), ("w2", 0), ("w3", 0)]),
    )
    .await
    .unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let r = Arc::clone(&r);
        let done = Arc::clone(&done);
        writers.push(tokio::spawn(async move {
            let (mut acked, mut pending, mut j) = (0i64, 0u64, 0i64);
            while !done.load(Ordering::SeqCst) || j < 50 {
                j += 1;
                match r.update("d", "docs", row([(format!("w{w}"), j)])).await {
                    Ok(1) => acked = j,
                    Ok(n) => panic!("write changed {n} rows"),
                    Err(e) if e.code() == "MIGRATION_CUTOVER_PENDING" => pending += 1,
                    Err(e) => panic!("{e}"),
                }
                tokio::task::yield_now().await;
            }
            (acked, pending)
        }));
    }
    let (mut moved, mut aborted) = (0, 0);
    for i in 0..8 {
        let to = if i % 2 == 0 { "s1" } else { "s0" };
        match r.reassign_shard("d", to, "docs").await {
            Ok(_) => moved += 1,
            Err(err)
                if err.code() == "MIGRATION_ABORTED" || err.code() == "MIGRATION_SAME_SHARD" =>
            {
                aborted += 1
            }
            Err(err) => panic!("{err}"),
        }
    }
    done.store(true, Ordering::SeqCst);
    let mut acked = Vec::new();
    let mut pending = 0;
    for w in writers {
        let (a, p) = w.await.unwrap();
        acked.push(a);
        pending += p;
    }
    println!(
        "concurrent writers: {moved} moves committed, {aborted} aborted, {pending} writes refused with MIGRATION_CUTOVER_PENDING"
    );
    let live = e.only_row("docs", "id", "d").await;
    for (w, a) in acked.iter().enumerate() {
        assert_eq!(
            live.1.get(&format!("w{w}")),
            Some(&Value::Integer(*a)),
            "writer {w}: last acknowledged write is in the row"
        );
    }
    assert!(moved > 0, "at least one move committed under load");
    clean_verify(&r).await;
}

/// One crash scenario: set up, crash the operation at write `n`, then a
/// fresh process recovers (optionally crashing the recovery at write `m`
/// first) and verifies. Returns whether the crash point (and the recovery's
/// crash point) was reached.
async fn crash_case(
    journal_apart: bool,
    tables: &[&str],
    n: u64,
    mode: FaultMode,
    recovery_crash: Option<(u64, FaultMode)>,
) -> (bool, bool) {
    let mut e = env(3);
    if journal_apart {
        e.journal = "s2";
    }
    let run = e.crash_move(tables, n, mode, recovery_crash).await;
    run.check(&e, tables, &format!("n={n} {mode:?} {recovery_crash:?}"))
        .await;
    (run.tripped, run.recovery_tripped)
}

async fn crash_points(journal_apart: bool, tables: &[&str]) -> (u64, u64) {
    let mut tried = 0;
    let mut recovery_tried = 0;
    for mode in [FaultMode::Before, FaultMode::After] {
        let mut n = 1;
        while crash_case(journal_apart, tables, n, mode, None).await.0 {
            tried += 1;
            // Crash the recovery of this crash at each of its writes.
            let mut m = 1;
            while crash_case(journal_apart, tables, n, mode, Some((m, mode)))
                .await
                .1
            {
                recovery_tried += 1;
                m += 1;
            }
            n += 1;
        }
    }
    (tried, recovery_tried)
}

/// Crashes a move of `tables` (`what`) at each of its writes, and its
/// recovery at each of its writes, with the journal on the source shard
/// (`committed` joins the cutover batch) and on a third shard (every
/// journal step is its own write).
async fn crash_at_every_write(what: &str, tables: &[&str]) {
    for (journal_apart, place, at_least) in [(false, "on the source", 10), (true, "apart", 14)] {
        let (moves, recoveries) = crash_points(journal_apart, tables).await;
        println!(
            "{what} move, journal {place}: {moves} crash points tried, {recoveries} recovery crash points tried"
        );
        assert!(
            moves >= at_least,
            "every journal step and shard write is a crash point ({moves})"
        );
    }
}

#[tokio::test]
async fn crash_at_every_write_of_a_move() {
    crash_at_every_write("single-table", &["users"]).await;
}

#[tokio::test]
async fn crash_at_every_write_of_a_table_set_move() {
    crash_at_every_write("table-set", &["users", "orgs"]).await;
}

type Hook = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// A write hook that runs a hook (any async work) before the Nth write, and
/// can change the row before every cutover (a writer that always wins).
struct OnWrite {
    at: u64,
    n: AtomicU64,
    hook: std::sync::Mutex<Option<Hook>>,
    bump_before_cutover: bool,
}

/// A shard over `inner` with an [`OnWrite`] hook.
fn hook_shard(
    inner: Arc<dyn Shard>,
    at: u64,
    hook: Option<Hook>,
    bump_before_cutover: bool,
) -> HookedShard<OnWrite> {
    HookedShard {
        inner,
        hook: OnWrite {
            at,
            n: AtomicU64::new(0),
            hook: std::sync::Mutex::new(hook),
            bump_before_cutover,
        },
    }
}

impl BeforeWrite for OnWrite {
    fn before_write<'a>(
        &'a self,
        inner: &'a Arc<dyn Shard>,
        stmts: &'a [Statement],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            if self.n.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
                let hook = self.hook.lock().unwrap().take();
                if let Some(h) = hook {
                    h().await;
                }
            }
            if self.bump_before_cutover
                && stmts
                    .iter()
                    .any(|s| s.sql.starts_with("INSERT INTO durability_retired"))
            {
                let st = Statement::new("UPDATE users SET n = n + 1 WHERE id = 'u1'");
                inner.execute(&st).await.unwrap();
            }
            Ok(())
        })
    }
}

fn hooked_config(e: &Harness, s0: Arc<dyn Shard>) -> MigrationConfig {
    MigrationConfig::new(e.mapping.clone())
        .shard("s0", s0)
        .shard("s1", e.shard("s1").clone())
        .journal_shard("s0")
        .clock(Arc::new(e.clock.clone()))
        .clock_domain(e.clock_domain.clone())
        .table("users")
}

#[tokio::test]
async fn move_aborts_when_copies_are_used_up() {
    let (e, r) = seeded(2, false).await;
    let s0: Arc<dyn Shard> = Arc::new(hook_shard(e.shard("s0").clone(), 0, None, true));
    let mover = Router::new(hooked_config(&e, s0)).unwrap();
    let err = mover.reassign_shard("u1", "s1", "users").await.unwrap_err();
    assert_eq!(err.code(), "MIGRATION_ABORTED", "{err}");
    let st = op_of(&r, "u1", "users").await;
    assert_eq!((st.state, st.attempts), (MoveState::Aborted, 3));
    let live = e.only_row("users", "id", "u1").await;
    assert_eq!(live.0, "s0", "key stays, copy dropped");
    assert_eq!(
        live.1.get("n"),
        Some(&Value::Integer(5)),
        "every winning write kept"
    );
    assert_eq!(r.route("u1").await.unwrap().as_deref(), Some("s0"));
    clean_verify(&r).await;
}

#[tokio::test]
async fn mover_taken_over_by_recovery_stops() {
    let e = Arc::new(env(2));
    let r = e.router().await;
    e.seed_ann(&r).await;
    let e2 = Arc::clone(&e);
    let hook: Hook = Box::new(move || {
        Box::pin(async move {
            // The mover stalls past its liveness; a recovery takes over.
            e2.clock.advance(31_000);
            let rec = e2.router().await;
            let rep = rec.recover_migrations().await.unwrap();
            assert_eq!(rep.committed.len(), 1, "{rep:?}");
        })
    });
    // s0 writes of the mover: claim (1), copied+verified+cutover_pending (2).
    let s0: Arc<dyn Shard> = Arc::new(hook_shard(e.shard("s0").clone(), 2, Some(hook), false));
    let mover = Router::new(hooked_config(&e, s0)).unwrap();
    let err = mover.reassign_shard("u1", "s1", "users").await.unwrap_err();
    assert_eq!(err.code(), "MIGRATION_TAKEN_OVER", "{err}");
    assert!(err.is_outcome_unknown());
    let live = e.only_row("users", "id", "u1").await;
    assert_eq!(live.0, "s1");
    assert_eq!(op_of(&r, "u1", "users").await.state, MoveState::Retired);
    clean_verify(&r).await;
}

#[tokio::test]
async fn backend_failures_are_outcome_unknown() {
    let (e, r) = seeded(2, true).await;
    e.plan.arm(2, FaultMode::After);
    let err = r.reassign_shard("u1", "s1", "users").await.unwrap_err();
    assert_eq!(err.code(), "SHARD_UNAVAILABLE");
    assert!(err.is_outcome_unknown() && err.is_retryable());
    e.plan.disarm();
    e.clock.advance(31_000);
    r.recover_migrations().await.unwrap();
    // Journal s0 apart from the source s1: claim (1), copy (2),
    // copied+verified+cutover_pending (3), cutover (4), committed (5),
    // lifting the old fence on s0 (6), mapping (7).
    e.plan.arm(7, FaultMode::Before);
    let err = r.reassign_shard("u1", "s0", "users").await.unwrap_err();
    assert_eq!(err.code(), "MAPPING_UNAVAILABLE");
    e.plan.disarm();
    let fresh = e.router().await;
    assert_eq!(
        fresh
            .update("u1", "users", user("x", 2))
            .await
            .unwrap_err()
            .code(),
        "MIGRATION_CUTOVER_PENDING"
    );
    e.clock.advance(31_000);
    fresh.recover_migrations().await.unwrap();
    assert_eq!(fresh.update("u1", "users", user("x", 2)).await.unwrap(), 1);
    clean_verify(&fresh).await;
}

/// The cutover batch is prepared once and reused for every key: SQLite
/// re-prepares a statement on every new binding when its `WHERE` holds
/// sibling `EXISTS` terms with non-key columns, which the nested predicate
/// avoids (a re-prepare per move cost a fifth of a move's time).
#[test]
fn cutover_statements_are_not_reprepared_per_key() {
    use rusqlite::{Connection, StatementStatus, params_from_iter};

    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(SCHEMA).unwrap();
    let d = Dialect::Sqlite;
    for st in d.retired_schema().iter().chain(&d.journal_schema()) {
        conn.execute_batch(&st.sql).unwrap();
    }
    conn.execute_batch(
        "INSERT INTO users VALUES ('u1', 'a', 1), ('u2', 'b', 2);
         INSERT INTO durability_migration_ops (op_id, scope, mkey, tables, source, target, \
         state, attempts, digests, owner, live_until_ms, retain_ms, created_ms, updated_ms) \
         VALUES ('op1', 'default', 'u1', 'users,orgs', 's0', 's1', 'cutover_pending', 0, '', \
         'me', 0, 0, 0, 0), ('op2', 'default', 'u2', 'users,orgs', 's0', 's1', \
         'cutover_pending', 0, '', 'me', 0, 0, 0, 0);",
    )
    .unwrap();
    let batch = |key: &str, op: &str, n: i64, name: &str| {
        let r = row([
            ("id", Value::from(key)),
            ("name", Value::from(name)),
            ("n", Value::Integer(n)),
        ]);
        let tables = vec![
            CutoverTable {
                table: Ident::new("users").unwrap(),
                key_col: Ident::new("id").unwrap(),
                row: Some(
                    r.iter()
                        .map(|(c, v)| (Ident::new(c).unwrap(), v.clone()))
                        .collect(),
                ),
                payload: Some(encode_row(&r)),
                digest: digest(Some(&r)),
            },
            CutoverTable {
                table: Ident::new("orgs").unwrap(),
                key_col: Ident::new("org_id").unwrap(),
                row: None,
                payload: None,
                digest: digest(None),
            },
        ];
        d.cutover_batch(&Cutover {
            op_id: op,
            scope: "default",
            key,
            moved_to: "s1",
            now_ms: 1,
            tables: &tables,
            journal_owner: Some("me"),
        })
    };
    let first = batch("u1", "op1", 1, "a");
    let second = batch("u2", "op2", 2, "b");
    assert_eq!(first.len(), second.len());
    for (a, b) in first.iter().zip(&second) {
        assert_eq!(a.sql, b.sql, "one statement text for every key");
        let mut st = conn.prepare(&a.sql).unwrap();
        let run = |st: &mut rusqlite::Statement<'_>, s: &Statement| {
            st.execute(params_from_iter(s.params.iter().map(|v| match v {
                Value::Text(t) => rusqlite::types::Value::Text(t.clone()),
                Value::Integer(i) => rusqlite::types::Value::Integer(*i),
                Value::Blob(b) => rusqlite::types::Value::Blob(b.clone()),
                Value::Real(f) => rusqlite::types::Value::Real(*f),
                Value::Null => rusqlite::types::Value::Null,
            })))
            .unwrap()
        };
        assert_eq!(run(&mut st, a), 1, "{}", a.sql);
        assert_eq!(run(&mut st, b), 1, "{}", b.sql);
        assert_eq!(
            st.get_status(StatementStatus::RePrepare),
            0,
            "re-prepared on a new binding: {}",
            a.sql
        );
    }
    let live: i64 = conn
        .query_row("SELECT count(*) FROM users", [], |r| r.get(0))
        .unwrap();
    assert_eq!(live, 0, "both cutovers hit");
}

/// Three shards, `u1` on `s0` with a users row (and none in the other
/// tables), and a move of its users row to `s1` through a faulty router
/// that crashed at write `crash` (the plan disarmed again).
async fn interrupted_move(crash: u64, mode: FaultMode) -> (Harness, Router) {
    let (e, r) = seeded(3, true).await;
    e.plan.arm(crash, mode);
    assert!(r.reassign_shard("u1", "s1", "users").await.is_err());
    e.plan.disarm();
    (e, r)
}

/// A key has one active move at a time, whatever its tables (the claim is
/// the key's); a claim a finished operation still holds (only a journal
/// written by other means has one) is released by recovery and reported.
#[tokio::test]
async fn one_active_move_per_key_and_leftover_claims_released() {
    // The users move's claim lands, its copy crashes.
    let (e, r) = interrupted_move(2, FaultMode::Before).await;
    let before = dump(&e).await;
    let err = r.reassign_shard("u1", "s2", "orgs").await.unwrap_err();
    assert_eq!(err.code(), "MIGRATION_ALREADY_ACTIVE");
    assert_eq!(dump(&e).await, before, "a refused claim writes nothing");
    e.clock.advance(31_000);
    let rep = r.recover_migrations().await.unwrap();
    assert_eq!(rep.committed.len(), 1, "{rep:?}");
    assert!(rep.released.is_empty(), "{rep:?}");

    let moved = r.reassign_shard("u1", "s2", "users").await.unwrap();
    e.shard("s0")
        .execute(&Statement::new(format!(
            "UPDATE durability_migration_ops SET claim = 'u1' WHERE op_id = '{}'",
            moved.op_id
        )))
        .await
        .unwrap();
    let err = r.reassign_shard("u1", "s0", "users").await.unwrap_err();
    assert_eq!(err.code(), "MIGRATION_ALREADY_ACTIVE");
    let rep = r.recover_migrations().await.unwrap();
    assert_eq!(rep.released, vec![moved.op_id.clone()], "{rep:?}");
    assert!(rep.examined.is_empty(), "{rep:?}");
    r.reassign_shard("u1", "s0", "users").await.unwrap();
    assert_eq!(e.only_row("users", "id", "u1").await.0, "s0");
    clean_verify(&r).await;
}

/// A move that stopped on an error is resumed at once by the router that
/// started it, when called again for the same key and target naming tables
/// it moves (every configured table on both shards: a call naming another
/// of them is the same move) (no wait for its liveness to lapse, no
/// recovery); another router or another target gets
/// `MIGRATION_ALREADY_ACTIVE`.
#[tokio::test]
async fn own_interrupted_move_resumes_when_called_again() {
    // Write 2 is the copy (crashes before applying: state `prepared`);
    // write 5 is the mapping put (applies, then fails: state `committed`,
    // the mapping already names the target).
    for (crash, mode, state) in [
        (2, FaultMode::Before, MoveState::Prepared),
        (5, FaultMode::After, MoveState::Committed),
    ] {
        let (e, r) = interrupted_move(crash, mode).await;
        let st = op_of(&r, "u1", "users").await;
        assert_eq!(st.state, state, "crash at write {crash}");
        let other = e.router().await;
        for (who, target, table) in [
            (&other, "s1", "users"),
            (&r, "s2", "users"),
            (&r, "s2", "orgs"),
        ] {
            let err = who.reassign_shard("u1", target, table).await.unwrap_err();
            assert!(
                matches!(
                    err.code(),
                    "MIGRATION_ALREADY_ACTIVE" | "MIGRATION_SAME_SHARD"
                ),
                "crash at write {crash}, {target}/{table}: {err}"
            );
        }
        // Naming another table it moves resumes it as well.
        let out = r.reassign_shard("u1", "s1", "orgs").await.unwrap();
        assert_eq!(out.op_id, st.op_id, "the interrupted operation itself");
        let st = op_of(&r, "u1", "users").await;
        assert_eq!(st.state, MoveState::Retired);
        let live = e.only_row("users", "id", "u1").await;
        assert_eq!(live.0, "s1");
        assert_eq!(r.route("u1").await.unwrap().as_deref(), Some("s1"));
        clean_verify(&r).await;
    }
}
