//! Unit tests: strict decoding, and every sentence of the seed's "Reading"
//! section on a fake store with a manual clock.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durability_time::{Clock, ManualClock, Random};
use tokio::sync::Notify;

use crate::{
    BoxError, ClientConfig, FallbackReport, FallbackSource, MAX_SNAPSHOT_BYTES, Member,
    MemberState, ReadStore, Snapshot, TopologyClient, TopologyClientError, UnavailableReason,
    decode, decode_for,
};

const START: i64 = 1_700_000_000_000;

fn enc(group: &str, version: u64, coordinator: &str, ids: &[&str]) -> Vec<u8> {
    let members: Vec<String> = ids
        .iter()
        .map(|id| format!(r#"{{"id":"{id}","state":"active","joinedAt":1}}"#))
        .collect();
    format!(
        r#"{{"format":1,"group":"{group}","version":{version},"coordinator":"{coordinator}","members":[{}]}}"#,
        members.join(",")
    )
    .into_bytes()
}

#[derive(Clone)]
enum Mode {
    Ok,
    Fail,
    Hang,
    Gate(Arc<Notify>),
}

#[derive(Clone)]
struct Fake {
    data: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    reads: Arc<AtomicUsize>,
    mode: Arc<Mutex<Mode>>,
}

impl Fake {
    fn new() -> Self {
        Self {
            data: Arc::default(),
            reads: Arc::default(),
            mode: Arc::new(Mutex::new(Mode::Ok)),
        }
    }
    fn put(&self, group: &str, bytes: Vec<u8>) {
        self.data.lock().unwrap().insert(group.to_owned(), bytes);
    }
    fn remove(&self, group: &str) {
        self.data.lock().unwrap().remove(group);
    }
    fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

impl ReadStore for Fake {
    async fn read(&self, group: &str) -> Result<Option<Vec<u8>>, BoxError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let mode = self.mode.lock().unwrap().clone();
        match mode {
            Mode::Ok => {}
            Mode::Fail => return Err("store down".into()),
            Mode::Hang => std::future::pending::<()>().await,
            Mode::Gate(gate) => gate.notified().await,
        }
        Ok(self.data.lock().unwrap().get(group).cloned())
    }
}

fn config(clock: &ManualClock) -> ClientConfig {
    ClientConfig::new()
        .clock(Arc::new(clock.clone()))
        .jitter(Random::fixed(0.5))
}

fn client(store: &Fake, config: ClientConfig) -> TopologyClient<Fake> {
    TopologyClient::new(store.clone(), config).unwrap()
}

/// A clock at [`START`] and a store holding the group `g` (`version`, from
/// `coordinator`, with the members `ids`).
fn store_with_g(version: u64, coordinator: &str, ids: &[&str]) -> (ManualClock, Fake) {
    let store = Fake::new();
    store.put("g", enc("g", version, coordinator, ids));
    (ManualClock::new(START), store)
}

fn reason(e: TopologyClientError) -> UnavailableReason {
    match e {
        TopologyClientError::TopologyUnavailable { reason, .. } => reason,
        other => panic!("expected TopologyUnavailable, got {other:?}"),
    }
}

#[test]
fn decode_rejects_malformed_truncated_oversized_and_unknown_formats_with_a_reason() {
    let good = enc("g", 1, "c", &["a", "b"]);
    assert_eq!(decode(&good).unwrap().members.len(), 2);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..good.len() - 3].to_vec(), "malformed"),
        ("not json", b"hello".to_vec(), "malformed"),
        ("not utf-8", vec![0xff, 0xfe], "UTF-8"),
        ("oversized", vec![b' '; MAX_SNAPSHOT_BYTES + 1], "oversized"),
        (
            "unknown format",
            String::from_utf8(good.clone())
                .unwrap()
                .replace(r#""format":1"#, r#""format":2"#)
                .into_bytes(),
            "unknown format version 2",
        ),
        (
            "no format",
            br#"{"group":"g","version":1,"coordinator":"c","members":[]}"#.to_vec(),
            "missing format",
        ),
        ("no members", enc("g", 1, "c", &[]), "at least one member"),
        ("unsorted", enc("g", 1, "c", &["b", "a"]), "sorted"),
        (
            "duplicate",
            enc("g", 1, "c", &["a", "a"]),
            "sorted by unique id",
        ),
        (
            "empty id",
            enc("g", 1, "c", &[""]),
            "member id must not be empty",
        ),
        ("version 0", enc("g", 0, "c", &["a"]), "version 0"),
        (
            "empty group",
            enc("", 1, "c", &["a"]),
            "group must not be empty",
        ),
        ("empty coordinator", enc("g", 1, "", &["a"]), "coordinator"),
        (
            "bad state",
            String::from_utf8(good.clone())
                .unwrap()
                .replacen("active", "gone", 1)
                .into_bytes(),
            "unknown state",
        ),
        (
            "unknown field",
            String::from_utf8(good.clone())
                .unwrap()
                .replacen(r#""version""#, r#""extra":1,"version""#, 1)
                .into_bytes(),
            "unknown field",
        ),
    ];
    for (name, bytes, expected) in cases {
        let err = decode(&bytes).expect_err(name);
        assert!(err.contains(expected), "{name}: {err:?} lacks {expected:?}");
    }
    let err = decode_for("other", &good).unwrap_err();
    assert!(err.contains("not \"other\""), "{err}");
}

#[test]
fn error_codes_are_unique() {
    let codes: BTreeSet<_> = TopologyClientError::CODES.iter().collect();
    assert_eq!(codes.len(), TopologyClientError::CODES.len());
}

#[test]
fn bad_config_is_rejected() {
    for cfg in [
        ClientConfig::new().ttl(Duration::ZERO),
        ClientConfig::new().read_timeout(Duration::ZERO),
        ClientConfig::new().max_groups(0),
    ] {
        let err = TopologyClient::new(Fake::new(), cfg).err().unwrap();
        assert_eq!(err.code(), "TOPOLOGY_CLIENT_INVALID_CONFIG");
    }
}

#[tokio::test]
async fn a_snapshot_is_cached_for_the_ttl() {
    let (clock, store) = store_with_g(1, "c", &["a"]);
    let c = client(&store, config(&clock));
    let s = c.get("g").await.unwrap();
    assert_eq!(s.members[0].id, "a");
    assert_eq!(store.reads(), 1);
    clock.advance(29_999);
    c.get("g").await.unwrap();
    assert_eq!(store.reads(), 1, "served from cache within the TTL");
    clock.advance(1);
    c.get("g").await.unwrap();
    assert_eq!(store.reads(), 2, "read again once the TTL passed");
}

#[tokio::test]
async fn the_ttl_is_jittered_by_twenty_percent() {
    for (r, ttl) in [(0.0, 24_000), (1.0, 36_000)] {
        let clock = ManualClock::new(START);
        let store = Fake::new();
        store.put("g", enc("g", 1, "c", &["a"]));
        let c = client(&store, config(&clock).jitter(Random::fixed(r)));
        c.get("g").await.unwrap();
        clock.advance(ttl - 1);
        c.get("g").await.unwrap();
        assert_eq!(store.reads(), 1);
        clock.advance(1);
        c.get("g").await.unwrap();
        assert_eq!(store.reads(), 2, "ttl {ttl}");
    }
}

#[tokio::test]
async fn ten_thousand_concurrent_cold_gets_cause_one_store_read() {
    let clock = ManualClock::new(START);
    let store = Fake::new();
    store.put("g", enc("g", 7, "c", &["a", "b"]));
    let gate = Arc::new(Notify::new());
    store.set_mode(Mode::Gate(Arc::clone(&gate)));
    let c = client(&store, config(&clock));
    // One current-thread runtime: every get registers before the release runs.
    let release = tokio::spawn(async move { gate.notify_one() });
    let results = futures::future::join_all((0..10_000).map(|_| c.get("g"))).await;
    release.await.unwrap();
    assert_eq!(store.reads(), 1, "one store read shared by every caller");
    let first = results[0].as_ref().unwrap();
    assert!(
        results
            .iter()
            .all(|r| Arc::ptr_eq(r.as_ref().unwrap(), first))
    );
}

#[tokio::test]
async fn an_older_version_from_the_same_coordinator_never_replaces_the_cache() {
    let (clock, store) = store_with_g(5, "c1", &["new"]);
    let c = client(&store, config(&clock));
    assert_eq!(c.get("g").await.unwrap().version, 5);
    store.put("g", enc("g", 4, "c1", &["old"]));
    clock.advance(30_000);
    let s = c.get("g").await.unwrap();
    assert_eq!((s.version, s.members[0].id.as_str()), (5, "new"));
    assert_eq!(store.reads(), 2);
    // A different coordinator's snapshot is accepted, whatever its version.
    store.put("g", enc("g", 1, "c2", &["moved"]));
    clock.advance(30_000);
    let s = c.get("g").await.unwrap();
    assert_eq!((s.coordinator.as_str(), s.version), ("c2", 1));
}

#[tokio::test]
async fn missing_and_failed_reads_are_remembered_for_the_negative_ttl() {
    let clock = ManualClock::new(START);
    let store = Fake::new();
    let c = client(&store, config(&clock));
    assert_eq!(
        reason(c.get("g").await.unwrap_err()),
        UnavailableReason::Missing
    );
    clock.advance(4_999);
    assert_eq!(
        reason(c.get("g").await.unwrap_err()),
        UnavailableReason::Missing
    );
    assert_eq!(store.reads(), 1, "the missing read is remembered");
    clock.advance(1);
    store.set_mode(Mode::Fail);
    let r = reason(c.get("g").await.unwrap_err());
    assert_eq!(r.code(), "read_failed");
    assert!(r.to_string().contains("store down"));
    assert_eq!(store.reads(), 2);
    c.get("g").await.unwrap_err();
    assert_eq!(store.reads(), 2, "the failed read is remembered");
    clock.advance(5_000);
    store.set_mode(Mode::Ok);
    store.put("g", enc("g", 1, "c", &["a"]));
    c.get("g").await.unwrap();
    assert_eq!(store.reads(), 3);
}

#[tokio::test]
async fn invalid_published_copies_are_unavailable_with_the_reason() {
    let clock = ManualClock::new(START);
    let store = Fake::new();
    store.put("g", b"{\"format\":9}".to_vec());
    let c = client(&store, config(&clock));
    let r = reason(c.get("g").await.unwrap_err());
    assert_eq!(r.code(), "invalid");
    assert!(r.to_string().contains("unknown format version 9"), "{r}");
    store.put("h", enc("x", 1, "c", &["a"]));
    assert_eq!(reason(c.get("h").await.unwrap_err()).code(), "invalid");
    let err = c.get("").await.unwrap_err();
    assert_eq!(err.code(), "TOPOLOGY_CLIENT_INVALID_GROUP");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn reads_time_out_after_the_read_timeout() {
    let clock = ManualClock::new(START);
    let store = Fake::new();
    store.set_mode(Mode::Hang);
    let c = client(&store, config(&clock));
    let task = {
        let c = c.clone();
        tokio::spawn(async move { c.get("g").await })
    };
    while clock.next_wake().is_none() {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        clock.next_wake(),
        Some(START + 1_000),
        "default read timeout: 1 s"
    );
    clock.advance(1_000);
    let r = reason(task.await.unwrap().unwrap_err());
    assert_eq!(r, UnavailableReason::Timeout { after_ms: 1_000 });
}

fn recording(reports: &Arc<Mutex<Vec<FallbackReport>>>) -> crate::FallbackHook {
    let reports = Arc::clone(reports);
    Arc::new(move |r: &FallbackReport| reports.lock().unwrap().push(r.clone()))
}

fn seeded(group: &str) -> Snapshot {
    Snapshot {
        group: group.to_owned(),
        version: 1,
        coordinator: "seed".into(),
        members: vec![Member {
            id: "seed-0".into(),
            state: MemberState::Active,
            location_hint: None,
            meta: None,
            joined_at: 0,
        }],
    }
}

#[tokio::test]
async fn fallbacks_run_in_order_stale_then_seed_then_fallback_and_are_reported() {
    let (clock, store) = store_with_g(3, "c", &["a"]);
    let reports = Arc::default();
    let fallback_calls = Arc::new(AtomicUsize::new(0));
    let seed_on = Arc::new(Mutex::new(true));
    let calls = Arc::clone(&fallback_calls);
    let on = Arc::clone(&seed_on);
    let c = client(
        &store,
        config(&clock)
            .stale_if_error(Duration::from_secs(60))
            .seed(Arc::new(move |g| on.lock().unwrap().then(|| seeded(g))))
            .fallback(Arc::new(move |g, _reason| {
                calls.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move {
                    let mut s = seeded(&g);
                    s.coordinator = "fallback".into();
                    Ok(s)
                })
            }))
            .on_fallback(recording(&reports)),
    );
    c.get("g").await.unwrap();
    store.set_mode(Mode::Fail);
    clock.advance(30_000);
    let s = c.get("g").await.unwrap();
    assert_eq!(
        (s.coordinator.as_str(), s.version),
        ("c", 3),
        "stale-if-error first"
    );
    clock.advance(60_000);
    let s = c.get("g").await.unwrap();
    assert_eq!(s.coordinator, "seed", "then the seed, once stale expired");
    *seed_on.lock().unwrap() = false;
    let s = c.get("g").await.unwrap();
    assert_eq!(s.coordinator, "fallback", "then the fallback");
    c.get("g").await.unwrap();
    assert_eq!(
        fallback_calls.load(Ordering::SeqCst),
        2,
        "fallback is not cached"
    );
    let sources: Vec<FallbackSource> = reports.lock().unwrap().iter().map(|r| r.source).collect();
    assert_eq!(
        sources,
        vec![
            FallbackSource::StaleIfError,
            FallbackSource::Seed,
            FallbackSource::Fallback,
            FallbackSource::Fallback
        ]
    );
    assert!(
        reports
            .lock()
            .unwrap()
            .iter()
            .all(|r| r.reason.code() == "read_failed")
    );
}

#[tokio::test]
async fn stale_if_error_never_applies_to_a_missing_group() {
    let (clock, store) = store_with_g(3, "c", &["a"]);
    let reports = Arc::default();
    let c = client(
        &store,
        config(&clock)
            .stale_if_error(Duration::from_secs(600))
            .on_fallback(recording(&reports)),
    );
    c.get("g").await.unwrap();
    store.remove("g");
    clock.advance(30_000);
    assert_eq!(
        reason(c.get("g").await.unwrap_err()),
        UnavailableReason::Missing
    );
    assert!(reports.lock().unwrap().is_empty());
}

#[tokio::test]
async fn without_fallbacks_get_fails_and_a_failing_fallback_keeps_the_reason() {
    let clock = ManualClock::new(START);
    let store = Fake::new();
    store.set_mode(Mode::Fail);
    let c = client(
        &store,
        config(&clock).fallback(Arc::new(|_, _| Box::pin(async { Err("nope".into()) }))),
    );
    let err = c.get("g").await.unwrap_err();
    assert!(err.is_retryable());
    assert_eq!(reason(err).code(), "read_failed");
}

/// A store holding `count` groups `g0`, `g1`, …, each at `version` from
/// the coordinator `c`.
fn store_of_groups(count: usize, version: u64) -> Fake {
    let store = Fake::new();
    for i in 0..count {
        let g = format!("g{i}");
        store.put(&g, enc(&g, version, "c", &["a"]));
    }
    store
}

/// A client built with `config` over [`store_of_groups`]`(count, version)`
/// that has read each group once, in order, with `bounded` checked after
/// every read; and the store.
async fn read_each_group(
    count: usize,
    version: u64,
    config: ClientConfig,
    bounded: impl Fn(&TopologyClient<Fake>),
) -> (Fake, TopologyClient<Fake>) {
    let store = store_of_groups(count, version);
    let c = client(&store, config);
    for i in 0..count {
        c.get(&format!("g{i}")).await.unwrap();
        bounded(&c);
    }
    (store, c)
}

#[tokio::test]
async fn the_cache_is_bounded_however_many_groups_are_read() {
    let clock = ManualClock::new(START);
    let bounds = config(&clock).max_groups(64);
    let (_, c) = read_each_group(2_000, 1, bounds, |c| assert!(c.cached_groups() <= 64)).await;
    assert_eq!(c.cached_groups(), 64);
    assert_eq!(crate::DEFAULT_MAX_GROUPS, 10_000);
    let _ = clock.now_ms();
}

#[tokio::test]
async fn an_evicted_group_never_comes_back_older_from_the_same_coordinator() {
    let clock = ManualClock::new(START);
    let store = Fake::new();
    store.put("g", enc("g", 5, "c1", &["new"]));
    store.put("h", enc("h", 1, "c1", &["a"]));
    let c = client(&store, config(&clock).max_groups(1));
    assert_eq!(c.get("g").await.unwrap().version, 5);
    // Reading another group evicts g's cache entry …
    c.get("h").await.unwrap();
    assert_eq!(c.cached_groups(), 1);
    // … and the store goes back to an older snapshot of the same coordinator.
    store.put("g", enc("g", 4, "c1", &["old"]));
    let err = c.get("g").await.unwrap_err();
    assert_eq!(
        reason(err),
        UnavailableReason::Regressed { served: 5, read: 4 },
        "v5 then v4 is never served"
    );
    // The refusal is remembered for the negative TTL, then the newer one is read.
    store.put("g", enc("g", 6, "c1", &["newer"]));
    assert!(c.get("g").await.is_err());
    clock.advance(5_000);
    assert_eq!(c.get("g").await.unwrap().version, 6);
    // Another coordinator's versions start over and are accepted.
    store.put("g", enc("g", 1, "c2", &["moved"]));
    clock.advance(30_000);
    assert_eq!(c.get("g").await.unwrap().coordinator, "c2");
}

#[tokio::test]
async fn version_floors_are_bounded_and_outlive_many_cache_evictions() {
    let clock = ManualClock::new(START);
    let bounds = config(&clock).max_groups(8).max_version_floors(256);
    let (store, c) = read_each_group(300, 7, bounds, |c| {
        assert!(c.cached_groups() <= 8);
        assert!(c.version_floors() <= 256);
    })
    .await;
    assert_eq!(c.version_floors(), 256);
    // g100 was evicted from the cache 192 groups ago; its floor still holds.
    store.put("g100", enc("g100", 6, "c", &["old"]));
    assert_eq!(reason(c.get("g100").await.unwrap_err()).code(), "regressed");
    assert_eq!(crate::DEFAULT_MAX_VERSION_FLOORS, 100_000);
    let bad = TopologyClient::new(store.clone(), config(&clock).max_version_floors(0));
    assert_eq!(bad.err().unwrap().code(), "TOPOLOGY_CLIENT_INVALID_CONFIG");
}

#[test]
fn cache_hits_store_reads_fallbacks_and_unavailable_reads_are_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let (clock, store) = store_with_g(3, "c", &["a"]);
            let c = client(
                &store,
                config(&clock).stale_if_error(Duration::from_secs(60)),
            );
            c.get("g").await.unwrap(); // a store read
            c.get("g").await.unwrap(); // a hit
            c.get("g").await.unwrap(); // a hit
            store.set_mode(Mode::Fail);
            clock.advance(30_000);
            c.get("g").await.unwrap(); // a failed read served stale
            clock.advance(120_000);
            assert!(c.get("g").await.is_err(), "no fallback left");
        });
    });
    let mut got: Vec<(String, String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| {
            let source = k
                .key()
                .labels()
                .find(|l| l.key() == "source")
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            let DebugValue::Counter(n) = v else {
                panic!("counters only")
            };
            (k.key().name().to_owned(), source, n)
        })
        // Handles are registered when the client is built: unused ones read 0.
        .filter(|(_, _, n)| *n > 0)
        .collect();
    got.sort();
    let s = |n: &str, l: &str, v: u64| (n.to_owned(), l.to_owned(), v);
    assert_eq!(
        got,
        [
            s("durability_topology_client_cache_hits_total", "", 2),
            s(
                "durability_topology_client_fallbacks_total",
                "stale_if_error",
                1
            ),
            s("durability_topology_client_store_reads_total", "", 3),
            s("durability_topology_client_unavailable_total", "", 1),
        ]
    );
}

