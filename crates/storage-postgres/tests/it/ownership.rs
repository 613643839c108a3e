//! The PostgreSQL lease store against the test server: the ownership
//! conformance suite (each case in a schema of its own), concurrent claims
//! from several store instances, hostile schema names, and
//! `Ownership` end to end.

use std::sync::Arc;

use durability_ownership::conformance::{Harness, RawState};
use durability_ownership::{
    ClaimOutcome, Claimant, LeaseStore, LifecycleAdmin, LifecycleId, ManualClock, OwnerScope,
    Ownership, OwnershipSettings, PresenceGroup, Resolution, ShardCount, StorageId, TaskId,
};
use durability_storage_postgres::ownership::PostgresLeaseStore;
use durability_storage_postgres::testkit::{TestSchema, url};

use crate::pg::{class_scopes, raw_client, schema};

/// Lifecycle `ns:<tag>` pointing at storage `st-<tag>` on `store`.
pub(crate) async fn active(store: &PostgresLeaseStore, tag: &str) -> (LifecycleId, StorageId) {
    let lifecycle = LifecycleId::new(&format!("ns:{tag}")).unwrap();
    let storage = StorageId::new(&format!("st-{tag}")).unwrap();
    store
        .set_active_storage(&lifecycle, Some(&storage))
        .await
        .unwrap();
    (lifecycle, storage)
}

/// A set-up lease store in `schema`.
pub(crate) async fn store_in(schema: &TestSchema) -> PostgresLeaseStore {
    let store = PostgresLeaseStore::connect(&url(), schema.name(), ShardCount::default()).unwrap();
    store.setup().await.unwrap();
    store
}

pub(crate) struct PgHarness {
    store: PostgresLeaseStore,
    raw: tokio_postgres::Client,
    table: String,
    // Dropped last: drops the schema.
    _schema: TestSchema,
}

impl PgHarness {
    pub(crate) async fn new() -> Option<Self> {
        let schema = schema().await?;
        let store = store_in(&schema).await;
        Some(Self {
            store,
            raw: raw_client().await,
            table: format!("\"{}\"", schema.name()),
            _schema: schema,
        })
    }
}

impl PgHarness {
    /// The stored counter of `scope`, whatever its value.
    async fn raw_counter(&self, scope: &OwnerScope) -> Option<i64> {
        self.raw_column("generation", "durability_owner_generations", scope)
            .await
    }

    /// Runs `statement`, its `{schema}` the harness's schema.
    async fn exec(&self, statement: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) {
        let statement = statement.replace("{schema}", &self.table);
        self.raw.execute(&statement, params).await.unwrap();
    }

    /// `column` of `scope`'s row of `table`, if it has one.
    async fn raw_column<T>(&self, column: &str, table: &str, scope: &OwnerScope) -> Option<T>
    where
        T: for<'r> tokio_postgres::types::FromSql<'r>,
    {
        self.raw
            .query_opt(
                &format!(
                    "SELECT {column} FROM {}.{table} WHERE scope = $1",
                    self.table
                ),
                &[&scope.host_id()],
            )
            .await
            .unwrap()
            .map(|r| r.get(0))
    }
}

impl Harness for PgHarness {
    type Store = PostgresLeaseStore;

    fn store(&self) -> &Self::Store {
        &self.store
    }

    async fn expire_owner(&self, scope: &OwnerScope) {
        // The lease ends now on the server's clock, as it would have.
        self.exec(
            "UPDATE {schema}.durability_owner_leases
             SET expires_at_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
             WHERE scope = $1",
            &[&scope.host_id()],
        )
        .await;
    }

    async fn expire_presence(&self, group: &PresenceGroup, task: &TaskId) {
        // The record ends now on the server's clock, as it would have.
        self.exec(
            "UPDATE {schema}.durability_presence
             SET expires_at_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
             WHERE grp = $1 AND task = $2",
            &[&group.key(), &task.as_str()],
        )
        .await;
    }

