//! The object's storage: synchronous transactions and the scheduler's rows.
//!
//! A backend implements [`Storage`] once, with one transaction type. Every
//! capability crate defines the narrow transaction trait it needs (the
//! outbox's `OutboxTx`, for example) and the backend implements it on that
//! same type, so one transaction commits the changes of every capability
//! together with the alarm they moved.

use std::error::Error as StdError;
use std::fmt;

/// A step of a capability's schema, as the backend registers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaStep {
    /// Version reached by applying this step; versions start at 1 and
    /// increase by one.
    pub version: u32,
    /// A stable name, used as a `migrate` target.
    pub name: &'static str,
}

impl SchemaStep {
    /// The step reaching `version`, named `name`.
    pub const fn new(version: u32, name: &'static str) -> Self {
        Self { version, name }
    }
}

/// Which way a schema step is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Apply the step (create or change tables).
    Up,
    /// Revert the step.
    Down,
}

/// What kind of storage failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StorageErrorKind {
    /// The backend failed (I/O, lock, constraint): the transaction rolled back.
    Backend,
    /// A stored value could not be decoded: it is corrupt or foreign.
    Corrupt,
    /// A crash was injected by a test harness.
    Crash,
    /// The commit may or may not have happened.
    Unknown,
    /// The storage refused the transaction: a newer owner generation is
    /// recorded in it, so this writer is stale. Nothing was written.
    Fenced,
}

/// A storage failure, with the backend's error as its source.
#[derive(Debug)]
pub struct StorageError {
    kind: StorageErrorKind,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl StorageError {
    /// A backend failure carrying its source error.
    pub fn backend(
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            kind: StorageErrorKind::Backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A stored value that failed validation on read.
    pub fn corrupt(message: impl Into<String>) -> Self {
        Self {
            kind: StorageErrorKind::Corrupt,
            message: message.into(),
            source: None,
        }
    }

    /// An error of the given kind with a message only.
    pub fn new(kind: StorageErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> StorageErrorKind {
        self.kind
    }
}

durability_time::error_codes! {
    StorageError {
        Self { kind: StorageErrorKind::Backend, .. } => "STORAGE_BACKEND",
        Self { kind: StorageErrorKind::Corrupt, .. } => "STORAGE_CORRUPT",
        Self { kind: StorageErrorKind::Crash, .. } => "STORAGE_CRASH",
        Self { kind: StorageErrorKind::Unknown, .. } => "STORAGE_UNKNOWN",
        Self { kind: StorageErrorKind::Fenced, .. } => "STORAGE_FENCED",
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "storage failed: {}", self.message)
    }
}

impl StdError for StorageError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// The rows the scheduler keeps in every object's storage.
pub trait SchedulerTx {
    /// The earliest due time a capability asked for, if it has one.
    ///
    /// # Errors
    /// A backend failure.
    fn capability_due(&mut self, capability: &str) -> Result<Option<i64>, StorageError>;

    /// Records (or clears, with `None`) a capability's earliest due time.
    ///
    /// # Errors
    /// A backend failure.
    fn set_capability_due(
        &mut self,
        capability: &str,
        due: Option<i64>,
    ) -> Result<(), StorageError>;

    /// The earliest due time over every capability.
    ///
    /// # Errors
    /// A backend failure.
    fn earliest_capability_due(&mut self) -> Result<Option<i64>, StorageError>;

    /// The object's one stored alarm.
    ///
    /// # Errors
    /// A backend failure.
    fn alarm(&mut self) -> Result<Option<i64>, StorageError>;

    /// Writes (or clears) the object's one stored alarm.
    ///
    /// # Errors
    /// A backend failure.
    fn set_alarm(&mut self, at: Option<i64>) -> Result<(), StorageError>;

    /// The schema version applied for a capability, if any.
    ///
    /// # Errors
    /// A backend failure.
    fn schema_version(&mut self, capability: &str) -> Result<Option<u32>, StorageError>;

    /// Records the schema version applied for a capability (`None`: nothing).
    ///
    /// # Errors
    /// A backend failure.
    fn set_schema_version(
        &mut self,
        capability: &str,
        version: Option<u32>,
    ) -> Result<(), StorageError>;
}

/// An object's transactional storage.
///
/// Transactions are synchronous closures, like a Durable Object's
/// `transactionSync`: nothing interleaves between a read and a write in the
/// same closure. A closure that returns `Err` rolls everything back.
pub trait Storage: Send + Sync + 'static {
    /// The one transaction type, implementing every capability's transaction
    /// trait the backend supports.
    type Tx<'t>: SchedulerTx;

    /// Runs `f` in one transaction: commits on `Ok`, rolls back on `Err`.
    ///
    /// # Errors
    /// `f`'s error, or a storage failure to begin or commit.
    fn transaction<R, E>(&self, f: impl FnOnce(&mut Self::Tx<'_>) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StorageError>;

    /// The schema steps the backend registers for a capability, in order.
    fn schema(&self, capability: &str) -> &'static [SchemaStep];

    /// Applies or reverts one schema step inside the migration transaction.
    ///
    /// # Errors
    /// A backend failure, or a step the backend does not know.
    fn apply_schema_step(
        &self,
        tx: &mut Self::Tx<'_>,
        capability: &str,
        version: u32,
        direction: Direction,
    ) -> Result<(), StorageError>;
}
