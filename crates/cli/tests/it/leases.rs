//! `durability leases list` on a SQLite lease store file and on Redis.

use durability_ownership::{
    ClaimOutcome, LeaseStore, LifecycleAdmin, LifecycleId, ManualClock, OwnerScope, ShardCount,
    TaskId,
};
use durability_storage_redis::ownership::RedisLeaseStore;
use durability_storage_redis::testkit::delete_prefix;
use durability_storage_sqlite::ownership::SqliteLeaseStore;

use crate::support::{
    START, assert_missing_file_refused, connected_or_skip, fails, fingerprint, ok, ok_json,
    redis_and_prefix, s, temp_file,
};

/// Claims `st1:Room:shard0` for `a` (10 s) and `st1:Room:shard1` for `b`
/// (2 s; claimed, released and claimed again, so its generation is 2);
/// `st1:Room:shard2` is claimed for `c` for 1 s.
async fn claims(store: &(impl LeaseStore + LifecycleAdmin)) {
    let l = LifecycleId::new("ns:w").unwrap();
    let scope =
        |n: u32| OwnerScope::parse(&format!("st1:Room:shard{n}"), ShardCount::default()).unwrap();
    let claim = async |n: u32, task: &str, ttl: u64| match store
        .claim(&scope(n), &l, &TaskId::new(task).unwrap(), ttl)
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed(lease) => lease.record,
        ClaimOutcome::Held(lease) => panic!("{n} is held by {lease:?}"),
    };
    store
        .set_active_storage(&l, Some(scope(0).storage_id()))
        .await
        .unwrap();
    claim(0, "a", 10_000).await;
    let first = claim(1, "b", 2_000).await;
    assert!(store.release(&first).await.unwrap());
    claim(1, "b", 2_000).await;
    claim(2, "c", 1_000).await;
}

#[tokio::test]
async fn live_leases_of_a_sqlite_store_with_owner_generation_and_lease_left() {
    let (_dir, db) = temp_file("leases.db");
    let clock = ManualClock::new(START);
    {
        let store = SqliteLeaseStore::open(&db, clock.clone(), ShardCount::default()).unwrap();
        claims(&store).await;
    }
    let before = fingerprint(&db);
    // 1.5 s later (store time): shard2's 1 s lease has expired.
    let now = (START + 1_500).to_string();
    let out = ok(&["leases", "list", "--sqlite", s(&db), "--now-ms", &now]);
    insta::assert_snapshot!(out);
    // One lease a page, as JSON, after `extra`.
    let page = |extra: &[&str]| {
        let mut args = vec!["leases", "list", "--sqlite", s(&db), "--now-ms", &now];
        args.extend(["--limit", "1"]);
        args.extend(extra);
        args.push("--json");
        ok_json(&args)
    };
    let v = page(&[]);
    assert_eq!(v["leases"].as_array().unwrap().len(), 1);
    assert_eq!(v["leases"][0]["scope"], "st1:Room:shard0");
    let cursor = v["cursor"].as_str().unwrap().to_owned();
    let v = page(&["--cursor", &cursor]);
    assert_eq!(v["leases"][0]["scope"], "st1:Room:shard1");
    assert_eq!(v["leases"][0]["owner"], "b");
    assert_eq!(v["leases"][0]["generation"], 2);
    assert_eq!(v["leases"][0]["lease_left_ms"], 500);
    assert_eq!(v["cursor"], serde_json::Value::Null);
    assert_eq!(fingerprint(&db), before, "listing changed the file");
}

#[test]
fn a_missing_or_foreign_lease_file_is_refused_and_not_created() {
    let dir = assert_missing_file_refused(&["leases", "list"]);
    let text = dir.path().join("notes");
    std::fs::write(&text, "x".repeat(4096)).unwrap();
    let line = fails(&["leases", "list", "--sqlite", s(&text)]);
    assert!(line.contains("not a lease store database"), "{line}");
    let line = fails(&["leases", "list", "--redis", "not a url"]);
    assert!(line.starts_with("error: lease store"), "{line}");
    let line = fails(&["leases", "list", "--sqlite", s(&text), "--shards", "0"]);
    assert!(line.contains("shard"), "{line}");
}

#[tokio::test]
async fn live_leases_of_a_redis_store_under_its_prefix() {
    let (url, prefix) = redis_and_prefix("cli-leases");
    let Some(store) = connected_or_skip(
        &url,
        RedisLeaseStore::connect(&url, &prefix, ShardCount::default()).await,
    ) else {
        return;
    };
    claims(&store).await;
    let v = ok_json(&[
        "leases", "list", "--redis", &url, "--prefix", &prefix, "--json", "--limit", "1000",
    ]);
    let leases = v["leases"].as_array().unwrap();
    let a = leases
        .iter()
        .find(|l| l["scope"] == "st1:Room:shard0")
        .unwrap();
    assert_eq!(a["owner"], "a");
    assert_eq!(a["generation"], 1);
    let left = a["lease_left_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 10_000, "{left}");
    let b = leases
        .iter()
        .find(|l| l["scope"] == "st1:Room:shard1")
        .unwrap();
    assert_eq!(b["generation"], 2);
    assert!(leases.iter().all(|l| l["problem"].is_null()), "{v}");
    // Another prefix lists nothing.
    let other = format!("{prefix}other:");
    let v = ok_json(&[
        "leases", "list", "--redis", &url, "--prefix", &other, "--json",
    ]);
    assert!(v["leases"].as_array().unwrap().is_empty());
    delete_prefix(store.connection(), &prefix).await.unwrap();
}
