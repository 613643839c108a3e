//! `Router::reconcile_allocations` on PostgreSQL: the ledger conformance
//! suite on `PostgresLedger`, and a reconciliation over two PostgreSQL
//! shards with the PostgreSQL mapping store and ledger (verify, a failing
//! probe, an unconfigured ledger shard, repair, prune, pages and `limit`).
//! Each test uses schemas of its own; without a server a test prints that it
//! skipped, unless `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use durability_migration::conformance;
use durability_migration::{
    AllocationLedger, Dialect, Ident, MappingStore, MigrationConfig, ReconcileOptions, RecordTable,
    Router, Shard, UncheckedReason, Value, VerifyRecords,
};
use durability_storage_postgres::testkit::TestSchema;
use durability_storage_postgres::{PostgresLedger, PostgresMappingStore, PostgresShard};

/// `s0` has both tables; `s1` has no `orgs`, so a probe of it there fails.
const S0_SCHEMA: &str = "
CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT, seen TIMESTAMPTZ DEFAULT now());
CREATE TABLE orgs (org_id TEXT PRIMARY KEY, title TEXT);
";
const S1_SCHEMA: &str =
    "CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT, seen TIMESTAMPTZ DEFAULT now());";

async fn put_row(shard: &PostgresShard, table: &str, col: &str, key: &str) {
    let cols = vec![(Ident::new(col).unwrap(), Value::from(key))];
    let st = Dialect::Postgres.insert_row(&Ident::new(table).unwrap(), &cols);
    assert_eq!(shard.execute(&st).await.unwrap(), 1);
}

#[tokio::test]
async fn postgres_ledger_passes_the_conformance_suite() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let ledger = PostgresLedger::new(schema.shard().await).await.unwrap();
    conformance::ledger_suite(&ledger).await;
    // Creating it again is idempotent and keeps the rows.
    let again = PostgresLedger::new(schema.shard().await).await.unwrap();
    assert_eq!(again.scan(None, 1000).await.unwrap().len(), 29);
}

#[tokio::test]
async fn reconcile_on_postgres_shards() {
    let Some(sc0) = TestSchema::create().await else {
        return;
    };
    let Some(sc1) = TestSchema::create().await else {
        return;
    };
    let s0 = sc0.shard().await;
    s0.batch_execute(S0_SCHEMA).await.unwrap();
    let s1 = sc1.shard().await;
    s1.batch_execute(S1_SCHEMA).await.unwrap();
    // The coordinator's ledger and the mapping store live in s0's schema.
    let mapping = Arc::new(PostgresMappingStore::new(sc0.shard().await).await.unwrap());
    let ledger = Arc::new(PostgresLedger::new(sc0.shard().await).await.unwrap());
    let config = MigrationConfig::new(mapping.clone())
        .shard("s0", Arc::new(s0.clone()))
        .shard("s1", Arc::new(s1.clone()))
        .journal_shard("s0")
        .table("users")
        .table_with_key_column("orgs", "org_id");
    let without = Router::new(config.clone()).unwrap();
    let router = Router::new(config.coordinator(ledger.clone())).unwrap();
    router.init().await.unwrap();

    // settled: mapped s0, row on s0, ledger s0 → agrees, verified, pruned.
    mapping.put("settled", "s0").await.unwrap();
    put_row(&s0, "users", "id", "settled").await;
    ledger.record("settled", "s0").await.unwrap();
    // differ: mapped s1 with its row there; ledger s0 → disagreement, verified on s1.
    mapping.put("differ", "s1").await.unwrap();
    put_row(&s1, "users", "id", "differ").await;
    ledger.record("differ", "s0").await.unwrap();
    // lost: unmapped, row on its ledger shard s0 (in orgs) → repaired.
    put_row(&s0, "orgs", "org_id", "lost").await;
    ledger.record("lost", "s0").await.unwrap();
    // gone: unmapped, no row → missing, not repaired.
    ledger.record("gone", "s0").await.unwrap();
    // unprobed: unmapped on s1, which has no orgs table → unchecked.
    ledger.record("unprobed", "s1").await.unwrap();
    // ghost: unconfigured ledger shard → unchecked.
    ledger.record("ghost", "s9").await.unwrap();

    let tables = VerifyRecords {
        tables: vec![RecordTable::new("users"), RecordTable::new("orgs")],
    };
    // Refusals write nothing.
    let err = without
        .reconcile_allocations(&ReconcileOptions {
            verify_records: Some(tables.clone()),
            repair: true,
            ..ReconcileOptions::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "COORDINATOR_NOT_CONFIGURED");
    let err = router
        .reconcile_allocations(&ReconcileOptions {
            repair: true,
            ..ReconcileOptions::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "RECONCILE_VERIFY_REQUIRED");
    assert_eq!(ledger.scan(None, 100).await.unwrap().len(), 6);
    assert_eq!(mapping.scan(None, 100).await.unwrap().len(), 2);

    // Pages of two with a limit of four, then resumed.
    let mut opts = ReconcileOptions {
        verify_records: Some(tables),
        repair: true,
        prune_verified: true,
        page_size: 2,
        limit: Some(4),
        ..ReconcileOptions::default()
    };
    let first = router.reconcile_allocations(&opts).await.unwrap();
    // Key order: differ, ghost, gone, lost | settled, unprobed.
    assert_eq!((first.examined, first.pages), (4, 2));
    assert_eq!(first.resume_after.as_deref(), Some("lost"));
    opts.after = first.resume_after.clone();
    let second = router.reconcile_allocations(&opts).await.unwrap();
    assert_eq!((second.examined, second.resume_after.clone()), (2, None));

    let agreed = first.routing_agreed + second.routing_agreed;
    assert_eq!(agreed, 1, "settled");
    assert_eq!(first.disagreeing_count + second.disagreeing_count, 5);
    assert_eq!(first.unrouted + second.unrouted, 4);
    // differ (on s1), lost, settled: the TIMESTAMPTZ column is never read.
    assert_eq!(first.record_verified + second.record_verified, 3);
    assert_eq!(first.record_missing_count, 1);
    assert_eq!(first.record_missing[0].key, "gone");
    assert_eq!(first.unchecked[0].key, "ghost");
    assert_eq!(first.unchecked[0].reason, UncheckedReason::UnknownShard);
    assert_eq!(second.unchecked[0].key, "unprobed");
    assert!(
        matches!(&second.unchecked[0].reason, UncheckedReason::ProbeFailed { table, .. } if table == "orgs"),
        "{:?}",
        second.unchecked
    );
    assert_eq!(first.repaired, vec!["lost".to_owned()]);
    assert_eq!(second.pruned, vec!["settled".to_owned()]);
    assert_eq!(
        mapping.get("lost").await.unwrap().as_deref(),
        Some("s0"),
        "repair mapped the key to its ledger shard"
    );
    assert_eq!(mapping.get("gone").await.unwrap(), None);
    assert_eq!(mapping.get("unprobed").await.unwrap(), None);
    let left: Vec<String> = ledger
        .scan(None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(left, vec!["differ", "ghost", "gone", "lost", "unprobed"]);
    drop((sc0, sc1));
}
