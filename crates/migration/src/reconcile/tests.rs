//! Unit tests of `reconcile_allocations` over in-memory shards and ledgers.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::dialect::Dialect;
use crate::ledger::{AllocationLedger, MemoryLedger};
use crate::mapping::{MappingStore, MemoryMappingStore};
use crate::router::Router;
use crate::shard::{BackendFuture, BatchSupport, Shard, Statement};
use crate::value::{Row, Value};
use crate::{MigrationConfig, conformance};

/// A shard answering only probe statements, from a set of keys per
/// table; tables in `failing` make the probe fail. Counts every call.
#[derive(Default)]
struct MemShard {
    rows: Mutex<BTreeMap<String, BTreeSet<String>>>,
    failing: Mutex<BTreeSet<String>>,
    queries: AtomicU64,
    writes: AtomicU64,
}

impl MemShard {
    fn with(rows: &[(&str, &str)]) -> Arc<Self> {
        let s = Self::default();
        for (t, k) in rows {
            s.rows
                .lock()
                .unwrap()
                .entry((*t).to_owned())
                .or_default()
                .insert((*k).to_owned());
        }
        Arc::new(s)
    }
    fn fail(&self, table: &str) {
        self.failing.lock().unwrap().insert(table.to_owned());
    }
    fn queries(&self) -> u64 {
        self.queries.load(Ordering::SeqCst)
    }
}

impl Shard for MemShard {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
    fn batch_support(&self) -> BatchSupport {
        BatchSupport::Atomic
    }
    fn execute<'a>(&'a self, _: &'a Statement) -> BackendFuture<'a, u64> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err("memshard is read-only".into()) })
    }
    fn query<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, Vec<Row>> {
        self.queries.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            // The journal of these tests holds no operation.
            if stmt.sql.contains(" FROM durability_migration_ops") {
                return Ok(Vec::new());
            }
            // SELECT "k" FROM "t" WHERE "k" = ?1 AND NOT EXISTS (<an
            // in-flight marker of the key in t>): these shards hold none.
            let table = stmt
                .sql
                .split(" FROM \"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .ok_or("not a probe")?
                .to_owned();
            assert!(stmt.sql.starts_with("SELECT \""), "{}", stmt.sql);
            assert!(
                stmt.sql
                    .contains("NOT EXISTS (SELECT 1 FROM durability_retired"),
                "a probe skips a move's marked copy: {}",
                stmt.sql
            );
            assert_eq!(
                stmt.params.first(),
                stmt.params.get(2),
                "the key is bound, in the probe and the marker lookup"
            );
            if self.failing.lock().unwrap().contains(&table) {
                return Err(format!("no such table: {table}").into());
            }
            let key = stmt.params[0].as_text().ok_or("key is text")?.to_owned();
            let hit = self
                .rows
                .lock()
                .unwrap()
                .get(&table)
                .is_some_and(|s| s.contains(&key));
            Ok(if hit {
                vec![Row::from([("k".to_owned(), Value::Text(key))])]
            } else {
                Vec::new()
            })
        })
    }
    fn batch<'a>(&'a self, _: &'a [Statement]) -> BackendFuture<'a, Vec<u64>> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err("memshard is read-only".into()) })
    }
}

/// A ledger wrapper counting calls; `fail` makes every call fail.
#[derive(Default)]
struct CountingLedger {
    inner: MemoryLedger,
    scans: AtomicU64,
    removes: AtomicU64,
    fail: bool,
}

impl AllocationLedger for CountingLedger {
    fn record<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()> {
        self.inner.record(key, shard)
    }
    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BackendFuture<'a, Vec<(String, String)>> {
        self.scans.fetch_add(1, Ordering::SeqCst);
        if self.fail {
            return Box::pin(async { Err("ledger down".into()) });
        }
        self.inner.scan(after, limit)
    }
    fn remove_if<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, bool> {
        self.removes.fetch_add(1, Ordering::SeqCst);
        self.inner.remove_if(key, shard)
    }
}

/// A ledger that returns the same page forever (out of order after
/// the first).
struct StuckLedger;

impl AllocationLedger for StuckLedger {
    fn record<'a>(&'a self, _: &'a str, _: &'a str) -> BackendFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn scan<'a>(
        &'a self,
        _: Option<&'a str>,
        _: usize,
    ) -> BackendFuture<'a, Vec<(String, String)>> {
        Box::pin(async { Ok(vec![("a".to_owned(), "s0".to_owned())]) })
    }
    fn remove_if<'a>(&'a self, _: &'a str, _: &'a str) -> BackendFuture<'a, bool> {
        Box::pin(async { Ok(false) })
    }
}

