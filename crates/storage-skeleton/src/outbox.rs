//! The outbox's rows: `OutboxTx` on [`SkeletonTx`].

use durability_outbox::{CorruptEntry, OutboxTx, Reschedule, StoredEntry, StoredRow};
use durability_scheduler::StorageError;

use crate::SkeletonTx;
use crate::object::unsupported;

impl OutboxTx for SkeletonTx {
    fn outbox_next_version(&mut self) -> Result<u64, StorageError> {
        // Return and advance the object-wide version counter, a stored row that never decreases.
        Err(unsupported("outbox_next_version"))
    }

    fn outbox_upsert(&mut self, _entry: &StoredEntry) -> Result<(), StorageError> {
        // Insert the entry, replacing the pending entry of the same channel and key.
        Err(unsupported("outbox_upsert"))
    }

    fn outbox_get(
        &mut self,
        _channel: &str,
        _key: &str,
    ) -> Result<Option<StoredRow>, StorageError> {
        // The key's pending entry, if any, decoded strictly: a row that fails is `StoredRow::Corrupt`.
        Err(unsupported("outbox_get"))
    }

    fn outbox_remove(&mut self, _channel: &str, _key: &str) -> Result<bool, StorageError> {
        // Delete the key's pending entry; whether a row was deleted.
        Err(unsupported("outbox_remove"))
    }

    fn outbox_remove_if(
        &mut self,
        _channel: &str,
        _key: &str,
        _version: u64,
        _attempt: u32,
    ) -> Result<bool, StorageError> {
        // Delete only while version and attempt still match (one guarded statement); whether it did.
        Err(unsupported("outbox_remove_if"))
    }

    fn outbox_reschedule_if(&mut self, _change: Reschedule<'_>) -> Result<bool, StorageError> {
        // Atomic compare of version and expected attempt, then set attempt, due and claim; whether a row changed.
        Err(unsupported("outbox_reschedule_if"))
    }

    fn outbox_due(
        &mut self,
        _channel: &str,
        _now: i64,
        _limit: usize,
    ) -> Result<Vec<StoredRow>, StorageError> {
        // Up to `limit` rows due at or before `now`, earliest due first, then lowest version; each decoded on its own.
        Err(unsupported("outbox_due"))
    }

    fn outbox_quarantine(&mut self, _row: &CorruptEntry, _at: i64) -> Result<bool, StorageError> {
        // Move the corrupt row, as stored, into the quarantine with its reason; whether it was there.
        Err(unsupported("outbox_quarantine"))
    }

    fn outbox_quarantined_len(&mut self, _channel: &str) -> Result<u64, StorageError> {
        // How many of the channel's rows are in quarantine.
        Err(unsupported("outbox_quarantined_len"))
    }

    fn outbox_purge_quarantined(&mut self, _channel: &str) -> Result<u64, StorageError> {
        // Delete the channel's quarantined rows; how many.
        Err(unsupported("outbox_purge_quarantined"))
    }

    fn outbox_next_due(&mut self, _channel: &str) -> Result<Option<i64>, StorageError> {
        // The channel's earliest due time.
        Err(unsupported("outbox_next_due"))
    }

    fn outbox_len(&mut self, _channel: &str) -> Result<u64, StorageError> {
        // How many entries the channel has pending.
        Err(unsupported("outbox_len"))
    }
}
