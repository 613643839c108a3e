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
