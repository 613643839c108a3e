//! The conformance suite for [`OutboxTx`] backends.
//!
//! The suite is a list of named cases ([`CASES`]). A backend's test file is
//! one [`outbox_conformance!`](crate::outbox_conformance) call with a factory
//! of fresh, empty storages (`impl Fn() -> S`); it emits one `#[test]` per
//! case. Each check panics with a message naming the broken rule.

use durability_scheduler::{SchemaTarget, Storage, StorageError, migrate};

use crate::channel::SCHEMA;
use crate::store::{OutboxTx, Reschedule, StoredEntry, StoredRow};

/// The body of this crate's conformance macros (see `durability_scheduler`).
#[doc(hidden)]
pub use durability_scheduler::storage_suite;

fn entry(channel: &str, key: &str, version: u64, due_at: i64) -> StoredEntry {
    StoredEntry {
        channel: channel.to_owned(),
        key: key.to_owned(),
        value: vec![1, 2, 3, version as u8],
        version,
        attempt: 0,
        due_at,
        claimed_until: None,
    }
}

/// The names of the suite's cases, in order (each runs on a fresh storage).
pub const CASES: &[&str] = crate::outbox_conformance!(@cases names);

/// Runs the case `name` on a fresh storage from `make`, with the outbox
/// schema applied.
///
/// # Panics
/// When the case fails (naming the broken rule), or when `name` is not in
/// [`CASES`].
pub fn run_case<S>(name: &str, make: impl Fn() -> S)
where
    S: Storage,
    for<'t> S::Tx<'t>: OutboxTx,
{
    let s = make();
    migrate(&s, SCHEMA, &SchemaTarget::Latest).expect("outbox schema applies");
    match name {
        "versions_only_increase" => versions_only_increase(&s),
        "upsert_replaces_and_get_reads" => upsert_replaces_and_get_reads(&s),
        "guarded_settlement" => guarded_settlement(&s),
        "due_order_limit_and_channels" => due_order_limit_and_channels(&s),
        "rollback_leaves_nothing" => rollback_leaves_nothing(&s),
        "schema_reverts_and_reapplies" => schema_reverts_and_reapplies(&s),
        other => panic!("no outbox conformance case {other:?}"),
    }
}

/// Runs every case in order, each on a fresh storage from `make`.
///
/// # Panics
/// On the first broken rule, naming it.
pub fn run<S>(make: impl Fn() -> S)
where
    S: Storage,
    for<'t> S::Tx<'t>: OutboxTx,
{
    for name in CASES {
        run_case(name, &make);
    }
}

