//! The lease store's writes are durable: a power loss must not forget a
//! generation and re-issue it, so the lease store runs `synchronous=FULL`
//! (and WAL), opened through the crate's one connection opener.
#![cfg(feature = "ownership")]
#![allow(clippy::unwrap_used)]

use durability_ownership::{ManualClock, ShardCount};
use durability_storage_sqlite::ownership::SqliteLeaseStore;

#[test]
fn the_lease_store_syncs_every_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteLeaseStore::open(
        dir.path().join("leases.db"),
        ManualClock::new(1_000),
        ShardCount::default(),
    )
    .unwrap();
    let (synchronous, journal): (i64, String) = store.with_connection(|c| {
        (
            c.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap(),
            c.query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap(),
        )
    });
    assert_eq!(synchronous, 2, "PRAGMA synchronous must be FULL (2)");
    assert_eq!(journal, "wal");
}
