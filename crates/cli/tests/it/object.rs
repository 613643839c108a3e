//! `durability object inspect`.

use crate::support::{START, fails, fingerprint, object, ok, temp_file};

fn path_str(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// An object with a pending outbox entry (due at START) and an application
/// capability due a minute later.
fn populated(path: &std::path::Path) {
    let o = object(path);
    o.sched
        .transaction(|tx| {
            o.outbox.stage(tx, "order-1", &"placed".to_owned())?;
            tx.set_due("reports", Some(START + 60_000))?;
            Ok::<_, durability_outbox::OutboxError>(())
        })
        .unwrap();
}

#[test]
fn inspect_shows_capabilities_schema_versions_and_the_alarm() {
    let (_dir, db) = temp_file("object.db");
    populated(&db);
    let before = fingerprint(&db);
    let now = (START + 1_500).to_string();
    let out = ok(&["object", "inspect", path_str(&db), "--now-ms", &now]);
    let out = out.replace(path_str(&db), "[DB]");
    insta::assert_snapshot!(out);
    assert_eq!(fingerprint(&db), before, "inspect changed the file");
}

#[test]
fn inspect_json_is_the_scheduler_report() {
    let (_dir, db) = temp_file("object.db");
    populated(&db);
    let now = START + 1_500;
    let out = ok(&[
        "object",
        "inspect",
        path_str(&db),
        "--json",
        "--now-ms",
        &now.to_string(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["now_ms"], now);
    assert_eq!(v["alarm"], START);
    assert_eq!(v["earliest_due"], START);
    let caps = v["capabilities"].as_array().unwrap();
    let outbox = caps.iter().find(|c| c["name"] == "outbox:orders").unwrap();
    assert_eq!(outbox["due"], START);
    assert_eq!(outbox["is_due"], true);
    let reports = caps.iter().find(|c| c["name"] == "reports").unwrap();
    assert_eq!(reports["due"], START + 60_000);
    assert_eq!(reports["is_due"], false);
    assert_eq!(reports["schema_version"], serde_json::Value::Null);
    let outbox_schema = caps.iter().find(|c| c["name"] == "outbox").unwrap();
    assert!(outbox_schema["schema_version"].as_u64().unwrap() >= 1);
}

#[test]
fn inspect_of_a_missing_file_fails_and_creates_nothing() {
    let (dir, db) = temp_file("missing.db");
    let line = fails(&["object", "inspect", path_str(&db)]);
    assert!(line.contains("no such file"), "{line}");
    assert!(!db.exists(), "inspect created the file");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn inspect_of_a_sqlite_file_without_scheduler_tables_fails_and_changes_nothing() {
    let (_dir, db) = temp_file("other.db");
    {
        let conn = durability_storage_sqlite::rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1);")
            .unwrap();
    }
    let before = fingerprint(&db);
    let line = fails(&["object", "inspect", path_str(&db), "--json"]);
    assert!(
        line.contains("not an object database") && line.contains("durability_schema"),
        "{line}"
    );
    assert_eq!(fingerprint(&db), before, "inspect changed the file");
}

#[test]
fn inspect_of_a_file_that_is_not_sqlite_fails_and_changes_nothing() {
    let (_dir, db) = temp_file("notes.txt");
    std::fs::write(
        &db,
        "not a database, just some text that is long enough\n".repeat(20),
    )
    .unwrap();
    let before = fingerprint(&db);
    let line = fails(&["object", "inspect", path_str(&db)]);
    assert!(line.contains("not a SQLite database"), "{line}");
    assert_eq!(fingerprint(&db), before, "inspect changed the file");
}

#[test]
fn inspect_reports_a_corrupt_due_row_as_corrupt() {
    let (_dir, db) = temp_file("object.db");
    populated(&db);
    {
        // Written behind the scheduler's back: a due time that is text.
        let conn = durability_storage_sqlite::rusqlite::Connection::open(&db).unwrap();
        conn.execute(
            "UPDATE durability_scheduler_due SET due = 'soon' WHERE capability = 'reports'",
            [],
        )
        .unwrap();
    }
    let before = fingerprint(&db);
    let line = fails(&["object", "inspect", path_str(&db)]);
    assert!(
        line.contains("corrupt row") && line.contains("reports"),
        "{line}"
    );
    assert_eq!(fingerprint(&db), before, "inspect changed the file");
}
