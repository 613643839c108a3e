//! The Redis publication stores against a real Redis: the publication
//! conformance suite for the plain `SET`/`DEL` publisher and the
//! version-aware Lua publisher, a late old write landing over each, and the
//! coordinator and client end to end. Each test uses its own key prefix.
//! Without Redis a test prints that it skipped, unless
//! `DURABILITY_REQUIRE_SERVICES=1`.
#![allow(clippy::unwrap_used)]

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use durability_scheduler::{ManualClock, ObjectContext, ObjectId, Scheduler, Storage as _};
use durability_storage_redis::topology::{
    RedisPublisher, RedisReadStore, RedisVersionedPublisher, connect,
};
use durability_storage_sqlite::{SqliteOptions, SqliteStorage, Synchronous};
use durability_topology::conformance::{coordinator_snapshots, memory_storage, run_publication};
use durability_topology::{
    Draft, EncodedSnapshot, MemberInput, Publisher, Topology, TopologyConfig,
};
use durability_topology_client::{ClientConfig, ReadStore, Snapshot, TopologyClient, decode};
use redis::aio::ConnectionManager;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// The Redis URL of the tests (`DURABILITY_REDIS_URL`, else loopback).
fn redis_url() -> String {
    std::env::var("DURABILITY_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

async fn redis(test: &str) -> Option<(ConnectionManager, String)> {
    let url = redis_url();
    let unique = RandomState::new().build_hasher().finish();
    let prefix = format!("durability:test:{unique:016x}:{test}:");
    match connect(&url).await {
        Ok(c) => Some((c, prefix)),
        Err(e) if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("Redis at {url} is required (DURABILITY_REQUIRE_SERVICES=1): {e}")
        }
        Err(e) => {
            eprintln!("skipped {test}: Redis at {url} unreachable: {e}");
            None
        }
    }
}

/// Runs the publication conformance suite on the publisher `make` builds
/// over a fresh prefix, read back through a `RedisReadStore` (`versioned`:
/// the publisher refuses late old writes).
async fn publication_suite<P: Publisher>(
    test: &str,
    make: impl FnOnce(ConnectionManager, &str) -> P,
    versioned: bool,
) {
    let Some((conn, prefix)) = redis(test).await else {
        return;
    };
    let publisher = make(conn.clone(), &prefix);
    let reader = RedisReadStore::new(conn, &prefix);
    run_publication(&publisher, &reader, "", versioned).await;
}

#[tokio::test]
async fn plain_redis_publisher_passes_the_conformance_suite_and_is_last_write_wins() {
    publication_suite("plain", |c, p| RedisPublisher::new(c, p), false).await;
}

#[tokio::test]
async fn versioned_redis_publisher_passes_the_conformance_suite_and_refuses_late_old_writes() {
    publication_suite("versioned", |c, p| RedisVersionedPublisher::new(c, p), true).await;
}

/// Writes `new`, then the late `old`, through `publisher`; returns what a
/// reader under `prefix` then reads of group `g`.
async fn late_write<P: Publisher>(
    publisher: &P,
    conn: &ConnectionManager,
    prefix: &str,
    old: &(Snapshot, EncodedSnapshot),
    new: &(Snapshot, EncodedSnapshot),
) -> Option<Vec<u8>> {
    publisher.write(&new.0, &new.1).await.unwrap();
    publisher.write(&old.0, &old.1).await.unwrap();
    RedisReadStore::new(conn.clone(), prefix)
        .read("g")
        .await
        .unwrap()
}

#[tokio::test]
async fn a_late_old_write_overwrites_a_plain_store_but_never_a_versioned_one() {
    let Some((conn, prefix)) = redis("late").await else {
        return;
    };
    let written = coordinator_snapshots("c", "g", &[Some(1), Some(2)]).await;
    let (old, new) = (&written[0], &written[1]);
    let (plain_at, versioned_at) = (format!("{prefix}plain:"), format!("{prefix}versioned:"));
    let plain = RedisPublisher::new(conn.clone(), &plain_at);
    let versioned = RedisVersionedPublisher::new(conn.clone(), &versioned_at);
    for (name, landed) in [
        (
            "plain",
            late_write(&plain, &conn, &plain_at, old, new).await,
        ),
        (
            "versioned",
            late_write(&versioned, &conn, &versioned_at, old, new).await,
        ),
    ] {
        let version = decode(&landed.unwrap()).unwrap().version;
        match name {
            "plain" => assert_eq!(version, 1, "plain SET: the late old write lands"),
            _ => assert_eq!(version, 2, "versioned: the late old write is refused"),
        }
    }
}

#[tokio::test]
async fn the_coordinator_publishes_through_redis_and_the_client_reads_it() {
    let Some((conn, prefix)) = redis("e2e").await else {
        return;
    };
    let clock = ManualClock::new(1_700_000_000_000);
    let ctx = ObjectContext::with_clock(
        ObjectId::new("coord").unwrap(),
        Arc::new(memory_storage()),
        Arc::new(clock.clone()),
    );
    let sched = Scheduler::new(ctx).unwrap();
    let topology = Topology::attach(
        &sched,
        TopologyConfig::new().publish(RedisVersionedPublisher::new(conn.clone(), &prefix)),
    )
    .unwrap();
    let out = topology
        .update("tenant", |_| {
            Draft::new().members(vec![MemberInput::active("s0"), MemberInput::active("s1")])
        })
        .await
        .unwrap();
    assert!(out.published);
    let client = TopologyClient::new(
        RedisReadStore::new(conn, &prefix),
        ClientConfig::new().clock(Arc::new(clock)),
    )
    .unwrap();
    assert_eq!(*client.get("tenant").await.unwrap(), out.snapshot);
    assert!(topology.delete("tenant").await.unwrap().published);
}

// ---- A real stall: a paused TCP proxy in front of Redis ----

/// A TCP proxy in front of Redis that can be paused: while paused, bytes
/// from clients are read and held, then forwarded on resume (a stalled
/// network path). Replies flow back unpaused.
#[derive(Clone)]
struct PausableProxy {
    url: String,
    paused: Arc<tokio::sync::watch::Sender<bool>>,
    /// Bytes held from clients while paused.
    held: Arc<AtomicUsize>,
    /// Bytes of replies passed back to clients.
    replied: Arc<AtomicUsize>,
    changed: Arc<Notify>,
}

impl PausableProxy {
    async fn start(upstream: &str) -> Self {
        let upstream = upstream
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, _) = tokio::sync::watch::channel(false);
        let proxy = Self {
            url: format!("redis://127.0.0.1:{port}"),
            paused: Arc::new(tx),
            held: Arc::default(),
            replied: Arc::default(),
            changed: Arc::default(),
        };
        let p = proxy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up = p.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut paused = up.paused.subscribe();
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if *paused.borrow_and_update() {
                            up.held.fetch_add(n, Ordering::SeqCst);
                            up.changed.notify_waiters();
                            paused.wait_for(|p| !*p).await.unwrap();
                            up.held.fetch_sub(n, Ordering::SeqCst);
                        }
                        if sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = sw.shutdown().await;
                });
                let down = p.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        down.replied.fetch_add(n, Ordering::SeqCst);
                        down.changed.notify_waiters();
                        // The client may be gone (evicted): keep draining.
                        let _ = cw.write_all(&buf[..n]).await;
                    }
                });
            }
        });
        proxy
    }

    fn pause(&self) {
        self.paused.send_replace(true);
    }

    fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Waits (on events, not time) until `done` holds.
    async fn until(&self, done: impl Fn(&Self) -> bool) {
        loop {
            let changed = self.changed.notified();
            if done(self) {
                return;
            }
            changed.await;
        }
    }
}

