//! `Router::reconcile_allocations` on SQLite file shards with the SQLite
//! mapping store and allocation ledger: refusals that write nothing,
//! agreement and record counts, repair, prune, capped key lists with exact
//! counts, pagination with `limit` and resumption, and the ledger
//! conformance suite.

#![cfg(feature = "migration")]
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use durability_migration::conformance;
use durability_migration::{
    AllocationLedger, Dialect, Ident, MAX_RECONCILE_KEYS, MappingStore, MigrationConfig, Placement,
    ReconcileOptions, RecordTable, Router, Shard, UncheckedReason, Value, VerifyRecords, row,
};
use durability_storage_sqlite::ledger::SqliteLedger;
use durability_storage_sqlite::migration::{SqliteMappingStore, SqliteShard};
use tempfile::TempDir;

/// `s0` has both tables; `s1` has no `orgs` table, so probing it there fails.
const S0_SCHEMA: &str = "
CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT, n INTEGER);
CREATE TABLE orgs (org_id TEXT PRIMARY KEY, title TEXT);
";
const S1_SCHEMA: &str = "CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT, n INTEGER);";

struct Env {
    dir: TempDir,
    s0: Arc<SqliteShard>,
    s1: Arc<SqliteShard>,
    mapping: Arc<SqliteMappingStore>,
    ledger: Arc<SqliteLedger>,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let s0 = SqliteShard::open(dir.path().join("s0.db")).unwrap();
    s0.execute_sync(S0_SCHEMA).unwrap();
    let s1 = SqliteShard::open(dir.path().join("s1.db")).unwrap();
    s1.execute_sync(S1_SCHEMA).unwrap();
    let mapping = Arc::new(SqliteMappingStore::open(dir.path().join("map.db")).unwrap());
    let ledger = Arc::new(SqliteLedger::open(dir.path().join("ledger.db")).unwrap());
    Env {
        dir,
        s0: Arc::new(s0),
        s1: Arc::new(s1),
        mapping,
        ledger,
    }
}

impl Env {
    fn config(&self) -> MigrationConfig {
        MigrationConfig::new(self.mapping.clone())
            .shard("s0", self.s0.clone())
            .shard("s1", self.s1.clone())
            .journal_shard("s0")
            .table("users")
            .table_with_key_column("orgs", "org_id")
    }

    async fn router(&self) -> Router {
        let r = Router::new(self.config().coordinator(self.ledger.clone())).unwrap();
        r.init().await.unwrap();
        r
    }

    fn shard(&self, name: &str) -> &Arc<SqliteShard> {
        if name == "s0" { &self.s0 } else { &self.s1 }
    }

    /// Inserts a row directly (no routing, no mapping).
    async fn put_row(&self, shard: &str, table: &str, col: &str, key: &str) {
        let cols = vec![(Ident::new(col).unwrap(), Value::from(key))];
        let st = Dialect::Sqlite.insert_row(&Ident::new(table).unwrap(), &cols);
        assert_eq!(self.shard(shard).execute(&st).await.unwrap(), 1);
    }

    async fn ledger_rows(&self) -> Vec<(String, String)> {
        self.ledger.scan(None, 100_000).await.unwrap()
    }

    async fn mappings(&self) -> Vec<(String, String)> {
        self.mapping.scan(None, 100_000).await.unwrap()
    }

    async fn users(&self, shard: &str) -> usize {
        let st = durability_migration::Statement::new("SELECT id FROM users");
        self.shard(shard).query(&st).await.unwrap().len()
    }
}

