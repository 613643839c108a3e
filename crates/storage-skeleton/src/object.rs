//! The object's transactional storage: [`SkeletonStorage`] (`Storage`) and
//! its one transaction type [`SkeletonTx`] (`SchedulerTx`; the outbox,
//! topology and alarms modules implement their transaction traits on it
//! too, so one commit covers every capability).

use durability_scheduler::{Direction, SchedulerTx, SchemaStep, Storage, StorageError};

use crate::Unsupported;

/// The stub storage error: a backend failure whose source is
/// [`Unsupported`].
pub(crate) fn unsupported(operation: &'static str) -> StorageError {
    StorageError::backend("skeleton backend unavailable", Unsupported::new(operation))
}

/// An object's transactional storage (stub).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SkeletonStorage {}

impl SkeletonStorage {
    /// The stub storage. A real backend opens its database here.
    pub fn new() -> Self {
        Self {}
    }
}

/// The one transaction type (stub): every capability's transaction trait is
/// implemented on it.
#[derive(Debug)]
pub struct SkeletonTx {
    _open: (),
}

impl SkeletonTx {
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        Self { _open: () }
    }
}

impl SchedulerTx for SkeletonTx {
    fn capability_due(&mut self, _capability: &str) -> Result<Option<i64>, StorageError> {
        // Read the capability's stored earliest due time (Unix ms), `None` when unset.
        Err(unsupported("capability_due"))
    }

    fn set_capability_due(
        &mut self,
        _capability: &str,
        _due: Option<i64>,
    ) -> Result<(), StorageError> {
        // Upsert the capability's due time, or delete its row for `None`, in this transaction.
        Err(unsupported("set_capability_due"))
    }

    fn earliest_capability_due(&mut self) -> Result<Option<i64>, StorageError> {
        // The minimum due time over every capability's row (an index on the due time helps).
        Err(unsupported("earliest_capability_due"))
    }

    fn alarm(&mut self) -> Result<Option<i64>, StorageError> {
        // Read the object's one stored alarm.
        Err(unsupported("alarm"))
    }

    fn set_alarm(&mut self, _at: Option<i64>) -> Result<(), StorageError> {
        // Write (or clear) the one alarm in this transaction; the scheduler is its only writer.
        Err(unsupported("set_alarm"))
    }

    fn schema_version(&mut self, _capability: &str) -> Result<Option<u32>, StorageError> {
        // Read the schema version applied for the capability, `None` before its first step.
        Err(unsupported("schema_version"))
    }

    fn set_schema_version(
        &mut self,
        _capability: &str,
        _version: Option<u32>,
    ) -> Result<(), StorageError> {
        // Record (or clear) the capability's applied schema version in this transaction.
        Err(unsupported("set_schema_version"))
    }
}

impl Storage for SkeletonStorage {
    type Tx<'t> = SkeletonTx;

    fn transaction<R, E>(&self, _f: impl FnOnce(&mut Self::Tx<'_>) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StorageError>,
    {
        // Begin, run `f`, commit on `Ok` and roll back on `Err`; nothing may interleave with `f`.
        Err(E::from(unsupported("transaction")))
    }

    fn schema(&self, _capability: &str) -> &'static [SchemaStep] {
        // The capability's schema steps in order (versions 1, 2, ...); none here, nothing to migrate.
        &[]
    }

    fn apply_schema_step(
        &self,
        _tx: &mut Self::Tx<'_>,
        _capability: &str,
        _version: u32,
        _direction: Direction,
    ) -> Result<(), StorageError> {
        // Create (Up) or drop (Down) the step's tables inside the migration transaction.
        Err(unsupported("apply_schema_step"))
    }
}