const START: i64 = 1_700_000_000_000;
const TIMEOUT: u64 = 1_000;

fn coordinator_on<P: Publisher>(
    db: &std::path::Path,
    clock: &ManualClock,
    publisher: P,
) -> (Scheduler<SqliteStorage>, Topology<SqliteStorage, P>) {
    let storage = Arc::new(
        SqliteStorage::open(
            db,
            SqliteOptions {
                synchronous: Synchronous::Off,
                ..SqliteOptions::default()
            },
        )
        .unwrap(),
    );
    let ctx = ObjectContext::with_clock(
        ObjectId::new("coord").unwrap(),
        storage,
        Arc::new(clock.clone()),
    );
    let sched = Scheduler::new(ctx).unwrap();
    let topology = Topology::attach(
        &sched,
        TopologyConfig::new()
            .attempt_timeout_ms(TIMEOUT)
            .retry_delay(Arc::new(|_| 1_000.0))
            .publish(publisher),
    )
    .unwrap();
    (sched, topology)
}

fn members(n: usize) -> Vec<MemberInput> {
    (0..n)
        .map(|i| MemberInput::active(format!("s{i}")))
        .collect()
}

fn outstanding(sched: &Scheduler<SqliteStorage>, group: &str) -> Option<i64> {
    use durability_topology::TopologyTx as _;
    sched
        .context()
        .storage()
        .transaction(|tx| tx.topology_outstanding_until(group, START))
        .unwrap()
}

async fn read_version(reader: &RedisReadStore, group: &str) -> Option<u64> {
    let bytes = reader.read(group).await.unwrap()?;
    Some(decode(&bytes).unwrap().version)
}

