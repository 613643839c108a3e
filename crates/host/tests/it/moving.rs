//! Moving objects between the SQLite directory and PostgreSQL through the
//! host's object stores: listing a class by name prefix, page by page, on
//! both; an export fenced at the mover's claim (an owner's acknowledged
//! write is in it, its later commit is refused); the export file refused
//! when damaged; an object round-tripped SQLite → PostgreSQL → SQLite with
//! every row equal.

use std::sync::Arc;

use durability_host::store::moving::{Export, MoveError, export_object, import_object};
use durability_host::store::{ObjectKey, ObjectQuery};
use durability_host::{ObjectStore, PostgresObjectStore, SqliteObjectStore};
use durability_ownership::{
    ClassName, Generation, LifecycleId, ObjectFence, ObjectName, OwnerRecord, OwnerScope,
    ShardCount, StorageId, TaskId,
};
use durability_scheduler::image::Value;
use durability_scheduler::{Storage, StorageError, StorageErrorKind};
use durability_storage_postgres::object::PostgresObjectOptions;
use durability_storage_postgres::testkit::{TestSchema, url};

fn key(class: &str, name: &str) -> ObjectKey {
    ObjectKey {
        class: class.to_owned(),
        name: name.to_owned(),
    }
}

fn storage() -> StorageId {
    StorageId::new("st").unwrap()
}

fn shards() -> ShardCount {
    ShardCount::new(16).unwrap()
}

/// Names that take each of the SQLite directory's file forms (plain,
/// hashed with a name file) and sort bytewise.
const NAMES: &[&str] = &["a-1", "a-2", "a 3", "a/é", "b-1", "A-0"];

async fn names_of<O: ObjectStore>(store: &O, prefix: &str, limit: usize) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let q = ObjectQuery::new("Cart", prefix, after.as_deref(), limit).unwrap();
        let page = store.list_class(&storage(), &q).await.unwrap();
        pages.push(page.objects.iter().map(|o| o.name.clone()).collect());
        assert!(page.objects.iter().all(|o| o.class == "Cart"));
        match page.cursor {
            Some(c) => after = Some(c),
            None => return pages,
        }
    }
}

async fn listing_cases<O: ObjectStore>(store: &O) {
    for name in NAMES {
        store.open(&storage(), &key("Cart", name)).await.unwrap();
    }
    store.open(&storage(), &key("Other", "a-9")).await.unwrap();
    assert_eq!(
        names_of(store, "a", 2).await,
        vec![vec!["a 3", "a-1"], vec!["a-2", "a/é"]]
    );
    assert_eq!(
        names_of(store, "", 10).await,
        vec![vec!["A-0", "a 3", "a-1", "a-2", "a/é", "b-1"]]
    );
    assert_eq!(names_of(store, "zz", 10).await, vec![Vec::<String>::new()]);
}

#[tokio::test]
async fn a_class_lists_by_name_prefix_page_by_page_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    listing_cases(&SqliteObjectStore::new(dir.path())).await;
}

/// The PostgreSQL object store in `schema`.
fn pg_store(schema: &TestSchema) -> PostgresObjectStore {
    PostgresObjectStore::connect(&url(), schema.name(), PostgresObjectOptions::default()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_class_lists_by_name_prefix_page_by_page_on_postgres() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    listing_cases(&pg_store(&schema)).await;
}

#[test]
fn bad_list_arguments_are_typed_errors() {
    let long = "x".repeat(513);
    for (class, prefix, after, limit, what) in [
        ("Cart", "", None, 0, "limit"),
        ("Cart", "", None, 1001, "limit"),
        ("bad:class", "", None, 10, "class"),
        ("Cart", long.as_str(), None, 10, "prefix"),
        ("Cart", "a\0", None, 10, "prefix"),
        ("Cart", "", Some(""), 10, "cursor"),
    ] {
        let e = ObjectQuery::new(class, prefix, after, limit).unwrap_err();
        assert_eq!(e.code(), "move_invalid_input");
        assert!(
            matches!(&e, MoveError::InvalidInput { what: w, .. } if *w == what),
            "{e}"
        );
    }
}

#[test]
fn an_object_id_gives_its_name_back() {
    let k = key("Cart", "a:b c/é");
    let id = k.object_id(&storage());
    assert_eq!(id, "st:Cart:a:b c/é");
    assert_eq!(ObjectKey::from_object_id(&storage(), &id), Some(k));
    assert_eq!(ObjectKey::from_object_id(&storage(), "st2:Cart:x"), None);
    assert_eq!(ObjectKey::from_object_id(&storage(), "st:Cart"), None);
}

fn owner(object: &ObjectKey, generation: u64) -> OwnerRecord {
    let scope = OwnerScope::for_object(
        storage(),
        ClassName::new(&object.class).unwrap(),
        &ObjectName::new(&object.name),
        shards(),
    )
    .unwrap();
    OwnerRecord::new(
        scope,
        LifecycleId::new("life").unwrap(),
        TaskId::new("host-a").unwrap(),
        Generation::new(generation).unwrap(),
    )
}

fn sqlite_rows(s: &durability_storage_sqlite::SqliteStorage) -> Result<i64, StorageError> {
    s.transaction(|tx| {
        tx.sql()
            .query_row("SELECT count(*) FROM orders", [], |r| r.get(0))
            .map_err(|e| StorageError::backend("count", e))
    })
}

fn sqlite_write(s: &durability_storage_sqlite::SqliteStorage, id: i64) -> Result<(), StorageError> {
    s.transaction(|tx| {
        tx.sql()
            .execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, note TEXT NOT NULL);
                 INSERT INTO orders VALUES ({id}, 'n{id}');"
            ))
            .map_err(|e| StorageError::backend("write", e))
    })
}

