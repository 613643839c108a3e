//! What the outbox keeps in the object's storage: the [`OutboxTx`] trait a
//! backend implements on its transaction type, and the stored row.

use durability_scheduler::{SchedulerTx, StorageError};

/// One pending entry as stored: the newest value of a key in a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntry {
    /// The channel name.
    pub channel: String,
    /// The key within the channel.
    pub key: String,
    /// The encoded value (a format byte, then postcard).
    pub value: Vec<u8>,
    /// The object-wide version assigned when the value was staged.
    pub version: u64,
    /// Attempts started for this version.
    pub attempt: u32,
    /// When the entry is next due (Unix ms). While an attempt is claimed this
    /// is the claim's deadline, so an attempt lost to a crash is retried.
    pub due_at: i64,
    /// The deadline of the attempt in flight, if one was claimed.
    pub claimed_until: Option<i64>,
}

/// A stored row that failed strict decoding: a version or attempt out of
/// range or of the wrong type, a value that is not bytes, a key that is
/// not text. The outbox quarantines it ([`OutboxTx::outbox_quarantine`])
/// so it never blocks its channel's healthy entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptEntry {
    /// The channel name.
    pub channel: String,
    /// The key as read (lossily, for a key that is not UTF-8 text).
    pub key: String,
    /// The backend's own identity of the row (for SQLite, the stored key's
    /// type and bytes), handed back to [`OutboxTx::outbox_quarantine`].
    pub row: Vec<u8>,
    /// What is wrong with it.
    pub reason: String,
}

/// One stored row: a well-formed entry, or a corrupt one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredRow {
    /// A row that decoded strictly.
    Entry(StoredEntry),
    /// A row that did not.
    Corrupt(CorruptEntry),
}

impl StoredRow {
    /// The entry, unless the row is corrupt.
    pub fn into_entry(self) -> Option<StoredEntry> {
        match self {
            Self::Entry(e) => Some(e),
            Self::Corrupt(_) => None,
        }
    }
}

/// The cells of one stored outbox row as a backend read them, before the
/// range checks: [`RowCells::check`] decides whether they make a
/// [`StoredEntry`] or a [`CorruptEntry`], the same way on every backend.
#[derive(Debug)]
pub struct RowCells {
    /// The channel name.
    pub channel: String,
    /// The key as read (lossily, for a key that is not UTF-8 text).
    pub key: String,
    /// The backend's own identity of the row ([`CorruptEntry::row`]).
    pub row: Vec<u8>,
    /// The value, or `None` when the stored cell is not bytes.
    pub value: Option<Vec<u8>>,
    /// What the backend already found wrong with the key or value cells.
    pub problem: Option<String>,
    /// The version cell (an `Err` when it is not an integer).
    pub version: Result<i64, String>,
    /// The attempt cell.
    pub attempt: Result<i64, String>,
    /// The due time cell.
    pub due_at: Result<i64, String>,
    /// The claim deadline cell (`Ok(None)` for no claim).
    pub claimed_until: Result<Option<i64>, String>,
}

impl RowCells {
    /// The stored row these cells make: an entry when every cell is in
    /// range (version 1..=2^53-1, attempt a `u32`, times 0..=2^53-1) and no
    /// problem was found; otherwise a corrupt row with the first problem.
    #[must_use]
    pub fn check(self) -> StoredRow {
        use durability_time::MAX_SAFE_INTEGER as MAX;
        let version = self.version.and_then(|v| in_range(v, "version", 1, MAX));
        let attempt = self
            .attempt
            .and_then(|v| in_range(v, "attempt", 0, i64::from(u32::MAX)));
        let due_at = self.due_at.and_then(|v| in_range(v, "due_at", 0, MAX));
        let claimed_until = self
            .claimed_until
            .and_then(|c| c.map(|v| in_range(v, "claimed_until", 0, MAX)).transpose());
        match (
            self.problem,
            version,
            attempt,
            due_at,
            claimed_until,
            self.value,
        ) {
            (None, Ok(version), Ok(attempt), Ok(due_at), Ok(claimed_until), Some(value)) => {
                StoredRow::Entry(StoredEntry {
                    channel: self.channel,
                    key: self.key,
                    value,
                    version: version.unsigned_abs(),
                    attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
                    due_at,
                    claimed_until,
                })
            }
            (problem, version, attempt, due_at, claimed_until, _) => {
                let reason = problem
                    .or(version.err())
                    .or(attempt.err())
                    .or(due_at.err())
                    .or(claimed_until.err())
                    .unwrap_or_else(|| "row is corrupt".to_owned());
                StoredRow::Corrupt(CorruptEntry {
                    channel: self.channel,
                    key: self.key,
                    row: self.row,
                    reason,
                })
            }
        }
    }
}