struct Env {
    s0: Arc<MemShard>,
    s1: Arc<MemShard>,
    mapping: Arc<MemoryMappingStore>,
    ledger: Arc<CountingLedger>,
    router: Router,
}

async fn env(s0: Arc<MemShard>, s1: Arc<MemShard>, ledger: CountingLedger) -> Env {
    let mapping = Arc::new(MemoryMappingStore::new());
    let ledger = Arc::new(ledger);
    let config = MigrationConfig::new(mapping.clone())
        .shard("s0", s0.clone())
        .shard("s1", s1.clone())
        .journal_shard("s0")
        .table("users")
        .table_with_key_column("orgs", "org_id")
        .coordinator(ledger.clone());
    let router = Router::new(config).unwrap();
    Env {
        s0,
        s1,
        mapping,
        ledger,
        router,
    }
}

async fn plain_env() -> Env {
    env(
        MemShard::with(&[]),
        MemShard::with(&[]),
        CountingLedger::default(),
    )
    .await
}

async fn ledger_rows(e: &Env) -> Vec<(String, String)> {
    e.ledger.inner.scan(None, 100_000).await.unwrap()
}

async fn mappings(e: &Env) -> Vec<(String, String)> {
    e.mapping.scan(None, 100_000).await.unwrap()
}

impl Env {
    /// Records `ledger` (key, shard) rows, then maps `mapped` (key, shard).
    async fn seed(&self, ledger: &[(&str, &str)], mapped: &[(&str, &str)]) {
        for (k, s) in ledger {
            self.ledger.record(k, s).await.unwrap();
        }
        for (k, s) in mapped {
            self.mapping.put(k, s).await.unwrap();
        }
    }

    /// A reconcile with `computed` as computed placement's owner.
    async fn reconcile(
        &self,
        opts: &ReconcileOptions,
        computed: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> ReconcileReport {
        self.router
            .core
            .reconcile_with(opts, computed)
            .await
            .unwrap()
    }

    /// The router's reconcile with the default options.
    async fn reconcile_default(&self) -> crate::Result<ReconcileReport> {
        let opts = ReconcileOptions::default();
        self.router.reconcile_allocations(&opts).await
    }

    /// The keys of the ledger's rows, in order.
    async fn ledger_keys(&self) -> Vec<String> {
        ledger_rows(self)
            .await
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }
}

fn verify_users() -> Option<VerifyRecords> {
    Some(VerifyRecords::tables(["users"]))
}

#[tokio::test]
async fn memory_ledger_passes_the_conformance_suite() {
    conformance::ledger_suite(&MemoryLedger::new()).await;
}

#[test]
fn the_reconcile_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let router = Router::new(
        MigrationConfig::new(Arc::new(MemoryMappingStore::new())).shard("s0", MemShard::with(&[])),
    )
    .unwrap();
    let opts = ReconcileOptions::default();
    let fut = router.reconcile_allocations(&opts);
    assert_send(&fut);
}

#[tokio::test]
async fn refusals_come_before_any_io_and_write_nothing() {
    // No coordinator.
    let s0 = MemShard::with(&[("users", "k")]);
    let mapping = Arc::new(MemoryMappingStore::new());
    let router =
        Router::new(MigrationConfig::new(mapping.clone()).shard("s0", s0.clone())).unwrap();
    let opts = ReconcileOptions {
        repair: true,
        verify_records: verify_users(),
        ..ReconcileOptions::default()
    };
    let err = router.reconcile_allocations(&opts).await.unwrap_err();
    assert_eq!(err.code(), "COORDINATOR_NOT_CONFIGURED");
    assert!(!err.is_retryable());

    let e = plain_env().await;
    e.seed(&[("k", "s0")], &[("m", "s1")]).await;
    let cases = [
        (
            ReconcileOptions {
                repair: true,
                prune_verified: true,
                ..ReconcileOptions::default()
            },
            "RECONCILE_VERIFY_REQUIRED",
        ),
        (
            ReconcileOptions {
                page_size: 0,
                ..ReconcileOptions::default()
            },
            "INVALID_CONFIG",
        ),
        (
            ReconcileOptions {
                page_size: MAX_RECONCILE_PAGE_SIZE + 1,
                ..ReconcileOptions::default()
            },
            "INVALID_CONFIG",
        ),
        (
            ReconcileOptions {
                limit: Some(0),
                ..ReconcileOptions::default()
            },
            "INVALID_CONFIG",
        ),
        (
            ReconcileOptions {
                verify_records: Some(VerifyRecords::tables(["users; DROP TABLE x"])),
                repair: true,
                ..ReconcileOptions::default()
            },
            "INVALID_IDENTIFIER",
        ),
        (
            ReconcileOptions {
                verify_records: Some(VerifyRecords {
                    tables: vec![RecordTable::with_key_column("users", "id\"")],
                }),
                ..ReconcileOptions::default()
            },
            "INVALID_IDENTIFIER",
        ),
    ];
    for (opts, code) in cases {
        let err = e.router.reconcile_allocations(&opts).await.unwrap_err();
        assert_eq!(err.code(), code, "{opts:?}");
    }
    assert_eq!(e.ledger.scans.load(Ordering::SeqCst), 0, "ledger not read");
    assert_eq!(e.ledger.removes.load(Ordering::SeqCst), 0);
    assert_eq!(e.s0.queries() + e.s1.queries(), 0, "no shard queried");
    assert_eq!(ledger_rows(&e).await, vec![("k".into(), "s0".into())]);
    assert_eq!(mappings(&e).await, vec![("m".into(), "s1".into())]);
}

