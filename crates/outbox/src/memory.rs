//! [`OutboxTx`] on the scheduler's in-memory test storage.

use std::collections::BTreeMap;

use durability_scheduler::StorageError;
use durability_scheduler::testkit::MemoryTx;

use crate::store::{CorruptEntry, OutboxTx, Reschedule, StoredEntry, StoredRow};

/// The outbox rows of a `MemoryStorage`.
#[derive(Debug, Clone, Default)]
struct MemOutbox {
    next_version: u64,
    entries: BTreeMap<(String, String), StoredEntry>,
    /// Quarantined rows: channel, key, reason. Rows here are typed, so
    /// none is ever corrupt; this only serves the trait.
    quarantine: Vec<(String, String, String)>,
}

fn rows<'a>(tx: &'a mut MemoryTx<'_>) -> &'a mut MemOutbox {
    tx.ext::<MemOutbox>()
}

fn k(channel: &str, key: &str) -> (String, String) {
    (channel.to_owned(), key.to_owned())
}

impl OutboxTx for MemoryTx<'_> {
    fn outbox_next_version(&mut self) -> Result<u64, StorageError> {
        let r = rows(self);
        r.next_version += 1;
        Ok(r.next_version)
    }

    fn outbox_upsert(&mut self, entry: &StoredEntry) -> Result<(), StorageError> {
        rows(self)
            .entries
            .insert(k(&entry.channel, &entry.key), entry.clone());
        Ok(())
    }

    fn outbox_get(&mut self, channel: &str, key: &str) -> Result<Option<StoredRow>, StorageError> {
        Ok(rows(self)
            .entries
            .get(&k(channel, key))
            .cloned()
            .map(StoredRow::Entry))
    }

    fn outbox_remove(&mut self, channel: &str, key: &str) -> Result<bool, StorageError> {
        Ok(rows(self).entries.remove(&k(channel, key)).is_some())
    }

    fn outbox_remove_if(
        &mut self,
        channel: &str,
        key: &str,
        version: u64,
        attempt: u32,
    ) -> Result<bool, StorageError> {
        let r = rows(self);
        let id = k(channel, key);
        if r.entries
            .get(&id)
            .is_some_and(|e| e.version == version && e.attempt == attempt)
        {
            r.entries.remove(&id);
            return Ok(true);
        }
        Ok(false)
    }

    fn outbox_reschedule_if(&mut self, change: Reschedule<'_>) -> Result<bool, StorageError> {
        match rows(self).entries.get_mut(&k(change.channel, change.key)) {
            Some(e) if e.version == change.version && e.attempt == change.expected_attempt => {
                e.attempt = change.attempt;
                e.due_at = change.due_at;
                e.claimed_until = change.claimed_until;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn outbox_due(
        &mut self,
        channel: &str,
        now: i64,
        limit: usize,
    ) -> Result<Vec<StoredRow>, StorageError> {
        let mut due: Vec<StoredEntry> = rows(self)
            .entries
            .values()
            .filter(|e| e.channel == channel && e.due_at <= now)
            .cloned()
            .collect();
        due.sort_by_key(|e| (e.due_at, e.version));
        due.truncate(limit);
        Ok(due.into_iter().map(StoredRow::Entry).collect())
    }

    fn outbox_quarantine(&mut self, row: &CorruptEntry, _at: i64) -> Result<bool, StorageError> {
        let r = rows(self);
        if r.entries.remove(&k(&row.channel, &row.key)).is_none() {
            return Ok(false);
        }
        r.quarantine
            .push((row.channel.clone(), row.key.clone(), row.reason.clone()));
        Ok(true)
    }

    fn outbox_quarantined_len(&mut self, channel: &str) -> Result<u64, StorageError> {
        Ok(rows(self)
            .quarantine
            .iter()
            .filter(|q| q.0 == channel)
            .count() as u64)
    }

    fn outbox_purge_quarantined(&mut self, channel: &str) -> Result<u64, StorageError> {
        let r = rows(self);
        let before = r.quarantine.len();
        r.quarantine.retain(|q| q.0 != channel);
        Ok((before - r.quarantine.len()) as u64)
    }

    fn outbox_next_due(&mut self, channel: &str) -> Result<Option<i64>, StorageError> {
        Ok(rows(self)
            .entries
            .values()
            .filter(|e| e.channel == channel)
            .map(|e| e.due_at)
            .min())
    }

    fn outbox_len(&mut self, channel: &str) -> Result<u64, StorageError> {
        Ok(rows(self)
            .entries
            .values()
            .filter(|e| e.channel == channel)
            .count() as u64)
    }
}
