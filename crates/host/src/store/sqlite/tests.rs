//! Unit tests of the SQLite directory's file names and listing.

use std::path::Path;

use durability_ownership::{LifecycleId, StorageId};

use super::{SqliteObjectStore, TOMBSTONE_FILE, object_of, object_path};
use crate::store::{ObjectKey, ObjectStore, TombstoneState};

#[test]
fn plain_names_are_file_names_and_others_are_hex_encoded() {
    let root = Path::new("/r");
    assert_eq!(
        object_path(root, "st", "Counter", "c-1_A"),
        Path::new("/r/st/Counter/c-1_A.sqlite")
    );
    // `~` marks the encoded form, so a plain name never collides with it.
    assert_eq!(
        object_path(root, "st", "Counter", "a b"),
        Path::new("/r/st/Counter/~612062.sqlite")
    );
    assert_eq!(
        object_path(root, "st", "Counter", ".."),
        Path::new("/r/st/Counter/~2e2e.sqlite")
    );
    let long = "é".repeat(120);
    let path = object_path(root, "st", "Counter", &long);
    assert!(path.starts_with("/r/st/Counter"));
    for part in path
        .strip_prefix("/r/st/Counter")
        .expect("under the class directory")
        .iter()
    {
        assert!(part.len() <= 207, "{part:?}");
    }
    assert_ne!(path, object_path(root, "st", "Counter", &"é".repeat(119)));
}

#[test]
fn a_file_name_decodes_to_its_object_and_nothing_else_does() {
    for name in [
        "c-1_A",
        "a b",
        "..",
        "~x",
        &"é".repeat(120),
        &"x".repeat(201),
    ] {
        let path = object_path(Path::new("/r"), "st", "Counter", name);
        let relative = path.strip_prefix("/r/st").expect("under the storage");
        assert_eq!(
            object_of(relative),
            Some(ObjectKey {
                class: "Counter".to_owned(),
                name: name.to_owned()
            }),
            "{name}"
        );
    }
    for stray in [
        "Counter/x.txt",
        "Counter/~zz.sqlite",
        "Counter/~6.sqlite",
        // Not the canonical spelling of "ab": the plain form is.
        "Counter/~6162.sqlite",
        "x.sqlite",
    ] {
        assert_eq!(object_of(Path::new(stray)), None, "{stray}");
    }
}

#[tokio::test]
async fn objects_are_listed_in_pages_and_deleted_one_by_one() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteObjectStore::new(dir.path());
    let storage = StorageId::new("st").expect("a valid storage id");
    // Long enough to split into directories; much longer paths pass
    // SQLite's 512-byte path limit, which the directory does not handle.
    let names = ["a", "b b", "c", &"é".repeat(60)];
    for name in names {
        let key = ObjectKey {
            class: "K".to_owned(),
            name: name.to_owned(),
        };
        store.open(&storage, &key).await.expect("opened");
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