#[tokio::test]
async fn routing_agreement_is_counted_and_nothing_is_probed_or_written() {
    let e = plain_env().await;
    e.seed(
        &[("agree", "s0"), ("differ", "s0"), ("unmapped", "s1")],
        &[("agree", "s0"), ("differ", "s1")],
    )
    .await;
    let r = e.reconcile_default().await.unwrap();
    assert_eq!(r.examined, 3);
    assert_eq!(r.routing_agreed, 1);
    assert_eq!(r.disagreeing_count, 2);
    assert_eq!(r.unrouted, 1);
    assert_eq!(
        r.disagreeing,
        vec![
            Disagreement {
                key: "differ".into(),
                ledger_shard: "s0".into(),
                routed_shard: Some("s1".into()),
                mapped: true,
            },
            Disagreement {
                key: "unmapped".into(),
                ledger_shard: "s1".into(),
                routed_shard: None,
                mapped: false,
            },
        ]
    );
    assert_eq!(
        r.record_unchecked, 3,
        "without verify_records all unchecked"
    );
    assert_eq!(r.record_verified + r.record_missing_count, 0);
    assert!(r.unchecked.is_empty(), "nothing was requested");
    assert_eq!(r.pages, 1);
    assert_eq!(r.resume_after, None);
    assert_eq!(e.s0.queries() + e.s1.queries(), 0, "no shard queried");
    assert_eq!(e.ledger.removes.load(Ordering::SeqCst), 0);
    assert_eq!(ledger_rows(&e).await.len(), 3, "ledger untouched");
    assert_eq!(mappings(&e).await.len(), 2, "no mapping written");
}

