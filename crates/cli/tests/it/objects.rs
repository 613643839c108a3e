//! `durability objects list|export|import`, run as the binary against a
//! SQLite object root and a PostgreSQL schema: an object with outbox rows,
//! a scheduler alarm and an own table goes SQLite → PostgreSQL → SQLite
//! with every row equal; hostile input (a damaged file, another version,
//! an existing target) is refused and leaves the target as it was.

use std::path::Path;

use durability_scheduler::Storage;
use durability_storage_postgres::object::PostgresObjects;
use durability_storage_postgres::testkit::{TestSchema, url};
use durability_storage_sqlite::{SqliteOptions, SqliteStorage};

use crate::support::{fails, object, ok, s};

/// `<root>/st/Cart/c-1.sqlite`: outbox entries staged through the outbox
/// (so its tables, version row and the scheduler's due time and alarm are
/// the capability's own), plus an own table.
fn populated(root: &Path) -> std::path::PathBuf {
    let dir = root.join("st").join("Cart");
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("c-1.sqlite");
    let o = object(&db);
    for key in ["a", "b"] {
        o.sched
            .transaction(|tx| o.outbox.stage(tx, key, &format!("value of {key}")))
            .unwrap();
    }
    o.sched
        .transaction(|tx| {
            tx.sql()
                .execute_batch(
                    "CREATE TABLE lines (id INTEGER PRIMARY KEY, sku TEXT NOT NULL, qty INTEGER);
                     INSERT INTO lines VALUES (1, 'x', 2), (2, 'y', NULL);",
                )
                .map_err(|e| durability_scheduler::StorageError::backend("t", e))
        })
        .unwrap();
    drop(o);
    for name in ["c-2", "d-1"] {
        drop(
            SqliteStorage::open(dir.join(format!("{name}.sqlite")), SqliteOptions::default())
                .unwrap(),
        );
    }
    db
}

fn image_of(db: &Path) -> durability_scheduler::image::ObjectImage {
    SqliteStorage::open(db, SqliteOptions::default())
        .unwrap()
        .transaction(|tx| tx.export_image())
        .unwrap()
}

/// Runs the binary with the words of `line` (no word holds a space: the
/// temporary directories' paths do not), expecting success.
fn run(line: &str) -> String {
    ok(&line.split(' ').collect::<Vec<_>>())
}

/// As [`run`], expecting failure: the one line on stderr.
fn refused(line: &str) -> String {
    fails(&line.split(' ').collect::<Vec<_>>())
}

#[test]
fn objects_list_pages_a_class_by_prefix_and_refuses_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path());
    let sq = format!("--sqlite-root {} --storage st", s(dir.path()));
    let first = run(&format!(
        "objects list {sq} --class Cart --prefix c --limit 1"
    ));
    assert_eq!(
        first,
        "\"c-1\"\tst:Cart:c-1\n1 objects\nnext page: --cursor \"c-1\"\n"
    );
    let json = run(&format!(
        "--json objects list {sq} --class Cart --prefix c --cursor c-1"
    ));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["objects"][0]["name"], "c-2");
    assert_eq!(v["objects"].as_array().unwrap().len(), 1);
    assert!(v["cursor"].is_null());
    let e = refused(&format!("objects list {sq} --class Cart --limit 0"));
    assert!(
        e.contains("move_invalid_input") && e.contains("limit"),
        "{e}"
    );
    let e = refused("objects list --storage st --class Cart");
    assert!(e.contains("--sqlite-root"), "{e}");
}