fn in_range(v: i64, name: &str, min: i64, max: i64) -> Result<i64, String> {
    if (min..=max).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{name} {v} is outside {min}..={max}"))
    }
}

/// A guarded reschedule of one pending entry
/// ([`OutboxTx::outbox_reschedule_if`]): the new attempt, due time and claim,
/// applied only while the entry is still at `version` and `expected_attempt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reschedule<'a> {
    /// The channel name.
    pub channel: &'a str,
    /// The key within the channel.
    pub key: &'a str,
    /// The version the entry must still be at.
    pub version: u64,
    /// The attempt count the entry must still be at.
    pub expected_attempt: u32,
    /// The attempt count to store.
    pub attempt: u32,
    /// When the entry is next due (Unix ms).
    pub due_at: i64,
    /// The deadline of the attempt now in flight, or `None` when no attempt
    /// is claimed.
    pub claimed_until: Option<i64>,
}

/// The outbox's rows in an object's storage.
///
/// Every method runs inside the caller's transaction. The version counter is
/// object-wide and never decreases, whatever is delivered or discarded.
pub trait OutboxTx: SchedulerTx {
    /// Returns the next object-wide version and advances the counter.
    /// The version returned is at least 1.
    ///
    /// # Errors
    /// A backend failure; a corrupt counter (missing, negative, not an
    /// integer) is a [`StorageErrorKind::Corrupt`](durability_scheduler::StorageErrorKind::Corrupt)
    /// error and nothing is issued.
    fn outbox_next_version(&mut self) -> Result<u64, StorageError>;

    /// Inserts the entry, replacing any pending entry of the same channel and
    /// key.
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_upsert(&mut self, entry: &StoredEntry) -> Result<(), StorageError>;

    /// Stages the entry as [`OutboxTx::outbox_upsert`] does, and says
    /// whether its key had no row before (a new pending entry). The
    /// default reads the key's row, then upserts; a backend may answer in
    /// fewer statements (SQLite: an insert that ignores an existing key,
    /// and an update only when it did).
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_stage(&mut self, entry: &StoredEntry) -> Result<bool, StorageError> {
        let new = self.outbox_get(&entry.channel, &entry.key)?.is_none();
        self.outbox_upsert(entry)?;
        Ok(new)
    }

    /// The pending entry of a key, if any; a row that fails strict decoding
    /// is returned as [`StoredRow::Corrupt`], never misread.
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_get(&mut self, channel: &str, key: &str) -> Result<Option<StoredRow>, StorageError>;

    /// Removes a key's pending entry; whether one was there.
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_remove(&mut self, channel: &str, key: &str) -> Result<bool, StorageError>;

    /// Removes a key's entry only if it is still at `version` and `attempt`.
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_remove_if(
        &mut self,
        channel: &str,
        key: &str,
        version: u64,
        attempt: u32,
    ) -> Result<bool, StorageError>;

