//! The topology scene of `cargo xtask demo` and `cargo xtask bench topology`.
//!
//! The demo is the seed's tenant story: a coordinator object creates tenants
//! with three shards and limits, a stateless router reads the published
//! snapshot through the client to route writes, a shard is retired
//! (draining) and replaced, and a tenant is deleted. Snapshots are published
//! through SQLite by default, through Redis (version-aware) with a URL.
#![allow(clippy::print_stdout)]

use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::hash::{BuildHasher as _, Hasher as _};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use durability_scheduler::{Driver, ObjectContext, ObjectId, Scheduler, SchemaStep, SystemClock};
use durability_storage_sqlite::topology::SqlitePublication;
use durability_storage_sqlite::{SqliteOptions, SqliteStorage, Synchronous};
use durability_topology::{
    BoxError, Draft, Member, MemberInput, MemberState, Publisher, Role, StateChannel, StateUpdate,
    Topology, TopologyConfig,
};
use durability_topology_client::{ClientConfig, ReadStore, Snapshot, TopologyClient};
use serde_json::json;

use crate::INITIAL_STEP;

type Result<T = ()> = std::result::Result<T, Box<dyn Error>>;

/// The shards' own state: the limits each applied, with the version, applied
/// only when newer (as the seed's `applyLimits`).
#[derive(Clone, Default)]
struct Shards {
    applied: Arc<Mutex<BTreeMap<String, (u64, serde_json::Value)>>>,
}

impl Shards {
    fn apply(&self, member: &Member, update: &StateUpdate) {
        let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        let newer = applied
            .get(&member.id)
            .is_none_or(|(v, _)| update.version > *v);
        if newer {
            println!(
                "  shard {:<10} applies limits {} (update v{}, topology v{})",
                member.id, update.value, update.version, update.topology_version
            );
            applied.insert(member.id.clone(), (update.version, update.value.clone()));
        }
    }

    fn limits(&self, shard: &str) -> Option<serde_json::Value> {
        self.applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(shard)
            .map(|(_, v)| v.clone())
    }
}

fn route<'a>(snapshot: &'a Snapshot, key: &str) -> Option<&'a Member> {
    let writable: Vec<&Member> = snapshot.writable().collect();
    // FNV-1a: a stable hash, so a key routes the same way in every run.
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let n = usize::try_from(hash % u64::try_from(writable.len()).ok()?.max(1)).ok()?;
    writable.get(n).copied()
}

fn describe(s: &Snapshot) -> String {
    let members: Vec<String> = s
        .members
        .iter()
        .map(|m| match m.state {
            MemberState::Active => m.id.clone(),
            MemberState::Draining => format!("{} (draining)", m.id),
        })
        .collect();
    format!(
        "{} v{} from {}: [{}]",
        s.group,
        s.version,
        s.coordinator,
        members.join(", ")
    )
}

