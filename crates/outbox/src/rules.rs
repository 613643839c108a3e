//! The outbox's decisions as plain functions over what was read: no
//! storage, no I/O, no clock (times come in as arguments).
//!
//! Every backend driver (the object outbox on [`OutboxTx`](crate::OutboxTx),
//! and drivers that keep their own tables, such as the PostgreSQL outbox in
//! the caller's own transaction) reads rows, asks these functions what to
//! do, and writes the answer. So the rules live here once:
//!
//! - staging: [`check_channel`], [`check_key`] and [`encode`] refuse bad
//!   input before anything is written, [`version_issued`] checks a version a counter issued,
//!   [`staged`] is the row a stage writes (attempt 0, due now, no claim);
//! - claiming: [`claim`] counts the attempt (or marks it exhausted when the
//!   channel's maximum is reached) and [`claim_deadline`] is the time the
//!   claim lapses;
//! - settlement: [`verdict`] turns a publish result into an [`Outcome`],
//!   [`settle`] says whether a settled entry is removed or rescheduled, and
//!   both writes are guarded by the version and attempt it was claimed at
//!   (the attempt is the claim's token: a stale worker never settles a newer
//!   attempt).

use durability_scheduler::StorageError;

pub use crate::channel::{check_channel, check_key};
use crate::codec::Codec;
use durability_time::MAX_SAFE_UNSIGNED;

use crate::error::OutboxError;
use crate::event::EventKind;
use crate::report::Fate;
use crate::store::StoredEntry;

/// Checks a version a counter issued for a stage: at least 1, at most
/// 2^53-1.
///
/// # Errors
/// A corrupt-storage error for 0 (a counter never issues it);
/// [`OutboxError::VersionsExhausted`] past 2^53-1.
pub fn version_issued(version: u64) -> Result<u64, OutboxError> {
    if version == 0 {
        return Err(StorageError::corrupt("the outbox version counter issued version 0").into());
    }
    if version > MAX_SAFE_UNSIGNED {
        return Err(OutboxError::VersionsExhausted);
    }
    Ok(version)
}

/// The stored bytes of a value staged on a channel using `codec`: its
/// format byte, then its payload, checked to read back, at most
/// [`MAX_VALUE_BYTES`](crate::MAX_VALUE_BYTES).
///
/// # Errors
/// [`OutboxError::Encode`], [`OutboxError::ValueTooLarge`] or
/// [`OutboxError::ValueDoesNotRoundTrip`].
pub fn encode<T: 'static>(codec: &dyn Codec<T>, value: &T) -> Result<Vec<u8>, OutboxError> {
    crate::publisher::encode_with(codec, value)
}

/// The row a stage writes: the newest value of `key`, at `version`, with
/// its attempt count reset, due `now` and no claim.
pub fn staged(channel: &str, key: &str, value: Vec<u8>, version: u64, now: i64) -> StoredEntry {
    StoredEntry {
        channel: channel.to_owned(),
        key: key.to_owned(),
        value,
        version,
        attempt: 0,
        due_at: now,
        claimed_until: None,
    }
}

/// An entry claimed for an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The entry as read before the claim (its `attempt` is the claim's
    /// expected attempt).
    pub stored: StoredEntry,
    /// The attempt number now recorded.
    pub attempt: u32,
    /// The entry reached the channel's maximum attempts: it is dead-lettered
    /// (or dropped), not published.
    pub exhausted: bool,
}

/// Claims `stored` for one attempt: the attempt count goes up by one,
/// unless the channel's maximum is reached (then it stays and the entry is
/// exhausted).
pub fn claim(stored: StoredEntry, max_attempts: Option<u32>) -> Claimed {
    let exhausted = max_attempts.is_some_and(|max| stored.attempt >= max);
    let attempt = if exhausted {
        stored.attempt
    } else {
        stored.attempt.saturating_add(1)
    };
    Claimed {
        stored,
        attempt,
        exhausted,
    }
}

/// When a claim made at `now` lapses: the entry is due again then, so an
/// attempt lost to a crash is retried.
pub fn claim_deadline(now: i64, attempt_timeout_ms: i64) -> i64 {
    now.saturating_add(attempt_timeout_ms)
}

/// What one claimed entry's attempt came to.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// The sink acknowledged it.
    Delivered,
    /// The attempt failed (or the sink asked to retry); `delay` is the
    /// delay the sink asked for, if any.
    Retry {
        /// Why.
        error: String,
        /// The requested delay in ms.
        delay: Option<f64>,
    },
    /// Handed to the dead-letter sink.
    DeadLettered {
        /// The last failure.
        error: String,
    },
    /// Dropped (no dead-letter sink).
    Dropped {
        /// The last failure.
        error: String,
    },
    /// The dead-letter sink failed: keep the entry and try again later.
    DeadLetterFailed {
        /// Why.
        error: String,
    },
}

/// The outcome of a published entry: the sink's result for the batch and
/// the entry's own retry request (whether its sink called
/// [`Entry::retry`](crate::Entry::retry) or [`Entry::retry_after`](crate::Entry::retry_after)).
/// A retry at or past the channel's maximum attempts gives up
/// ([`verdict_gives_up`]).
pub fn verdict(result: &Result<(), String>, retry_request: Option<Option<f64>>) -> Outcome {
    match (result, retry_request) {
        (Ok(()), None) => Outcome::Delivered,
        (Ok(()), Some(delay)) => Outcome::Retry {
            error: "sink asked to retry".to_owned(),
            delay,
        },
        (Err(error), request) => Outcome::Retry {
            error: error.clone(),
            delay: request.flatten(),
        },
    }
}

/// Whether a failed `attempt` was the channel's last.
pub fn verdict_gives_up(attempt: u32, max_attempts: Option<u32>) -> bool {
    max_attempts.is_some_and(|m| attempt >= m)
}

/// What settlement writes for one entry, guarded by the version and
/// attempt it was claimed at.
#[derive(Debug, Clone, PartialEq)]
pub enum Settle {
    /// Remove the entry; report `kind` (and the fate, for an entry that
    /// will not be delivered).
    Remove {
        /// The event to report.
        kind: EventKind,
        /// Where an undelivered entry went; `None` when delivered.
        fate: Option<Fate>,
    },
    /// Keep the entry, due again after a retry delay, unclaimed.
    Reschedule {
        /// The failure.
        error: String,
        /// The delay the sink asked for, if any.
        requested: Option<f64>,
        /// [`Fate::Kept`] when dead-lettering failed; `None` for a retry.
        fate: Option<Fate>,
    },
}

/// What to write for an outcome.
pub fn settle(outcome: Outcome) -> Settle {
    match outcome {
        Outcome::Delivered => Settle::Remove {
            kind: EventKind::Delivered,
            fate: None,
        },
        Outcome::DeadLettered { error } => Settle::Remove {
            kind: EventKind::DeadLettered { error },
            fate: Some(Fate::DeadLettered),
        },
        Outcome::Dropped { error } => Settle::Remove {
            kind: EventKind::Dropped { error },
            fate: Some(Fate::Dropped),
        },
        Outcome::Retry { error, delay } => Settle::Reschedule {
            error,
            requested: delay,
            fate: None,
        },
        Outcome::DeadLetterFailed { error } => Settle::Reschedule {
            error,
            requested: None,
            fate: Some(Fate::Kept),
        },
    }
}

#[cfg(test)]
mod tests;