#[tokio::test]
async fn each_row_lands_in_exactly_one_record_count() {
    let s0 = MemShard::with(&[
        ("users", "found"),
        ("orgs", "in-orgs"),
        ("orgs", "flaky-but-found"),
    ]);
    let s1 = MemShard::with(&[("users", "mapped-away")]);
    s0.fail("broken");
    let e = env(s0, s1, CountingLedger::default()).await;
    let ledger = [
        ("found", "s0"),
        ("in-orgs", "s0"),
        ("flaky-but-found", "s0"),
        ("absent", "s0"),
        ("flaky", "s0"),
        ("ghost-shard", "s9"),
        ("mapped-away", "s0"),
        ("mapped-nowhere", "s0"),
    ];
    // Routing points mapped-away's probe at s1 (where the row is), not the
    // ledger shard; mapped-nowhere's mapping names an unconfigured shard.
    e.seed(&ledger, &[("mapped-away", "s1"), ("mapped-nowhere", "s7")])
        .await;
    let opts = ReconcileOptions {
        verify_records: Some(VerifyRecords {
            tables: vec![
                RecordTable::new("users"),
                RecordTable::new("broken"),
                RecordTable::new("orgs"),
            ],
        }),
        ..ReconcileOptions::default()
    };
    let r = e.router.reconcile_allocations(&opts).await.unwrap();
    assert_eq!(r.examined, 8);
    assert_eq!(
        r.record_verified + r.record_missing_count + r.record_unchecked,
        r.examined
    );
    // found (users), in-orgs and flaky-but-found (orgs after a failed
    // probe), mapped-away (on s1).
    assert_eq!(r.record_verified, 4);
    assert_eq!(r.record_missing_count, 0, "a failed probe is not a miss");
    assert_eq!(r.record_unchecked, 4);
    let reasons: Vec<(&str, &str, &UncheckedReason)> = r
        .unchecked
        .iter()
        .map(|u| (u.key.as_str(), u.shard.as_str(), &u.reason))
        .collect();
    let failed = UncheckedReason::ProbeFailed {
        table: "broken".into(),
        error: "no such table: broken".into(),
    };
    assert_eq!(
        reasons,
        vec![
            ("absent", "s0", &failed),
            ("flaky", "s0", &failed),
            ("ghost-shard", "s9", &UncheckedReason::UnknownShard),
            ("mapped-nowhere", "s7", &UncheckedReason::UnknownShard),
        ]
    );

    // Without the broken table, `absent` is a clean miss.
    let opts = ReconcileOptions {
        verify_records: Some(VerifyRecords {
            tables: vec![RecordTable::new("users"), RecordTable::new("orgs")],
        }),
        ..ReconcileOptions::default()
    };
    let r = e.router.reconcile_allocations(&opts).await.unwrap();
    assert_eq!(
        (
            r.record_verified,
            r.record_missing_count,
            r.record_unchecked
        ),
        (4, 2, 2)
    );
    assert_eq!(
        r.record_missing,
        vec![
            MissingRecord {
                key: "absent".into(),
                shard: "s0".into()
            },
            MissingRecord {
                key: "flaky".into(),
                shard: "s0".into()
            },
        ]
    );

    // An empty table list: every probe is unable to run.
    let opts = ReconcileOptions {
        verify_records: Some(VerifyRecords::default()),
        ..ReconcileOptions::default()
    };
    let r = e.router.reconcile_allocations(&opts).await.unwrap();
    assert_eq!(r.record_unchecked, 8);
    assert!(
        r.unchecked
            .iter()
            .all(|u| u.reason == UncheckedReason::NoTables)
    );
    assert_eq!(mappings(&e).await.len(), 2, "verification writes nothing");
    assert_eq!(ledger_rows(&e).await.len(), 8);
    assert_eq!(e.s0.writes.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn repair_maps_only_unrouted_keys_found_on_their_ledger_shard() {
    let s0 = MemShard::with(&[("users", "lost"), ("users", "mapped")]);
    let s1 = MemShard::with(&[("users", "elsewhere"), ("users", "computed")]);
    s0.fail("broken");
    let e = env(s0, s1, CountingLedger::default()).await;
    let ledger = [
        ("lost", "s0"),      // unrouted, row on s0: repaired
        ("gone", "s0"),      // unrouted, no row: not repaired
        ("elsewhere", "s0"), // unrouted, row only on s1: not repaired
        ("mapped", "s0"),    // mapped: never repaired
        ("computed", "s0"),  // computed owner s1: not unrouted
        ("nowhere", "s9"),   // unconfigured ledger shard: unchecked
        ("flaky", "s0"),     // probe failed: unchecked
    ];
    e.seed(&ledger, &[("mapped", "s0")]).await;
    let computed = |k: &str| (k == "computed").then(|| "s1".to_owned());
    let opts = ReconcileOptions {
        verify_records: Some(VerifyRecords::tables(["users", "broken"])),
        repair: true,
        ..ReconcileOptions::default()
    };
    let r = e.reconcile(&opts, &computed).await;
    assert_eq!(r.repaired_count, 1);
    assert_eq!(r.repaired, vec!["lost".to_owned()]);
    assert_eq!(r.unrouted, 5, "lost, gone, elsewhere, nowhere, flaky");
    assert_eq!(
        mappings(&e).await,
        vec![
            ("lost".to_owned(), "s0".to_owned()),
            ("mapped".to_owned(), "s0".to_owned())
        ]
    );
    assert_eq!(e.router.route("lost").await.unwrap().as_deref(), Some("s0"));
    assert_eq!(
        ledger_rows(&e).await.len(),
        7,
        "repair never touches the ledger"
    );
    // A second run finds the key routed and agreeing: nothing to repair.
    let r = e.reconcile(&opts, &computed).await;
    assert_eq!(r.repaired_count, 0);
    assert_eq!(r.unrouted, 4);
}

#[tokio::test]
async fn repair_keeps_a_mapping_another_writer_made_first() {
    /// A mapping store where someone else maps `race` to s1 just before
    /// our `put_if_absent`.
    struct Racy(MemoryMappingStore);
    impl MappingStore for Racy {
        fn get<'a>(&'a self, key: &'a str) -> BackendFuture<'a, Option<String>> {
            self.0.get(key)
        }
        fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()> {
            self.0.put(key, shard)
        }
        fn put_if_absent<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, String> {
            Box::pin(async move {
                self.0.put(key, "s1").await?;
                self.0.put_if_absent(key, shard).await
            })
        }
        fn remove<'a>(&'a self, key: &'a str) -> BackendFuture<'a, bool> {
            self.0.remove(key)
        }
        fn scan<'a>(
            &'a self,
            after: Option<&'a str>,
            limit: usize,
        ) -> BackendFuture<'a, Vec<(String, String)>> {
            self.0.scan(after, limit)
        }
    }
    let ledger = Arc::new(MemoryLedger::new());
    ledger.record("race", "s0").await.unwrap();
    let mapping = Arc::new(Racy(MemoryMappingStore::new()));
    let router = Router::new(
        MigrationConfig::new(mapping.clone())
            .shard("s0", MemShard::with(&[("users", "race")]))
            .coordinator(ledger),
    )
    .unwrap();
    let opts = ReconcileOptions {
        verify_records: verify_users(),
        repair: true,
        ..ReconcileOptions::default()
    };
    let r = router.reconcile_allocations(&opts).await.unwrap();
    assert_eq!(r.repaired_count, 0, "the other writer's mapping wins");
    assert_eq!(mapping.get("race").await.unwrap().as_deref(), Some("s1"));
}

