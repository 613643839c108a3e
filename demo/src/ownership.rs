//! Ownership scenes for `cargo xtask demo` and `cargo xtask bench ownership`.
//!
//! [`demo`] tells a failover story: two hosts, one pauses past its lease, the
//! other takes over, and the stale host's late commit is refused by the
//! object's own database. [`bench()`] measures renew, claim and admission on
//! Redis against raw Redis baselines in the same run, one JSON object per line
//! on stdout (human text on stderr).

#![allow(
    clippy::print_stdout,
    reason = "the demo prints its story and its JSON lines"
)]

use std::error::Error;
use std::path::Path;
use std::time::{Duration, Instant};

use durability_ownership::conformance::{HookedStore, Hooks};
use durability_ownership::{
    Admission, ClaimOutcome, ClassName, Generation, LeaseStore, LifecycleAdmin, LifecycleId,
    ManualClock, ObjectName, OwnerRecord, OwnerScope, Ownership, OwnershipError, OwnershipSettings,
    Resolution, ShardCount, StorageId, TaskId,
};
use durability_storage_redis::ownership::RedisLeaseStore;
use durability_storage_sqlite::ownership::{
    SqliteLeaseStore, check_generation, ensure_fence_schema, record_generation,
};
use rusqlite::{Connection, params};

type BoxResult<T> = Result<T, Box<dyn Error>>;

const DEMO_TTL_MS: u64 = 1_000;

fn object_db(path: &Path) -> BoxResult<Connection> {
    let c = Connection::open(path)?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.busy_timeout(Duration::from_secs(5))?;
    ensure_fence_schema(&c)?;
    c.execute_batch("CREATE TABLE IF NOT EXISTS messages (seq INTEGER PRIMARY KEY, host TEXT, generation INTEGER, body TEXT)")?;
    Ok(c)
}

/// One fenced commit into the object's database: records the claim
/// (generation and holder) at the host's first dispatch, checks it, writes.
fn fenced_commit(
    conn: &mut Connection,
    scope: &OwnerScope,
    generation: Generation,
    first: bool,
    host: &str,
    body: &str,
) -> Result<(), OwnershipError> {
    let tx = conn
        .transaction()
        .map_err(|e| OwnershipError::StoreUnavailable {
            source: Box::new(e),
        })?;
    // The claim's record: the bytes the lease store wrote for it.
    let record = OwnerRecord::new(
        scope.clone(),
        LifecycleId::new("demo:chat")?,
        TaskId::new(host)?,
        generation,
    );
    if first {
        record_generation(&tx, &record)?;
    }
    check_generation(&tx, &record)?;
    tx.execute(
        "INSERT INTO messages (host, generation, body) VALUES (?1, ?2, ?3)",
        params![
            host,
            i64::try_from(generation.get()).unwrap_or(i64::MAX),
            body
        ],
    )
    .and_then(|_| tx.commit())
    .map_err(|e| OwnershipError::OwnerUnavailable {
        source: Box::new(e),
    })
}

