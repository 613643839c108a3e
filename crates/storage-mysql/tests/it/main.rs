//! `MysqlShard` against a real MariaDB server: the conformance suite, batch
//! rollback, found-rows counting and retried deadlocks. Each test works in a
//! database of its own.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use durability_migration::MappingStore;
use durability_migration::conformance::harness::{failed_batches_roll_back, insert_t};
use durability_migration::{Shard, Statement, Value};
use durability_storage_mysql::MysqlMappingStore;
use durability_storage_mysql::testkit::TestDatabase;

durability_migration::shard_conformance!(mysql_shard_conforms, "conf_t", async {
    let db = TestDatabase::create().await?;
    Some((db.shard(), db))
});

durability_migration::mapping_store_conformance!(mysql_mapping_store_conforms, "c:", async {
    let db = TestDatabase::create().await?;
    let store = MysqlMappingStore::new(db.shard()).await.unwrap();
    Some((store, db))
});

#[tokio::test]
async fn mysql_mapping_store_keys_are_bytes() {
    let Some(db) = TestDatabase::create().await else {
        return;
    };
    let store = MysqlMappingStore::new(db.shard()).await.unwrap();
    // Keys are bytes: no case folding, no trailing-space padding.
    for (a, b) in [("K", "k"), ("k", "k ")] {
        store.put(a, "s1").await.unwrap();
        store.put(b, "s2").await.unwrap();
        assert_eq!(
            store.get(a).await.unwrap().as_deref(),
            Some("s1"),
            "{a:?} vs {b:?}"
        );
    }
}

