//! Unit tests of the SQLite directory's file names, listing and admission.

use std::path::Path;

use durability_ownership::{LifecycleId, StorageId};

use super::names::{files, legacy_path, object_of};
use super::{ADMISSION_FILE, SqliteObjectStore, TOMBSTONE_FILE};
use crate::store::{ObjectKey, ObjectStore, TombstoneState};

fn key(class: &str, name: &str) -> ObjectKey {
    ObjectKey {
        class: class.to_owned(),
        name: name.to_owned(),
    }
}

/// The longest valid class name (468 bytes of the class grammar).
fn longest_class() -> String {
    format!("C{}", "x".repeat(467))
}

#[test]
fn short_plain_names_are_file_names_and_every_other_name_a_fixed_length_hash() {
    let root = Path::new("/r");
    let plain = files(root, "st", "Counter", "c-1_A");
    assert_eq!(plain.db, Path::new("/r/st/Counter/c-1_A.sqlite"));
    assert_eq!(plain.sidecar, None);
    // The same file as the legacy mapping: existing objects need no lookup.
    assert_eq!(plain.db, legacy_path(root, "st", "Counter", "c-1_A"));
    for (class, name) in [
        ("Counter", "a b".to_owned()),
        ("Counter", "x".repeat(65)),
        ("Counter", "🛒".repeat(128)),
        (longest_class().as_str(), "c1".to_owned()),
        (longest_class().as_str(), "é".repeat(256)),
    ] {
        let storage = "s".repeat(128);
        let f = files(root, &storage, class, &name);
        let (sidecar, text) = f.sidecar.clone().expect("a hashed name has a sidecar");
        assert_eq!(text, format!("{class}\n{name}"));
        assert_eq!(sidecar.with_extension("sqlite"), f.db);
        let under =
            f.db.strip_prefix(root.join(&storage))
                .expect("under the storage");
        for part in under.iter() {
            assert!(part.len() <= 72, "{part:?}");
        }
        // Root, storage id at its limit, class, hashed file, `-journal`.
        assert!(f.db.as_os_str().len() + 8 <= 2 + 276, "{}", f.db.display());
    }
    assert_ne!(
        files(root, "st", "Counter", "a b").db,
        files(root, "st", "Counter2", "a b").db
    );
}

#[test]
fn a_file_decodes_to_its_object_and_any_other_file_is_an_error() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let base = dir.path();
    let touch = |path: &Path| {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("created");
        std::fs::write(path, "").expect("written");
    };
    // Legacy files, plain and hex-encoded (split into directories).
    for name in [
        "c-1_A",
        "a b",
        "..",
        "~x",
        &"é".repeat(120),
        &"x".repeat(200),
    ] {
        let path = legacy_path(base, "", "Counter", name);
        touch(&path);
        let relative = path.strip_prefix(base).expect("under the base");
        assert_eq!(
            object_of(base, relative),
            Ok(key("Counter", name)),
            "{name}"
        );
    }
    // Current hashed files, with their sidecars.
    for (class, name) in [("Counter", "🛒 カート"), (&*longest_class(), "n")] {
        let f = files(base, "", class, name);
        let (sidecar, text) = f.sidecar.expect("hashed");
        touch(&f.db);
        std::fs::write(&sidecar, text).expect("written");
        let relative = f.db.strip_prefix(base).expect("under the base");
        assert_eq!(object_of(base, relative), Ok(key(class, name)));
    }
    // A hashed file whose sidecar is missing, names another object, or
    // does not decode.
    let f = files(base, "", "Counter", "lost name");
    touch(&f.db);
    let relative = f.db.strip_prefix(base).expect("under the base").to_owned();
    assert!(object_of(base, &relative).is_err());
    let (sidecar, _) = f.sidecar.expect("hashed");
    std::fs::write(&sidecar, "Counter\nanother name").expect("written");
    assert!(object_of(base, &relative).is_err());
    std::fs::write(&sidecar, [0xff, 0xfe]).expect("written");
    assert!(object_of(base, &relative).is_err());
    for stray in [
        "Counter/~zz.sqlite",
        "Counter/~6.sqlite",
        // Not the canonical spelling of "ab": the plain form is.
        "Counter/~6162.sqlite",
        "x.sqlite",
        "not-a-class/x.sqlite",
        "Counter/@00.sqlite",
    ] {
        assert!(object_of(base, Path::new(stray)).is_err(), "{stray}");
    }
}

#[tokio::test]
async fn files_of_the_legacy_mapping_still_open_list_and_delete() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteObjectStore::new(dir.path());
    let storage = StorageId::new("st").expect("a valid storage id");
    let name = "é".repeat(60);
    // An object created by the earlier mapping, holding a row.
    let legacy = legacy_path(dir.path(), "st", "K", &name);
    std::fs::create_dir_all(legacy.parent().expect("a parent")).expect("created");
    rusqlite::Connection::open(&legacy)
        .and_then(|c| {
            c.execute_batch("CREATE TABLE kept (v INTEGER); INSERT INTO kept VALUES (7);")
        })
        .expect("written");
    let object = key("K", &name);
    store.open(&storage, &object).await.expect("opened");
    let current = files(dir.path(), "st", "K", &name);
    assert!(
        !current.db.exists(),
        "the legacy file was opened, no new one made"
    );
    let page = store.list(&storage, None, 10).await.expect("listed");
    assert_eq!(page.objects, std::slice::from_ref(&object));
    assert!(
        store
            .delete_object(&storage, &object)
            .await
            .expect("deleted")
    );
    assert!(!legacy.exists());
}