async fn story<S: LeaseStore + LifecycleAdmin>(
    store_a: S,
    store_b: S,
    clock: ManualClock,
    dir: &Path,
    lease_passes: impl AsyncFnOnce(),
) -> BoxResult<()> {
    let lifecycle = LifecycleId::new("demo:chat")?;
    let storage = StorageId::new("st-demo")?;
    store_a
        .set_active_storage(&lifecycle, Some(&storage))
        .await?;
    let object = ObjectName::new("room-1");
    let scope = OwnerScope::for_object(
        storage,
        ClassName::new("Room")?,
        &object,
        ShardCount::default(),
    )?;
    let settings = OwnershipSettings {
        owner_ttl_ms: DEMO_TTL_MS,
        lease_guard_ms: 100,
        ..OwnershipSettings::default()
    };
    let host_a = Ownership::new(store_a, clock.clone(), TaskId::new("host-a")?, settings);
    let host_b = Ownership::new(store_b, clock.clone(), TaskId::new("host-b")?, settings);
    let mut db_a = object_db(&dir.join("room-1.db"))?;
    let mut db_b = object_db(&dir.join("room-1.db"))?;

    println!(
        "object `room-1` of class Room lives in owner scope {scope} (shard = stable hash % 16)"
    );
    let Resolution::Local(g1) = host_a.resolve(&scope, &lifecycle).await? else {
        return Err("host-a should own the free scope".into());
    };
    println!(
        "1. host-a claims the scope: generation {}, lease {DEMO_TTL_MS} ms",
        g1.get()
    );
    match host_b.resolve(&scope, &lifecycle).await? {
        Resolution::Remote {
            task, generation, ..
        } => {
            println!(
                "   host-b asks: owned by {} at generation {} -> it would forward",
                task.as_str(),
                generation.get()
            );
        }
        Resolution::Local(_) => return Err("two owners at once".into()),
    }
    let permit = host_a.admit(&scope, g1).await?;
    fenced_commit(
        &mut db_a,
        &scope,
        permit.generation(),
        true,
        "host-a",
        "hello",
    )?;
    drop(permit);
    println!(
        "2. host-a admits a dispatch, records generation {} in room-1's database and commits `hello`",
        g1.get()
    );
    let paused = host_a.admit(&scope, g1).await?;
    println!(
        "3. host-a admits another dispatch ... and pauses before its commit (a long GC pause)"
    );
    lease_passes().await;
    println!("4. the lease runs out on the lease store's clock");
    let Resolution::Local(g2) = host_b.resolve(&scope, &lifecycle).await? else {
        return Err("host-b should take over the expired scope".into());
    };
    println!(
        "5. host-b claims the expired scope: generation {} (never decreases)",
        g2.get()
    );
    let permit = host_b.admit(&scope, g2).await?;
    fenced_commit(&mut db_b, &scope, g2, true, "host-b", "taken over")?;
    drop(permit);
    println!(
        "6. host-b's first dispatch raises room-1's fence to generation {} and commits `taken over`",
        g2.get()
    );
    match fenced_commit(&mut db_a, &scope, g1, false, "host-a", "late write") {
        Err(e @ OwnershipError::StaleGeneration { .. }) => {
            println!(
                "7. host-a wakes up and tries to commit `late write`: refused by the storage itself"
            );
            println!(
                "   error {}: {e} (retry once via the new owner: {})",
                e.code(),
                e.may_retry(false)
            );
        }
        Err(e) => return Err(format!("unexpected error: {e}").into()),
        Ok(()) => return Err("the stale commit landed: fencing failed".into()),
    }
    drop(paused);
    match host_a.admit(&scope, g1).await {
        Err(e) => println!(
            "8. host-a's next admission fails closed before dispatch: {}",
            e.code()
        ),
        Ok(_) => return Err("a stale host was admitted".into()),
    }
    let mut stmt = db_b.prepare("SELECT host, generation, body FROM messages ORDER BY seq")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, String>(2)?,
        ))
    })?;
    println!("room-1 now holds:");
    for row in rows {
        let (host, generation, body) = row?;
        println!("   [{host} @ generation {generation}] {body}");
    }
    Ok(())
}

/// The failover scene. Uses a SQLite lease store in a temporary directory, or
/// Redis when `redis_url` is given (then the lease really runs out on Redis
/// time, about one second).
///
/// # Errors
/// Any failure of the scene, including a stale commit that was not refused.
pub(crate) async fn demo(redis_url: Option<&str>) -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(1_000_000);
    match redis_url {
        None => {
            println!(
                "== ownership failover (lease store: SQLite {}) ==",
                dir.path().join("leases.db").display()
            );
            let open = || {
                SqliteLeaseStore::open(
                    dir.path().join("leases.db"),
                    clock.clone(),
                    ShardCount::default(),
                )
            };
            let (a, b) = (open()?, open()?);
            let c = clock.clone();
            story(a, b, clock, dir.path(), async move || {
                c.advance(DEMO_TTL_MS.cast_signed())
            })
            .await
        }
        Some(url) => {
            println!("== ownership failover (lease store: Redis {url}) ==");
            let prefix = format!("durability:demo:{}:", std::process::id());
            let a = RedisLeaseStore::connect(url, &prefix, ShardCount::default()).await?;
            let b = a.clone();
            let cleanup = a.clone();
            let c = clock.clone();
            let out = story(a, b, clock, dir.path(), async move || {
                c.advance(DEMO_TTL_MS.cast_signed());
                tokio::time::sleep(Duration::from_millis(DEMO_TTL_MS + 50)).await;
            })
            .await;
            delete_prefix(cleanup.connection(), &prefix).await?;
            out
        }
    }
}