#[tokio::test]
async fn failed_batch_rolls_back_every_statement() {
    let Some(db) = TestDatabase::create().await else {
        return;
    };
    let shard = db.shard();
    shard
        .query_drop("CREATE TABLE t (id VARCHAR(64) PRIMARY KEY, n BIGINT NOT NULL)")
        .await
        .unwrap();
    let ins = |id: &str, n: Value| insert_t(&shard, id, n);
    failed_batches_roll_back(
        &shard,
        vec![
            ins("a", Value::Null),
            Statement::new("UPDATE t SET missing = 1"),
            ins("x", 3i64.into()),
        ],
    )
    .await;
    // An update that matches but changes nothing still counts its row.
    let same = Statement::with_params(
        "UPDATE t SET n = ? WHERE id = ?",
        vec![1i64.into(), "x".into()],
    );
    assert_eq!(shard.execute(&same).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conflicting_batches_are_retried_not_lost() {
    let Some(db) = TestDatabase::create().await else {
        return;
    };
    let shard = Arc::new(db.shard());
    shard
        .query_drop("CREATE TABLE c (id VARCHAR(64) PRIMARY KEY, n BIGINT NOT NULL)")
        .await
        .unwrap();
    shard
        .query_drop("INSERT INTO c VALUES ('k', 0)")
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let shard = Arc::clone(&shard);
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                // A shared read then a write in one transaction: concurrent
                // batches deadlock, and the loser is retried.
                let stmts = [
                    Statement::new("SELECT n FROM c WHERE id = 'k'"),
                    Statement::new("UPDATE c SET n = n + 1 WHERE id = 'k'"),
                ];
                shard.batch(&stmts).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rows = shard
        .query(&Statement::new("SELECT n FROM c"))
        .await
        .unwrap();
    assert_eq!(rows[0].get("n"), Some(&Value::Integer(40)));
}

#[test]
fn shard_is_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<durability_storage_mysql::MysqlShard>();
    check::<MysqlMappingStore>();
}

/// Values whose literal form is easy to get wrong.
fn hostile_values() -> Vec<(Value, Value, Value, Value)> {
    vec![
        (
            "it's \\ a ? ; -- /* \"q\" `b`".into(),
            Value::Blob(vec![0, 0x27, 0x5c, 0xff, 0xfe]),
            Value::Integer(i64::MIN),
            Value::Real(-0.0),
        ),
        (
            "nul \0 and ünïcødé 🦀".into(),
            Value::Blob(Vec::new()),
            Value::Integer(i64::MAX),
            Value::Real(1.797_693_134_862_315_7e308),
        ),
        (
            String::new().into(),
            Value::Null,
            Value::Integer(-1),
            Value::Real(0.1),
        ),
        (
            "trailing space ".into(),
            Value::Blob(b"?".to_vec()),
            Value::Null,
            Value::Null,
        ),
    ]
}

#[tokio::test]
async fn batch_values_are_stored_as_bound_parameters_store_them() {
    let Some(db) = TestDatabase::create().await else {
        return;
    };
    let shard = db.shard();
    shard
        .query_drop(
            "CREATE TABLE v (id VARCHAR(64) COLLATE utf8mb4_nopad_bin PRIMARY KEY, \
             t LONGTEXT, b LONGBLOB, i BIGINT, r DOUBLE)",
        )
        .await
        .unwrap();
    let insert = |id: String, (t, b, i, r): (Value, Value, Value, Value)| {
        Statement::with_params(
            "INSERT INTO v (id, t, b, i, r) VALUES (?, ?, ?, ?, ?)",
            vec![id.into(), t, b, i, r],
        )
    };
    let values = hostile_values();
    // A batch (one multi-statement query) and single prepared statements.
    let batch: Vec<Statement> = values
        .iter()
        .enumerate()
        .map(|(n, v)| insert(format!("batch-{n}"), v.clone()))
        .collect();
    assert_eq!(shard.batch(&batch).await.unwrap(), vec![1; values.len()]);
    for (n, v) in values.iter().enumerate() {
        assert_eq!(
            shard
                .execute(&insert(format!("one-{n}"), v.clone()))
                .await
                .unwrap(),
            1
        );
    }
    let read = |id: String| {
        let shard = &shard;
        async move {
            let st =
                Statement::with_params("SELECT t, b, i, r FROM v WHERE id = ?", vec![id.into()]);
            shard.query(&st).await.unwrap().pop().unwrap()
        }
    };
    for (n, (t, b, i, r)) in values.into_iter().enumerate() {
        let batched = read(format!("batch-{n}")).await;
        assert_eq!(batched, read(format!("one-{n}")).await, "row {n}");
        assert_eq!(batched.get("t"), Some(&t), "row {n}");
        assert_eq!(batched.get("b"), Some(&b), "row {n}");
        assert_eq!(batched.get("i"), Some(&i), "row {n}");
        assert_eq!(batched.get("r"), Some(&r), "row {n}");
    }
    // Placeholders inside the batch's WHERE clauses match the stored bytes,
    // and an update that matches but changes nothing counts its row.
    let (t, ..) = hostile_values().remove(0);
    let counts = shard
        .batch(&[
            Statement::with_params(
                "UPDATE v SET i = i WHERE t = ? AND id = ?",
                vec![t.clone(), "batch-0".into()],
            ),
            Statement::with_params(
                "DELETE FROM v WHERE t = ? AND id = ?",
                vec![t, "one-0".into()],
            ),
            Statement::with_params("DELETE FROM v WHERE id = ?", vec!["absent".into()]),
        ])
        .await
        .unwrap();
    assert_eq!(counts, vec![1, 1, 0]);
}

#[tokio::test]
async fn a_failed_batch_leaves_its_connection_outside_any_transaction() {
    let Some(db) = TestDatabase::create().await else {
        return;
    };
    // One connection: the statement after the failed batch reuses it.
    let one = mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(&db.url()).unwrap())
        .pool_opts(
            mysql_async::PoolOpts::default()
                .with_constraints(mysql_async::PoolConstraints::new(1, 1).unwrap()),
        );
    let shard = durability_storage_mysql::MysqlShard::new(one.into());
    shard
        .query_drop("CREATE TABLE f (id VARCHAR(64) PRIMARY KEY, n BIGINT NOT NULL)")
        .await
        .unwrap();
    let ins = |id: &str| insert_t_named(id);
    let err = shard
        .batch(&[ins("a"), ins("b"), ins("a")])
        .await
        .unwrap_err();
    assert!(
        durability_migration::UniqueViolation::is(err.as_ref()),
        "a duplicate key is a definite rejection: {err}"
    );
    assert_eq!(shard.execute(&ins("c")).await.unwrap(), 1);
    // Another pool sees the single statement committed, and nothing of the
    // failed batch.
    let other = db.shard();
    let rows = other
        .query(&Statement::new("SELECT id FROM f ORDER BY id"))
        .await
        .unwrap();
    let ids: Vec<_> = rows.iter().map(|r| r.get("id").cloned()).collect();
    assert_eq!(ids, vec![Some(Value::from("c"))]);
}

fn insert_t_named(id: &str) -> Statement {
    Statement::with_params("INSERT INTO f (id, n) VALUES (?, 1)", vec![id.into()])
}
