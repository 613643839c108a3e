//! The coordinator's rows (`TopologyTx` on [`SkeletonTx`]) and the
//! publication store ([`SkeletonPublication`]: `Publisher` for the
//! coordinator, `ReadStore` for the read client).

use durability_scheduler::StorageError;
use durability_topology::{
    BoxError, EncodedSnapshot, GroupRow, PublishError, Publisher, Snapshot, SnapshotDeletion,
    TopologyTx,
};
use durability_topology_client::ReadStore;

use crate::object::unsupported;
use crate::{SkeletonTx, Unsupported};

impl TopologyTx for SkeletonTx {
    fn topology_group(&mut self, _group: &str) -> Result<Option<GroupRow>, StorageError> {
        // The group's row, deleted or not.
        Err(unsupported("topology_group"))
    }

    fn topology_put_group(
        &mut self,
        _group: &str,
        _row: &GroupRow,
        _updated_at: i64,
    ) -> Result<(), StorageError> {
        // Insert or replace the group's row in this transaction.
        Err(unsupported("topology_put_group"))
    }

    fn topology_states(&mut self, _group: &str) -> Result<Vec<(String, String)>, StorageError> {
        // The group's `(channel, JSON)` state values, ordered by channel.
        Err(unsupported("topology_states"))
    }

    fn topology_put_state(
        &mut self,
        _group: &str,
        _channel: &str,
        _value: &str,
    ) -> Result<(), StorageError> {
        // Insert or replace one state value.
        Err(unsupported("topology_put_state"))
    }

    fn topology_delete_states(&mut self, _group: &str) -> Result<(), StorageError> {
        // Delete every state value of the group.
        Err(unsupported("topology_delete_states"))
    }

    fn topology_record_write(&mut self, _group: &str, _land_by: i64) -> Result<u64, StorageError> {
        // Record a write about to start; its ID must be unique for the object forever.
        Err(unsupported("topology_record_write"))
    }

    fn topology_forget_write(&mut self, _id: u64) -> Result<(), StorageError> {
        // Delete a settled write record.
        Err(unsupported("topology_forget_write"))
    }

    fn topology_outstanding_until(
        &mut self,
        _group: &str,
        _now: i64,
    ) -> Result<Option<i64>, StorageError> {
        // Drop records landed by `now`; return the latest landing deadline of those left.
        Err(unsupported("topology_outstanding_until"))
    }
}

/// The publication store (stub): where snapshots are written and read.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SkeletonPublication {}

impl SkeletonPublication {
    /// The stub store. A real backend connects here.
    pub fn new() -> Self {
        Self {}
    }
}

impl Publisher for SkeletonPublication {
    async fn write(
        &self,
        _snapshot: &Snapshot,
        _encoded: &EncodedSnapshot,
    ) -> Result<(), PublishError> {
        // Store the encoded bytes as is under the snapshot's group; idempotent.
        // Say whether a failure is a definite refusal or an unknown outcome.
        Err(PublishError::rejected(Unsupported::boxed(
            "publisher write",
        )))
    }

    async fn delete(&self, _deletion: SnapshotDeletion<'_>) -> Result<(), PublishError> {
        // Remove the group's snapshot; idempotent.
        Err(PublishError::rejected(Unsupported::boxed(
            "publisher delete",
        )))
    }
}

impl ReadStore for SkeletonPublication {
    async fn read(&self, _group: &str) -> Result<Option<Vec<u8>>, BoxError> {
        // The exact bytes the publisher stored for the group, `None` when nothing is published.
        Err(Unsupported::boxed("read"))
    }
}
