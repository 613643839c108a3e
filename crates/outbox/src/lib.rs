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
//!   custom delay; an optional maximum sends entries to a dead-letter sink
//!   (or drops them, with an event).
//! - Sinks receive versions and **must ignore versions older than the newest
//!   they applied**: a timed-out attempt can land after a newer one.
//!
//! # Codecs
//!
//! A channel stores its values with a [`Codec`]: [`Postcard`] by default,
//! [`Json`] ([`ChannelConfig::codec`]) for types postcard cannot decode
//! (`#[serde(tag = ...)]`, `#[serde(untagged)]`, `#[serde(flatten)]`,
//! `serde_json::Value`), or any implementation of the trait. Each stored
//! value is the codec's format byte, then its payload. [`Outbox::stage`]
//! encodes the value, decodes it again and checks it reads back
//! ([`Codec::check_round_trip`]) before anything is written; a value that
//! does not is [`OutboxError::ValueDoesNotRoundTrip`], naming the codec and
//! the cause. A stored value that cannot be decoded at delivery (written by
//! another codec, or changed in storage) is never published and never
//! retried: it goes to the dead-letter sink ([`DeadReason::Undecodable`],
//! with the stored bytes) or, without one, is dropped with a
//! [`EventKind::Dropped`] event. [`Outbox::deliver_due`] and
//! [`Outbox::publish_now`] list it in [`DeliveryReport::undecodable`].
//!
//! # Corrupt rows
//!
//! The backend decodes stored rows strictly: a version, attempt or time out
//! of range or of the wrong type is a [`StoredRow::Corrupt`], never a
//! misread number. The outbox moves a corrupt row to the quarantine in the
//! transaction that found it, reports [`EventKind::Quarantined`] after the
//! commit and lists it in [`DeliveryReport::quarantined`], so it never
//! blocks the channel's healthy entries and never holds the alarm in the
//! past. [`Outbox::quarantined`] counts quarantined rows and
//! [`Outbox::purge_quarantined`] deletes them. A corrupt version counter
//! makes [`Outbox::stage`] fail with the code `OUTBOX_CORRUPT`.
//!
//! The storage backend implements [`OutboxTx`] on its transaction type.
//!
//! # Example
//!
//! A channel on the in-memory storage of the `conformance` feature (a real
//! object uses a backend such as `durability-storage-sqlite`): a value staged in a transaction, then
//! delivered to the sink with its version.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use durability_outbox::{ChannelConfig, Entry, Outbox, Sink, SinkError};
//! use durability_outbox::conformance::memory_storage;
//! use durability_scheduler::{ObjectContext, ObjectId, Scheduler};
//!
//! #[derive(Clone, Default)]
//! struct Log(Arc<Mutex<Vec<(String, u64, u32)>>>);
//! impl Sink<u32> for Log {
//!     async fn publish(&self, batch: &[Entry<u32>]) -> Result<(), SinkError> {
//!         let mut log = self.0.lock().unwrap();
//!         log.extend(batch.iter().map(|e| (e.key().to_owned(), e.version(), *e.value())));
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = ObjectContext::new(ObjectId::new("shop-1")?, Arc::new(memory_storage()));
//! let scheduler = Scheduler::new(ctx)?;
//! let log = Log::default();
//! let orders = Outbox::attach(&scheduler, ChannelConfig::new("orders"), log.clone())?;
//!
//! let version = scheduler.transaction(|tx| orders.stage(tx, "order-7", &1200))?;
//! assert_eq!(orders.len()?, 1); // pending until delivered
//!
//! let report = orders.deliver_due().await?;
//! assert_eq!(report.delivered, 1);
//! assert_eq!(*log.0.lock().unwrap(), [("order-7".to_owned(), version, 1200)]);
//! assert_eq!(orders.len()?, 0);
//! # Ok(())
//! # }
//! ```
//!
//! # Operator tools
//!
//! The [`admin`] module reads and repairs stored entries without a channel
//! attached: [`admin::EntryReport`] describes a stored row,
//! [`admin::retry_now`] makes an entry due now and [`admin::discard`]
//! removes one, both moving the object's alarm in the caller's transaction.
//!
//! # Features
//!
//! - `conformance`: the `conformance` module, the suite every [`OutboxTx`] backend runs,
//!   and the in-memory implementation on the scheduler's testkit storage.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

pub mod admin;
mod channel;
mod codec;
mod error;
mod event;
mod metrics;
mod policy;
mod publisher;
mod report;
pub mod rules;
mod store;

#[cfg(any(test, feature = "conformance"))]
mod memory;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use channel::{
    ChannelConfig, DeadLetter, DeadLetterFn, DeadReason, Entry, MAX_CHANNEL_BYTES, MAX_KEY_BYTES,
    MAX_VALUE_BYTES, Outbox, SCHEMA, SCHEMA_STEPS, Sink,
};
pub use codec::{Codec, CodecError, JSON_FORMAT, Json, POSTCARD_FORMAT, Postcard};
pub use error::{OutboxError, SinkError};
pub use event::{EventHook, EventKind, OutboxEvent};
pub use policy::{
    BASE_DELAY_MS, DEFAULT_ATTEMPT_TIMEOUT_MS, DEFAULT_BACKOFF, DEFAULT_BATCH_SIZE, DelayFn,
    MAX_ATTEMPT_TIMEOUT_MS, MAX_BATCH_SIZE, MAX_DELAY_MS, RetryPolicy, default_delay_ms,
};
pub use publisher::{Publisher, Settled, Settlement};
pub use report::{DeliveryReport, Fate, PublishOutcome, Quarantined, Undelivered};
pub use store::{CorruptEntry, OutboxTx, Reschedule, RowCells, StoredEntry, StoredRow};

pub mod docs;
