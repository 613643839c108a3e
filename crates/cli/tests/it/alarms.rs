//! `durability alarms jobs|counts` on a SQLite index file and on Redis.

use durability_alarms::{AlarmIndex, ObjectId, Token};
use durability_storage_redis::alarms::{IndexTime, RedisAlarmIndex};
use durability_storage_redis::testkit::delete_prefix;
use durability_storage_sqlite::Synchronous;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;

use crate::support::{
    START, assert_missing_file_refused, connected_or_skip, fails, fingerprint, ok, ok_json,
    redis_and_prefix, s, strings, temp_file,
};

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
    let (_dir, db) = temp_file("alarms.db");
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
    let v = ok_json(&["alarms", "counts", "--sqlite", s(&db), "--json"]);
    assert_eq!(v["scheduled"], 3);
    assert_eq!(v["ready"], 0);
    assert_eq!(v["total"], 3);
    let v = ok_json(&["alarms", "jobs", "--sqlite", s(&db), "--json"]);
    assert_eq!(v["jobs"].as_array().unwrap().len(), 3);
    assert_eq!(v["jobs"][2]["object"], "user:9");
    assert_eq!(v["jobs"][2]["due_at"], START);
    assert_eq!(fingerprint(&db), before, "reading changed the file");
}

#[test]
fn a_missing_or_foreign_index_file_is_refused_and_not_created() {
    let dir = assert_missing_file_refused(&["alarms", "counts"]);
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
    let (url, prefix) = redis_and_prefix("cli-alarms");
    let Some(ix) = connected_or_skip(
        &url,
        RedisAlarmIndex::connect(&url, &prefix, IndexTime::Caller).await,
    ) else {
        return;
    };
    fill(&ix).await;
    let v = ok_json(&[
        "alarms", "counts", "--redis", &url, "--prefix", &prefix, "--json",
    ]);
    assert_eq!(v["total"], 3, "{v}");
    let v = ok_json(&[
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
    let objects = strings(&v["jobs"], "object");
    assert_eq!(objects, ["shop:1", "shop:2"]);
    assert_eq!(v["jobs"][0]["token"], "tok-shop-1");
    // Another prefix sees nothing.
    let other = format!("{prefix}other:");
    let v = ok_json(&[
        "alarms", "counts", "--redis", &url, "--prefix", &other, "--json",
    ]);
    assert_eq!(v["total"], 0);
    delete_prefix(ix.connection(), &prefix).await.unwrap();
}
