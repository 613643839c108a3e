//! Test support: an in-memory [`Storage`], a crash-injecting wrapper, and the
//! conformance suite every backend's [`SchedulerTx`] runs.
//!
//! Enabled by the `conformance` feature; the suite is also reachable as
//! `durability_scheduler::conformance`.

use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::storage::{Direction, SchedulerTx, SchemaStep, Storage, StorageError, StorageErrorKind};

trait Ext: Any + Send {
    fn clone_box(&self) -> Box<dyn Ext>;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any + Send + Clone> Ext for T {
    fn clone_box(&self) -> Box<dyn Ext> {
        Box::new(self.clone())
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Everything a [`MemoryStorage`] holds.
#[derive(Default)]
pub struct MemoryState {
    dues: BTreeMap<String, i64>,
    alarm: Option<i64>,
    schema: BTreeMap<String, u32>,
    applied: Vec<(String, u32, Direction)>,
    ext: BTreeMap<TypeId, Box<dyn Ext>>,
}

durability_time::debug_fields!(MemoryState { alarm });

impl Clone for MemoryState {
    fn clone(&self) -> Self {
        Self {
            dues: self.dues.clone(),
            alarm: self.alarm,
            schema: self.schema.clone(),
            applied: self.applied.clone(),
            ext: self.ext.iter().map(|(k, v)| (*k, v.clone_box())).collect(),
        }
    }
}

/// An in-memory object storage: transactions copy the state on begin and
/// replace it on commit, so a rolled-back closure leaves nothing behind.
///
/// Capability crates keep their rows in typed extension slots
/// ([`MemoryTx::ext`]), so each can implement its transaction trait for
/// [`MemoryTx`].
#[derive(Default)]
pub struct MemoryStorage {
    state: Mutex<MemoryState>,
    schemas: BTreeMap<String, &'static [SchemaStep]>,
}

durability_time::debug_fields!(MemoryStorage {});

impl MemoryStorage {
    /// An empty storage with no registered schemas.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers schema steps for a capability.
    #[must_use]
    pub fn with_schema(mut self, capability: &str, steps: &'static [SchemaStep]) -> Self {
        self.schemas.insert(capability.to_owned(), steps);
        self
    }

    /// The schema steps applied so far, in order.
    pub fn applied_steps(&self) -> Vec<(String, u32, Direction)> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .applied
            .clone()
    }
}

/// A transaction on a [`MemoryStorage`].
pub struct MemoryTx<'t> {
    state: &'t mut MemoryState,
}

impl std::fmt::Debug for MemoryTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTx").finish_non_exhaustive()
    }
}

impl MemoryTx<'_> {
    /// The typed extension slot `T`, created empty on first use. Capability
    /// crates keep their in-memory rows here.
    pub fn ext<T: Any + Send + Clone + Default>(&mut self) -> &mut T {
        let slot = self
            .state
            .ext
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::new(T::default()));
        match slot.as_any_mut().downcast_mut::<T>() {
            Some(value) => value,
            None => unreachable!("extension slots are keyed by their own TypeId"),
        }
    }
}

impl SchedulerTx for MemoryTx<'_> {
    fn capability_due(&mut self, capability: &str) -> Result<Option<i64>, StorageError> {
        Ok(self.state.dues.get(capability).copied())
    }

    fn set_capability_due(
        &mut self,
        capability: &str,
        due: Option<i64>,
    ) -> Result<(), StorageError> {
        match due {
            Some(due) => self.state.dues.insert(capability.to_owned(), due),
            None => self.state.dues.remove(capability),
        };
        Ok(())
    }

    fn earliest_capability_due(&mut self) -> Result<Option<i64>, StorageError> {
        Ok(self.state.dues.values().min().copied())
    }

    fn alarm(&mut self) -> Result<Option<i64>, StorageError> {
        Ok(self.state.alarm)
    }

    fn set_alarm(&mut self, at: Option<i64>) -> Result<(), StorageError> {
        self.state.alarm = at;
        Ok(())
    }

    fn schema_version(&mut self, capability: &str) -> Result<Option<u32>, StorageError> {
        Ok(self.state.schema.get(capability).copied())
    }

    fn set_schema_version(
        &mut self,
        capability: &str,
        version: Option<u32>,
    ) -> Result<(), StorageError> {
        match version {
            Some(v) => self.state.schema.insert(capability.to_owned(), v),
            None => self.state.schema.remove(capability),
        };
        Ok(())
    }
}

