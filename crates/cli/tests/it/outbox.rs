//! `durability outbox list|retry|discard`.

use std::path::Path;

use durability_scheduler::SchedulerTx;
use durability_storage_sqlite::SqliteStorage;
use durability_storage_sqlite::inspect::inspect_object;
use durability_storage_sqlite::rusqlite::Connection;

use crate::support::{
    Accept, RETRY_MS, RetryLater, START, fails, fingerprint, object_at, ok, ok_json, s, temp_file,
};

/// `outbox <verb> <db> --channel <channel> --key <key> --yes`, then `extra`.
fn on_entry<'a>(
    verb: &'a str,
    db: &'a Path,
    channel: &'a str,
    key: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "outbox",
        verb,
        s(db),
        "--channel",
        channel,
        "--key",
        key,
        "--yes",
    ];
    args.extend_from_slice(extra);
    args
}

fn stage<K: durability_outbox::Sink<String>>(o: &crate::support::Object<K>, key: &str) {
    o.sched
        .transaction(|tx| o.outbox.stage(tx, key, &format!("value of {key}")))
        .unwrap();
}

/// `orders`: `a` waiting for a retry at START + RETRY_MS (one attempt),
/// `b` staged after that run (due at START + 1); `mail`: `m` due at START,
/// and `bad`, a row whose version is text (corrupt).
async fn populated(db: &Path) {
    {
        let o = object_at(db, START, "orders", RetryLater);
        stage(&o, "a");
        let report = o.outbox.deliver_due().await.unwrap();
        assert_eq!(report.retried, 1);
    }
    {
        let o = object_at(db, START + 1, "orders", Accept);
        stage(&o, "b");
    }
    {
        let o = object_at(db, START, "mail", Accept);
        stage(&o, "m");
        stage(&o, "bad");
    }
    let conn = Connection::open(db).unwrap();
    conn.execute(
        "UPDATE durability_outbox SET version = 'x' WHERE key = 'bad'",
        [],
    )
    .unwrap();
}

#[tokio::test]
async fn list_shows_versions_attempts_due_times_and_states() {
    let (_dir, db) = temp_file("object.db");
    populated(&db).await;
    let before = fingerprint(&db);
    let now = (START + 10).to_string();
    let out = ok(&["outbox", "list", s(&db), "--now-ms", &now]);
    insta::assert_snapshot!(out.replace(s(&db), "[DB]"));
    assert_eq!(fingerprint(&db), before, "list changed the file");

    let v = ok_json(&[
        "outbox",
        "list",
        s(&db),
        "--channel",
        "orders",
        "--json",
        "--now-ms",
        &now,
    ]);
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "only the orders channel: {v}");
    assert_eq!(entries[0]["key"], "a");
    assert_eq!(entries[0]["attempts"], 1);
    assert_eq!(entries[0]["due_at"], START + RETRY_MS);
    assert_eq!(entries[0]["state"], "waiting");
    assert_eq!(entries[1]["key"], "b");
    assert_eq!(entries[1]["state"], "due");
    assert_eq!(v["truncated"], false);

    let v = ok_json(&["outbox", "list", s(&db), "--limit", "1", "--json"]);
    assert_eq!(v["entries"].as_array().unwrap().len(), 1);
    assert_eq!(v["truncated"], true);
}

#[tokio::test]
async fn retry_makes_a_waiting_entry_due_now_and_moves_the_alarm() {
    let (_dir, db) = temp_file("object.db");
    // Only `a`, waiting until START + RETRY_MS.
    {
        let o = object_at(&db, START, "orders", RetryLater);
        stage(&o, "a");
        o.outbox.deliver_due().await.unwrap();
    }
    let now = START + 5;
    assert_eq!(
        inspect_object(&db, now).unwrap().alarm,
        Some(START + RETRY_MS)
    );
    let out = ok(&on_entry(
        "retry",
        &db,
        "orders",
        "a",
        &["--now-ms", &now.to_string()],
    ));
    assert_eq!(
        out.replace(s(&db), "[DB]"),
        "due now: key \"a\" of channel \"orders\" (version 1, attempts 1) in [DB]\n"
    );
    let report = inspect_object(&db, now).unwrap();
    assert_eq!(report.alarm, Some(now), "the alarm moved to now");
    // The next driver of the object delivers it, attempts kept.
    let o = object_at(&db, now, "orders", Accept);
    assert_eq!(o.sched.alarm_at(), Some(now));
    assert_eq!(o.outbox.pending("a").unwrap(), Some((1, 1)));
    let delivered = o.outbox.deliver_due().await.unwrap();
    assert_eq!(delivered.delivered, 1);
    assert!(o.outbox.is_empty().unwrap());
}

#[tokio::test]
async fn discard_removes_an_entry_and_moves_the_alarm_to_the_next_one() {
    let (_dir, db) = temp_file("object.db");
    populated(&db).await;
    // `b` (due START + 1) is the earliest of orders; mail's `m` is at START.
    let json = ok(&on_entry("discard", &db, "mail", "m", &["--json"]));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["outcome"], "done");
    assert_eq!(v["entry"]["key"], "m");
    // The corrupt row of mail (its due time intact) still holds the alarm.
    let report = inspect_object(&db, START).unwrap();
    assert_eq!(report.alarm, Some(START));
    let conn = Connection::open(&db).unwrap();
    let mut tx_rows: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM durability_outbox WHERE key = 'm'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tx_rows, 0);
    // A corrupt row is discarded too.
    ok(&on_entry("discard", &db, "mail", "bad", &[]));
    tx_rows = conn
        .query_row(
            "SELECT COUNT(*) FROM durability_outbox WHERE channel = 'mail'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tx_rows, 0);
    drop(conn);
    // Now orders' `b` holds the alarm.
    assert_eq!(inspect_object(&db, START).unwrap().alarm, Some(START + 1));
    let storage = SqliteStorage::open(&db, Default::default()).unwrap();
    let due =
        durability_scheduler::Storage::transaction(&storage, |tx| tx.capability_due("outbox:mail"))
            .unwrap();
    assert_eq!(due, None, "an empty channel has no due time");
}

#[tokio::test]
async fn mutations_without_yes_off_a_terminal_are_refused_and_change_nothing() {
    let (_dir, db) = temp_file("object.db");
    populated(&db).await;
    let before = fingerprint(&db);
    for verb in ["retry", "discard"] {
        let line = fails(&["outbox", verb, s(&db), "--channel", "orders", "--key", "a"]);
        assert!(line.contains("--yes"), "{line}");
    }
    assert_eq!(fingerprint(&db), before);
}

#[tokio::test]
async fn bad_targets_are_refused_and_change_nothing() {
    let (dir, db) = temp_file("object.db");
    populated(&db).await;
    let before = fingerprint(&db);
    for (channel, key, refusal) in [
        ("orders", "zz", "no stored entry"),
        ("mail", "bad", "corrupt"),
        ("", "a", "invalid channel"),
    ] {
        let line = fails(&on_entry("retry", &db, channel, key, &[]));
        assert!(line.contains(refusal), "{channel:?} {key:?}: {line}");
    }
    assert_eq!(
        fingerprint(&db).0,
        before.0,
        "the file's bytes are unchanged"
    );
    let missing = dir.path().join("missing.db");
    let line = fails(&on_entry("discard", &missing, "c", "k", &[]));
    assert!(line.contains("no such file"), "{line}");
    assert!(!missing.exists());
    let line = fails(&["outbox", "list", s(&missing)]);
    assert!(line.contains("no such file"), "{line}");
    assert!(!missing.exists());
}