    /// Sets attempt, due time and claim of a key's entry only if it is still
    /// at `change.version` and `change.expected_attempt`; whether it was.
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_reschedule_if(&mut self, change: Reschedule<'_>) -> Result<bool, StorageError>;

    /// Up to `limit` rows of a channel due at or before `now`, earliest
    /// due first (then lowest version). Each row is decoded on its own: a
    /// corrupt row is a [`StoredRow::Corrupt`] among the healthy ones. A
    /// backend may add rows whose stored due time is not a valid time
    /// (they are corrupt, and must not stay unseen), up to `limit` more.
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_due(
        &mut self,
        channel: &str,
        now: i64,
        limit: usize,
    ) -> Result<Vec<StoredRow>, StorageError>;

    /// Moves a corrupt row out of the channel into the quarantine, as
    /// stored, with `reason` and the time `at`; whether it was there.
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_quarantine(&mut self, row: &CorruptEntry, at: i64) -> Result<bool, StorageError>;

    /// How many rows of a channel are in quarantine.
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_quarantined_len(&mut self, channel: &str) -> Result<u64, StorageError>;

    /// Deletes a channel's quarantined rows; how many there were.
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_purge_quarantined(&mut self, channel: &str) -> Result<u64, StorageError>;

    /// The earliest due time in a channel.
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_next_due(&mut self, channel: &str) -> Result<Option<i64>, StorageError>;

    /// How many entries a channel has pending.
    ///
    /// # Errors
    /// A backend failure.
    fn outbox_len(&mut self, channel: &str) -> Result<u64, StorageError>;
}

#[cfg(test)]
mod tests {
    use super::{RowCells, StoredEntry, StoredRow};

    fn cells() -> RowCells {
        RowCells {
            channel: "c".to_owned(),
            key: "k".to_owned(),
            row: b"tk".to_vec(),
            value: Some(vec![1, 2]),
            problem: None,
            version: Ok(7),
            attempt: Ok(2),
            due_at: Ok(1_000),
            claimed_until: Ok(Some(2_000)),
        }
    }

    fn reason(row: StoredRow) -> String {
        match row {
            StoredRow::Corrupt(c) => {
                assert_eq!((c.channel.as_str(), c.key.as_str()), ("c", "k"));
                assert_eq!(c.row, b"tk", "the backend's row identity is kept");
                c.reason
            }
            StoredRow::Entry(e) => panic!("expected a corrupt row, got {e:?}"),
        }
    }

    #[test]
    fn cells_in_range_make_an_entry() {
        assert_eq!(
            cells().check(),
            StoredRow::Entry(StoredEntry {
                channel: "c".to_owned(),
                key: "k".to_owned(),
                value: vec![1, 2],
                version: 7,
                attempt: 2,
                due_at: 1_000,
                claimed_until: Some(2_000),
            })
        );
    }

    #[test]
    fn a_cell_out_of_range_or_a_problem_makes_a_corrupt_row() {
        let max = (1_i64 << 53) - 1;
        let c = RowCells {
            version: Ok(0),
            ..cells()
        };
        assert_eq!(reason(c.check()), format!("version 0 is outside 1..={max}"));
        let c = RowCells {
            attempt: Ok(i64::from(u32::MAX) + 1),
            ..cells()
        };
        assert_eq!(
            reason(c.check()),
            format!(
                "attempt {} is outside 0..={}",
                i64::from(u32::MAX) + 1,
                u32::MAX
            )
        );
        let c = RowCells {
            due_at: Ok(-1),
            ..cells()
        };
        assert_eq!(reason(c.check()), format!("due_at -1 is outside 0..={max}"));
        let c = RowCells {
            claimed_until: Ok(Some(max + 1)),
            ..cells()
        };
        assert_eq!(
            reason(c.check()),
            format!("claimed_until {} is outside 0..={max}", max + 1)
        );
        let c = RowCells {
            version: Err("version is text, not an integer".to_owned()),
            ..cells()
        };
        assert_eq!(reason(c.check()), "version is text, not an integer");
        // The backend's own problem comes first, then the cells in order.
        let c = RowCells {
            problem: Some("key is not UTF-8".to_owned()),
            version: Ok(0),
            ..cells()
        };
        assert_eq!(reason(c.check()), "key is not UTF-8");
        let c = RowCells {
            version: Ok(0),
            due_at: Ok(-1),
            ..cells()
        };
        assert_eq!(reason(c.check()), format!("version 0 is outside 1..={max}"));
        let c = RowCells {
            value: None,
            ..cells()
        };
        assert_eq!(reason(c.check()), "row is corrupt");
    }
}