#[test]
fn an_object_moves_sqlite_to_postgres_and_back_with_every_row() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(schema) = rt.block_on(TestSchema::create()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root1 = dir.path().join("one");
    let root2 = dir.path().join("two");
    std::fs::create_dir_all(&root2).unwrap();
    let before = image_of(&populated(&root1));
    assert_eq!(before.table("outbox.entries").unwrap().rows.len(), 2);
    let (file, file2) = (dir.path().join("c-1.export"), dir.path().join("pg.export"));
    let (file, file2) = (s(&file), s(&file2));
    let one = format!("--sqlite-root {} --storage st", s(&root1));
    let two = format!("--sqlite-root {} --storage st", s(&root2));
    let pg = format!(
        "--postgres {} --schema {} --storage st",
        url(),
        schema.name()
    );
    let c1 = "--class Cart --name c-1";
    let out = run(&format!("objects export {one} {c1} --out {file}"));
    assert!(out.starts_with("exported st:Cart:c-1 ("), "{out}");
    assert!(out.contains("fenced at generation 1"), "{out}");
    let out = run(&format!("objects import {pg} --file {file}"));
    assert!(out.starts_with("imported st:Cart:c-1"), "{out}");
    // The rows on PostgreSQL are the SQLite file's.
    let objects = PostgresObjects::connect(&url(), schema.name(), Default::default()).unwrap();
    let on_pg = objects
        .open("st:Cart:c-1")
        .unwrap()
        .transaction(|tx| tx.export_image())
        .unwrap();
    assert_eq!(on_pg, before);
    let listed = run(&format!("objects list {pg} --class Cart"));
    assert_eq!(listed, "\"c-1\"\tst:Cart:c-1\n1 objects\n");
    run(&format!("objects export {pg} {c1} --out {file2}"));
    run(&format!("objects import {two} --file {file2}"));
    let target = root2.join("st/Cart/c-1.sqlite");
    assert_eq!(image_of(&target), before);
    // An existing target is refused, untouched.
    let kept = std::fs::read(&target).unwrap();
    let e = refused(&format!("objects import {two} --file {file}"));
    assert!(e.contains("not empty"), "{e}");
    assert_eq!(std::fs::read(&target).unwrap(), kept);
    let e = refused(&format!("objects import {pg} --file {file}"));
    assert!(e.contains("not empty"), "{e}");
    // An export file is never overwritten.
    let e = refused(&format!("objects export {one} {c1} --out {file}"));
    assert!(e.contains("exists"), "{e}");
}

#[test]
fn a_damaged_or_foreign_file_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root1 = dir.path().join("one");
    populated(&root1);
    let file = dir.path().join("c-1.export");
    run(&format!(
        "objects export --sqlite-root {} --storage st --class Cart --name c-1 --out {}",
        s(&root1),
        s(&file)
    ));
    let root2 = dir.path().join("two");
    std::fs::create_dir_all(&root2).unwrap();
    let good = std::fs::read_to_string(&file).unwrap();
    let cases = [
        (
            "flipped",
            good.replacen("{\"t\":\"x\"}", "{\"t\":\"z\"}", 1),
            "move_corrupt_file",
        ),
        (
            "truncated",
            good[..good.len() / 2].to_owned(),
            "move_corrupt_file",
        ),
        ("not json", "hello\n".to_owned(), "move_corrupt_file"),
        (
            "version 9",
            reseal(&good.replacen("\"version\":1", "\"version\":9", 1)),
            "move_unsupported_version",
        ),
    ];
    for (what, text, code) in cases {
        assert_ne!(text, good, "{what}");
        let bad = dir
            .path()
            .join(format!("{}.export", what.replace(' ', "-")));
        std::fs::write(&bad, text).unwrap();
        let e = refused(&format!(
            "objects import --sqlite-root {} --storage st --file {}",
            s(&root2),
            s(&bad)
        ));
        assert!(e.contains(code), "{what}: {e}");
    }
    // Nothing was created under the target root.
    assert_eq!(std::fs::read_dir(&root2).unwrap().count(), 0);
}

/// `text` with its trailer replaced by the checksum of its body.
fn reseal(text: &str) -> String {
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with("{\"sha256\""))
        .map(|l| format!("{l}\n"))
        .collect();
    let sum: String = sha256(body.as_bytes());
    format!("{body}{{\"sha256\":\"{sum}\"}}\n")
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
