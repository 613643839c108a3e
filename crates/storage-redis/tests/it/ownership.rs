//! Integration tests of the Redis owner lease store against a real Redis:
//! the conformance suite, malformed persisted state, server-time leases, and
//! [`Ownership`] end to end. Each test uses its own key prefix. Without Redis
//! a test prints that it skipped, unless `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use durability_ownership::conformance::{self, Harness, RawState};
use durability_ownership::{
    ClaimOutcome, DrainReport, Lease, LeaseStore, LifecycleAdmin, LifecycleId, ManualClock,
    OwnerScope, Ownership, OwnershipSettings, PresenceGroup, Resolution, ShardCount, StorageId,
    TaskId,
};
use durability_storage_redis::ownership::RedisLeaseStore;
use durability_storage_redis::testkit::delete_prefix;
use redis::AsyncCommands;

async fn store(test: &str) -> Option<RedisLeaseStore> {
    let url = std::env::var("DURABILITY_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let unique = RandomState::new().build_hasher().finish();
    let prefix = format!("durability:test:{unique:016x}:{test}:");
    match RedisLeaseStore::connect(&url, &prefix, ShardCount::default()).await {
        Ok(s) => Some(s),
        Err(e) if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("Redis at {url} is required (DURABILITY_REQUIRE_SERVICES=1): {e}")
        }
        Err(e) => {
            eprintln!("skipped {test}: Redis at {url} unreachable: {e}");
            None
        }
    }
}

/// Deletes every key of this test's prefix.
async fn cleanup(s: &RedisLeaseStore) {
    delete_prefix(s.connection(), s.prefix()).await.unwrap();
}

struct RedisHarness(RedisLeaseStore);

impl Harness for RedisHarness {
    type Store = RedisLeaseStore;

    fn store(&self) -> &Self::Store {
        &self.0
    }

    async fn expire_owner(&self, scope: &OwnerScope) {
        // PEXPIRE 0 expires the key at once, exactly as Redis does when the lease runs out.
        let mut c = self.0.connection();
        let _: i64 = c.pexpire(self.0.owner_key(scope), 0).await.unwrap();
    }

    async fn expire_presence(&self, group: &PresenceGroup, task: &TaskId) {
        // Score 0: the record's expiry is in the past on the server's clock.
        let (z, _) = self.0.presence_keys(group);
        let mut c = self.0.connection();
        let _: i64 = c.zadd(z, task.as_str(), 0).await.unwrap();
    }

    async fn put_raw_owner(&self, scope: &OwnerScope, raw: &[u8]) {
        let mut c = self.0.connection();
        let _: () = c
            .pset_ex(self.0.owner_key(scope), raw, conformance::TTL_MS)
            .await
            .unwrap();
    }

    async fn raw_state(&self, scope: &OwnerScope) -> RawState {
        let mut c = self.0.connection();
        let owner: Option<Vec<u8>> = c.get(self.0.owner_key(scope)).await.unwrap();
        let generation: Option<String> = c.get(self.0.generation_key(scope)).await.unwrap();
        RawState {
            owner,
            generation: generation.map(|g| g.parse().unwrap()),
        }
    }

    async fn finish(&self) {
        cleanup(&self.0).await;
    }
}

fn scope(s: &str) -> OwnerScope {
    OwnerScope::parse(s, ShardCount::default()).unwrap()
}

/// The lifecycle `lifecycle`, pointed at the storage id of the scope `sc`.
async fn pointed(s: &RedisLeaseStore, lifecycle: &str, sc: &str) -> (LifecycleId, OwnerScope) {
    let (l, sc) = (LifecycleId::new(lifecycle).unwrap(), scope(sc));
    s.set_active_storage(&l, Some(sc.storage_id()))
        .await
        .unwrap();
    (l, sc)
}

/// The lease of a claim of `sc` by `t` that must succeed.
async fn claimed(
    s: &RedisLeaseStore,
    sc: &OwnerScope,
    l: &LifecycleId,
    t: &TaskId,
    ttl: u64,
) -> Lease {
    match s.claim(sc, l, t, ttl).await.unwrap() {
        ClaimOutcome::Claimed(lease) => lease,
        ClaimOutcome::Held(lease) => panic!("held by {:?}", lease.record.task()),
    }
}

durability_ownership::ownership_conformance!(
    redis_store_passes_the_conformance_suite,
    "redis",
    async { store("conformance").await.map(RedisHarness) }
);