    async fn put_raw_owner(&self, scope: &OwnerScope, raw: &[u8]) {
        self.exec(
            "INSERT INTO {schema}.durability_owner_leases (scope, record, expires_at_ms)
             VALUES ($1, $2, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 60000)
             ON CONFLICT (scope) DO UPDATE SET record = excluded.record,
               expires_at_ms = excluded.expires_at_ms",
            &[&scope.host_id(), &raw],
        )
        .await;
    }

    async fn raw_state(&self, scope: &OwnerScope) -> RawState {
        let owner = self
            .raw_column("record", "durability_owner_leases", scope)
            .await;
        let generation = self
            .raw_counter(scope)
            .await
            .map(|g| u64::try_from(g).unwrap());
        RawState { owner, generation }
    }
}

durability_ownership::ownership_conformance!(conformance, "pg", PgHarness::new());

/// Eight store instances (eight pools, as eight hosts have) claim the same
/// sixteen scopes at once, whole class per call and one by one: every
/// scope is claimed exactly once, at generation 1, and every other answer
/// names that claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_from_many_stores_hand_out_one_owner_per_scope() {
    let Some(schema) = schema().await else { return };
    let first = store_in(&schema).await;
    let (lifecycle, storage) = active(&first, "race").await;
    let scopes = Arc::new(class_scopes(&storage, "Race"));
    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = store_in(&schema).await;
        let (scopes, lifecycle) = (Arc::clone(&scopes), lifecycle.clone());
        tasks.push(tokio::spawn(async move {
            let task = TaskId::new(&format!("host-{n}")).unwrap();
            if n % 2 == 0 {
                store
                    .claim_many(&scopes, Claimant::new(&lifecycle, &task, 60_000))
                    .await
            } else {
                let mut out = Vec::new();
                for s in scopes.iter().rev() {
                    out.push(store.claim(s, &lifecycle, &task, 60_000).await);
                }
                out.reverse();
                out
            }
        }));
    }
    let mut winners = vec![Vec::new(); 16];
    let mut seen = vec![Vec::new(); 16];
    for t in tasks {
        for (i, r) in t.await.unwrap().into_iter().enumerate() {
            match r.unwrap() {
                ClaimOutcome::Claimed(l) => winners[i].push(l.record),
                ClaimOutcome::Held(l) => seen[i].push(l.record),
            }
        }
    }
    for i in 0..16 {
        assert_eq!(winners[i].len(), 1, "scope {i}: exactly one claim");
        let won = &winners[i][0];
        assert_eq!(won.generation().get(), 1, "scope {i}");
        assert_eq!(seen[i].len(), 7, "scope {i}");
        assert!(
            seen[i].iter().all(|r| r == won),
            "scope {i}: every holder is the winner"
        );
        let snap = first.snapshot(&scopes[i], &lifecycle).await.unwrap();
        assert_eq!(snap.owner.map(|l| l.record).as_ref(), Some(won));
        assert_eq!(snap.generation, 1);
    }
}

/// A schema name that could break out of its identifier is refused before
/// anything is sent, and nothing is created on the server.
#[tokio::test]
async fn hostile_schema_names_are_refused_before_any_statement() {
    let Some(_schema) = schema().await else {
        return;
    };
    let hostile = [
        "x\"; DROP SCHEMA public CASCADE; --",
        "a b",
        "Tenant",
        "pg_temp",
        "",
        "1x",
        "dur\u{0}able",
        "s\u{e9}",
    ];
    let long = "a".repeat(64);
    for name in hostile.iter().copied().chain([long.as_str()]) {
        let e = PostgresLeaseStore::connect(&url(), name, ShardCount::default()).expect_err(name);
        assert_eq!(e.code(), "invalid_input", "{name:?}: {e}");
    }
    // Nothing reached the server: no schema by any of these names (nor the
    // part before a quote), and `public` is still there.
    let raw = raw_client().await;
    let found: i64 = raw
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1) OR nspname = 'x'",
            &[&hostile
                .iter()
                .map(|n| n.replace('\0', ""))
                .collect::<Vec<_>>()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(found, 0, "no schema was created");
    let public: i64 = raw
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'public'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(public, 1);
    let sql = PostgresLeaseStore::setup_sql(
        &durability_storage_postgres::SchemaName::new("tenant_1").unwrap(),
    );
    assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"tenant_1\".durability_owner_leases"));
}