impl Storage for MemoryStorage {
    type Tx<'t> = MemoryTx<'t>;

    fn transaction<R, E>(&self, f: impl FnOnce(&mut MemoryTx<'_>) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StorageError>,
    {
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut draft = guard.clone();
        let value = f(&mut MemoryTx { state: &mut draft })?;
        *guard = draft;
        Ok(value)
    }

    fn schema(&self, capability: &str) -> &'static [SchemaStep] {
        self.schemas.get(capability).copied().unwrap_or(&[])
    }

    fn apply_schema_step(
        &self,
        tx: &mut MemoryTx<'_>,
        capability: &str,
        version: u32,
        direction: Direction,
    ) -> Result<(), StorageError> {
        if !self.schema(capability).iter().any(|s| s.version == version) {
            return Err(StorageError::new(
                StorageErrorKind::Backend,
                format!("no schema step {version} for {capability}"),
            ));
        }
        tx.state
            .applied
            .push((capability.to_owned(), version, direction));
        Ok(())
    }
}

/// Where an injected crash happens relative to the commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// The transaction's work is lost: it rolls back.
    BeforeCommit,
    /// The transaction commits, but the caller sees a failure.
    AfterCommit,
}

/// Wraps a storage and crashes the object at its n-th transaction.
///
/// After the crash every later transaction fails too, as a dead process's
/// would: the test drops the object and reopens it on the inner storage.
pub struct CrashStorage<S> {
    inner: Arc<S>,
    point: CrashPoint<CrashMode>,
}

impl<S> std::fmt::Debug for CrashStorage<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrashStorage").finish_non_exhaustive()
    }
}

/// What [`CrashPoint::next`] says of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashGate<M> {
    /// The process already crashed: the call fails without running.
    Dead,
    /// The call runs as usual.
    Pass,
    /// This is the call to crash at, in this mode (the process is dead after
    /// it).
    Crash(M),
}

/// Counts the calls of a crash-injecting wrapper and names the one to crash
/// at (the n-th, counted from 1, or none), after which every call fails:
/// the counting [`CrashStorage`] and the suites' crash wrappers share.
#[derive(Debug)]
pub struct CrashPoint<M> {
    crash_at: Option<u64>,
    mode: M,
    seen: AtomicU64,
    crashed: AtomicBool,
}

impl<M: Copy> CrashPoint<M> {
    /// Crashes at the `crash_at`-th call in `mode`, or never with `None` (to
    /// count the calls a run makes).
    pub fn new(crash_at: Option<u64>, mode: M) -> Self {
        Self {
            crash_at,
            mode,
            seen: AtomicU64::new(0),
            crashed: AtomicBool::new(false),
        }
    }

    /// How many calls were counted (calls after the crash are not).
    pub fn calls(&self) -> u64 {
        self.seen.load(Ordering::SeqCst)
    }

    /// Whether the crash happened.
    pub fn crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// Counts one call and says what becomes of it.
    pub fn next(&self) -> CrashGate<M> {
        if self.crashed() {
            return CrashGate::Dead;
        }
        let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        if self.crash_at != Some(n) {
            return CrashGate::Pass;
        }
        self.crashed.store(true, Ordering::SeqCst);
        CrashGate::Crash(self.mode)
    }
}

impl<S: Storage> CrashStorage<S> {
    /// Crashes at the `crash_at`-th transaction (counted from 1), or never
    /// with `None` (to count the transactions a run makes).
    pub fn new(inner: Arc<S>, crash_at: Option<u64>, mode: CrashMode) -> Self {
        Self {
            inner,
            point: CrashPoint::new(crash_at, mode),
        }
    }

    /// How many transactions were started.
    pub fn transactions(&self) -> u64 {
        self.point.calls()
    }

    /// Whether the crash happened.
    pub fn crashed(&self) -> bool {
        self.point.crashed()
    }

    /// The storage underneath, to reopen on.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }
}

fn crash() -> StorageError {
    StorageError::new(StorageErrorKind::Crash, "injected crash")
}

impl<S: Storage> Storage for CrashStorage<S> {
    type Tx<'t> = S::Tx<'t>;