#[tokio::test]
async fn leases_use_redis_time_and_px_expiry() {
    let Some(s) = store("time").await else { return };
    let (l, sc) = pointed(&s, "ns:w", "st1:Room:shard2").await;
    let lease = claimed(&s, &sc, &l, &TaskId::new("a").unwrap(), 30_000).await;
    assert!(lease.remaining_ms > 29_000 && lease.remaining_ms <= 30_000);
    let mut c = s.connection();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let server_now = secs * 1000 + micros / 1000;
    let snap = s.snapshot(&sc, &l).await.unwrap();
    assert!(
        server_now.abs_diff(snap.store_now_ms) < 5_000,
        "snapshots read the server's TIME"
    );
    let pttl: i64 = c.pttl(s.owner_key(&sc)).await.unwrap();
    assert!(
        (29_000..=30_000).contains(&pttl),
        "owner key carries the lease as PX: {pttl}"
    );
    let gen_ttl: i64 = c.pttl(s.generation_key(&sc)).await.unwrap();
    assert_eq!(gen_ttl, -1, "the generation key never expires");
    cleanup(&s).await;
}

#[tokio::test]
async fn malformed_redis_state_fails_closed_and_writes_nothing() {
    let Some(s) = store("malformed").await else {
        return;
    };
    let mut c = s.connection();
    let t = TaskId::new("a").unwrap();
    for (i, bad_gen) in ["abc", "0", "-3", "01", "9007199254740991", "1.5"]
        .iter()
        .enumerate()
    {
        let (l, sc) = pointed(&s, &format!("ns:g{i}"), &format!("stg{i}:Room:shard0")).await;
        let _: () = c.set(s.generation_key(&sc), *bad_gen).await.unwrap();
        let e = s.claim(&sc, &l, &t, 10_000).await.unwrap_err();
        assert_eq!(
            e.code(),
            "invalid_lifecycle_state",
            "generation {bad_gen:?}"
        );
        let raw: Option<String> = c.get(s.generation_key(&sc)).await.unwrap();
        assert_eq!(raw.as_deref(), Some(*bad_gen), "nothing written");
        let owner: Option<String> = c.get(s.owner_key(&sc)).await.unwrap();
        assert_eq!(owner, None);
    }
    // Malformed lifecycle values.
    let (l, sc) = pointed(&s, "ns:lock", "stl:Room:shard0").await;
    let _: () = c.set(s.delete_lock_key(&l), "sometimes").await.unwrap();
    assert_eq!(
        s.claim(&sc, &l, &t, 10_000).await.unwrap_err().code(),
        "invalid_lifecycle_state"
    );
    let l = LifecycleId::new("ns:ptr").unwrap();
    let sc = scope("stp:Room:shard0");
    let _: () = c.set(s.storage_pointer_key(&l), "bad id!").await.unwrap();
    assert_eq!(
        s.claim(&sc, &l, &t, 10_000).await.unwrap_err().code(),
        "invalid_lifecycle_state"
    );
    // An owner record without a lease expiry fails closed.
    let (l, sc) = pointed(&s, "ns:persist", "stn:Room:shard0").await;
    let lease = claimed(&s, &sc, &l, &t, 10_000).await;
    let _: bool = c.persist(s.owner_key(&sc)).await.unwrap();
    assert_eq!(
        s.claim(&sc, &l, &t, 10_000).await.unwrap_err().code(),
        "invalid_owner_record"
    );
    assert_eq!(
        s.snapshot(&sc, &l).await.unwrap_err().code(),
        "invalid_owner_record"
    );
    // Bad TTLs are refused before any write.
    assert_eq!(
        s.renew(&lease.record, 0).await.unwrap_err().code(),
        "invalid_input"
    );
    let pttl: i64 = c.pttl(s.owner_key(&sc)).await.unwrap();
    assert_eq!(pttl, -1, "renew with a bad TTL wrote nothing");
    cleanup(&s).await;
}