#[tokio::test]
async fn prune_removes_only_agreeing_mapped_verified_rows() {
    let s0 = MemShard::with(&[
        ("users", "settled"),
        ("users", "computed"),
        ("users", "unrouted"),
    ]);
    let e = env(s0, MemShard::with(&[]), CountingLedger::default()).await;
    let ledger = [
        ("settled", "s0"),  // mapped s0, row on s0: pruned
        ("no-row", "s0"),   // mapped s0, no row: kept with verification
        ("differ", "s0"),   // mapped s1: kept
        ("computed", "s0"), // agrees with computed placement only: kept
        ("unrouted", "s0"), // no routing: kept
    ];
    let mapped = [("settled", "s0"), ("no-row", "s0"), ("differ", "s1")];
    e.seed(&ledger, &mapped).await;
    let computed = |k: &str| (k == "computed").then(|| "s0".to_owned());
    let opts = ReconcileOptions {
        verify_records: verify_users(),
        prune_verified: true,
        ..ReconcileOptions::default()
    };
    let r = e.reconcile(&opts, &computed).await;
    assert_eq!(r.routing_agreed, 3, "settled, no-row, computed");
    assert_eq!(r.pruned_count, 1);
    assert_eq!(r.pruned, vec!["settled".to_owned()]);
    assert_eq!(
        e.ledger_keys().await,
        vec!["computed", "differ", "no-row", "unrouted"]
    );
    assert_eq!(mappings(&e).await.len(), 3, "prune never touches mappings");

    // Without verification, agreement with an explicit mapping suffices.
    let opts = ReconcileOptions {
        prune_verified: true,
        ..ReconcileOptions::default()
    };
    let r = e.reconcile(&opts, &computed).await;
    assert_eq!(r.pruned, vec!["no-row".to_owned()]);
    assert_eq!(
        (e.s0.queries(), e.s1.queries()),
        (4, 1),
        "only the first run probed, differ on s1 where routing points"
    );
    assert_eq!(
        e.ledger_keys().await,
        vec!["computed", "differ", "unrouted"]
    );
}

#[tokio::test]
async fn key_lists_are_capped_and_counts_exact() {
    let e = plain_env().await;
    for i in 0..1500 {
        let k = format!("k{i:05}");
        e.ledger.record(&k, "s0").await.unwrap();
        e.mapping.put(&k, "s1").await.unwrap();
    }
    let opts = ReconcileOptions {
        verify_records: verify_users(),
        page_size: 128,
        ..ReconcileOptions::default()
    };
    let r = e.router.reconcile_allocations(&opts).await.unwrap();
    assert_eq!(r.examined, 1500);
    assert_eq!(r.disagreeing_count, 1500);
    assert_eq!(r.disagreeing.len(), MAX_RECONCILE_KEYS);
    assert_eq!(r.disagreeing[999].key, "k00999", "the first keys, in order");
    assert_eq!(r.record_missing_count, 1500);
    assert_eq!(r.record_missing.len(), MAX_RECONCILE_KEYS);
    assert_eq!(r.pages, 12, "ceil(1500 / 128)");
}