    fn transaction<R, E>(&self, f: impl FnOnce(&mut S::Tx<'_>) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StorageError>,
    {
        match self.point.next() {
            CrashGate::Dead => Err(crash().into()),
            CrashGate::Pass => self.inner.transaction(f),
            CrashGate::Crash(CrashMode::BeforeCommit) => self.inner.transaction(|tx| {
                f(tx)?;
                Err(crash().into())
            }),
            CrashGate::Crash(CrashMode::AfterCommit) => {
                self.inner.transaction(f)?;
                Err(crash().into())
            }
        }
    }

    fn schema(&self, capability: &str) -> &'static [SchemaStep] {
        self.inner.schema(capability)
    }

    fn apply_schema_step(
        &self,
        tx: &mut S::Tx<'_>,
        capability: &str,
        version: u32,
        direction: Direction,
    ) -> Result<(), StorageError> {
        self.inner
            .apply_schema_step(tx, capability, version, direction)
    }
}

/// The conformance suite for [`SchedulerTx`] and schema migrations, as a list
/// of named cases ([`CASES`](conformance::CASES)). A backend's test file is one
/// [`scheduler_conformance!`](crate::scheduler_conformance) call with a
/// factory of fresh, empty storages whose `"conformance"` capability has at
/// least two schema steps; it emits one `#[test]` per case.
///
/// The test support types ([`MemoryStorage`], [`CrashStorage`], ...) are
/// re-exported here, so the feature's whole surface is under this module.
pub mod conformance {
    use super::*;
    use crate::error::SchedulerError;
    use crate::schema::{SchemaTarget, migrate};

    pub use super::{
        CrashGate, CrashMode, CrashPoint, CrashStorage, MemoryState, MemoryStorage, MemoryTx,
    };

    /// Two schema steps (`1 initial`, `2 second`) for the `"conformance"`
    /// capability the suite migrates: what a backend registers it with (and
    /// pairs with its own statements).
    pub const STEPS: &[SchemaStep] = &[SchemaStep::new(1, "initial"), SchemaStep::new(2, "second")];

    /// The names of the suite's cases, in order.
    pub const CASES: &[&str] = crate::scheduler_conformance!(@cases names);

    /// Runs the case `name` on fresh storages from `make`.
    ///
    /// # Panics
    /// When the case fails (naming the broken rule), or when `name` is not in
    /// [`CASES`].
    pub fn run_case<S: Storage>(name: &str, make: impl Fn() -> S) {
        match name {
            "alarm_roundtrip" => alarm_roundtrip(&make()),
            "dues_and_earliest" => dues_and_earliest(&make()),
            "rollback_discards" => rollback_discards(&make()),
            "schema_versions" => schema_versions(&make()),
            "migrate_up_down_and_unknown" => migrate_up_down_and_unknown(&make()),
            other => panic!("no scheduler conformance case {other:?}"),
        }
    }

    /// Runs every case in order; panics with the check's name on the first failure.
    pub fn run<S: Storage>(make: impl Fn() -> S) {
        for name in CASES {
            run_case(name, &make);
        }
    }

    fn alarm_roundtrip<S: Storage>(s: &S) {
        let got = s
            .transaction(|tx| {
                assert_eq!(tx.alarm()?, None, "alarm starts unset");
                tx.set_alarm(Some(42))?;
                tx.alarm()
            })
            .expect("alarm roundtrip");
        assert_eq!(got, Some(42));
        let got = s.transaction(|tx| tx.alarm()).expect("read alarm");
        assert_eq!(got, Some(42), "alarm survives commit");
        s.transaction(|tx| tx.set_alarm(None)).expect("clear alarm");
        assert_eq!(s.transaction(|tx| tx.alarm()).expect("read"), None);
    }

    fn dues_and_earliest<S: Storage>(s: &S) {
        s.transaction(|tx| {
            assert_eq!(tx.earliest_capability_due()?, None);
            tx.set_capability_due("a", Some(30))?;
            tx.set_capability_due("b", Some(10))?;
            tx.set_capability_due("c", Some(20))?;
            assert_eq!(tx.capability_due("b")?, Some(10));
            assert_eq!(tx.earliest_capability_due()?, Some(10));
            tx.set_capability_due("b", None)?;
            assert_eq!(tx.capability_due("b")?, None);
            assert_eq!(tx.earliest_capability_due()?, Some(20));
            tx.set_capability_due("a", Some(5))?;
            assert_eq!(tx.earliest_capability_due()?, Some(5));
            Ok::<_, StorageError>(())
        })
        .expect("dues");
    }