/// Issue 32 item 13: the never-older guard is bounded. Past the floor bound
/// the least recently used floor is evicted and counted (with the event
/// `durability.topology_client.version_floor_evicted`); that pair's guard
/// has lapsed, so an older snapshot of it is served again, as the docs
/// say. Before, the eviction was silent.
#[tokio::test]
async fn an_evicted_version_floor_is_reported_and_its_guard_lapses() {
    let clock = ManualClock::new(START);
    let store = store_of_groups(3, 7);
    let c = client(&store, config(&clock).max_groups(1).max_version_floors(2));
    c.get("g0").await.unwrap();
    c.get("g1").await.unwrap();
    // A newer version of a kept floor replaces it: no eviction.
    store.put("g1", enc("g1", 8, "c", &["a"]));
    clock.advance(60_000);
    c.get("g1").await.unwrap();
    assert_eq!(c.version_floors_evicted(), 0);
    c.get("g2").await.unwrap(); // evicts g0's floor
    assert_eq!(c.version_floors_evicted(), 1);
    assert_eq!(c.version_floors(), 2);
    store.put("g0", enc("g0", 6, "c", &["old"]));
    let served = c.get("g0").await.unwrap();
    assert_eq!(served.version, 6, "g0's guard lapsed with its floor");
    // g0's floor came back and evicted g1's.
    assert_eq!(c.version_floors_evicted(), 2);
}