/// `Ownership` on the PostgreSQL store: resolve claims, a second task is
/// routed to the first, renew_all renews, and after expiry the second
/// claims a higher generation.
#[tokio::test]
async fn ownership_end_to_end_on_server_time() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let store = Arc::new(h.store.clone());
    let (lifecycle, storage) = active(&store, "e2e").await;
    let scope = class_scopes(&storage, "Cart").remove(3);
    let settings = OwnershipSettings {
        owner_ttl_ms: 60_000,
        ..OwnershipSettings::default()
    };
    let clock = ManualClock::new(1_000);
    let a = Ownership::new(
        store.clone(),
        clock.clone(),
        TaskId::new("a").unwrap(),
        settings,
    );
    let b = Ownership::new(store.clone(), clock, TaskId::new("b").unwrap(), settings);
    let Resolution::Local(first) = a.resolve(&scope, &lifecycle).await.unwrap() else {
        panic!("a claims")
    };
    assert!(matches!(
        b.resolve(&scope, &lifecycle).await.unwrap(),
        Resolution::Remote { .. }
    ));
    drop(a.admit(&scope, first).await.unwrap());
    assert!(a.renew_all().await.iter().all(|(_, r)| r.is_ok()));
    h.expire_owner(&scope).await;
    let Resolution::Local(second) = b.resolve(&scope, &lifecycle).await.unwrap() else {
        panic!("b claims after expiry")
    };
    assert!(second > first);
    assert!(a.admit(&scope, first).await.is_err(), "a is stale");
}

/// A stored generation counter out of range (0, negative, above 2^53-1)
/// fails its scope closed, typed, with nothing written; the other scopes
/// of the same class claim go through. (A counter at 2^53-1 is valid but
/// spent: the conformance of `snapshot` accepts it, claims refuse it.)
#[tokio::test]
async fn a_corrupt_counter_fails_its_scope_closed_and_only_its_scope() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let (lifecycle, storage) = active(&h.store, "corrupt").await;
    let scopes = class_scopes(&storage, "Cart");
    let task = TaskId::new("a").unwrap();
    for bad in [0_i64, -4, 9_007_199_254_740_992, i64::MAX] {
        h.raw
            .execute(
                &format!(
                    "INSERT INTO {}.durability_owner_generations (scope, generation) VALUES ($1, $2)
             ON CONFLICT (scope) DO UPDATE SET generation = excluded.generation",
                    h.table
                ),
                &[&scopes[5].host_id(), &bad],
            )
            .await
            .unwrap();
        let before = h.raw_counter(&scopes[5]).await;
        let results = h
            .store
            .claim_many(&scopes, Claimant::new(&lifecycle, &task, 60_000))
            .await;
        for (i, r) in results.iter().enumerate() {
            match (i, r) {
                (5, Err(e)) => assert_eq!(e.code(), "invalid_lifecycle_state", "{bad}: {e}"),
                (5, Ok(_)) => panic!("{bad}: a corrupt counter was claimed over"),
                (_, r) => assert!(r.is_ok(), "{bad}: scope {i}: {r:?}"),
            }
        }
        let e = h.store.snapshot(&scopes[5], &lifecycle).await.unwrap_err();
        assert_eq!(e.code(), "invalid_lifecycle_state", "{bad}: {e}");
        let floor = durability_ownership::Generation::new(3).unwrap();
        let e = h
            .store
            .raise_generation_floor(&scopes[5], floor)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "invalid_lifecycle_state", "{bad}: {e}");
        assert_eq!(
            h.raw_counter(&scopes[5]).await,
            before,
            "{bad}: nothing written"
        );
        let owners: i64 = h
            .raw
            .query_one(
                &format!(
                    "SELECT count(*) FROM {}.durability_owner_leases WHERE scope = $1",
                    h.table
                ),
                &[&scopes[5].host_id()],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(owners, 0, "{bad}: no owner written");
    }
}

