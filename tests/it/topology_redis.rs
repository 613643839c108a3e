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

use durability_scheduler::{ManualClock, ObjectContext, ObjectId, Scheduler};
use durability_storage_redis::topology::{
    RedisPublisher, RedisReadStore, RedisVersionedPublisher, connect,
};
use durability_topology::conformance::{encoded, memory_storage, run_publication, sample};
use durability_topology::{Draft, MemberInput, Publisher, Topology, TopologyConfig};
use durability_topology_client::{ClientConfig, ReadStore, Snapshot, TopologyClient, decode};
use redis::aio::ConnectionManager;

async fn redis(test: &str) -> Option<(ConnectionManager, String)> {
    let url = std::env::var("DURABILITY_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
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
    old: &Snapshot,
    new: &Snapshot,
) -> Option<Vec<u8>> {
    publisher.write(new, &encoded(new)).await.unwrap();
    publisher.write(old, &encoded(old)).await.unwrap();
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
    let (old, new) = (sample("g", 1, "c", 1), sample("g", 2, "c", 2));
    let (plain_at, versioned_at) = (format!("{prefix}plain:"), format!("{prefix}versioned:"));
    let plain = RedisPublisher::new(conn.clone(), &plain_at);
    let versioned = RedisVersionedPublisher::new(conn.clone(), &versioned_at);
    for (name, landed) in [
        (
            "plain",
            late_write(&plain, &conn, &plain_at, &old, &new).await,
        ),
        (
            "versioned",
            late_write(&versioned, &conn, &versioned_at, &old, &new).await,
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
