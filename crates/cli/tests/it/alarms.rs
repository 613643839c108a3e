//! `durability alarms jobs|counts` on a SQLite index file and on Redis.

use std::hash::{BuildHasher, Hasher};
use std::path::Path;

use durability_alarms::{AlarmIndex, ObjectId, Token};
use durability_storage_redis::alarms::{IndexTime, RedisAlarmIndex};
use durability_storage_redis::testkit::delete_prefix;
use durability_storage_sqlite::Synchronous;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;

use crate::support::{START, fails, fingerprint, ok};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

async fn fill(ix: &impl AlarmIndex) {
    for (id, due) in [
        ("shop:2", START + 20),
        ("shop:1", START + 10),
        ("user:9", START),
    ] {
        ix.upsert(
            &ObjectId::new(id).unwrap(),
            &Token::new(format!("tok-{}", id.replace(':', "-"))).unwrap(),
            due,
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn jobs_and_counts_of_a_sqlite_index_are_read_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("alarms.db");
    {
        let ix = SqliteAlarmIndex::open(&db, Synchronous::Full).unwrap();
        fill(&ix).await;
    }
    let before = fingerprint(&db);
    let out = ok(&[
        "alarms",
        "jobs",
        "--sqlite",
        s(&db),
        "--object-prefix",
        "shop:",
    ]);
    insta::assert_snapshot!(out);
    let json = ok(&["alarms", "counts", "--sqlite", s(&db), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["scheduled"], 3);
    assert_eq!(v["ready"], 0);
    assert_eq!(v["total"], 3);
    let json = ok(&["alarms", "jobs", "--sqlite", s(&db), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["jobs"].as_array().unwrap().len(), 3);
    assert_eq!(v["jobs"][2]["object"], "user:9");
    assert_eq!(v["jobs"][2]["due_at"], START);
    assert_eq!(fingerprint(&db), before, "reading changed the file");
}

#[test]
fn a_missing_or_foreign_index_file_is_refused_and_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let line = fails(&["alarms", "counts", "--sqlite", s(&missing)]);
    assert!(line.contains("no such file"), "{line}");
    assert!(!missing.exists());
    let other = dir.path().join("other.db");
    {
        let conn = durability_storage_sqlite::rusqlite::Connection::open(&other).unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER);").unwrap();
    }
    let before = fingerprint(&other);
    let line = fails(&["alarms", "jobs", "--sqlite", s(&other)]);
    assert!(line.contains("not an alarm index database"), "{line}");
    assert_eq!(fingerprint(&other), before);
}

#[test]
fn a_malformed_redis_url_is_one_line() {
    let line = fails(&["alarms", "counts", "--redis", "not a url"]);
    assert!(line.starts_with("error: alarm index"), "{line}");
}

#[tokio::test]
async fn jobs_and_counts_of_a_redis_index_under_its_prefix() {
    let url = std::env::var("DURABILITY_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let unique = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let prefix = format!("durability:test:{unique:016x}:cli-alarms:");
    let ix = match RedisAlarmIndex::connect(&url, &prefix, IndexTime::Caller).await {
        Ok(ix) => ix,
        Err(e) if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("Redis at {url} is required (DURABILITY_REQUIRE_SERVICES=1): {e}")
        }
        Err(e) => {
            eprintln!("skipped: Redis at {url} unreachable: {e}");
            return;
        }
    };
    fill(&ix).await;
    let json = ok(&[
        "alarms", "counts", "--redis", &url, "--prefix", &prefix, "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["total"], 3, "{v}");
    let json = ok(&[
        "alarms",
        "jobs",
        "--redis",
        &url,
        "--prefix",
        &prefix,
        "--object-prefix",
        "shop:",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let objects: Vec<&str> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["object"].as_str().unwrap())
        .collect();
    assert_eq!(objects, ["shop:1", "shop:2"]);
    assert_eq!(v["jobs"][0]["token"], "tok-shop-1");
    // Another prefix sees nothing.
    let other = format!("{prefix}other:");
    let json = ok(&[
        "alarms", "counts", "--redis", &url, "--prefix", &other, "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["total"], 0);
    delete_prefix(ix.connection(), &prefix).await.unwrap();
}
