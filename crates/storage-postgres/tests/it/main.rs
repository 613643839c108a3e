//! `PostgresShard` and `PostgresMappingStore` against a real PostgreSQL
//! server: the conformance suites, batch rollback, and retried
//! serialization failures; the lease store (`ownership`), the alarm index
//! (`alarms`), their round trips on the wire (`claim_round_trips`) and a
//! private server crashed and restarted under them (`restart`). Each test
//! works in a schema (or a server) of its own.

#![allow(clippy::unwrap_used)]

mod alarms;
mod claim_round_trips;
mod cluster;
mod ownership;
mod pg;
mod restart;

use std::sync::Arc;

use durability_migration::conformance::harness::{failed_batches_roll_back, insert_t};
use durability_migration::{Shard, Statement, Value};

mod outbox;
mod outbox_faults;
mod outbox_round_trips;
use durability_storage_postgres::PostgresMappingStore;
use durability_storage_postgres::testkit::TestSchema;

#[cfg(feature = "object")]
mod object;
#[cfg(feature = "object")]
mod object_commit_deadline;
#[cfg(feature = "object")]
mod object_crash;
#[cfg(feature = "object")]
mod object_fence;
#[cfg(feature = "object")]
mod object_fence_wait;
#[cfg(feature = "object")]
mod object_image;
#[cfg(feature = "object")]
mod object_restart;
#[cfg(feature = "object")]
mod object_round_trips;
#[cfg(feature = "object")]
mod object_support;

durability_migration::shard_conformance!(postgres_shard_conforms, "conf_t", async {
    let schema = TestSchema::create().await?;
    let shard = schema.shard().await;
    Some((shard, schema))
});

durability_migration::mapping_store_conformance!(postgres_mapping_store_conforms, "c:", async {
    let schema = TestSchema::create().await?;
    let store = PostgresMappingStore::new(schema.shard().await)
        .await
        .unwrap();
    Some((store, schema))
});

/// A shard in a schema of its own (dropped with the returned schema) where
/// `ddl` ran; `None` (said) without a server.
async fn shard_with(ddl: &str) -> Option<(TestSchema, durability_storage_postgres::PostgresShard)> {
    let schema = TestSchema::create().await?;
    let shard = schema.shard().await;
    shard.batch_execute(ddl).await.unwrap();
    Some((schema, shard))
}

#[tokio::test]
async fn failed_batch_rolls_back_every_statement() {
    let Some((_schema, shard)) =
        shard_with("CREATE TABLE t (id TEXT PRIMARY KEY, n BIGINT NOT NULL)").await
    else {
        return;
    };
    let ins = |id: &str, n: Value| insert_t(&shard, id, n);
    // The failing statement comes last, after two that succeeded; the pool
    // still works after failed transactions.
    failed_batches_roll_back(
        &shard,
        vec![
            ins("a", Value::Null),
            Statement::new("UPDATE t SET missing = 1"),
            ins("x", Value::from("not a number")),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conflicting_batches_are_retried_not_lost() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let shard = Arc::new(schema.shard_with_pool(4));
    shard
        .batch_execute("CREATE TABLE c (id TEXT PRIMARY KEY, n BIGINT NOT NULL); INSERT INTO c VALUES ('k', 0)")
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let shard = Arc::clone(&shard);
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                // Read then write in one serializable transaction: a lost
                // update would show as a short count.
                let stmts = [Statement::new(
                    "UPDATE c SET n = (SELECT n FROM c WHERE id = 'k') + 1 WHERE id = 'k'",
                )];
                assert_eq!(shard.batch(&stmts).await.unwrap(), vec![1]);
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

/// The race the isolation level closes: a cutover that found no row of the
/// key writes a tombstone while a routed insert of that key, which did not
/// see the uncommitted tombstone, lands. At `READ COMMITTED` both commit (a
/// live row behind a tombstone); at `SERIALIZABLE`, the shard's level, the
/// cutover's commit fails with a serialization failure, which the shard
/// retries as a whole batch (and the retry then sees the row).
#[tokio::test]
async fn serializable_refuses_a_cutover_racing_an_insert() {
    let Some((schema, shard)) =
        shard_with("CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT)").await
    else {
        return;
    };
    let d = shard.dialect();
    for st in d.retired_schema() {
        shard.execute(&st).await.unwrap();
    }
    let config = durability_storage_postgres::config_for(
        &durability_storage_postgres::testkit::url(),
        Some(schema.name()),
    )
    .unwrap();
    let (cutover, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let users = durability_migration::Ident::new("users").unwrap();
    let id = durability_migration::Ident::new("id").unwrap();
    for (level, key, refused) in [
        ("READ COMMITTED", "k1", false),
        ("SERIALIZABLE", "k2", true),
    ] {
        cutover
            .batch_execute(&format!(
                "BEGIN ISOLATION LEVEL {level}; \
                 SELECT 1 FROM users WHERE id = '{key}'; \
                 INSERT INTO durability_retired (op_id, tname, mkey, scope, moved_to, payload, \
                 digest, retired_ms) VALUES ('op-{key}', 'users', '{key}', 's', 'x', NULL, '-', 1)"
            ))
            .await
            .unwrap();
        let insert = d.fenced_insert(&users, key, &[(id.clone(), Value::from(key))], None);
        assert_eq!(
            shard.execute(&insert).await.unwrap(),
            1,
            "{level}: insert lands"
        );
        let commit = cutover.batch_execute("COMMIT").await;
        if refused {
            let err = commit.unwrap_err();
            assert_eq!(
                err.code(),
                Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE),
                "{err}"
            );
        } else {
            commit.unwrap();
            let tomb = shard.query(&d.tombstone_query(&users, key)).await.unwrap();
            assert_eq!(tomb.len(), 1, "{level}: a live row behind a tombstone");
        }
    }
}

#[test]
fn shard_and_store_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<durability_storage_postgres::PostgresShard>();
    check::<PostgresMappingStore>();
}