/// Deletes every Redis key under `prefix` (in chunks of 500 keys).
pub(crate) async fn delete_prefix(
    mut conn: redis::aio::ConnectionManager,
    prefix: &str,
) -> BoxResult<()> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await?;
    for chunk in keys.chunks(500) {
        let _: () = redis::cmd("DEL").arg(chunk).query_async(&mut conn).await?;
    }
    Ok(())
}

#[allow(clippy::disallowed_methods, reason = "benchmarks measure wall time")]
pub(crate) fn start() -> Instant {
    Instant::now()
}

/// The median of per-operation samples in microseconds (robust to load spikes
/// from other processes on a shared machine).
pub(crate) fn median_us(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples
        .get(samples.len() / 2)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// Rounds of a paired measurement that warm up and are not recorded.
const WARM_UP: u64 = 200;

/// Per-operation samples of ours and of a raw baseline, taken in turns.
#[derive(Default)]
struct Paired {
    ours: Vec<Duration>,
    raw: Vec<Duration>,
}

impl Paired {
    /// Records round `round`'s two times (none of the first [`WARM_UP`]).
    fn record(&mut self, round: u64, ours: Duration, raw: Duration) {
        if round >= WARM_UP {
            self.ours.push(ours);
            self.raw.push(raw);
        }
    }

    /// Prints the medians of operation `op` and of `baseline` on stderr,
    /// and the figure `name` as a JSON [`line()`].
    fn report(self, op: &str, baseline: &str, name: &str, target: &str, n: u64) {
        let (ours, raw) = (median_us(self.ours), median_us(self.raw));
        eprintln!("{op}: median {ours:.1} us vs {baseline} {raw:.1} us");
        line(name, ours, Some(raw), "us/op", target, n);
    }
}

fn per_op(elapsed: Duration, n: u64, scale: f64) -> f64 {
    elapsed.as_secs_f64() * scale / n as f64
}

fn line(name: &str, value: f64, baseline: Option<f64>, unit: &str, target: &str, n: u64) {
    let ratio = baseline.map(|b| value / b);
    let v = serde_json::json!({
        "name": name,
        "value": (value * 100.0).round() / 100.0,
        "baseline": baseline.map(|b| (b * 100.0).round() / 100.0),
        "unit": unit,
        "ratio": ratio.map(|r| (r * 1000.0).round() / 1000.0),
        "target": target,
        "n": n,
        "backend": "redis",
    });
    println!("{v}");
}

/// `cargo xtask bench ownership`: medians of renew vs a raw `EVALSHA` compare-and-expire
/// (target ratio ≤ 1.2), claim vs a raw `SET NX PX` (≤ 1.5), a renew cycle of
/// 1, 100 and 1,000 scopes (`renew_all`, batched, vs one renew per scope:
/// time and server-counted round trips), and cached
/// admission ([`Admission::Cached`]) with ample budget (asserted to do no
/// I/O; its cost in ns).
///
/// # Errors
/// Redis failures, or admission that did I/O.
pub(crate) async fn bench(redis_url: &str) -> Result<(), Box<dyn Error>> {
    const N: u64 = 2_000;
    const PEER_ITERATIONS: u64 = 20_000;
    let prefix = format!("durability:bench:{}:", std::process::id());
    let store = RedisLeaseStore::connect(redis_url, &prefix, ShardCount::default()).await?;
    let out = bench_on(&store, &prefix, N).await;
    let out = match out {
        Ok(()) => renew_cycles(&store).await,
        Err(e) => Err(e),
    };
    let out = match out {
        Ok(()) => crate::lease_peers::bench(redis_url, &store, PEER_ITERATIONS)
            .await
            .map_err(|e| e as Box<dyn Error>),
        Err(e) => Err(e),
    };
    delete_prefix(store.connection(), &prefix).await?;
    out
}

/// Script calls (`EVALSHA`, `EVAL`, `SCRIPT`) the server has executed: the
/// lease store's round trips, plus any other client's script calls on a
/// shared server.
async fn script_calls(store: &RedisLeaseStore) -> BoxResult<u64> {
    let mut c = store.connection();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await?;
    Ok(info
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            if !matches!(name, "cmdstat_evalsha" | "cmdstat_eval" | "cmdstat_script") {
                return None;
            }
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()
        })
        .sum())
}