#[tokio::test]
async fn a_deletion_waits_for_admitted_work_and_admission_then_finds_the_tombstone() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteObjectStore::new(dir.path());
    let storage = StorageId::new("st").expect("a valid storage id");
    let admitted = store
        .admit(&storage)
        .await
        .expect("admitted")
        .expect("no tombstone");
    let lifecycle = LifecycleId::new("ns:x").expect("a valid lifecycle");
    store
        .write_tombstone(&storage, &lifecycle, TombstoneState::Deleting)
        .expect("written");
    let deleter = store.clone();
    let excluded = tokio::spawn({
        let storage = storage.clone();
        async move { deleter.exclude(&storage).await.map(drop) }
    });
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        !excluded.is_finished(),
        "the deletion waits for admitted work"
    );
    drop(admitted);
    excluded.await.expect("joined").expect("excluded");
    assert!(
        store.admit(&storage).await.expect("answered").is_none(),
        "a tombstoned storage id admits nothing"
    );
    assert!(dir.path().join("st").join(ADMISSION_FILE).exists());
}

/// Gives the other tasks (and a blocked lock's thread) many turns.
async fn turns() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn the_process_s_admitted_calls_share_one_lock_that_a_deletion_waits_out_to_the_last() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteObjectStore::new(dir.path());
    let storage = StorageId::new("st").expect("a valid storage id");
    let first = store.admit(&storage).await.expect("admitted");
    let second = store.admit(&storage).await.expect("admitted");
    assert!(first.is_some() && second.is_some(), "no tombstone");
    // A deletion holding the exclusion until told to end.
    let (excluded_tx, mut excluded) = tokio::sync::oneshot::channel();
    let (end, ended) = tokio::sync::oneshot::channel::<()>();
    let deleter = store.clone();
    let deletion = tokio::spawn({
        let storage = storage.clone();
        async move {
            let exclusion = deleter.exclude(&storage).await.expect("excluded");
            let _ = excluded_tx.send(());
            let _ = ended.await;
            drop(exclusion);
        }
    });
    turns().await;
    assert!(excluded.try_recv().is_err(), "two calls are admitted");
    // The first call's end leaves the lock held for the second.
    drop(first);
    turns().await;
    assert!(
        excluded.try_recv().is_err(),
        "the deletion waits for the call still admitted"
    );
    drop(second);
    excluded
        .await
        .expect("the deletion excluded once the last call ended");
    // While the deletion holds the lock, a call waits for it.
    let admitting = tokio::spawn({
        let store = store.clone();
        let storage = storage.clone();
        async move { store.admit(&storage).await.expect("admitted") }
    });
    turns().await;
    assert!(!admitting.is_finished(), "a call waits for the deletion");
    end.send(()).expect("the deletion waits");
    deletion.await.expect("joined");
    let waited = admitting.await.expect("joined");
    assert!(
        waited.is_some(),
        "admitted after the deletion (no tombstone)"
    );
    // The shared lock is taken again beside the waited call's own.
    let again = store.admit(&storage).await.expect("admitted");
    assert!(again.is_some());
    let deleter = store.clone();
    let exclusion = tokio::spawn(async move { deleter.exclude(&storage).await.map(drop) });
    drop(waited);
    turns().await;
    assert!(!exclusion.is_finished(), "the counted call still runs");
    drop(again);
    exclusion.await.expect("joined").expect("excluded");
}

#[tokio::test]
async fn objects_are_listed_in_pages_and_deleted_one_by_one() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteObjectStore::new(dir.path());
    let storage = StorageId::new("st").expect("a valid storage id");
    // Names of every length up to the limit, any Unicode.
    let names = [
        "a",
        "b b",
        "c",
        &"é".repeat(60),
        &"🛒".repeat(128),
        "line\nbreak",
        "日本語",
    ];
    for name in names {
        store.open(&storage, &key("K", name)).await.expect("opened");
    }
    std::fs::write(dir.path().join("st/K/stray.txt"), "x").expect("written");
    let mut listed = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list(&storage, cursor.as_deref(), 3)
            .await
            .expect("listed");
        assert!(page.objects.len() <= 3);
        listed.extend(page.objects);
        match page.cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let mut expected: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut got: Vec<String> = listed.iter().map(|o| o.name.clone()).collect();
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
    for object in &listed {
        assert!(
            store
                .delete_object(&storage, object)
                .await
                .expect("deleted")
        );
        assert!(!store.delete_object(&storage, object).await.expect("gone"));
    }
    let lifecycle = LifecycleId::new("ns:x").expect("a valid lifecycle");
    store
        .write_tombstone(&storage, &lifecycle, TombstoneState::Deleting)
        .expect("written");
    assert!(store.delete_rest(&storage).await.is_empty());
    let left: Vec<_> = std::fs::read_dir(dir.path().join("st"))
        .expect("the storage directory stays")
        .map(|e| e.expect("an entry").file_name())
        .collect();
    assert_eq!(left, [TOMBSTONE_FILE]);
    assert!(store.tombstone(&storage).is_some());
}