#[tokio::test]
async fn ownership_over_redis_claims_admits_drains_and_hands_over() {
    let Some(s) = store("ownership").await else {
        return;
    };
    let l = LifecycleId::new("ns:w").unwrap();
    let storage = StorageId::new("st1").unwrap();
    s.set_active_storage(&l, Some(&storage)).await.unwrap();
    let clock = ManualClock::new(0);
    let settings = OwnershipSettings {
        owner_ttl_ms: 30_000,
        ..OwnershipSettings::default()
    };
    let a = Ownership::new(
        s.clone(),
        clock.clone(),
        TaskId::new("task-a").unwrap(),
        settings,
    );
    let b = Ownership::new(
        s.clone(),
        clock.clone(),
        TaskId::new("task-b").unwrap(),
        settings,
    );
    let sc = scope("st1:Room:shard5");
    let Resolution::Local(g1) = a.resolve(&sc, &l).await.unwrap() else {
        panic!("a owns")
    };
    assert_eq!(
        b.resolve(&sc, &l).await.unwrap(),
        Resolution::Remote {
            task: TaskId::new("task-a").unwrap(),
            generation: g1,
            endpoint: None,
        }
    );
    let permit = a.admit(&sc, g1).await.unwrap();
    drop(permit);
    assert_eq!(a.renew(&sc).await.unwrap(), g1);
    let DrainReport::Drained { released, .. } = a.drain().await else {
        panic!("drained")
    };
    assert_eq!(released, vec![(sc.clone(), g1)]);
    let Resolution::Local(g2) = b.resolve(&sc, &l).await.unwrap() else {
        panic!("b owns")
    };
    assert!(g2 > g1);
    assert_eq!(a.admit(&sc, g1).await.unwrap_err().code(), "draining");
    let snap = s.snapshot(&sc, &l).await.unwrap();
    assert_eq!(snap.owner.unwrap().record.task().as_str(), "task-b");
    assert_eq!(snap.generation, g2.get());
    cleanup(&s).await;
}

#[test]
fn store_is_send_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<RedisLeaseStore>();
}

/// A stored shard count that is not a canonical count in 1..=1024 fails its
/// storage id closed, and a count of another value refuses the claim as a
/// mismatch naming both counts; nothing is written either way.
#[tokio::test]
async fn a_corrupt_or_other_shard_count_refuses_the_claim_and_writes_nothing() {
    let Some(s) = store("shardcount").await else {
        return;
    };
    let mut c = s.connection();
    let t = TaskId::new("a").unwrap();
    for (i, (stored, code)) in [
        ("016", "invalid_lifecycle_state"),
        ("0", "invalid_lifecycle_state"),
        ("1025", "invalid_lifecycle_state"),
        ("sixteen", "invalid_lifecycle_state"),
        ("8", "shard_count_mismatch"),
    ]
    .into_iter()
    .enumerate()
    {
        let (l, sc) = pointed(&s, &format!("ns:c{i}"), &format!("stc{i}:Room:shard0")).await;
        let _: () = c
            .set(s.shard_count_key(sc.storage_id()), stored)
            .await
            .unwrap();
        let e = s.claim(&sc, &l, &t, 10_000).await.unwrap_err();
        assert_eq!(e.code(), code, "{stored}: {e}");
        let e = s.record_shard_count(&sc, &l).await.unwrap_err();
        assert_eq!(e.code(), code, "{stored}: {e}");
        if code == "invalid_lifecycle_state" {
            let e = s.snapshot(&sc, &l).await.unwrap_err();
            assert_eq!(e.code(), code, "{stored}: {e}");
        } else {
            assert!(
                e.to_string().contains("8") && e.to_string().contains("16"),
                "{e}"
            );
        }
        let owner: Option<String> = c.get(s.owner_key(&sc)).await.unwrap();
        let generation: Option<String> = c.get(s.generation_key(&sc)).await.unwrap();
        let count: Option<String> = c.get(s.shard_count_key(sc.storage_id())).await.unwrap();
        assert_eq!(
            (owner, generation),
            (None, None),
            "{stored}: nothing written"
        );
        assert_eq!(count.as_deref(), Some(stored), "{stored}: count untouched");
    }
}

#[tokio::test]
async fn connect_errors_name_the_store_and_the_cause_but_never_the_url() {
    // A URL that does not parse, holding a password.
    let e = RedisLeaseStore::connect("redis://:s3cret@[::1", "p:", ShardCount::default())
        .await
        .expect_err("an invalid URL is refused");
    let text = e.to_string();
    assert_eq!(e.code(), "owner_store_unavailable");
    assert!(
        text.contains("the Redis lease store's URL is invalid"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");
    // A server that is not there: the address and the cause.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://:s3cret@127.0.0.1:{port}");
    let e = RedisLeaseStore::connect(&url, "p:", ShardCount::default())
        .await
        .expect_err("an unreachable server is refused");
    let text = e.to_string();
    assert!(
        text.contains(&format!(
            "the Redis lease store at 127.0.0.1:{port} cannot be reached"
        )),
        "{text}"
    );
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}