/// An object fence in memory: the claim it holds (generation and exact
/// record bytes), refusing lower generations and other holders of its own.
#[derive(Default)]
struct MemoryFence(std::sync::Mutex<Option<(u64, String)>>);

impl durability_ownership::ObjectFence for MemoryFence {
    fn fence_claim(
        &self,
        record: &durability_ownership::OwnerRecord,
        _budget: Option<Arc<dyn durability_ownership::BudgetCheck>>,
    ) -> Result<(), durability_ownership::OwnershipError> {
        let mut held = self.0.lock().unwrap();
        let g = record.generation().get();
        if let Some((stored, holder)) = &*held
            && (*stored > g || (*stored == g && holder != record.encoded()))
        {
            return Err(durability_ownership::OwnershipError::StaleGeneration {
                scope: record.scope().to_string(),
                attempted: g,
                stored: *stored,
            });
        }
        *held = Some((g, record.encoded().to_owned()));
        Ok(())
    }
}

/// The lease tables lost (truncated, as a restore from an old backup or a
/// recreated database loses them): claims start again from generation 1,
/// and opening the object through `fence_with_floor` raises the counter
/// above the generation its fence accepted, so no generation is handed out
/// twice.
#[tokio::test]
async fn a_wiped_table_is_brought_above_the_fence_by_the_floor() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let (lifecycle, storage) = active(&h.store, "wipe").await;
    let scope = class_scopes(&storage, "Cart").remove(0);
    let fence = MemoryFence::default();
    let clock: Arc<dyn durability_ownership::Clock> = Arc::new(ManualClock::new(0));
    let settings = durability_ownership::FloorSettings {
        clock: Arc::clone(&clock),
        ttl_ms: 60_000,
        guard_ms: 1_000,
    };
    let claim = |t: &'static str| {
        let store = h.store.clone();
        let (scope, lifecycle) = (scope.clone(), lifecycle.clone());
        async move {
            match store
                .claim(&scope, &lifecycle, &TaskId::new(t).unwrap(), 60_000)
                .await
                .unwrap()
            {
                ClaimOutcome::Claimed(l) => l,
                ClaimOutcome::Held(_) => panic!("{t}: held"),
            }
        }
    };
    for t in ["a", "b", "c"] {
        let lease = claim(t).await;
        let fenced = durability_ownership::fence_with_floor(&h.store, &fence, &settings, lease, 0)
            .await
            .unwrap();
        h.expire_owner(&scope).await;
        drop(fenced);
    }
    assert_eq!(h.raw_counter(&scope).await, Some(3));
    h.raw
        .batch_execute(&format!(
            "TRUNCATE {t}.durability_owner_leases, {t}.durability_owner_generations",
            t = h.table
        ))
        .await
        .unwrap();
    let reissued = claim("d").await;
    assert_eq!(
        reissued.record.generation().get(),
        1,
        "the wiped table starts over"
    );
    let fenced = durability_ownership::fence_with_floor(&h.store, &fence, &settings, reissued, 0)
        .await
        .unwrap();
    assert_eq!(
        fenced.lease.record.generation().get(),
        4,
        "above the fence's 3"
    );
    assert_eq!(h.raw_counter(&scope).await, Some(4));
}

