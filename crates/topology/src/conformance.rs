//! Conformance suites for topology backends, and in-memory implementations.
//!
//! - [`TX_CASES`]: every [`TopologyTx`] backend (object storage), one test
//!   per case from one [`topology_tx_conformance!`](crate::topology_tx_conformance)
//!   call ([`run_tx`] runs them all in one go).
//! - [`run_publication`]: every [`Publisher`] + [`ReadStore`] pair (the
//!   publication store); `versioned` adds the checks of a store that keeps
//!   only the highest version per group and coordinator. It is one scenario
//!   (each step builds on the state the previous one left), so it is one
//!   case: backends call it from their own test, next to their own checks.
//! - [`memory_storage`]: the scheduler's in-memory storage with the outbox
//!   and topology schemas registered.
//! - [`MemoryPublication`]: an in-memory publication store (plain or
//!   versioned).
//! - [`coordinator_snapshots`]: snapshots encoded by a real coordinator, for
//!   suites that replay writes in any order. There is no public encoder:
//!   even a suite gets its encoded snapshots from a coordinator.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use durability_scheduler::testkit::MemoryStorage;
use durability_scheduler::{
    ObjectContext, ObjectId, Scheduler, SchemaStep, SchemaTarget, Storage, StorageError, migrate,
};
use durability_time::ManualClock;
use durability_topology_client::{BoxError, Member, MemberState, ReadStore, Snapshot, decode};

use crate::SCHEMA;
use crate::coordinator::{Draft, MemberInput, Topology, TopologyConfig};
use crate::encode::EncodedSnapshot;
use crate::store::{GroupRow, PublishError, Publisher, SnapshotDeletion, TopologyTx};

/// The body of this crate's conformance macros (see `durability_scheduler`).
#[doc(hidden)]
pub use durability_scheduler::storage_suite;

static MEMORY_STEPS: &[SchemaStep] = &[SchemaStep::new(1, "initial")];

/// The scheduler's in-memory storage with the outbox and topology schemas
/// registered: the in-memory implementation of [`TopologyTx`].
pub fn memory_storage() -> MemoryStorage {
    durability_outbox::conformance::memory_storage().with_schema(SCHEMA, MEMORY_STEPS)
}

#[derive(Default)]
struct Stored {
    /// group → (coordinator, version, encoded)
    data: BTreeMap<String, (String, u64, Vec<u8>)>,
    /// (group, coordinator) → highest version seen (versioned mode only).
    highest: BTreeMap<(String, String), u64>,
}

/// An in-memory publication store. Plain mode is a key-value store
/// (last write wins); versioned mode keeps only the highest version per
/// group and coordinator.
#[derive(Clone, Default)]
pub struct MemoryPublication {
    versioned: bool,
    stored: Arc<Mutex<Stored>>,
}

durability_time::debug_fields!(MemoryPublication { versioned });

impl MemoryPublication {
    /// A plain key-value store.
    pub fn plain() -> Self {
        Self::default()
    }

    /// A version-aware store.
    pub fn versioned() -> Self {
        Self {
            versioned: true,
            ..Self::default()
        }
    }

