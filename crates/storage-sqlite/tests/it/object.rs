//! The scheduler and outbox conformance suites on SQLite file databases, and
//! the SQLite-specific behaviour of the object storage.
#![cfg(feature = "outbox")]
#![allow(clippy::unwrap_used)]

use durability_scheduler::conformance::STEPS as CONFORMANCE_STEPS;
use durability_scheduler::{SchedulerTx, Storage};
use durability_storage_sqlite::{SqliteOptions, SqliteSchemaStep, SqliteStorage, Synchronous};

static CONFORMANCE_SQL: &[SqliteSchemaStep] = &[
    SqliteSchemaStep {
        step: CONFORMANCE_STEPS[0],
        up: "CREATE TABLE app_conformance (id INTEGER PRIMARY KEY)",
        down: "DROP TABLE app_conformance",
    },
    SqliteSchemaStep {
        step: CONFORMANCE_STEPS[1],
        up: "ALTER TABLE app_conformance ADD COLUMN note TEXT",
        down: "ALTER TABLE app_conformance DROP COLUMN note",
    },
];

fn file_storage(dir: &tempfile::TempDir, n: &std::sync::atomic::AtomicU32) -> SqliteStorage {
    let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mut s = SqliteStorage::open(
        dir.path().join(format!("obj-{i}.db")),
        SqliteOptions::default(),
    )
    .unwrap();
    s.register_schema("conformance", CONFORMANCE_STEPS, CONFORMANCE_SQL)
        .unwrap();
    s
}

/// A factory of fresh SQLite file storages in a temporary directory it owns.
fn file_storages() -> impl Fn() -> SqliteStorage {
    let dir = tempfile::tempdir().unwrap();
    let n = std::sync::atomic::AtomicU32::new(0);
    move || file_storage(&dir, &n)
}

durability_scheduler::scheduler_conformance!(
    scheduler_conformance_on_sqlite_files,
    file_storages()
);

durability_outbox::outbox_conformance!(outbox_conformance_on_sqlite_files, file_storages());

durability_outbox::outbox_conformance!(
    outbox_conformance_on_memory_storage,
    durability_outbox::conformance::memory_storage
);

#[test]
fn database_is_wal_with_the_chosen_synchronous_and_prefixed_tables() {
    let dir = tempfile::tempdir().unwrap();
    for (sync, expected) in [
        (Synchronous::Full, 2),
        (Synchronous::Normal, 1),
        (Synchronous::Off, 0),
    ] {
        let path = dir.path().join(format!("{expected}.db"));
        let s = SqliteStorage::open(
            &path,
            SqliteOptions {
                synchronous: sync,
                ..Default::default()
            },
        )
        .unwrap();
        durability_scheduler::migrate(&s, "outbox", &durability_scheduler::SchemaTarget::Latest)
            .unwrap();
        let (mode, level, names): (String, i64, Vec<String>) = s
            .transaction(|tx| {
                let c = tx.sql();
                let mode = c.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
                let level = c.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
                let mut st = c.prepare("SELECT name FROM sqlite_master WHERE type = 'table'")?;
                let names = st
                    .query_map([], |r| r.get(0))?
                    .collect::<Result<Vec<String>, _>>()?;
                Ok::<_, rusqlite_error::E>((mode, level, names))
            })
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(level, expected, "synchronous {sync:?}");
        assert!(
            names.iter().all(|n| n.starts_with("durability_")),
            "{names:?}"
        );
    }
    assert_eq!(
        SqliteOptions::default().synchronous,
        Synchronous::Full,
        "FULL is the default"
    );
}

#[test]
fn schema_registration_is_validated() {
    let mut s = SqliteStorage::open_in_memory().unwrap();
    assert!(
        s.register_schema("outbox", CONFORMANCE_STEPS, CONFORMANCE_SQL)
            .is_err(),
        "built-in name"
    );
    assert!(
        s.register_schema("x", &CONFORMANCE_STEPS[..1], CONFORMANCE_SQL)
            .is_err(),
        "mismatch"
    );
    s.register_schema("x", CONFORMANCE_STEPS, CONFORMANCE_SQL)
        .unwrap();
}

#[test]
fn alarm_survives_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    {
        let s = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
        s.transaction(|tx| tx.set_alarm(Some(1234))).unwrap();
    }
    let s = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    assert_eq!(s.transaction(|tx| tx.alarm()).unwrap(), Some(1234));
}

/// Turns rusqlite errors into storage errors inside test transactions.
mod rusqlite_error {
    use durability_scheduler::StorageError;

    /// A test error: either kind.
    #[derive(Debug)]
    pub(crate) struct E(#[allow(dead_code)] String);
    impl From<StorageError> for E {
        fn from(e: StorageError) -> Self {
            Self(e.to_string())
        }
    }
    impl From<rusqlite::Error> for E {
        fn from(e: rusqlite::Error) -> Self {
            Self(e.to_string())
        }
    }
}

#[test]
fn a_file_that_cannot_be_opened_is_sqlite_open_failed() {
    use durability_storage_sqlite::connection::{ConnectionOptions, OpenError, open_connection};
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir").join("x.db");
    let options = ConnectionOptions {
        wal: true,
        synchronous: Synchronous::Full,
        busy_timeout: std::time::Duration::from_secs(1),
    };
    let err = open_connection(&missing, &options).unwrap_err();
    assert!(matches!(err, OpenError::Sqlite { .. }), "{err:?}");
    assert_eq!(err.code(), "SQLITE_OPEN_FAILED");
    assert!(OpenError::CODES.contains(&err.code()));
    assert!(!missing.exists(), "nothing was created");
}
