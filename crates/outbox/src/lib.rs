//! A transactional outbox for object-local state.
//!
//! Values are staged inside the caller's storage transaction and delivered
//! to a [`Sink`] at least once, after the commit, by the object's alarm.
//!
//! - Channels are named ([`ChannelConfig`]); entries are keyed within a
//!   channel, and only the newest value of a key is pending.
//! - [`Outbox::stage`] assigns a version that only ever increases for the
//!   object (it survives delivery and restarts), resets the attempt count,
//!   makes the entry due now and moves the alarm, all in the caller's
//!   transaction. [`Outbox::discard`] removes a pending entry.
//! - Publish calls of one channel run one at a time; channels run
//!   concurrently. Each attempt is claimed durably (with a deadline) before
//!   the call, so an attempt lost to a crash is retried after its deadline.
//! - Settlement is guarded by version and attempt: acknowledging an old
//!   version never removes a newer one staged while it was in flight.
//! - Retries use jittered exponential backoff capped at 5 minutes, or a
//!   custom delay; an optional maximum sends entries to a dead-letter sink.
//! - Sinks receive versions and **must ignore versions older than the newest
//!   they applied**: a timed-out attempt can land after a newer one.
//!
//! The storage backend implements [`OutboxTx`] on its transaction type.
//!
//! # Features
//!
//! - `conformance`: the `conformance` module, the suite every [`OutboxTx`] backend runs,
//!   and the in-memory implementation on the scheduler's testkit storage.

mod channel;
mod codec;
mod error;
mod event;
mod policy;
mod report;
mod store;

#[cfg(any(test, feature = "conformance"))]
mod memory;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use channel::{
    ChannelConfig, DeadLetter, DeadLetterFn, DeadReason, Entry, MAX_CHANNEL_BYTES, MAX_KEY_BYTES,
    MAX_VALUE_BYTES, Outbox, SCHEMA, Sink,
};
pub use codec::{Codec, CodecError, JSON_FORMAT, Json, POSTCARD_FORMAT, Postcard};
pub use error::{OutboxError, SinkError};
pub use event::{EventHook, EventKind, OutboxEvent};
pub use policy::{
    BASE_DELAY_MS, DEFAULT_ATTEMPT_TIMEOUT_MS, DEFAULT_BACKOFF, DEFAULT_BATCH_SIZE, DelayFn,
    MAX_ATTEMPT_TIMEOUT_MS, MAX_BATCH_SIZE, MAX_DELAY_MS, RetryPolicy, default_delay_ms,
};
pub use report::{DeliveryReport, Fate, PublishOutcome, Quarantined, Undelivered};
pub use store::{CorruptEntry, OutboxTx, Reschedule, StoredEntry, StoredRow};