    /// The version stored for a group, if any.
    pub fn version(&self, group: &str) -> Option<u64> {
        self.lock().data.get(group).map(|(_, v, _)| *v)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stored> {
        self.stored.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn admit(&self, s: &mut Stored, group: &str, coordinator: &str, version: u64) -> bool {
        if !self.versioned {
            return true;
        }
        let key = (group.to_owned(), coordinator.to_owned());
        if s.highest.get(&key).is_some_and(|h| *h >= version) {
            return false;
        }
        s.highest.insert(key, version);
        true
    }
}

impl Publisher for MemoryPublication {
    async fn write(
        &self,
        snapshot: &Snapshot,
        encoded: &EncodedSnapshot,
    ) -> Result<(), PublishError> {
        let mut s = self.lock();
        if self.admit(
            &mut s,
            &snapshot.group,
            &snapshot.coordinator,
            snapshot.version,
        ) {
            s.data.insert(
                snapshot.group.clone(),
                (
                    snapshot.coordinator.clone(),
                    snapshot.version,
                    encoded.as_bytes().to_vec(),
                ),
            );
        }
        Ok(())
    }

    async fn delete(&self, deletion: SnapshotDeletion<'_>) -> Result<(), PublishError> {
        let mut s = self.lock();
        if self.admit(
            &mut s,
            deletion.group,
            deletion.coordinator,
            deletion.version,
        ) {
            s.data.remove(deletion.group);
        }
        Ok(())
    }
}

impl ReadStore for MemoryPublication {
    async fn read(&self, group: &str) -> Result<Option<Vec<u8>>, BoxError> {
        Ok(self.lock().data.get(group).map(|(_, _, b)| b.clone()))
    }
}

/// A sample snapshot for suites: `members` active members `m0..`.
pub fn sample(group: &str, version: u64, coordinator: &str, members: usize) -> Snapshot {
    Snapshot {
        group: group.to_owned(),
        version,
        coordinator: coordinator.to_owned(),
        members: (0..members)
            .map(|i| Member {
                id: format!("m{i}"),
                state: MemberState::Active,
                location_hint: None,
                meta: None,
                joined_at: 1_700_000_000_000,
            })
            .collect(),
    }
}

/// Records what a coordinator publishes.
#[derive(Clone, Default)]
struct Recorder {
    writes: Arc<Mutex<Vec<(Snapshot, EncodedSnapshot)>>>,
}

impl Publisher for Recorder {
    async fn write(
        &self,
        snapshot: &Snapshot,
        encoded: &EncodedSnapshot,
    ) -> Result<(), PublishError> {
        self.writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((snapshot.clone(), encoded.clone()));
        Ok(())
    }

    async fn delete(&self, _: SnapshotDeletion<'_>) -> Result<(), PublishError> {
        Ok(())
    }
}

/// Snapshots encoded by a real coordinator: a coordinator object named
/// `coordinator` on fresh in-memory storage applies `steps` to `group` in
/// order (`Some(n)`: set `n` active members `m0..`, a new version when it
/// changes the membership; `None`: delete the group, which takes a version
/// too), and every snapshot it publishes is returned with its encoding, in
/// order. Suites replay them against a store in any order (late writes).
///
/// # Panics
/// When the coordinator refuses a step (an invalid coordinator name, `n`
/// of 0 or over the member limit).
pub async fn coordinator_snapshots(
    coordinator: &str,
    group: &str,
    steps: &[Option<usize>],
) -> Vec<(Snapshot, EncodedSnapshot)> {
    let ctx = ObjectContext::with_clock(
        ObjectId::new(coordinator).expect("a valid coordinator object ID"),
        Arc::new(memory_storage()),
        Arc::new(ManualClock::new(1_700_000_000_000)),
    );
    let scheduler = Scheduler::new(ctx).expect("a scheduler on memory storage");
    let recorder = Recorder::default();
    let topology = Topology::attach(&scheduler, TopologyConfig::new().publish(recorder.clone()))
        .expect("the coordinator attaches");
    for step in steps {
        match step {
            Some(n) => {
                let members: Vec<MemberInput> = (0..*n)
                    .map(|i| MemberInput::active(format!("m{i}")))
                    .collect();
                let out = topology
                    .update(group, |_| Draft::new().members(members))
                    .await
                    .expect("the update commits");
                assert!(out.published, "the recording publisher never fails");
            }
            None => {
                topology.delete(group).await.expect("the delete commits");
            }
        }
    }
    recorder
        .writes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

async fn read_version<R: ReadStore>(reader: &R, group: &str) -> Option<(String, u64)> {
    let bytes = reader.read(group).await.expect("read succeeds")?;
    let s = decode(&bytes).expect("the store returns what was written, byte for byte");
    Some((s.coordinator, s.version))
}

/// Runs the publication suite against a store. `group_prefix` keeps runs
/// apart on shared servers.
///
/// # Panics
/// On the first broken rule, naming it.
pub async fn run_publication<P: Publisher, R: ReadStore>(
    publisher: &P,
    reader: &R,
    group_prefix: &str,
    versioned: bool,
) {
    let g = format!("{group_prefix}g");
    let other = format!("{group_prefix}other");
    assert_eq!(
        reader.read(&g).await.expect("read"),
        None,
        "nothing published yet"
    );

    let c1 = coordinator_snapshots("c1", &g, &[Some(2), Some(3), None, Some(1)]).await;
    let [(v1, e1), (v2, e2), (v4, e4)] = <[_; 3]>::try_from(c1).expect("three writes");
    assert_eq!((v1.version, v2.version, v4.version), (1, 2, 4));
    publisher.write(&v1, &e1).await.expect("write v1");
    assert_eq!(
        reader.read(&g).await.expect("read").as_deref(),
        Some(e1.as_bytes()),
        "the encoded snapshot is stored as is"
    );
    publisher.write(&v1, &e1).await.expect("idempotent write");
    publisher.write(&v2, &e2).await.expect("write v2");
    assert_eq!(read_version(reader, &g).await, Some(("c1".into(), 2)));
    assert_eq!(
        reader.read(&other).await.expect("read"),
        None,
        "groups are separate"
    );

    // An older write landing late.
    publisher.write(&v1, &e1).await.expect("late write");
    let after_late = read_version(reader, &g).await;
    if versioned {
        assert_eq!(
            after_late,
            Some(("c1".into(), 2)),
            "a version-aware store never lets an older write overwrite a newer snapshot"
        );
    } else {
        assert_eq!(
            after_late,
            Some(("c1".into(), 1)),
            "a plain key-value store is last-write-wins (the landing-window bound)"
        );
        publisher.write(&v2, &e2).await.expect("rewrite v2");
    }

    let deletion = SnapshotDeletion {
        group: &g,
        version: 3,
        coordinator: "c1",
    };
    publisher.delete(deletion).await.expect("delete");
    assert_eq!(reader.read(&g).await.expect("read"), None, "deleted");
    publisher.delete(deletion).await.expect("idempotent delete");
    if versioned {
        publisher.write(&v2, &e2).await.expect("late write");
        assert_eq!(
            reader.read(&g).await.expect("read"),
            None,
            "a late older write cannot resurrect a deleted group"
        );
    }
    publisher.write(&v4, &e4).await.expect("recreate");
    assert_eq!(read_version(reader, &g).await, Some(("c1".into(), 4)));

    // Another coordinator's versions start over and are accepted.
    let c2 = coordinator_snapshots("c2", &g, &[Some(1)]).await;
    let [(moved, moved_encoded)] = <[_; 1]>::try_from(c2).expect("one write");
    publisher
        .write(&moved, &moved_encoded)
        .await
        .expect("other coordinator");
    assert_eq!(
        read_version(reader, &g).await,
        Some(("c2".into(), 1)),
        "a different coordinator's snapshot is accepted"
    );
}

fn tx<S: Storage, R>(s: &S, f: impl FnOnce(&mut S::Tx<'_>) -> Result<R, StorageError>) -> R {
    s.transaction(f).expect("transaction")
}

/// Runs every [`TopologyTx`] check on fresh storages from `make` (the
/// outbox and topology schemas must be registered).
///
/// # Panics
/// On the first broken rule, naming it.
pub fn run_tx<S>(make: impl Fn() -> S)
where
    S: Storage,
    for<'t> S::Tx<'t>: TopologyTx,
{
    for name in TX_CASES {
        run_tx_case(name, &make);
    }
}

/// The names of the [`TopologyTx`] suite's cases, in order (each runs on a
/// fresh storage).
pub const TX_CASES: &[&str] = crate::topology_tx_conformance!(@cases names);

/// Runs the [`TopologyTx`] case `name` on a fresh storage from `make`, with
/// the outbox and topology schemas applied.
///
/// # Panics
/// When the case fails (naming the broken rule), or when `name` is not in
/// [`TX_CASES`].
pub fn run_tx_case<S>(name: &str, make: impl Fn() -> S)
where
    S: Storage,
    for<'t> S::Tx<'t>: TopologyTx,
{
    let s = make();
    migrate(&s, durability_outbox::SCHEMA, &SchemaTarget::Latest).expect("outbox schema");
    migrate(&s, SCHEMA, &SchemaTarget::Latest).expect("topology schema");
    match name {
        "groups_roundtrip" => groups_roundtrip(&s),
        "states_roundtrip" => states_roundtrip(&s),
        "write_records" => write_records(&s),
        "rollback_leaves_nothing" => rollback_leaves_nothing(&s),
        "schema_reverts" => schema_reverts(&s),
        other => panic!("no topology conformance case {other:?}"),
    }
}

fn groups_roundtrip<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    assert_eq!(tx(s, |t| t.topology_group("g")), None);
    let row = GroupRow {
        version: 3,
        members: "[]".into(),
        deleted: false,
    };
    tx(s, |t| t.topology_put_group("g", &row, 1));
    assert_eq!(tx(s, |t| t.topology_group("g")), Some(row));
    let deleted = GroupRow {
        version: 4,
        members: "[]".into(),
        deleted: true,
    };
    tx(s, |t| t.topology_put_group("g", &deleted, 2));
    assert_eq!(
        tx(s, |t| t.topology_group("g")),
        Some(deleted),
        "put replaces"
    );
    assert_eq!(
        tx(s, |t| t.topology_group("h")),
        None,
        "groups are separate"
    );
}

fn states_roundtrip<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    tx(s, |t| {
        t.topology_put_state("g", "b", "2")?;
        t.topology_put_state("g", "a", "1")?;
        t.topology_put_state("g", "a", "3")?;
        t.topology_put_state("h", "a", "9")
    });
    let mut got = tx(s, |t| t.topology_states("g"));
    got.sort();
    assert_eq!(
        got,
        vec![("a".into(), "3".into()), ("b".into(), "2".into())]
    );
    tx(s, |t| t.topology_delete_states("g"));
    assert!(
        tx(s, |t| t.topology_states("g")).is_empty(),
        "states dropped"
    );
    assert_eq!(
        tx(s, |t| t.topology_states("h")).len(),
        1,
        "other groups kept"
    );
}

fn write_records<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    let a = tx(s, |t| t.topology_record_write("g", 100));
    let b = tx(s, |t| t.topology_record_write("g", 200));
    let c = tx(s, |t| t.topology_record_write("h", 300));
    assert!(a != b && b != c && a != c, "write ids are unique");
    assert_eq!(tx(s, |t| t.topology_outstanding_until("g", 0)), Some(200));
    tx(s, |t| t.topology_forget_write(b));
    assert_eq!(tx(s, |t| t.topology_outstanding_until("g", 0)), Some(100));
    assert_eq!(
        tx(s, |t| t.topology_outstanding_until("g", 100)),
        None,
        "records at or past their deadline are dropped"
    );
    assert_eq!(tx(s, |t| t.topology_outstanding_until("h", 0)), Some(300));
    tx(s, |t| t.topology_forget_write(b));
    let d = tx(s, |t| t.topology_record_write("g", 1));
    assert!(d > c, "ids are never reused");
}

fn rollback_leaves_nothing<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    let r: Result<(), StorageError> = s.transaction(|t| {
        t.topology_put_group(
            "g",
            &GroupRow {
                version: 1,
                members: "[]".into(),
                deleted: false,
            },
            1,
        )?;
        t.topology_put_state("g", "a", "1")?;
        t.topology_record_write("g", 5)?;
        Err(StorageError::corrupt("roll back"))
    });
    assert!(r.is_err());
    assert_eq!(tx(s, |t| t.topology_group("g")), None);
    assert!(tx(s, |t| t.topology_states("g")).is_empty());
    assert_eq!(tx(s, |t| t.topology_outstanding_until("g", 0)), None);
}

fn schema_reverts<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    tx(s, |t| t.topology_put_state("g", "a", "1"));
    migrate(s, SCHEMA, &SchemaTarget::Nothing).expect("revert topology schema");
    migrate(s, SCHEMA, &SchemaTarget::Latest).expect("reapply");
    tx(s, |t| t.topology_put_state("g", "a", "2"));
    assert_eq!(tx(s, |t| t.topology_states("g")).len(), 1);
}

/// Emits one `#[test]` per case of the [`TopologyTx`](crate::TopologyTx)
/// conformance suite ([`conformance::TX_CASES`](crate::conformance::TX_CASES)),
/// in a module named `$module`, each running the case on fresh storages from
/// the factory `$make` (an expression evaluated in each test, inside the new
/// module, which sees the caller's items through `use super::*`).
///
/// ```text
/// durability_topology::topology_tx_conformance!(tx_on_memory, durability_topology::conformance::memory_storage);
/// ```
#[macro_export]
macro_rules! topology_tx_conformance {
    ($($args:tt)*) => {
        $crate::conformance::storage_suite! { $crate::conformance::run_tx_case, [
            groups_roundtrip
            states_roundtrip
            write_records
            rollback_leaves_nothing
            schema_reverts
        ], $($args)* }
    };
}