#[tokio::test]
async fn a_write_stalled_past_its_timeout_keeps_its_record_lands_later_and_is_repaired_after_a_restart()
 {
    let Some((direct, prefix)) = redis("stall").await else {
        return;
    };
    let proxy = PausableProxy::start(&redis_url()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("coordinator.db");
    let clock = ManualClock::new(START);
    let reader = RedisReadStore::new(direct.clone(), &prefix);

    // Coordinator A publishes through the proxy, on `connect`'s defaults.
    let through_proxy = connect(&proxy.url).await.unwrap();
    let (sched_a, a) = coordinator_on(&db, &clock, RedisPublisher::new(through_proxy, &prefix));
    assert!(
        a.update("g", |_| Draft::new().members(members(1)))
            .await
            .unwrap()
            .published
    );
    assert_eq!(read_version(&reader, "g").await, Some(1));

    // The path stalls mid-write of v2.
    proxy.pause();
    let a2 = a.clone();
    let mut write_v2 =
        tokio::spawn(async move { a2.update("g", |_| Draft::new().members(members(2))).await });
    proxy.until(|p| p.held.load(Ordering::SeqCst) > 0).await;
    // The Redis client does not time out on its own (redis-rs would after
    // 500 ms by default): only the coordinator's attempt timeout ends the
    // attempt.
    assert!(
        tokio::time::timeout(Duration::from_millis(1_500), &mut write_v2)
            .await
            .is_err(),
        "the publisher's client timed the write out before the attempt timeout"
    );
    clock.set(START + TIMEOUT as i64);
    let out = write_v2.await.unwrap().unwrap();
    assert!(!out.published, "timed out");
    let land_by = START + TIMEOUT as i64 + durability_topology::LANDING_WINDOW_MS;
    assert_eq!(
        outstanding(&sched_a, "g"),
        Some(land_by),
        "a timed-out write keeps its record: it may still land"
    );

    // Evict A mid-write; B restarts on the same storage with a fresh path.
    sched_a.abort_background();
    drop(a);
    drop(sched_a);
    let (sched_b, b) = coordinator_on(&db, &clock, RedisPublisher::new(direct.clone(), &prefix));
    let v3 = b
        .update("g", |_| Draft::new().members(members(3)))
        .await
        .unwrap();
    assert_eq!(v3.snapshot.version, 3);
    assert_eq!(read_version(&reader, "g").await, Some(3));
    assert!(!v3.published, "the stalled v2 may still land over v3");

    // The stalled write lands late, over v3: readers see it …
    let replied = proxy.replied.load(Ordering::SeqCst);
    proxy.resume();
    proxy
        .until(|p| p.replied.load(Ordering::SeqCst) > replied)
        .await;
    assert_eq!(
        read_version(&reader, "g").await,
        Some(2),
        "the stalled write landed"
    );
    // … and at the landing deadline the coordinator writes v3 again.
    clock.set(land_by);
    b.deliver_due().await.unwrap();
    assert_eq!(read_version(&reader, "g").await, Some(3), "repaired");
    assert_eq!(b.pending().unwrap(), 0);
    assert_eq!(outstanding(&sched_b, "g"), None);
}

#[tokio::test]
async fn a_redis_client_timeout_is_an_unknown_outcome_and_a_server_refusal_a_rejection() {
    let Some((direct, prefix)) = redis("classify").await else {
        return;
    };
    let proxy = PausableProxy::start(&redis_url()).await;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);

    // A user's connection manager with a short response timeout of its own:
    // its timeout is an unknown outcome, so the write record is kept.
    let short = ConnectionManager::new_with_config(
        redis::Client::open(proxy.url.as_str()).unwrap(),
        redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_millis(200))),
    )
    .await
    .unwrap();
    let (sched, t) = coordinator_on(
        &dir.path().join("a.db"),
        &clock,
        RedisPublisher::new(short, &prefix),
    );
    proxy.pause();
    let out = t
        .update("g", |_| Draft::new().members(members(1)))
        .await
        .unwrap();
    assert!(!out.published);
    assert_eq!(
        outstanding(&sched, "g"),
        Some(START + TIMEOUT as i64 + durability_topology::LANDING_WINDOW_MS),
        "a client-side timeout does not prove the write will not land"
    );
    proxy.resume();

    // A server refusal (WRONGTYPE: the versions key is not a hash) is a
    // definite rejection: the record is forgotten at once.
    let mut conn = direct.clone();
    let () = redis::AsyncCommands::set(&mut conn, format!("{prefix}h:versions"), "x")
        .await
        .unwrap();
    let (sched, t) = coordinator_on(
        &dir.path().join("b.db"),
        &clock,
        RedisVersionedPublisher::new(direct, &prefix),
    );
    let out = t
        .update("h", |_| Draft::new().members(members(1)))
        .await
        .unwrap();
    assert!(!out.published);
    assert_eq!(
        outstanding(&sched, "h"),
        None,
        "a refused write can never land"
    );
}