#[tokio::test]
async fn sqlite_ledger_passes_the_conformance_suite() {
    conformance::ledger_suite(&SqliteLedger::open_in_memory().unwrap()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    conformance::ledger_suite(&SqliteLedger::open(&path).unwrap()).await;
    // Reopening keeps the rows and creates nothing twice.
    let again = SqliteLedger::open(&path).unwrap();
    assert_eq!(again.scan(None, 1000).await.unwrap().len(), 29);
}

#[tokio::test]
async fn refusals_write_nothing() {
    let e = env();
    e.ledger.record("k", "s0").await.unwrap();
    e.mapping.put("m", "s1").await.unwrap();
    e.put_row("s0", "users", "id", "k").await;

    let without = Router::new(e.config()).unwrap();
    let opts = ReconcileOptions {
        verify_records: Some(VerifyRecords::tables(["users"])),
        repair: true,
        prune_verified: true,
        ..ReconcileOptions::default()
    };
    let err = without.reconcile_allocations(&opts).await.unwrap_err();
    assert_eq!(err.code(), "COORDINATOR_NOT_CONFIGURED");

    let r = e.router().await;
    let opts = ReconcileOptions {
        repair: true,
        prune_verified: true,
        ..ReconcileOptions::default()
    };
    let err = r.reconcile_allocations(&opts).await.unwrap_err();
    assert_eq!(err.code(), "RECONCILE_VERIFY_REQUIRED");
    assert!(!err.is_retryable());

    assert_eq!(e.ledger_rows().await, vec![("k".into(), "s0".into())]);
    assert_eq!(e.mappings().await, vec![("m".into(), "s1".into())]);
    assert_eq!(e.users("s0").await, 1);

    // A plain run writes nothing either.
    let report = r
        .reconcile_allocations(&ReconcileOptions {
            verify_records: Some(VerifyRecords::tables(["users"])),
            ..ReconcileOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(report.record_verified, 1);
    assert_eq!(report.unrouted, 1);
    assert_eq!(report.repaired_count + report.pruned_count, 0);
    assert_eq!(e.ledger_rows().await.len(), 1);
    assert_eq!(e.mappings().await.len(), 1);
}

#[tokio::test]
async fn reconcile_verifies_repairs_and_prunes_on_sqlite_shards() {
    let e = env();
    let r = e.router().await;
    // A routed write allocates a mapping; the coordinator recorded the same shard.
    r.insert("u-settled", "users", row([("name", "ann")]))
        .await
        .unwrap();
    let settled_on = r.route("u-settled").await.unwrap().unwrap();
    e.ledger.record("u-settled", &settled_on).await.unwrap();
    // Mapped to s1 with its row there; the ledger says s0.
    e.mapping.put("u-differ", "s1").await.unwrap();
    e.put_row("s1", "users", "id", "u-differ").await;
    e.ledger.record("u-differ", "s0").await.unwrap();
    // Unmapped rows on their ledger shard: repaired.
    e.put_row("s1", "users", "id", "u-lost").await;
    e.ledger.record("u-lost", "s1").await.unwrap();
    e.put_row("s0", "orgs", "org_id", "o-lost").await;
    e.ledger.record("o-lost", "s0").await.unwrap();
    // Unmapped, no row anywhere: missing, not repaired.
    e.ledger.record("u-gone", "s0").await.unwrap();
    // Unmapped, row on the other shard only: missing on the ledger shard.
    e.put_row("s1", "users", "id", "u-wrong-shard").await;
    e.ledger.record("u-wrong-shard", "s0").await.unwrap();
    // Unmapped on s1, which has no orgs table: the probe fails.
    e.ledger.record("u-unprobed", "s1").await.unwrap();
    // A ledger shard that is not configured.
    e.ledger.record("u-ghost", "s9").await.unwrap();
    // Mapped and agreeing, but no row: kept by prune.
    e.mapping.put("u-empty", "s0").await.unwrap();
    e.ledger.record("u-empty", "s0").await.unwrap();

    let opts = ReconcileOptions {
        verify_records: Some(VerifyRecords {
            tables: vec![RecordTable::new("users"), RecordTable::new("orgs")],
        }),
        repair: true,
        prune_verified: true,
        page_size: 2,
        ..ReconcileOptions::default()
    };
    let rep = r.reconcile_allocations(&opts).await.unwrap();
    assert_eq!(rep.examined, 9);
    assert_eq!(rep.pages, 5, "nine rows in pages of two");
    assert_eq!(rep.routing_agreed, 2, "u-settled, u-empty");
    assert_eq!(rep.disagreeing_count, 7);
    assert_eq!(rep.unrouted, 6);
    let differ = rep
        .disagreeing
        .iter()
        .find(|d| d.key == "u-differ")
        .unwrap();
    assert_eq!(differ.routed_shard.as_deref(), Some("s1"));
    assert_eq!(differ.ledger_shard, "s0");
    // u-settled, u-differ (probed on s1, where routing points), u-lost, o-lost.
    assert_eq!(rep.record_verified, 4);
    let missing: Vec<&str> = rep.record_missing.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(missing, vec!["u-empty", "u-gone", "u-wrong-shard"]);
    assert_eq!(rep.record_missing_count, 3);
    assert_eq!(rep.record_unchecked, 2);
    let unchecked: Vec<(&str, &UncheckedReason)> = rep
        .unchecked
        .iter()
        .map(|u| (u.key.as_str(), &u.reason))
        .collect();
    assert_eq!(unchecked[0].0, "u-ghost");
    assert_eq!(unchecked[0].1, &UncheckedReason::UnknownShard);
    assert_eq!(unchecked[1].0, "u-unprobed");
    assert!(
        matches!(unchecked[1].1, UncheckedReason::ProbeFailed { table, error }
            if table == "orgs" && error.contains("no such table")),
        "{unchecked:?}"
    );
    assert_eq!(rep.repaired, vec!["o-lost".to_owned(), "u-lost".to_owned()]);
    assert_eq!(rep.pruned, vec!["u-settled".to_owned()]);

    let maps = e.mappings().await;
    assert!(maps.contains(&("u-lost".into(), "s1".into())));
    assert!(maps.contains(&("o-lost".into(), "s0".into())));
    assert_eq!(maps.len(), 5, "settled, differ, empty + two repairs");
    assert!(
        r.get("u-lost", "users").await.unwrap().is_some(),
        "repaired key reads"
    );
    let ledger: Vec<String> = e.ledger_rows().await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(ledger.len(), 8, "only u-settled was pruned");
    assert!(!ledger.contains(&"u-settled".to_owned()));
    assert!(
        ledger.contains(&"u-differ".to_owned()),
        "disagreements are never resolved"
    );
    assert_eq!(
        e.users("s0").await + e.users("s1").await,
        4,
        "reconciliation writes no shard row"
    );

    // A second run: the repaired keys now agree and verify, and are pruned.
    let rep = r.reconcile_allocations(&opts).await.unwrap();
    assert_eq!(rep.repaired_count, 0);
    assert_eq!(rep.pruned, vec!["o-lost".to_owned(), "u-lost".to_owned()]);
    assert_eq!(e.ledger_rows().await.len(), 6);
}

#[tokio::test]
async fn capped_lists_exact_counts_and_resumable_pages() {
    let e = env();
    let r = e.router().await;
    for i in 0..1500 {
        let k = format!("k{i:05}");
        e.ledger.record(&k, "s0").await.unwrap();
        e.mapping.put(&k, "s1").await.unwrap();
    }
    let opts = ReconcileOptions {
        verify_records: Some(VerifyRecords::tables(["users"])),
        page_size: 100,
        ..ReconcileOptions::default()
    };
    let rep = r.reconcile_allocations(&opts).await.unwrap();
    assert_eq!(rep.examined, 1500);
    assert_eq!(rep.pages, 15);
    assert_eq!(rep.disagreeing_count, 1500);
    assert_eq!(rep.disagreeing.len(), MAX_RECONCILE_KEYS);
    assert_eq!(rep.record_missing_count, 1500);
    assert_eq!(rep.record_missing.len(), MAX_RECONCILE_KEYS);
    assert_eq!(
        rep.record_missing[0].shard, "s1",
        "probed where routing points"
    );
    assert_eq!(rep.resume_after, None);

    // Limited runs, resumed from each report, cover every row exactly once.
    let mut opts = ReconcileOptions {
        page_size: 64,
        limit: Some(700),
        ..ReconcileOptions::default()
    };
    let mut examined = Vec::new();
    loop {
        let rep = r.reconcile_allocations(&opts).await.unwrap();
        examined.push(rep.examined);
        assert_eq!(rep.disagreeing_count, rep.examined);
        match rep.resume_after {
            Some(a) => opts.after = Some(a),
            None => break,
        }
    }
    assert_eq!(examined, vec![700, 700, 100]);
    assert_eq!(e.ledger_rows().await.len(), 1500, "nothing pruned");
    drop(e.dir);
}

#[tokio::test]
async fn computed_placement_rows_agree_but_are_never_repaired_or_pruned() {
    let e = env();
    let config = || {
        e.config()
            .placement(Placement::Computed)
            .coordinator(e.ledger.clone())
    };
    let writer = Router::new(config()).unwrap();
    writer.init().await.unwrap();
    for i in 0..20 {
        let k = format!("c{i:02}");
        writer
            .insert(&k, "users", row([("name", "x")]))
            .await
            .unwrap();
        let owner = writer.computed_owner(&k).unwrap();
        e.ledger.record(&k, &owner).await.unwrap();
    }
    let mapped_keys =
        |maps: Vec<(String, String)>| maps.into_iter().filter(|(k, _)| k.starts_with('c')).count();
    assert_eq!(
        mapped_keys(e.mappings().await),
        0,
        "computed keys have no mapping"
    );

    // A router that never loaded the manifest: reconciliation confirms one
    // first, so no key looks unrouted.
    let fresh = Router::new(config()).unwrap();
    let opts = ReconcileOptions {
        verify_records: Some(VerifyRecords::tables(["users"])),
        repair: true,
        prune_verified: true,
        page_size: 6,
        ..ReconcileOptions::default()
    };
    let rep = fresh.reconcile_allocations(&opts).await.unwrap();
    assert_eq!(rep.examined, 20);
    assert_eq!(rep.routing_agreed, 20);
    assert_eq!(rep.unrouted, 0);
    assert_eq!(rep.record_verified, 20, "probed on the computed owner");
    assert_eq!(rep.repaired_count, 0, "computed keys are not unrouted");
    assert_eq!(
        rep.pruned_count, 0,
        "rows matching only computed placement stay"
    );
    assert_eq!(e.ledger_rows().await.len(), 20);
    assert_eq!(mapped_keys(e.mappings().await), 0);
}
