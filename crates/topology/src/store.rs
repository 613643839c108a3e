//! What the coordinator keeps in the object's storage ([`TopologyTx`]) and
//! where it publishes ([`Publisher`]).

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

/// Where the coordinator publishes snapshots. Calls must be idempotent.
///
/// A plain key-value store is enough for the seed's guarantees within the
/// landing window; a store that keeps only the highest version per group
/// and coordinator removes that bound.
pub trait Publisher: Send + Sync + 'static {
    /// Stores `encoded` as is under `snapshot.group`: it is what the client
    /// reads.
    fn write<'a>(
        &'a self,
        snapshot: &'a Snapshot,
        encoded: &'a EncodedSnapshot,
    ) -> impl Future<Output = Result<(), BoxError>> + Send + 'a;

    /// Removes the group's snapshot; `version` is the deletion's version
    /// (newer than any snapshot of the group from `coordinator`).
    fn delete<'a>(
        &'a self,
        group: &'a str,
        version: u64,
        coordinator: &'a str,
    ) -> impl Future<Output = Result<(), BoxError>> + Send + 'a;
}

impl<P: Publisher> Publisher for Arc<P> {
    fn write<'a>(
        &'a self,
        snapshot: &'a Snapshot,
        encoded: &'a EncodedSnapshot,
    ) -> impl Future<Output = Result<(), BoxError>> + Send + 'a {
        P::write(self, snapshot, encoded)
    }

    fn delete<'a>(
        &'a self,
        group: &'a str,
        version: u64,
        coordinator: &'a str,
    ) -> impl Future<Output = Result<(), BoxError>> + Send + 'a {
        P::delete(self, group, version, coordinator)
    }
}