/// An owner at generation 5 writes (acknowledged), the export fences the
/// object at 6 and reads it: the write is in the export, the owner's next
/// commit is refused, and nothing lands in the old file after the export.
#[tokio::test]
async fn an_export_holds_every_acknowledged_write_and_refuses_the_old_owner_afterwards() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteObjectStore::new(dir.path());
    let object = key("Cart", "c-1");
    let live = store.open(&storage(), &object).await.unwrap();
    live.fence_claim(&owner(&object, 5), None).unwrap();
    sqlite_write(&live, 1).unwrap();
    let export = export_object(&store, "st", &object, shards())
        .await
        .unwrap();
    assert_eq!(export.header.fenced_generation, 6);
    assert_eq!(export.image.table("orders").unwrap().rows.len(), 1);
    let refused = sqlite_write(&live, 2).unwrap_err();
    assert_eq!(refused.kind(), StorageErrorKind::Fenced);
    let fresh = store.find(&storage(), &object).await.unwrap().unwrap();
    assert_eq!(sqlite_rows(&fresh).unwrap(), 1);
    // A second export raises the fence again (a rerun after a failed
    // write of the file).
    let again = export_object(&store, "st", &object, shards())
        .await
        .unwrap();
    assert_eq!(again.header.fenced_generation, 7);
    assert_eq!(again.image, export.image);
    // An object that is not stored is not created by an export.
    let e = export_object(&store, "st", &key("Cart", "none"), shards())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "move_not_found");
    assert!(
        store
            .find(&storage(), &key("Cart", "none"))
            .await
            .unwrap()
            .is_none()
    );
    // A fence of another shard count refuses the mover; nothing is read.
    let e = export_object(&store, "st", &object, ShardCount::new(4).unwrap())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "move_fence", "{e}");
}

#[test]
fn a_damaged_or_foreign_export_file_is_refused() {
    let export = Export {
        header: durability_host::store::moving::ExportHeader {
            format: "durability-object-export".to_owned(),
            version: 1,
            storage: "st".to_owned(),
            class: "Cart".to_owned(),
            name: "c".to_owned(),
            source: "sqlite".to_owned(),
            fenced_generation: 1,
        },
        image: durability_scheduler::image::ObjectImage::default(),
    };
    let bytes = export.encode().unwrap();
    assert_eq!(Export::decode(&bytes).unwrap(), export);
    let text = String::from_utf8(bytes.clone()).unwrap();
    let mut flipped = bytes.clone();
    flipped[40] ^= 1;
    assert_eq!(
        Export::decode(&flipped).unwrap_err().code(),
        "move_corrupt_file"
    );
    assert_eq!(
        Export::decode(&bytes[..bytes.len() - 10])
            .unwrap_err()
            .code(),
        "move_corrupt_file"
    );
    // Another version, with a checksum that matches it.
    let v2 = reseal(&text.replace("\"version\":1", "\"version\":2"));
    assert!(matches!(
        Export::decode(v2.as_bytes()).unwrap_err(),
        MoveError::UnsupportedVersion { found: 2 }
    ));
    let unknown = reseal(&text.replace("\"source\"", "\"extra\":1,\"source\""));
    assert_eq!(
        Export::decode(unknown.as_bytes()).unwrap_err().code(),
        "move_corrupt_file"
    );
    let bad_value = reseal(&format!(
        "{}{{\"table\":\"t\",\"columns\":[[\"a\",\"integer\",false]],\"key\":[],\"rows\":[[{{\"i\":\"x\"}}]]}}\n",
        text.lines().next().unwrap().to_owned() + "\n"
    ));
    assert_eq!(
        Export::decode(bad_value.as_bytes()).unwrap_err().code(),
        "move_corrupt_file"
    );
}