/// The operator listing pages through every live lease once, in scope
/// order, leaves expired leases out and lists an invalid record with its
/// problem instead of hiding the healthy ones.
#[tokio::test]
async fn list_leases_pages_through_live_leases() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let (lifecycle, storage) = active(&h.store, "list").await;
    let scopes = class_scopes(&storage, "Cart");
    let task = TaskId::new("a").unwrap();
    for r in h
        .store
        .claim_many(&scopes, Claimant::new(&lifecycle, &task, 60_000))
        .await
    {
        r.unwrap();
    }
    h.expire_owner(&scopes[0]).await;
    h.put_raw_owner(&scopes[1], b"garbage").await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let page = h.store.list_leases(cursor.as_deref(), 4).await.unwrap();
        assert!(page.leases.len() <= 4);
        seen.extend(page.leases);
        cursor = page.cursor;
        if cursor.is_none() {
            break;
        }
    }
    assert!(cursor.is_none(), "paging ends");
    let names: Vec<&str> = seen.iter().map(|l| l.scope.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "scope order");
    assert_eq!(
        seen.len(),
        15,
        "every live lease once, the expired one left out"
    );
    let bad = seen
        .iter()
        .find(|l| l.scope == scopes[1].host_id())
        .unwrap();
    assert!(bad.problem.is_some() && bad.owner.is_none());
    assert!(
        seen.iter()
            .filter(|l| l.scope != scopes[1].host_id())
            .all(|l| l.owner.as_deref() == Some("a") && l.lease_left_ms > 0)
    );
    let e = h.store.list_leases(None, 0).await.unwrap_err();
    assert_eq!(e.code(), "invalid_input");
}

/// Hosts starting together all run the setup: concurrent setups of one
/// schema wait for each other (an advisory lock) and all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_setups_of_one_schema_all_succeed() {
    let Some(schema) = schema().await else { return };
    let name = format!("{}_fresh", schema.name());
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let leases = PostgresLeaseStore::connect(&url(), &name, ShardCount::default())?;
            leases.setup().await?;
            let index = durability_storage_postgres::alarms::PostgresAlarmIndex::connect(
                &url(),
                &name,
                durability_storage_postgres::alarms::IndexTime::Server,
            )?;
            index.setup().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    let results: Vec<_> = futures::future::join_all(tasks).await;
    let raw = raw_client().await;
    raw.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
        .await
        .unwrap();
    for r in results {
        r.unwrap().unwrap();
    }
}

/// A scope named twice in one `claim_many` is claimed once; the second
/// answer is that claim, held. Refusals stay per scope: a scope of another
/// storage in the same batch is refused, the rest are claimed.
#[tokio::test]
async fn claim_many_answers_per_scope() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let (lifecycle, storage) = active(&h.store, "many").await;
    let mut scopes = class_scopes(&storage, "Cart");
    scopes.truncate(2);
    scopes.push(scopes[0].clone());
    scopes.push(class_scopes(&StorageId::new("st-other").unwrap(), "Cart").remove(0));
    let task = TaskId::new("a").unwrap();
    let r = h
        .store
        .claim_many(&scopes, Claimant::new(&lifecycle, &task, 60_000))
        .await;
    let ClaimOutcome::Claimed(first) = r[0].as_ref().unwrap() else {
        panic!("first named: claimed")
    };
    assert!(matches!(r[1].as_ref().unwrap(), ClaimOutcome::Claimed(_)));
    match r[2].as_ref().unwrap() {
        ClaimOutcome::Held(l) => assert_eq!(l.record, first.record, "the same claim"),
        ClaimOutcome::Claimed(_) => panic!("a scope named twice was claimed twice"),
    }
    assert_eq!(r[3].as_ref().unwrap_err().code(), "storage_inactive");
    assert_eq!(h.raw_counter(&scopes[0]).await, Some(1));
    assert_eq!(
        h.raw_counter(&scopes[3]).await,
        None,
        "nothing written for the refused scope"
    );
    assert!(
        h.store
            .claim_many(&[], Claimant::new(&lifecycle, &task, 60_000))
            .await
            .is_empty()
    );
    let bad_ttl = h
        .store
        .claim_many(&scopes, Claimant::new(&lifecycle, &task, 0))
        .await;
    assert!(
        bad_ttl
            .iter()
            .all(|r| r.as_ref().unwrap_err().code() == "invalid_input")
    );
}