fn tx<S: Storage, R>(s: &S, f: impl FnOnce(&mut S::Tx<'_>) -> Result<R, StorageError>) -> R {
    s.transaction(f).expect("transaction")
}

fn versions_only_increase<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: OutboxTx,
{
    let a = tx(s, |t| t.outbox_next_version());
    let b = tx(s, |t| t.outbox_next_version());
    assert!(b > a, "versions increase across transactions");
    tx(s, |t| {
        t.outbox_upsert(&entry("c", "k", b, 0))?;
        t.outbox_remove("c", "k")
    });
    let c = tx(s, |t| t.outbox_next_version());
    assert!(c > b, "versions keep increasing after an entry is removed");
}

fn upsert_replaces_and_get_reads<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: OutboxTx,
{
    tx(s, |t| {
        t.outbox_upsert(&entry("c", "k", 1, 10))?;
        let mut newer = entry("c", "k", 2, 20);
        newer.value = vec![9; 300];
        newer.attempt = 0;
        t.outbox_upsert(&newer)?;
        Ok(())
    });
    let got = tx(s, |t| t.outbox_get("c", "k"))
        .and_then(StoredRow::into_entry)
        .expect("entry present");
    assert_eq!(got.version, 2, "only the newest value is pending");
    assert_eq!(got.value, vec![9; 300], "value bytes round-trip");
    assert_eq!(got.due_at, 20);
    assert_eq!(got.claimed_until, None);
    assert_eq!(tx(s, |t| t.outbox_len("c")), 1);
    assert!(tx(s, |t| t.outbox_get("c", "other")).is_none());
    assert!(tx(s, |t| t.outbox_remove("c", "k")));
    assert!(
        !tx(s, |t| t.outbox_remove("c", "k")),
        "second remove finds nothing"
    );
}

fn guarded_settlement<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: OutboxTx,
{
    tx(s, |t| t.outbox_upsert(&entry("c", "k", 5, 0)));
    assert!(
        tx(s, |t| t.outbox_reschedule_if(Reschedule {
            channel: "c",
            key: "k",
            version: 5,
            expected_attempt: 0,
            attempt: 1,
            due_at: 100,
            claimed_until: Some(100),
        })),
        "claim at the current version and attempt succeeds"
    );
    let got = tx(s, |t| t.outbox_get("c", "k"))
        .and_then(StoredRow::into_entry)
        .expect("present");
    assert_eq!(
        (got.attempt, got.due_at, got.claimed_until),
        (1, 100, Some(100))
    );
    assert!(
        !tx(s, |t| t.outbox_reschedule_if(Reschedule {
            channel: "c",
            key: "k",
            version: 5,
            expected_attempt: 0,
            attempt: 2,
            due_at: 7,
            claimed_until: None,
        })),
        "a stale attempt cannot reschedule"
    );
    assert!(
        !tx(s, |t| t.outbox_remove_if("c", "k", 4, 1)),
        "an older version cannot settle"
    );
    assert!(
        !tx(s, |t| t.outbox_remove_if("c", "k", 5, 0)),
        "an older attempt cannot settle"
    );
    tx(s, |t| t.outbox_upsert(&entry("c", "k", 6, 0)));
    assert!(
        !tx(s, |t| t.outbox_remove_if("c", "k", 5, 1)),
        "a restaged entry survives the old version's acknowledgement"
    );
    assert!(tx(s, |t| t.outbox_remove_if("c", "k", 6, 0)));
    assert!(tx(s, |t| t.outbox_get("c", "k")).is_none());
}

fn due_order_limit_and_channels<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: OutboxTx,
{
    tx(s, |t| {
        t.outbox_upsert(&entry("a", "late", 1, 500))?;
        t.outbox_upsert(&entry("a", "second", 3, 100))?;
        t.outbox_upsert(&entry("a", "first", 2, 100))?;
        t.outbox_upsert(&entry("a", "zero", 4, 50))?;
        t.outbox_upsert(&entry("b", "other", 5, 0))?;
        Ok(())
    });
    let due: Vec<String> = tx(s, |t| t.outbox_due("a", 100, 10))
        .into_iter()
        .map(|e| e.into_entry().expect("healthy row").key)
        .collect();
    assert_eq!(
        due,
        ["zero", "first", "second"],
        "due order: time, then version"
    );
    let limited = tx(s, |t| t.outbox_due("a", 1_000, 2));
    assert_eq!(limited.len(), 2, "limit bounds the batch");
    assert_eq!(tx(s, |t| t.outbox_next_due("a")), Some(50));
    assert_eq!(tx(s, |t| t.outbox_next_due("b")), Some(0));
    assert_eq!(tx(s, |t| t.outbox_next_due("none")), None);
    assert_eq!(tx(s, |t| t.outbox_len("a")), 4, "channels are separate");
    assert!(tx(s, |t| t.outbox_due("a", 49, 10)).is_empty());
}

fn rollback_leaves_nothing<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: OutboxTx,
{
    let before = tx(s, |t| t.outbox_next_version());
    let r: Result<(), StorageError> = s.transaction(|t| {
        t.outbox_upsert(&entry("r", "k", before + 1, 0))?;
        Err(StorageError::corrupt("roll back"))
    });
    assert!(r.is_err());
    assert!(
        tx(s, |t| t.outbox_get("r", "k")).is_none(),
        "a rolled-back stage leaves no entry"
    );
}

fn schema_reverts_and_reapplies<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: OutboxTx,
{
    tx(s, |t| t.outbox_upsert(&entry("m", "k", 1, 0)));
    migrate(s, SCHEMA, &SchemaTarget::Nothing).expect("revert outbox schema");
    migrate(s, SCHEMA, &SchemaTarget::Latest).expect("reapply outbox schema");
    tx(s, |t| t.outbox_upsert(&entry("m", "k2", 2, 0)));
    assert_eq!(
        tx(s, |t| t.outbox_get("m", "k2"))
            .and_then(StoredRow::into_entry)
            .map(|e| e.version),
        Some(2),
        "the schema is usable after reapplying"
    );
}

/// A scheduler test storage with the outbox schema registered: the
/// in-memory implementation of [`OutboxTx`].
pub fn memory_storage() -> durability_scheduler::testkit::MemoryStorage {
    durability_scheduler::testkit::MemoryStorage::new().with_schema(SCHEMA, crate::SCHEMA_STEPS)
}

/// Emits one `#[test]` per case of the outbox conformance suite
/// ([`conformance::CASES`](crate::conformance::CASES)), in a module named
/// `$module`, each running the case on fresh storages from the factory
/// `$make` (an expression evaluated in each test, inside the new module,
/// which sees the caller's items through `use super::*`).
///
/// ```text
/// durability_outbox::outbox_conformance!(outbox_on_memory, durability_outbox::conformance::memory_storage);
/// ```
#[macro_export]
macro_rules! outbox_conformance {
    ($($args:tt)*) => {
        $crate::conformance::storage_suite! { $crate::conformance::run_case, [
            versions_only_increase
            upsert_replaces_and_get_reads
            guarded_settlement
            due_order_limit_and_channels
            rollback_leaves_nothing
            schema_reverts_and_reapplies
        ], $($args)* }
    };
}