/// `text` with its trailer replaced by the checksum of its body.
fn reseal(text: &str) -> String {
    use sha2::Digest as _;
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with("{\"sha256\""))
        .map(|l| format!("{l}\n"))
        .collect();
    let sum: String = sha2::Sha256::digest(body.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{body}{{\"sha256\":\"{sum}\"}}\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_object_round_trips_sqlite_to_postgres_to_sqlite_with_every_row() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let pg = pg_store(&schema);
    let dir = tempfile::tempdir().unwrap();
    let first = SqliteObjectStore::new(dir.path().join("one"));
    let back = SqliteObjectStore::new(dir.path().join("two"));
    let object = key("Cart", "a name/é that is hashed");
    let source = first.open(&storage(), &object).await.unwrap();
    sqlite_write(&source, 1).unwrap();
    sqlite_write(&source, 2).unwrap();
    // A recorded idempotency key moves with the object.
    source
        .transaction(|tx| {
            assert_eq!(tx.idempotency_result("pay", "k-1")?, None);
            tx.record_idempotency_result("pay", "k-1", r#"{"paid":true}"#)
        })
        .unwrap();
    let out = export_object(&first, "st", &object, shards())
        .await
        .unwrap();
    let file = Export::decode(&out.encode().unwrap()).unwrap();
    import_object(&pg, &file, None, false).await.unwrap();
    let on_pg = export_object(&pg, "st", &object, shards()).await.unwrap();
    assert_eq!(on_pg.image, out.image);
    let moved: Arc<_> = pg.find(&storage(), &object).await.unwrap().unwrap();
    let recorded = moved
        .transaction(|tx| tx.idempotency_result("pay", "k-1"))
        .unwrap();
    assert_eq!(recorded.as_deref(), Some(r#"{"paid":true}"#));
    assert_eq!(on_pg.header.source, "postgres");
    import_object(&back, &on_pg, None, false).await.unwrap();
    let home = export_object(&back, "st", &object, shards()).await.unwrap();
    assert_eq!(home.image, out.image);
    let returned = back.find(&storage(), &object).await.unwrap().unwrap();
    let recorded = returned
        .transaction(|tx| tx.idempotency_result("pay", "k-1"))
        .unwrap();
    assert_eq!(recorded.as_deref(), Some(r#"{"paid":true}"#));
    let orders = home.image.table("orders").unwrap();
    assert_eq!(
        orders.rows[1],
        vec![Value::Integer(2), Value::Text("n2".into())]
    );
    // The imported object lists under its class.
    let q = ObjectQuery::new("Cart", "a ", None, 10).unwrap();
    let page = back.list_class(&storage(), &q).await.unwrap();
    assert_eq!(page.objects, vec![object.clone()]);
    // An existing target is refused and left as it was; replacing works.
    let e = import_object(&pg, &file, None, false).await.unwrap_err();
    assert_eq!(e.code(), "move_image");
    assert!(e.to_string().contains("not empty"), "{e}");
    import_object(&pg, &file, None, true).await.unwrap();
    let again: Arc<_> = pg.find(&storage(), &object).await.unwrap().unwrap();
    assert_eq!(
        again
            .transaction(|tx| PostgresObjectStore::export_tx(tx))
            .unwrap(),
        out.image
    );
}

/// A holder paused inside a transaction on the object (it holds the object
/// row, as an owner SIGSTOPped mid-call does) does not block an export on
/// PostgreSQL past the lock timeout: the mover reads the fence without the
/// row lock, and its fence round ends the holder's session, so the holder
/// can never commit. Before, the fence read waited for the row, timed out
/// after 1 s and failed every retry.
#[tokio::test(flavor = "multi_thread")]
async fn an_export_on_postgres_ends_a_holder_paused_inside_a_transaction() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let pg = pg_store(&schema);
    let object = key("Cart", "held");
    let live = pg.open(&storage(), &object).await.unwrap();
    live.fence_claim(&owner(&object, 5), None).unwrap();
    let (holder, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    holder.batch_execute("BEGIN").await.unwrap();
    let locked = holder
        .query(
            &format!(
                "SELECT 1 FROM \"{}\".durability_objects WHERE id = $1 FOR UPDATE",
                schema.name()
            ),
            &[&live.object_id()],
        )
        .await
        .unwrap();
    assert_eq!(locked.len(), 1, "the holder holds the object row");
    let export = export_object(&pg, "st", &object, shards())
        .await
        .expect("the export is not blocked by the paused holder");
    assert_eq!(export.header.fenced_generation, 6);
    // The holder's session was ended: it can never commit.
    let after = holder.batch_execute("COMMIT").await;
    assert!(after.is_err(), "the paused holder's session was ended");
    let _ = driver.await;
    let refused = live
        .transaction(|tx| tx.fences())
        .expect_err("the old owner's handle is fenced");
    assert_eq!(refused.kind(), StorageErrorKind::Fenced, "{refused}");
}
