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

use crate::support::{fails, object, ok};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

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

#[test]
fn objects_list_pages_a_class_by_prefix_and_refuses_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path());
    let root = s(dir.path());
    let first = ok(&[
        "objects",
        "list",
        "--sqlite-root",
        root,
        "--storage",
        "st",
        "--class",
        "Cart",
        "--prefix",
        "c",
        "--limit",
        "1",
    ]);
    assert_eq!(
        first,
        "\"c-1\"\tst:Cart:c-1\n1 objects\nnext page: --cursor \"c-1\"\n"
    );
    let json = ok(&[
        "--json",
        "objects",
        "list",
        "--sqlite-root",
        root,
        "--storage",
        "st",
        "--class",
        "Cart",
        "--prefix",
        "c",
        "--cursor",
        "c-1",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["objects"][0]["name"], "c-2");
    assert_eq!(v["objects"].as_array().unwrap().len(), 1);
    assert!(v["cursor"].is_null());
    let e = fails(&[
        "objects",
        "list",
        "--sqlite-root",
        root,
        "--storage",
        "st",
        "--class",
        "Cart",
        "--limit",
        "0",
    ]);
    assert!(
        e.contains("move_invalid_input") && e.contains("limit"),
        "{e}"
    );
    let e = fails(&["objects", "list", "--storage", "st", "--class", "Cart"]);
    assert!(e.contains("--sqlite-root"), "{e}");
}

#[test]
fn an_object_moves_sqlite_to_postgres_and_back_with_every_row() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(schema) = rt.block_on(TestSchema::create()) else {
        return;
    };
    let pg = url();
    let dir = tempfile::tempdir().unwrap();
    let db = populated(&dir.path().join("one"));
    let before = image_of(&db);
    assert!(before.table("outbox.entries").unwrap().rows.len() == 2);
    let file = dir.path().join("c-1.export");
    let file2 = dir.path().join("c-1.pg.export");
    let root1 = dir.path().join("one");
    let out = ok(&[
        "objects",
        "export",
        "--sqlite-root",
        s(&root1),
        "--storage",
        "st",
        "--class",
        "Cart",
        "--name",
        "c-1",
        "--out",
        s(&file),
    ]);
    assert!(out.starts_with("exported st:Cart:c-1 ("), "{out}");
    assert!(out.contains("fenced at generation 1"), "{out}");
    let out = ok(&[
        "objects",
        "import",
        "--postgres",
        &pg,
        "--schema",
        schema.name(),
        "--storage",
        "st",
        "--file",
        s(&file),
    ]);
    assert!(out.starts_with("imported st:Cart:c-1"), "{out}");
    // The rows on PostgreSQL are the SQLite file's.
    let objects = PostgresObjects::connect(&pg, schema.name(), Default::default()).unwrap();
    let on_pg = objects
        .open("st:Cart:c-1")
        .unwrap()
        .transaction(|tx| tx.export_image())
        .unwrap();
    assert_eq!(on_pg, before);
    let listed = ok(&[
        "objects",
        "list",
        "--postgres",
        &pg,
        "--schema",
        schema.name(),
        "--storage",
        "st",
        "--class",
        "Cart",
    ]);
    assert_eq!(listed, "\"c-1\"\tst:Cart:c-1\n1 objects\n");
    ok(&[
        "objects",
        "export",
        "--postgres",
        &pg,
        "--schema",
        schema.name(),
        "--storage",
        "st",
        "--class",
        "Cart",
        "--name",
        "c-1",
        "--out",
        s(&file2),
    ]);
    let root2 = dir.path().join("two");
    std::fs::create_dir_all(&root2).unwrap();
    ok(&[
        "objects",
        "import",
        "--sqlite-root",
        s(&root2),
        "--storage",
        "st",
        "--file",
        s(&file2),
    ]);
    assert_eq!(image_of(&root2.join("st/Cart/c-1.sqlite")), before);
    // An existing target is refused, untouched.
    let target = root2.join("st/Cart/c-1.sqlite");
    let kept = std::fs::read(&target).unwrap();
    let e = fails(&[
        "objects",
        "import",
        "--sqlite-root",
        s(&root2),
        "--storage",
        "st",
        "--file",
        s(&file),
    ]);
    assert!(e.contains("not empty"), "{e}");
    assert_eq!(std::fs::read(&target).unwrap(), kept);
    let e = fails(&[
        "objects",
        "import",
        "--postgres",
        &pg,
        "--schema",
        schema.name(),
        "--storage",
        "st",
        "--file",
        s(&file),
    ]);
    assert!(e.contains("not empty"), "{e}");
    // An export file is never overwritten.
    let e = fails(&[
        "objects",
        "export",
        "--sqlite-root",
        s(&root1),
        "--storage",
        "st",
        "--class",
        "Cart",
        "--name",
        "c-1",
        "--out",
        s(&file),
    ]);
    assert!(e.contains("exists"), "{e}");
}

#[test]
fn a_damaged_or_foreign_file_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root1 = dir.path().join("one");
    populated(&root1);
    let file = dir.path().join("c-1.export");
    ok(&[
        "objects",
        "export",
        "--sqlite-root",
        s(&root1),
        "--storage",
        "st",
        "--class",
        "Cart",
        "--name",
        "c-1",
        "--out",
        s(&file),
    ]);
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
        let bad = dir.path().join(format!("{what}.export"));
        std::fs::write(&bad, text).unwrap();
        let e = fails(&[
            "objects",
            "import",
            "--sqlite-root",
            s(&root2),
            "--storage",
            "st",
            "--file",
            s(&bad),
        ]);
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
