//! Operator reads and repairs of stored outbox entries, without a channel
//! attached.
//!
//! An operator tool does not know a channel's value type or sink, so these
//! work on the stored rows only: [`EntryReport`] describes one stored row
//! (from [`EntryReport::from_row`]), [`retry_now`] makes a pending entry due
//! now and [`discard`] removes one. Both run inside the caller's
//! [`Transaction`] (from [`Scheduler::transaction`](durability_scheduler::Scheduler::transaction))
//! and move the channel's due time, so the object's alarm stays the earliest
//! due time and the next driver of the object delivers the entry. A process
//! that has the object open keeps its in-memory alarm until it next reads
//! storage (its next alarm or restart).

use durability_scheduler::{Storage, Transaction};
use serde::Serialize;

use crate::OutboxError;
use crate::channel::{check_channel, check_key};
use crate::store::{OutboxTx, Reschedule, StoredRow};

/// The scheduler capability a channel's due time is stored under.
pub fn capability(channel: &str) -> String {
    format!("outbox:{channel}")
}

/// Where a stored entry stands at the report's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EntryState {
    /// Due at or before now: the next delivery run tries it.
    Due,
    /// Due later (a retry after a failed attempt waits here).
    Waiting,
    /// An attempt is claimed and its deadline has not passed.
    InFlight,
    /// The row failed strict decoding; the next delivery run quarantines it.
    Corrupt,
}

/// One stored outbox row, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EntryReport {
    /// The channel.
    pub channel: String,
    /// The key (read lossily for a corrupt row).
    pub key: String,
    /// The version staged (`None` for a corrupt row).
    pub version: Option<u64>,
    /// Attempts started for this version (`None` for a corrupt row).
    pub attempts: Option<u32>,
    /// When it is next due, Unix ms (`None` for a corrupt row).
    pub due_at: Option<i64>,
    /// The deadline of the attempt in flight, if one is claimed.
    pub claimed_until: Option<i64>,
    /// Where it stands at `now_ms`.
    pub state: EntryState,
    /// What is wrong with a corrupt row.
    pub problem: Option<String>,
}

impl EntryReport {
    /// Describes a stored row at `now_ms`.
    pub fn from_row(row: &StoredRow, now_ms: i64) -> Self {
        match row {
            StoredRow::Entry(e) => {
                let state = match e.claimed_until {
                    Some(until) if until > now_ms => EntryState::InFlight,
                    _ if e.due_at <= now_ms => EntryState::Due,
                    _ => EntryState::Waiting,
                };
                Self {
                    channel: e.channel.clone(),
                    key: e.key.clone(),
                    version: Some(e.version),
                    attempts: Some(e.attempt),
                    due_at: Some(e.due_at),
                    claimed_until: e.claimed_until,
                    state,
                    problem: None,
                }
            }
            StoredRow::Corrupt(c) => Self {
                channel: c.channel.clone(),
                key: c.key.clone(),
                version: None,
                attempts: None,
                due_at: None,
                claimed_until: None,
                state: EntryState::Corrupt,
                problem: Some(c.reason.clone()),
            },
        }
    }
}

/// A listing of stored outbox rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutboxListing {
    /// The time the states were read at, Unix ms.
    pub now_ms: i64,
    /// The rows, by channel then key.
    pub entries: Vec<EntryReport>,
    /// Rows in quarantine per channel (only channels that have some).
    pub quarantined: Vec<QuarantineCount>,
    /// Whether more rows are stored than were listed.
    pub truncated: bool,
}

/// How many rows of a channel are in quarantine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuarantineCount {
    /// The channel.
    pub channel: String,
    /// Quarantined rows.
    pub rows: u64,
}

/// What [`retry_now`] or [`discard`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AdminOutcome {
    /// The entry is due now (retry) or removed (discard); `entry` is the
    /// row as it was before.
    Done {
        /// The row before the change.
        entry: EntryReport,
    },
    /// No entry is stored for the key: nothing was written.
    NotFound,
    /// An attempt is in flight until `claimed_until`: retrying now would
    /// overlap it, so nothing was written.
    InFlight {
        /// The claim's deadline, Unix ms.
        claimed_until: i64,
    },
    /// The row is corrupt: it cannot be retried (discard removes it).
    Corrupt {
        /// What is wrong with it.
        problem: String,
    },
}

/// Makes the pending entry of `key` in `channel` due at `now_ms` (attempts
/// kept, no claim) and lowers the channel's due time, and so the object's
/// alarm, to `now_ms`, in `tx`.
///
/// # Errors
/// [`OutboxError::InvalidChannel`] or [`OutboxError::InvalidKey`] before
/// anything is read; a storage error (roll the transaction back).
pub fn retry_now<S>(
    tx: &mut Transaction<'_, '_, S>,
    channel: &str,
    key: &str,
    now_ms: i64,
) -> Result<AdminOutcome, OutboxError>
where
    S: Storage,
    for<'t> S::Tx<'t>: OutboxTx,
{
    check_channel(channel)?;
    check_key(key)?;
    let Some(row) = tx.outbox_get(channel, key)? else {
        return Ok(AdminOutcome::NotFound);
    };
    let entry = match &row {
        StoredRow::Corrupt(c) => {
            return Ok(AdminOutcome::Corrupt {
                problem: c.reason.clone(),
            });
        }
        StoredRow::Entry(e) => e,
    };
    if let Some(until) = entry.claimed_until.filter(|until| *until > now_ms) {
        return Ok(AdminOutcome::InFlight {
            claimed_until: until,
        });
    }
    let changed = tx.outbox_reschedule_if(Reschedule {
        channel,
        key,
        version: entry.version,
        expected_attempt: entry.attempt,
        attempt: entry.attempt,
        due_at: now_ms,
        claimed_until: None,
    })?;
    if !changed {
        // Read and write are in one transaction: this cannot happen unless
        // the backend is broken.
        return Err(durability_scheduler::StorageError::corrupt(
            "the outbox entry changed inside the transaction that retried it",
        )
        .into());
    }
    tx.lower_due(&capability(channel), now_ms)?;
    Ok(AdminOutcome::Done {
        entry: EntryReport::from_row(&row, now_ms),
    })
}

/// Removes the stored row of `key` in `channel` (healthy or corrupt) and
/// moves the channel's due time to its next entry, in `tx`. An attempt in
/// flight may still land at the sink.
///
/// # Errors
/// [`OutboxError::InvalidChannel`] or [`OutboxError::InvalidKey`] before
/// anything is read; a storage error (roll the transaction back).
pub fn discard<S>(
    tx: &mut Transaction<'_, '_, S>,
    channel: &str,
    key: &str,
    now_ms: i64,
) -> Result<AdminOutcome, OutboxError>
where
    S: Storage,
    for<'t> S::Tx<'t>: OutboxTx,
{
    check_channel(channel)?;
    check_key(key)?;
    let Some(row) = tx.outbox_get(channel, key)? else {
        return Ok(AdminOutcome::NotFound);
    };
    tx.outbox_remove(channel, key)?;
    let next = tx.outbox_next_due(channel)?;
    tx.set_due(&capability(channel), next)?;
    Ok(AdminOutcome::Done {
        entry: EntryReport::from_row(&row, now_ms),
    })
}

#[cfg(test)]
mod tests;