/// One renew cycle of 1, 100 and 1,000 owned scopes: `renew_all` (batched
/// through `renew_many`) against renewing each scope on its own, measured in
/// the same run, with the round trips the server counted for each.
async fn renew_cycles(store: &RedisLeaseStore) -> BoxResult<()> {
    let lifecycle = LifecycleId::new("bench:cycle")?;
    let storage = StorageId::new("st-cycle")?;
    store.set_active_storage(&lifecycle, Some(&storage)).await?;
    let settings = OwnershipSettings {
        owner_ttl_ms: 60_000,
        ..OwnershipSettings::default()
    };
    for n in [1_u32, 100, 1000] {
        let o = Ownership::new(
            store.clone(),
            ManualClock::new(0),
            TaskId::new(&format!("bench-cycle-{n}"))?,
            settings,
        );
        let mut scopes = Vec::new();
        for i in 0..n {
            let scope = OwnerScope::new(
                storage.clone(),
                ClassName::new(&format!("Cycle{n}x{i}"))?,
                i % 16,
                ShardCount::default(),
            )?;
            let Resolution::Local(_) = o.resolve(&scope, &lifecycle).await? else {
                return Err("bench cycle scope held elsewhere".into());
            };
            scopes.push(scope);
        }
        for _ in 0..3 {
            o.renew_all().await;
            for s in &scopes {
                o.renew(s).await?;
            }
        }
        let before = script_calls(store).await?;
        let renewed = o.renew_all().await;
        let trips = script_calls(store).await? - before;
        if renewed.iter().any(|(_, r)| r.is_err()) {
            return Err("a batched renew failed".into());
        }
        let before = script_calls(store).await?;
        for s in &scopes {
            o.renew(s).await?;
        }
        let base_trips = script_calls(store).await? - before;
        let iterations = (20_000 / n).clamp(20, 2000);
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        for _ in 0..iterations {
            let t = start();
            let renewed = o.renew_all().await;
            ours.push(t.elapsed());
            if renewed.iter().any(|(_, r)| r.is_err()) {
                return Err("a batched renew failed".into());
            }
            let t = start();
            for s in &scopes {
                o.renew(s).await?;
            }
            base.push(t.elapsed());
        }
        let (ours, base) = (median_us(ours), median_us(base));
        eprintln!(
            "renew cycle of {n} scopes: renew_all {ours:.1} us in {trips} round trips vs one by one {base:.1} us in {base_trips}"
        );
        let v = serde_json::json!({
            "name": format!("ownership.renew_cycle.{n}"),
            "value": (ours * 100.0).round() / 100.0,
            "baseline": (base * 100.0).round() / 100.0,
            "unit": "us/cycle",
            "ratio": ((ours / base) * 1000.0).round() / 1000.0,
            "target": "round_trips = ceil(scopes / 256)",
            "scopes": n,
            "round_trips": trips,
            "baseline_round_trips": base_trips,
            "round_trip_ratio": (trips as f64 / base_trips.max(1) as f64 * 1000.0).round() / 1000.0,
            "n": iterations,
            "backend": "redis",
        });
        println!("{v}");
    }
    Ok(())
}