async fn settle<P: Publisher>(topology: &Topology<SqliteStorage, P>) -> Result {
    for _ in 0..200 {
        if topology.pending()? == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err("publication and deliveries did not settle".into())
}

async fn scene<P: Publisher, R: ReadStore>(
    dir: &std::path::Path,
    publisher: P,
    reader: R,
) -> Result {
    let storage = SqliteStorage::open(
        dir.join("coordinator.db"),
        SqliteOptions {
            synchronous: Synchronous::Normal,
            ..SqliteOptions::default()
        },
    )?;
    let ctx = ObjectContext::with_clock(
        ObjectId::new("coordinator-eu")?,
        Arc::new(storage),
        Arc::new(SystemClock),
    );
    let scheduler = Scheduler::new(ctx)?;
    let shards = Shards::default();
    let s = shards.clone();
    let limits = StateChannel::new(Arc::new(move |member: Member, update: StateUpdate| {
        let s = s.clone();
        Box::pin(async move {
            s.apply(&member, &update);
            Ok::<(), BoxError>(())
        })
    }))
    .role(Role::Write);
    let topology = Topology::attach(
        &scheduler,
        TopologyConfig::new()
            .publish(publisher)
            .state("limits", limits),
    )?;
    let _driver = Driver::start(scheduler.clone());

    println!("-- create tenants with three shards and limits");
    for (tenant, rps) in [("acme", 100), ("globex", 50)] {
        let out = topology
            .update(tenant, |_| {
                Draft::new()
                    .members((0..3).map(|n| MemberInput::active(format!("{tenant}-{n}"))))
                    .state("limits", json!({ "rps": rps }))
            })
            .await?;
        println!(
            "  {} (published: {})",
            describe(&out.snapshot),
            out.published
        );
    }
    settle(&topology).await?;

    println!("-- a stateless router routes writes with the client (never the coordinator)");
    let client = TopologyClient::new(reader, ClientConfig::new().ttl(Duration::from_millis(100)))?;
    let acme = client.get("acme").await?;
    for key in ["order-1", "order-2", "order-3", "order-4"] {
        if let Some(shard) = route(&acme, key) {
            println!("  write {key:<8} -> {}", shard.id);
        }
    }

    println!("-- retire shard acme-1: it drains (read set only) and acme-3 joins");
    let out = topology
        .update("acme", |cur| {
            let mut members: Vec<MemberInput> = cur
                .members
                .iter()
                .map(|m| {
                    let mut input = MemberInput::from(m);
                    if m.id == "acme-1" {
                        input.state = MemberState::Draining;
                    }
                    input
                })
                .collect();
            members.push(MemberInput::active(format!("acme-{}", cur.members.len())));
            Draft::new().members(members)
        })
        .await?;
    println!("  {}", describe(&out.snapshot));
    settle(&topology).await?;
    println!(
        "  acme-3 got the current limits in the transaction that added it: {}",
        shards.limits("acme-3").unwrap_or_default()
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    let acme = client.get("acme").await?;
    println!("  the router's cache expired; it reads {}", describe(&acme));
    for key in ["order-1", "order-2", "order-3", "order-4"] {
        if let Some(shard) = route(&acme, key) {
            println!("  write {key:<8} -> {}", shard.id);
        }
    }
    let readers: Vec<&str> = acme.members.iter().map(|m| m.id.as_str()).collect();
    println!("  queries still reach every member that may hold data: {readers:?}");

    println!("-- raise acme's limits: every active shard converges, each retried on its own");
    topology
        .update("acme", |_| {
            Draft::new().state("limits", json!({ "rps": 200 }))
        })
        .await?;
    settle(&topology).await?;

    println!("-- delete tenant globex");
    let out = topology.delete("globex").await?;
    println!("  deleted (published: {})", out.published);
    tokio::time::sleep(Duration::from_millis(150)).await;
    match client.get("globex").await {
        Ok(s) => println!("  unexpected: {}", describe(&s)),
        Err(e) => println!("  the router now gets: {e} [{}]", e.code()),
    }
    scheduler.settle().await;
    Ok(())
}

/// The tenant story on SQLite, or on Redis with `redis_url`.
///
/// # Errors
/// A storage, publisher or client failure.
pub(crate) async fn demo(redis_url: Option<&str>) -> Result {
    let dir = tempfile::tempdir()?;
    match redis_url {
        None => {
            println!("== topology: tenants and shards, published through SQLite");
            let kv = dir.path().join("topology.db");
            println!("publication store: {}", kv.display());
            scene(
                dir.path(),
                SqlitePublication::open(&kv)?,
                SqlitePublication::open(&kv)?,
            )
            .await
        }
        Some(url) => {
            use durability_storage_redis::topology::{
                RedisReadStore, RedisVersionedPublisher, connect,
            };
            println!(
                "== topology: tenants and shards, published through Redis at {url} (version-aware)"
            );
            let conn = connect(url).await?;
            let unique = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish();
            let prefix = format!("durability:demo:{unique:016x}:topology:");
            scene(
                dir.path(),
                RedisVersionedPublisher::new(conn.clone(), &prefix),
                RedisReadStore::new(conn, &prefix),
            )
            .await
        }
    }
}

/// A read store holding one group, for the cached `get` benchmark.
struct OneGroup(Vec<u8>);

impl ReadStore for OneGroup {
    async fn read(&self, _group: &str) -> std::result::Result<Option<Vec<u8>>, BoxError> {
        Ok(Some(self.0.clone()))
    }
}

fn figure(name: &str, value: f64, baseline: f64, unit: &str, target: &str, n: u64) {
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    println!(
        "{}",
        json!({
            "name": name, "value": round(value), "baseline": round(baseline), "unit": unit,
            "ratio": round(value / baseline), "target": target, "n": n,
        })
    );
}

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
fn elapsed_ns(f: impl FnOnce()) -> f64 {
    let t = std::time::Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1e9
}

static BASE_STEPS: &[SchemaStep] = &[INITIAL_STEP];
static BASE_SQL: &[durability_storage_sqlite::SqliteSchemaStep] =
    &[durability_storage_sqlite::SqliteSchemaStep {
        step: INITIAL_STEP,
        up: "CREATE TABLE bench_groups (
                group_id TEXT PRIMARY KEY NOT NULL, version INTEGER NOT NULL,
                members TEXT NOT NULL, deleted INTEGER NOT NULL, updated_at INTEGER NOT NULL
             ) WITHOUT ROWID;",
        down: "DROP TABLE bench_groups;",
    }];

/// `cargo xtask bench topology`: a cached `get` against a bare `HashMap`
/// lookup behind the same lock type, and `update` changing one member (no
/// publisher) against a bare transaction reading and writing the same row.
///
/// # Errors
/// A storage or runtime failure.
pub(crate) fn bench() -> Result {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;

    // Cached get.
    let kv = dir.path().join("kv.db");
    let publication = SqlitePublication::open(&kv)?;
    let clock = Arc::new(SystemClock);
    let storage = Arc::new(SqliteStorage::open(
        dir.path().join("c.db"),
        SqliteOptions::default(),
    )?);
    let sched = Scheduler::new(ObjectContext::with_clock(
        ObjectId::new("bench")?,
        storage,
        clock,
    ))?;
    let topology = Topology::attach(&sched, TopologyConfig::new().publish(publication))?;
    rt.block_on(topology.update("tenant", |_| {
        Draft::new().members((0..3).map(|n| MemberInput::active(format!("tenant-{n}"))))
    }))?;
    let encoded = rt
        .block_on(SqlitePublication::open(&kv)?.read("tenant"))
        .map_err(|e| e as Box<dyn Error>)?
        .ok_or("nothing published")?;
    let client = TopologyClient::new(
        OneGroup(encoded),
        ClientConfig::new().ttl(Duration::from_secs(3600)),
    )?;
    let snapshot = rt.block_on(client.get("tenant"))?;
    let n: u64 = 1_000_000;
    let value = elapsed_ns(|| {
        rt.block_on(async {
            for _ in 0..n {
                let s = client.get("tenant").await;
                std::hint::black_box(s.is_ok());
            }
        });
    }) / n as f64;
    let map: Mutex<HashMap<String, Arc<Snapshot>>> =
        Mutex::new(HashMap::from([("tenant".to_owned(), snapshot)]));
    let baseline = elapsed_ns(|| {
        for _ in 0..n {
            let s = map
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(std::hint::black_box("tenant"))
                .cloned();
            std::hint::black_box(s.is_some());
        }
    }) / n as f64;
    eprintln!("cached get: {value:.1} ns/op vs bare HashMap behind a Mutex {baseline:.1} ns/op");
    figure("topology.cached_get", value, baseline, "ns/op", "<=3", n);

    // update changing one member, no publisher.
    let mut storage = SqliteStorage::open(
        dir.path().join("u.db"),
        SqliteOptions {
            synchronous: Synchronous::Normal,
            ..SqliteOptions::default()
        },
    )?;
    storage.register_schema("bench", BASE_STEPS, BASE_SQL)?;
    let sched = Scheduler::new(ObjectContext::new(
        ObjectId::new("bench")?,
        Arc::new(storage),
    ))?;
    durability_scheduler::migrate(
        sched.context().storage().as_ref(),
        "bench",
        &durability_scheduler::SchemaTarget::Latest,
    )?;
    let topology = Topology::attach(&sched, TopologyConfig::new())?;
    let members = |i: u64| {
        (0..3)
            .map(|n| MemberInput::active(format!("tenant-{n}")))
            .chain(std::iter::once(MemberInput::active(format!(
                "extra-{}",
                i % 2
            ))))
            .collect::<Vec<_>>()
    };
    rt.block_on(topology.update("tenant", |_| Draft::new().members(members(1))))?;
    let n: u64 = 5_000;
    let value = elapsed_ns(|| {
        rt.block_on(async {
            for i in 0..n {
                let out = topology
                    .update("tenant", |_| Draft::new().members(members(i)))
                    .await;
                std::hint::black_box(out.is_ok());
            }
        });
    }) / n as f64
        / 1000.0;
    let rows = [
        r#"[{"id":"extra-0","state":"active","joinedAt":1},{"id":"tenant-0","state":"active","joinedAt":1}]"#,
        r#"[{"id":"extra-1","state":"active","joinedAt":1},{"id":"tenant-0","state":"active","joinedAt":1}]"#,
    ];
    let baseline = elapsed_ns(|| {
        for i in 0..n {
            let r = sched.transaction(|tx| {
                let version: Option<i64> = tx
                    .sql()
                    .query_row(
                        "SELECT version FROM bench_groups WHERE group_id = ?1",
                        ["tenant"],
                        |r| r.get(0),
                    )
                    .ok();
                tx.sql()
                    .execute(
                        "INSERT INTO bench_groups (group_id, version, members, deleted, updated_at)
                         VALUES (?1, ?2, ?3, 0, ?4)
                         ON CONFLICT (group_id) DO UPDATE SET version = excluded.version,
                           members = excluded.members, updated_at = excluded.updated_at",
                        rusqlite::params![
                            "tenant",
                            version.unwrap_or(0) + 1,
                            rows[usize::from(i % 2 == 1)],
                            1_i64
                        ],
                    )
                    .map_err(|e| durability_scheduler::StorageError::backend("bench", e))
            });
            std::hint::black_box(r.is_ok());
        }
    }) / n as f64
        / 1000.0;
    eprintln!(
        "update (one member changed, no publisher): {value:.1} us/op vs bare transaction {baseline:.1} us/op"
    );
    figure("topology.update", value, baseline, "us/op", "<=2", n);
    Ok(())
}
