//! What the coordinator keeps in the object's storage ([`TopologyTx`]) and
//! where it publishes ([`Publisher`]).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use durability_outbox::OutboxTx;
use durability_scheduler::StorageError;
use durability_topology_client::{BoxError, Snapshot};

use crate::encode::EncodedSnapshot;

/// A group's stored row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRow {
    /// The membership version; keeps counting across deletes.
    pub version: u64,
    /// The members as JSON (an array of wire members, sorted by ID).
    pub members: String,
    /// Whether the group was deleted (members are then `[]`).
    pub deleted: bool,
}

/// The coordinator's rows (tables `durability_topology_groups`,
/// `durability_topology_states`, `durability_topology_writes` on SQL).
///
/// Every method runs inside the caller's transaction.
pub trait TopologyTx: OutboxTx {
    /// The group's row, deleted or not.
    ///
    /// # Errors
    /// A backend failure.
    fn topology_group(&mut self, group: &str) -> Result<Option<GroupRow>, StorageError>;

    /// Inserts or replaces the group's row.
    ///
    /// # Errors
    /// A backend failure.
    fn topology_put_group(
        &mut self,
        group: &str,
        row: &GroupRow,
        updated_at: i64,
    ) -> Result<(), StorageError>;

    /// The group's state values, `(channel, JSON)`, by channel.
    ///
    /// # Errors
    /// A backend failure.
    fn topology_states(&mut self, group: &str) -> Result<Vec<(String, String)>, StorageError>;

    /// Inserts or replaces one state value.
    ///
    /// # Errors
    /// A backend failure.
    fn topology_put_state(
        &mut self,
        group: &str,
        channel: &str,
        value: &str,
    ) -> Result<(), StorageError>;

    /// Drops every state value of the group.
    ///
    /// # Errors
    /// A backend failure.
    fn topology_delete_states(&mut self, group: &str) -> Result<(), StorageError>;

    /// Records a publisher write about to start; returns its ID, unique for
    /// the object forever.
    ///
    /// # Errors
    /// A backend failure.
    fn topology_record_write(&mut self, group: &str, land_by: i64) -> Result<u64, StorageError>;

    /// Forgets a settled write.
    ///
    /// # Errors
    /// A backend failure.
    fn topology_forget_write(&mut self, id: u64) -> Result<(), StorageError>;

    /// Drops the group's records whose landing deadline is at or before
    /// `now`, and returns the latest deadline of those left.
    ///
    /// # Errors
    /// A backend failure.
    fn topology_outstanding_until(
        &mut self,
        group: &str,
        now: i64,
    ) -> Result<Option<i64>, StorageError>;
}

/// What a failed publisher call says about the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishOutcome {
    /// The store definitely did not apply the call (a refusal it answered,
    /// a local transaction that rolled back): it can never land later.
    Rejected,
    /// The call may or may not have been applied, now or later (a timeout,
    /// a dropped connection, an unreadable reply): the coordinator keeps its
    /// write record until the landing deadline.
    Unknown,
}

/// A failed [`Publisher`] call and whether its outcome is known.
///
/// Any error converts into one with `?` as an unknown outcome, the safe
/// default; a publisher that knows the store refused the call says so with
/// [`PublishError::rejected`].
pub struct PublishError {
    outcome: PublishOutcome,
    source: BoxError,
}

impl PublishError {
    /// The store definitely did not apply the call.
    pub fn rejected(source: impl Into<BoxError>) -> Self {
        Self {
            outcome: PublishOutcome::Rejected,
            source: source.into(),
        }
    }

    /// The call may or may not have been applied.
    pub fn unknown(source: impl Into<BoxError>) -> Self {
        Self {
            outcome: PublishOutcome::Unknown,
            source: source.into(),
        }
    }

    /// Whether the call was rejected or its outcome is unknown.
    pub fn outcome(&self) -> PublishOutcome {
        self.outcome
    }

    /// Whether the store definitely did not apply the call.
    pub fn is_rejected(&self) -> bool {
        self.outcome == PublishOutcome::Rejected
    }

    /// The underlying error.
    pub fn source(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }

    /// The underlying error, owned.
    pub fn into_source(self) -> BoxError {
        self.source
    }
}

impl<E: Into<BoxError>> From<E> for PublishError {
    fn from(error: E) -> Self {
        Self::unknown(error)
    }
}

impl fmt::Debug for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishError")
            .field("outcome", &self.outcome)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.outcome {
            PublishOutcome::Rejected => write!(f, "rejected: {}", self.source),
            PublishOutcome::Unknown => write!(f, "outcome unknown: {}", self.source),
        }
    }
}

/// What [`Publisher::delete`] removes: named fields, so the group and the
/// coordinator (both strings) cannot be swapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotDeletion<'a> {
    /// The group whose snapshot is removed.
    pub group: &'a str,
    /// The deletion's version (newer than any snapshot of the group from
    /// `coordinator`).
    pub version: u64,
    /// The coordinator deleting the group.
    pub coordinator: &'a str,
}

/// Where the coordinator publishes snapshots. Calls must be idempotent.
///
/// A failed call returns a [`PublishError`] saying whether the store
/// definitely refused it or its outcome is unknown; only a rejection lets
/// the coordinator forget the write. A publisher must not time out on its
/// own before the coordinator's attempt timeout (the coordinator bounds
/// every call).
///
/// A plain key-value store is enough for the publication guarantees within the
/// landing window; a store that keeps only the highest version per group
/// and coordinator removes that bound.
///
/// # Cancellation
///
/// The futures must be cancel-safe: a write that outlives its attempt
/// timeout keeps running only while the object lives (it is then settled
/// late), and the outbox drops the whole publication batch (every write in
/// it) at its own deadline, twice the attempt timeout, as eviction does. A
/// dropped call counts as an unknown outcome: its durable write record
/// holds newer writes back until its landing deadline, so a dropped
/// future may have sent its request, but must not leave the store in a
/// state a completed or refused call could not.
pub trait Publisher: Send + Sync + 'static {
    /// Stores `encoded` as is under `snapshot.group`: it is what the client
    /// reads.
    fn write<'a>(
        &'a self,
        snapshot: &'a Snapshot,
        encoded: &'a EncodedSnapshot,
    ) -> impl Future<Output = Result<(), PublishError>> + Send + 'a;

    /// Removes the group's snapshot, as of `deletion.version`.
    fn delete<'a>(
        &'a self,
        deletion: SnapshotDeletion<'a>,
    ) -> impl Future<Output = Result<(), PublishError>> + Send + 'a;
}

impl<P: Publisher> Publisher for Arc<P> {
    fn write<'a>(
        &'a self,
        snapshot: &'a Snapshot,
        encoded: &'a EncodedSnapshot,
    ) -> impl Future<Output = Result<(), PublishError>> + Send + 'a {
        P::write(self, snapshot, encoded)
    }

    fn delete<'a>(
        &'a self,
        deletion: SnapshotDeletion<'a>,
    ) -> impl Future<Output = Result<(), PublishError>> + Send + 'a {
        P::delete(self, deletion)
    }
}