async fn bench_on(store: &RedisLeaseStore, prefix: &str, n: u64) -> BoxResult<()> {
    let mut conn = store.connection();
    let lifecycle = LifecycleId::new("bench:w")?;
    let storage = StorageId::new("st-bench")?;
    store.set_active_storage(&lifecycle, Some(&storage)).await?;
    let task = TaskId::new("bench-task")?;
    let count = ShardCount::default();
    let ttl = 60_000_u64;

    // Renew against a raw compare-and-expire script on the same connection.
    let scope = OwnerScope::new(storage.clone(), ClassName::new("Renew")?, 0, count)?;
    let ClaimOutcome::Claimed(lease) = store.claim(&scope, &lifecycle, &task, ttl).await? else {
        return Err("bench scope already held".into());
    };
    let raw_key = format!("{prefix}raw:renew");
    let _: () = redis::cmd("SET")
        .arg(&raw_key)
        .arg(lease.record.encoded())
        .query_async(&mut conn)
        .await?;
    let cas = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0",
    );
    let mut samples = Paired::default();
    for i in 0..n + WARM_UP {
        let t = start();
        store.renew(&lease.record, ttl).await?;
        let d_ours = t.elapsed();
        let t = start();
        let ok: i64 = cas
            .key(&raw_key)
            .arg(lease.record.encoded())
            .arg(ttl)
            .invoke_async(&mut conn)
            .await?;
        let d_raw = t.elapsed();
        if ok != 1 {
            return Err("raw compare-and-expire failed".into());
        }
        samples.record(i, d_ours, d_raw);
    }
    let baseline = "raw EVALSHA compare-and-expire";
    samples.report("renew", baseline, "ownership.renew", "<=1.2", n);

    // Claim of a fresh scope against a raw SET NX PX.
    let mut samples = Paired::default();
    for i in 0..n + WARM_UP {
        let scope = OwnerScope::new(storage.clone(), ClassName::new(&format!("C{i}"))?, 0, count)?;
        let t = start();
        let claimed = store.claim(&scope, &lifecycle, &task, ttl).await?;
        let d_ours = t.elapsed();
        let t = start();
        let set: Option<String> = redis::cmd("SET")
            .arg(format!("{prefix}raw:claim:{i}"))
            .arg(lease.record.encoded())
            .arg("NX")
            .arg("PX")
            .arg(ttl)
            .query_async(&mut conn)
            .await?;
        let d_raw = t.elapsed();
        if !matches!(claimed, ClaimOutcome::Claimed(_)) || set.is_none() {
            return Err("bench claim did not claim".into());
        }
        samples.record(i, d_ours, d_raw);
    }
    samples.report("claim", "raw SET NX PX", "ownership.claim", "<=1.5", n);

    // Admission with ample budget: no I/O.
    // A store wrapper counting calls, to assert that admission does no I/O.
    let calls = Hooks::new();
    let counted = HookedStore::new(store.clone(), calls.clone());
    let clock = ManualClock::new(0);
    let settings = OwnershipSettings {
        owner_ttl_ms: ttl,
        admission: Admission::Cached,
        ..OwnershipSettings::default()
    };
    let owner = Ownership::new(counted, clock, TaskId::new("bench-admit")?, settings);
    let scope = OwnerScope::new(storage, ClassName::new("Admit")?, 0, count)?;
    let Resolution::Local(g) = owner.resolve(&scope, &lifecycle).await? else {
        return Err("admission scope held elsewhere".into());
    };
    let before = calls.total();
    let admits = 200_000_u64;
    let t = start();
    for _ in 0..admits {
        let permit = owner.admit(&scope, g).await?;
        drop(permit);
    }
    let elapsed = t.elapsed();
    let io = calls.total() - before;
    if io != 0 {
        return Err(format!("admission with ample budget did {io} store calls").into());
    }
    eprintln!("admission: {admits} admits in {elapsed:?}, 0 store calls");
    let v = serde_json::json!({
        "name": "ownership.admit",
        "value": (per_op(elapsed, admits, 1e9) * 100.0).round() / 100.0,
        "baseline": null,
        "unit": "ns/op",
        "ratio": null,
        "target": "no I/O",
        "store_calls": io,
        "n": admits,
        "backend": "redis",
    });
    println!("{v}");
    Ok(())
}
