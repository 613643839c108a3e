//! The semaphore holder on a host: calls through the router, the long poll
//! a release or expiry answers (the clock never moves to a poll's end),
//! errors with the semaphore's codes, and `SemaphorePermits`.

use std::sync::Arc;

use durability_host::semaphore::{HolderCall, Limit, SemaphorePermits};
use durability_host::{Host, HostError, ObjectRef};
use durability_scheduler::Permits;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use serde_json::{Value, json};

use crate::support::{Store, TestHost, World, spin};

/// A new world, a semaphore holder host on it and its `limits` semaphore,
/// whose pool `sink` has `capacity` permits.
async fn sink_holder(capacity: u64) -> (World, TestHost, ObjectRef<Store, SqliteAlarmIndex>) {
    let world = World::new();
    let host: TestHost = Host::start(world.config("t1").semaphore_holder())
        .await
        .unwrap();
    let holder = host.object_by_name("Semaphore", "limits");
    configure_sink(&holder, capacity).await;
    (world, host, holder)
}

/// Gives the holder's pool `sink` `capacity` permits.
async fn configure_sink(holder: &dyn HolderCall, capacity: u64) {
    holder
        .call_holder("configure", json!({"pool": "sink", "capacity": capacity}))
        .await
        .unwrap();
}

/// The holder's pool `sink`, as it reports it.
async fn sink(holder: &dyn HolderCall) -> Value {
    holder
        .call_holder("pool", json!({"pool": "sink"}))
        .await
        .unwrap()
}

/// The permits of pool `sink` held now and granted so far.
async fn held_and_granted(holder: &dyn HolderCall) -> (Option<u64>, Option<u64>) {
    let pool = sink(holder).await;
    (pool["held"].as_u64(), pool["granted"].as_u64())
}

fn acquire(key: &str, count: u64) -> Value {
    json!({"pool": "sink", "key": key, "holder": format!("shard-{key}"), "count": count,
        "lease_ms": 60_000, "wait_ms": 60_000, "poll_ms": 10_000})
}

#[tokio::test]
async fn a_queued_acquire_is_answered_when_a_release_frees_permits_not_at_its_poll_end() {
    let (_world, host, holder) = sink_holder(1).await;
    let first = holder.call("acquire", acquire("a", 1)).await.unwrap();
    let id = first["granted"]["id"].as_u64().unwrap();

    let waiting = {
        let holder = host.object_by_name("Semaphore", "limits");
        tokio::spawn(async move { holder.call("acquire", acquire("b", 1)).await })
    };
    spin().await;
    assert!(
        !waiting.is_finished(),
        "queued: the call waits on the holder"
    );
    let pool = sink(&holder).await;
    assert_eq!(
        (pool["held"].as_u64(), pool["queued"].as_u64()),
        (Some(1), Some(1))
    );

    let released = holder
        .call("release", json!({"holder": "shard-a", "id": id}))
        .await
        .unwrap();
    assert_eq!(released["now"], json!(true));
    // The manual clock never moved: only the release can have answered it.
    let answer = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert!(answer["granted"]["id"].as_u64().is_some(), "{answer}");

    // A retried release changes nothing; a retried acquire never grants twice.
    let again = holder
        .call("release", json!({"holder": "shard-a", "id": id}))
        .await
        .unwrap();
    assert_eq!(again["now"], json!(false));
    let retried = holder.call("acquire", acquire("b", 1)).await.unwrap();
    assert_eq!(retried["granted"]["id"], answer["granted"]["id"]);
    assert_eq!(held_and_granted(&holder).await, (Some(1), Some(2)));
    host.shutdown().await;
}

#[tokio::test]
async fn a_refusal_is_the_methods_error_with_the_semaphores_code_and_writes_nothing() {
    let (_world, host, holder) = sink_holder(2).await;
    let err = holder.call("acquire", acquire("big", 3)).await.unwrap_err();
    let HostError::Method { code, .. } = &err else {
        panic!("not the method's error: {err:?}")
    };
    assert_eq!(code, "semaphore_count_exceeds_capacity");
    let err = holder
        .call("acquire", json!({"pool": "sink"}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("semaphore_invalid_args"), "{err}");
    assert_eq!(held_and_granted(&holder).await, (Some(0), Some(0)));
    host.shutdown().await;
}

#[tokio::test]
async fn concurrency_permits_never_exceed_the_capacity_and_a_dropped_permit_wakes_the_next() {
    let (_world, host, holder) = sink_holder(2).await;
    let holder: Arc<dyn HolderCall> = Arc::new(holder);
    let permits = Arc::new(SemaphorePermits::new(
        Arc::clone(&holder),
        "sink",
        "shard-1",
        Limit::Concurrency,
    ));
    let one = permits.acquire(5).await.unwrap();
    let two = permits.acquire(5).await.unwrap();
    assert_eq!(one.entries(), 1, "one grant per delivery");
    let third = {
        let permits = Arc::clone(&permits);
        tokio::spawn(async move { permits.acquire(1).await.map(|p| p.entries()) })
    };
    spin().await;
    assert!(!third.is_finished(), "a third waits while two are held");
    drop(one);
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), third)
        .await
        .expect("the released permit woke the waiter")
        .unwrap();
    assert_eq!(got, Ok(1));
    drop(two);
    spin().await;
    let pool = sink(holder.as_ref()).await;
    // The third permit's entry count was read and the permit dropped.
    assert_eq!(pool["granted"].as_u64(), Some(3));
    assert!(pool["held"].as_u64().unwrap() <= 2);
    host.shutdown().await;
}

#[tokio::test]
async fn rate_permits_return_at_their_interval_on_the_holders_clock() {
    let (world, host, holder) = sink_holder(3).await;
    let holder: Arc<dyn HolderCall> = Arc::new(holder);
    let limit = Limit::Rate {
        interval_ms: 1_000,
        per_delivery: 2,
    };
    let permits = Arc::new(SemaphorePermits::new(
        Arc::clone(&holder),
        "sink",
        "s",
        limit,
    ));
    let a = permits.acquire(5).await.unwrap();
    assert_eq!(a.entries(), 2, "at most per_delivery items");
    drop(a);
    let b = permits.acquire(1).await.unwrap();
    drop(b);
    let waiting = {
        let permits = Arc::clone(&permits);
        tokio::spawn(async move { permits.acquire(1).await.map(|p| p.entries()) })
    };
    spin().await;
    assert!(
        !waiting.is_finished(),
        "3 of 3 used in this interval: dropping returns nothing"
    );
    world.clock.advance(999);
    spin().await;
    assert!(!waiting.is_finished(), "not before the interval passed");
    world.clock.advance(1);
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("the lease deadline woke the waiter")
        .unwrap();
    assert_eq!(got, Ok(1));
    host.shutdown().await;
}