    fn rollback_discards<S: Storage>(s: &S) {
        let r: Result<(), StorageError> = s.transaction(|tx| {
            tx.set_alarm(Some(7))?;
            tx.set_capability_due("x", Some(7))?;
            tx.set_schema_version("x", Some(3))?;
            Err(StorageError::corrupt("roll back"))
        });
        assert!(r.is_err());
        s.transaction(|tx| {
            assert_eq!(tx.alarm()?, None, "rolled-back alarm is gone");
            assert_eq!(tx.capability_due("x")?, None, "rolled-back due is gone");
            assert_eq!(tx.schema_version("x")?, None, "rolled-back schema is gone");
            Ok::<_, StorageError>(())
        })
        .expect("read after rollback");
    }

    fn schema_versions<S: Storage>(s: &S) {
        s.transaction(|tx| {
            tx.set_schema_version("v", Some(2))?;
            assert_eq!(tx.schema_version("v")?, Some(2));
            tx.set_schema_version("v", None)?;
            assert_eq!(tx.schema_version("v")?, None);
            Ok::<_, StorageError>(())
        })
        .expect("schema versions");
    }

    fn migrate_up_down_and_unknown<S: Storage>(s: &S) {
        let steps = s.schema("conformance");
        assert!(steps.len() >= 2, "the suite needs two conformance steps");
        let latest = steps.last().map(|st| st.version);
        assert_eq!(
            migrate(s, "conformance", &SchemaTarget::Latest).expect("up"),
            latest
        );
        let first = steps[0];
        assert_eq!(
            migrate(
                s,
                "conformance",
                &SchemaTarget::Named(first.name.to_owned())
            )
            .expect("down to first"),
            Some(first.version)
        );
        let err = migrate(
            s,
            "conformance",
            &SchemaTarget::Named("no-such-version".into()),
        )
        .expect_err("unknown target");
        assert!(matches!(err, SchedulerError::UnknownSchemaTarget { .. }));
        let stored = s
            .transaction(|tx| tx.schema_version("conformance"))
            .expect("read");
        assert_eq!(
            stored,
            Some(first.version),
            "unknown target changes nothing"
        );
        assert_eq!(
            migrate(s, "conformance", &SchemaTarget::Nothing).expect("revert all"),
            None
        );
        let err = migrate(s, "no-such-capability", &SchemaTarget::Latest)
            .expect_err("unknown capability");
        assert!(matches!(err, SchedulerError::UnknownSchema { .. }));
    }
}

/// Emits one `#[test]` per case of the scheduler conformance suite
/// ([`conformance::CASES`](crate::conformance::CASES)), in a module named
/// `$module`, each running the case on fresh storages from the factory
/// `$make` (an expression evaluated in each test, inside the new module,
/// which sees the caller's items through `use super::*`).
///
/// ```text
/// durability_scheduler::scheduler_conformance!(scheduler_on_files, || open_storage());
/// ```
#[macro_export]
macro_rules! scheduler_conformance {
    ($($args:tt)*) => {
        $crate::storage_suite! { $crate::conformance::run_case, [
            alarm_roundtrip
            dues_and_earliest
            rollback_discards
            schema_versions
            migrate_up_down_and_unknown
        ], $($args)* }
    };
}

/// The one body of the storage conformance macros
/// ([`scheduler_conformance!`](crate::scheduler_conformance) and those of
/// the outbox, topology and alarms crates): given the function that runs one
/// case by name and the suite's cases, `@cases names` is the slice of the
/// case names, and `$module, $make` emits a module `$module` with one
/// `#[test]` per case that calls `$run(case, $make)` (`$make` is evaluated
/// inside the new module, which sees the caller's items through
/// `use super::*`).
#[doc(hidden)]
#[macro_export]
macro_rules! storage_suite {
    ($run:path, [$($case:ident)*], @cases names) => { &[$(stringify!($case)),*] };
    ($run:path, [$($case:ident)*], $module:ident, $make:expr $(,)?) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $case() {
                    $run(stringify!($case), $make);
                }
            )*
        }
    };
}