#[tokio::test]
async fn pages_are_walked_to_the_end_and_limit_resumes() {
    let e = plain_env().await;
    for i in 0..25 {
        e.ledger.record(&format!("k{i:02}"), "s0").await.unwrap();
    }
    let all = ReconcileOptions {
        page_size: 4,
        ..ReconcileOptions::default()
    };
    let r = e.router.reconcile_allocations(&all).await.unwrap();
    assert_eq!((r.examined, r.pages, r.resume_after.clone()), (25, 7, None));
    assert_eq!(r.disagreeing.len(), 25);

    let mut opts = ReconcileOptions {
        page_size: 4,
        limit: Some(10),
        ..ReconcileOptions::default()
    };
    let r = e.router.reconcile_allocations(&opts).await.unwrap();
    assert_eq!(r.examined, 10);
    assert_eq!(r.pages, 3, "4 + 4 + 2");
    assert_eq!(r.resume_after.as_deref(), Some("k09"));
    assert_eq!(r.disagreeing.last().unwrap().key, "k09");

    let mut seen = r.examined;
    let mut after = r.resume_after;
    let mut runs = 1;
    while let Some(a) = after {
        runs += 1;
        assert!(runs < 10, "resuming terminates");
        opts.after = Some(a);
        let r = e.router.reconcile_allocations(&opts).await.unwrap();
        seen += r.examined;
        after = r.resume_after;
    }
    assert_eq!(runs, 3, "10 + 10 + 5");
    assert_eq!(seen, 25, "resumed runs cover every row once");

    // A limit that ends exactly at the last row leaves nothing to resume.
    let r = e
        .router
        .reconcile_allocations(&ReconcileOptions {
            limit: Some(25),
            ..ReconcileOptions::default()
        })
        .await
        .unwrap();
    assert_eq!((r.examined, r.resume_after), (25, None));
    // A limit above the ledger size reads it all.
    let r = e
        .router
        .reconcile_allocations(&ReconcileOptions {
            limit: Some(1000),
            page_size: 7,
            ..ReconcileOptions::default()
        })
        .await
        .unwrap();
    assert_eq!((r.examined, r.pages), (25, 4));
}

#[tokio::test]
async fn ledger_faults_are_errors_not_silent_truncation() {
    let e = env(
        MemShard::with(&[]),
        MemShard::with(&[]),
        CountingLedger {
            fail: true,
            ..CountingLedger::default()
        },
    )
    .await;
    let err = e.reconcile_default().await.unwrap_err();
    assert_eq!(err.code(), "COORDINATOR_UNAVAILABLE");
    assert!(err.is_retryable());

    let router = Router::new(
        MigrationConfig::new(Arc::new(MemoryMappingStore::new()))
            .shard("s0", MemShard::with(&[]))
            .coordinator(Arc::new(StuckLedger)),
    )
    .unwrap();
    let err = router
        .reconcile_allocations(&ReconcileOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "CORRUPT_RECORD", "a repeated page is refused");
}

#[tokio::test]
async fn computed_placement_routes_unmapped_keys() {
    let s1 = MemShard::with(&[("users", "c-agree")]);
    let e = env(
        MemShard::with(&[("users", "c-differ")]),
        s1,
        CountingLedger::default(),
    )
    .await;
    e.seed(&[("c-agree", "s1"), ("c-differ", "s0")], &[]).await;
    let computed = |_: &str| Some("s1".to_owned());
    let opts = ReconcileOptions {
        verify_records: verify_users(),
        repair: true,
        prune_verified: true,
        ..ReconcileOptions::default()
    };
    let r = e.reconcile(&opts, &computed).await;
    assert_eq!(
        (r.routing_agreed, r.disagreeing_count, r.unrouted),
        (1, 1, 0)
    );
    assert_eq!(
        r.disagreeing[0].routed_shard.as_deref(),
        Some("s1"),
        "the computed owner"
    );
    assert!(!r.disagreeing[0].mapped);
    // The probe goes to the computed owner s1, where c-differ has no row.
    assert_eq!((r.record_verified, r.record_missing_count), (1, 1));
    assert_eq!(r.repaired_count + r.pruned_count, 0);
    assert!(mappings(&e).await.is_empty());
    assert_eq!(ledger_rows(&e).await.len(), 2);
}
