//! An outbox channel: staging, claiming, publishing and settling entries.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use durability_scheduler::{
    Capability, Permit, PermitError, Permits, Scheduler, Storage, StorageError, Transaction,
};
use durability_time::check_name;
use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::Codec;
use crate::error::{OutboxError, SinkError};
use crate::event::{EventHook, EventKind, emit};
use crate::metrics::Pending;
use crate::policy::{DEFAULT_ATTEMPT_TIMEOUT_MS, DEFAULT_BATCH_SIZE, RetryPolicy};
use crate::publisher::{Publisher, Settled, Settlement};
use crate::report::{DeliveryReport, PublishOutcome, Quarantined};
use crate::rules::{self, Claimed, Settle};
use crate::store::{CorruptEntry, OutboxTx, Reschedule, StoredRow};
use tracing::Instrument as _;

/// Largest encoded value accepted by [`Outbox::stage`]: 1 MiB.
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 1_024;
/// Longest channel name accepted, in bytes.
pub const MAX_CHANNEL_BYTES: usize = 200;
/// The schema name the outbox's tables are registered under.
pub const SCHEMA: &str = "outbox";
/// The outbox's schema history, registered under [`SCHEMA`] by every
/// backend: the entries and version counter (1), the quarantine (2).
pub const SCHEMA_STEPS: &[durability_scheduler::SchemaStep] = &[
    durability_scheduler::SchemaStep::new(1, "initial"),
    durability_scheduler::SchemaStep::new(2, "quarantine"),
];

/// One entry handed to a [`Sink`]: the newest value of a key.
///
/// The sink acknowledges every entry it does not ask to retry. Sinks must
/// ignore versions older than the newest they have applied: a timed-out
/// attempt may still land after a newer one.
#[derive(Debug)]
pub struct Entry<T> {
    key: String,
    value: T,
    version: u64,
    attempt: u32,
    retry: Mutex<Option<Option<f64>>>,
}

impl<T> Entry<T> {
    /// The entry's key.
    pub fn key(&self) -> &str {
        &self.key
    }
    /// The staged value.
    pub fn value(&self) -> &T {
        &self.value
    }
    /// The object-wide version of this value; only ever increases.
    pub fn version(&self) -> u64 {
        self.version
    }
    /// The attempt number, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// Asks for this entry to be retried after the channel's retry delay.
    pub fn retry(&self) {
        *self.retry.lock().unwrap_or_else(PoisonError::into_inner) = Some(None);
    }
    /// Asks for this entry to be retried after `delay_ms` milliseconds.
    /// A negative, non-finite or overflowing delay is rejected when settled
    /// (reported) and the channel's retry delay is used instead.
    pub fn retry_after(&self, delay_ms: f64) {
        *self.retry.lock().unwrap_or_else(PoisonError::into_inner) = Some(Some(delay_ms));
    }
    /// The retry this entry's sink asked for: `None` when it did not,
    /// `Some(None)` for the channel's delay, `Some(Some(ms))` for its own.
    pub(crate) fn retry_requested(&self) -> Option<Option<f64>> {
        *self.retry.lock().unwrap_or_else(PoisonError::into_inner)
    }
    pub(crate) fn new(key: String, value: T, version: u64, attempt: u32) -> Self {
        Self {
            key,
            value,
            version,
            attempt,
            retry: Mutex::new(None),
        }
    }
    pub(crate) fn into_value(self) -> T {
        self.value
    }
}

/// Where a channel publishes. Calls for one channel never overlap.
///
/// The future `publish` returns must be cancel-safe: at the attempt
/// timeout it is dropped (it stops at the await point it is parked on and
/// only its drop glue runs), and every entry of the batch is retried later
/// with its version, so a request it already sent may still land after a
/// newer one. Sinks ignore versions older than the newest they applied.
pub trait Sink<T>: Send + Sync + 'static {
    /// Publishes a batch. `Ok` acknowledges every entry that did not call
    /// [`Entry::retry`]; `Err` retries the whole batch.
    fn publish<'a>(
        &'a self,
        batch: &'a [Entry<T>],
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'a;
}

/// Why an entry went to the dead-letter sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadReason {
    /// It reached the channel's maximum attempts.
    Exhausted,
    /// Its stored value could not be decoded with the channel's codec; it
    /// was never published.
    Undecodable,
}

/// An entry handed to the dead-letter sink: it ran out of attempts, or its
/// stored value cannot be decoded.
#[derive(Debug, Clone)]
pub struct DeadLetter<T> {
    /// The channel.
    pub channel: String,
    /// The key.
    pub key: String,
    /// The value; `None` when it could not be decoded
    /// ([`DeadReason::Undecodable`]).
    pub value: Option<T>,
    /// The stored bytes: the codec's format byte, then its payload.
    pub bytes: Vec<u8>,
    /// Its version.
    pub version: u64,
    /// Attempts made.
    pub attempts: u32,
    /// Why it is here.
    pub reason: DeadReason,
    /// The last failure, or why the value could not be decoded.
    pub error: String,
}

/// Receives entries that ran out of attempts or cannot be decoded. A
/// failure keeps the entry and retries the dead-lettering after the retry
/// delay.
pub type DeadLetterFn<T> =
    Arc<dyn Fn(DeadLetter<T>) -> BoxFuture<'static, Result<(), SinkError>> + Send + Sync>;

/// A channel's settings.
pub struct ChannelConfig<T> {
    name: String,
    attempt_timeout_ms: u64,
    batch_size: usize,
    retry: RetryPolicy,
    dead_letter: Option<DeadLetterFn<T>>,
    on_event: Option<EventHook>,
    codec: Option<Arc<dyn Codec<T>>>,
    permits: Option<Arc<dyn Permits>>,
}

impl<T> std::fmt::Debug for ChannelConfig<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelConfig")
            .field("name", &self.name)
            .field("attempt_timeout_ms", &self.attempt_timeout_ms)
            .field("batch_size", &self.batch_size)
            .field("permits", &self.permits.is_some())
            .finish_non_exhaustive()
    }
}

impl<T> ChannelConfig<T> {
    /// Defaults: 30 s attempts, batches of 100, jittered exponential backoff
    /// capped at 5 minutes, no maximum attempts.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            attempt_timeout_ms: DEFAULT_ATTEMPT_TIMEOUT_MS,
            batch_size: DEFAULT_BATCH_SIZE,
            retry: RetryPolicy::default(),
            dead_letter: None,
            on_event: None,
            codec: None,
            permits: None,
        }
    }
    /// The codec values are stored with ([`Postcard`](crate::Postcard) by default; [`Json`](crate::Json)
    /// for types postcard cannot decode; any [`Codec`]).
    #[must_use]
    pub fn codec(mut self, codec: impl Codec<T>) -> Self {
        self.codec = Some(Arc::new(codec));
        self
    }
    /// Maximum duration of one publish call, `1..=2^31-1` ms.
    #[must_use]
    pub fn attempt_timeout_ms(mut self, ms: u64) -> Self {
        self.attempt_timeout_ms = ms;
        self
    }
    /// Maximum entries per publish call, `1..=1000`.
    #[must_use]
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }
    /// How failed attempts are retried.
    #[must_use]
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }
    /// Where entries go after their last attempt (with a maximum) and
    /// entries whose stored value cannot be decoded. Without one, such
    /// entries are dropped with an event.
    #[must_use]
    pub fn dead_letter(mut self, sink: DeadLetterFn<T>) -> Self {
        self.dead_letter = Some(sink);
        self
    }
    /// The lifecycle hook.
    #[must_use]
    pub fn on_event(mut self, hook: EventHook) -> Self {
        self.on_event = Some(hook);
        self
    }
    /// Flow control: every publish call holds a [`Permit`](durability_scheduler::Permit)
    /// of `permits` while it runs (a cross-host concurrency or rate limit).
    /// The permit is taken before the batch is claimed and limits its size
    /// ([`Permit::entries`](durability_scheduler::Permit::entries)); without
    /// one nothing is claimed or published, the entries stay pending with
    /// no attempt used, and the channel looks again after
    /// [`PermitError::retry_in_ms`](durability_scheduler::PermitError).
    #[must_use]
    pub fn permits(mut self, permits: Arc<dyn Permits>) -> Self {
        self.permits = Some(permits);
        self
    }
}

/// A [`ChannelConfig`] taken apart (by [`Publisher::new`](crate::Publisher::new)).
pub(crate) struct ConfigParts<T> {
    pub(crate) name: String,
    pub(crate) attempt_timeout_ms: u64,
    pub(crate) batch_size: usize,
    pub(crate) retry: RetryPolicy,
    pub(crate) dead_letter: Option<DeadLetterFn<T>>,
    pub(crate) on_event: Option<EventHook>,
    pub(crate) codec: Option<Arc<dyn Codec<T>>>,
    pub(crate) permits: Option<Arc<dyn Permits>>,
}

impl<T> ChannelConfig<T> {
    pub(crate) fn into_parts(self) -> ConfigParts<T> {
        ConfigParts {
            name: self.name,
            attempt_timeout_ms: self.attempt_timeout_ms,
            batch_size: self.batch_size,
            retry: self.retry,
            dead_letter: self.dead_letter,
            on_event: self.on_event,
            codec: self.codec,
            permits: self.permits,
        }
    }
}

/// Validates a channel name: 1..=200 bytes, no control characters.
///
/// # Errors
/// [`OutboxError::InvalidChannel`].
pub fn check_channel(name: &str) -> Result<(), OutboxError> {
    check_name(name, MAX_CHANNEL_BYTES, "must be at most 200 bytes").map_err(|reason| {
        OutboxError::InvalidChannel {
            name: name.to_owned(),
            reason,
        }
    })
}

/// Validates a key: 1..=1024 bytes, no control characters.
///
/// # Errors
/// [`OutboxError::InvalidKey`].
pub fn check_key(key: &str) -> Result<(), OutboxError> {
    check_name(key, MAX_KEY_BYTES, "must be at most 1024 bytes")
        .map_err(|reason| OutboxError::InvalidKey { reason })
}

/// A named outbox channel attached to an object's scheduler.
///
/// Values are staged inside the caller's transaction ([`Outbox::stage`]) and
/// delivered by the scheduler's alarm, or at once by [`Outbox::publish_now`].
/// Cloning shares the channel; dropping the last handle detaches it.
pub struct Outbox<S: Storage, T, K> {
    inner: Arc<Channel<S, T, K>>,
}

impl<S: Storage, T, K> std::fmt::Debug for Outbox<S, T, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("channel", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl<S: Storage, T, K> Clone for Outbox<S, T, K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Channel<S: Storage, T, K> {
    scheduler: Scheduler<S>,
    name: String,
    capability: String,
    pending: Arc<Pending>,
    publisher: Publisher<T, K>,
    busy: tokio::sync::Mutex<()>,
}

impl<S: Storage, T, K> Drop for Channel<S, T, K> {
    fn drop(&mut self) {
        self.scheduler.detach(&self.capability);
    }
}

/// The scheduler holds the channel weakly, so dropping every [`Outbox`]
/// handle frees it.
struct Attachment<S: Storage, T, K>(Weak<Channel<S, T, K>>);

impl<S, T, K> Outbox<S, T, K>
where
    S: Storage,
    for<'t> S::Tx<'t>: OutboxTx,
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    K: Sink<T>,
{
    /// Attaches a channel to the scheduler (capability `outbox:<name>`) and
    /// applies the outbox schema.
    ///
    /// # Errors
    /// [`OutboxError::InvalidChannel`] or [`OutboxError::InvalidPolicy`] for
    /// bad settings, a scheduler error for a duplicate channel or a schema
    /// problem; nothing is attached or written then.
    ///
    /// # Example
    ///
    /// One channel of a name per object; a bad setting is refused before
    /// anything is attached.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use durability_outbox::{ChannelConfig, Entry, Outbox, Sink, SinkError};
    /// # use durability_outbox::conformance::memory_storage;
    /// # use durability_scheduler::{ObjectContext, ObjectId, Scheduler};
    /// # #[derive(Clone)]
    /// # struct Print;
    /// # impl Sink<String> for Print {
    /// #     async fn publish(&self, _batch: &[Entry<String>]) -> Result<(), SinkError> { Ok(()) }
    /// # }
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = ObjectContext::new(ObjectId::new("shop-1")?, Arc::new(memory_storage()));
    /// # let scheduler = Scheduler::new(ctx)?;
    /// let events = Outbox::attach(&scheduler, ChannelConfig::new("events"), Print)?;
    /// assert_eq!(events.name(), "events");
    ///
    /// let twice = Outbox::attach(&scheduler, ChannelConfig::<String>::new("events"), Print);
    /// assert!(twice.is_err(), "the channel is attached already");
    ///
    /// let bad = ChannelConfig::<String>::new("mail").batch_size(0);
    /// assert_eq!(
    ///     Outbox::attach(&scheduler, bad, Print).unwrap_err().code(),
    ///     "OUTBOX_INVALID_POLICY"
    /// );
    /// # Ok(())
    /// # }
    /// ```
    pub fn attach(
        scheduler: &Scheduler<S>,
        config: ChannelConfig<T>,
        sink: K,
    ) -> Result<Self, OutboxError> {
        let publisher = Publisher::new(config, sink, Arc::clone(scheduler.context().clock()))?;
        let capability = crate::admin::capability(publisher.name());
        let pending = Arc::new(publisher.metrics().pending());
        let inner = Arc::new(Channel {
            scheduler: scheduler.clone(),
            name: publisher.name().to_owned(),
            capability: capability.clone(),
            pending,
            publisher,
            busy: tokio::sync::Mutex::new(()),
        });
        let attachment: Arc<dyn Capability> = Arc::new(Attachment(Arc::downgrade(&inner)));
        if let Err(e) = scheduler.attach(&capability, Some(SCHEMA), attachment) {
            // The channel was never attached: dropping it must not detach the
            // channel of the same name that is.
            let inner = Arc::into_inner(inner);
            if let Some(mut inner) = inner {
                inner.capability.clear();
            }
            return Err(e.into());
        }
        // The pending gauge starts from what the store holds (entries staged
        // before a restart). A failed count detaches the channel again (the
        // dropped handle detaches it).
        let ch = &inner;
        ch.scheduler.transaction(|tx| {
            let ticket = ch.pending.ticket();
            let n = tx.outbox_len(&ch.name)?;
            let pending = Arc::clone(&ch.pending);
            tx.after_commit(move || pending.counted(ticket, n));
            Ok::<_, OutboxError>(())
        })?;
        Ok(Self { inner })
    }

    /// The channel's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Stages `value` for `key` inside the caller's transaction: replaces any
    /// pending value of the key, assigns a new object-wide version, resets
    /// the attempt count, makes it due now and moves the alarm — all in `tx`.
    /// Use [`Scheduler::transaction`] so the alarm and the `Staged` event
    /// follow the commit.
    ///
    /// The value must read back through the channel's codec: it is encoded,
    /// decoded and checked ([`Codec::check_round_trip`]) before anything is
    /// written, so a value that could never be delivered is refused here.
    ///
    /// Returns the version assigned.
    ///
    /// # Errors
    /// [`OutboxError::InvalidKey`], [`OutboxError::ValueTooLarge`],
    /// [`OutboxError::Encode`] or [`OutboxError::ValueDoesNotRoundTrip`]
    /// before anything is written; a storage error (roll the transaction
    /// back), [`OutboxError::code`] `OUTBOX_CORRUPT` for a corrupt version
    /// counter.
    ///
    /// # Example
    ///
    /// A value staged in a transaction that fails is never pending; a newer
    /// value of a key replaces the pending one with a higher version.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use durability_outbox::{ChannelConfig, Entry, Outbox, OutboxError, Sink, SinkError};
    /// # use durability_outbox::conformance::memory_storage;
    /// # use durability_scheduler::{ObjectContext, ObjectId, Scheduler};
    /// # #[derive(Clone)]
    /// # struct Print;
    /// # impl Sink<String> for Print {
    /// #     async fn publish(&self, _batch: &[Entry<String>]) -> Result<(), SinkError> { Ok(()) }
    /// # }
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = ObjectContext::new(ObjectId::new("shop-1")?, Arc::new(memory_storage()));
    /// # let scheduler = Scheduler::new(ctx)?;
    /// let events = Outbox::attach(&scheduler, ChannelConfig::new("events"), Print)?;
    ///
    /// let failed: Result<u64, OutboxError> = scheduler.transaction(|tx| {
    ///     events.stage(tx, "order-7", &"placed".to_owned())?;
    ///     // The caller's own write fails: the whole transaction rolls back.
    ///     Err(OutboxError::InvalidKey { reason: "example" })
    /// });
    /// assert!(failed.is_err());
    /// assert_eq!(events.len()?, 0, "nothing staged by a rolled-back transaction");
    ///
    /// let v1 = scheduler.transaction(|tx| events.stage(tx, "order-7", &"placed".to_owned()))?;
    /// let v2 = scheduler.transaction(|tx| events.stage(tx, "order-7", &"paid".to_owned()))?;
    /// assert!(v2 > v1);
    /// assert_eq!(events.len()?, 1, "only the newest value of a key is pending");
    /// # Ok(())
    /// # }
    /// ```
    pub fn stage(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        key: &str,
        value: &T,
    ) -> Result<u64, OutboxError> {
        check_key(key)?;
        let ch = &self.inner;
        let bytes = ch.publisher.encode(value)?;
        let version = rules::version_issued(tx.outbox_next_version()?)?;
        let now = ch.scheduler.now_ms();
        // A new key adds a pending entry; a staged value replacing a
        // pending one does not.
        let new = tx.outbox_stage(&rules::staged(&ch.name, key, bytes, version, now))?;
        tx.lower_due(&ch.capability, now)?;
        let added = i64::from(new);
        ch.after_commit_counting(tx, added, key, version, 0, EventKind::Staged);
        Ok(version)
    }

    /// Removes `key`'s pending entry inside the caller's transaction; whether
    /// there was one. An attempt already in flight may still land. A corrupt
    /// row of the key is removed too (reported with version 0).
    ///
    /// # Errors
    /// [`OutboxError::InvalidKey`]; a storage error.
    pub fn discard(&self, tx: &mut Transaction<'_, '_, S>, key: &str) -> Result<bool, OutboxError> {
        check_key(key)?;
        let ch = &self.inner;
        let Some(row) = tx.outbox_get(&ch.name, key)? else {
            return Ok(false);
        };
        let (version, attempt) = match &row {
            StoredRow::Entry(e) => (e.version, e.attempt),
            StoredRow::Corrupt(_) => (0, 0),
        };
        tx.outbox_remove(&ch.name, key)?;
        let next = tx.outbox_next_due(&ch.name)?;
        tx.set_due(&ch.capability, next)?;
        ch.after_commit_counting(tx, -1, key, version, attempt, EventKind::Discarded);
        Ok(true)
    }

    /// The pending entry of `key`: its version and attempts so far.
    ///
    /// # Errors
    /// [`OutboxError::InvalidKey`]; a storage error; `OUTBOX_CORRUPT` when
    /// the key's row is corrupt (it is quarantined when next due).
    pub fn pending(&self, key: &str) -> Result<Option<(u64, u32)>, OutboxError> {
        check_key(key)?;
        let ch = &self.inner;
        ch.scheduler
            .transaction(|tx| match tx.outbox_get(&ch.name, key)? {
                None => Ok(None),
                Some(StoredRow::Entry(e)) => Ok(Some((e.version, e.attempt))),
                Some(StoredRow::Corrupt(c)) => Err(StorageError::corrupt(c.reason).into()),
            })
    }

    /// How many entries are pending.
    ///
    /// # Errors
    /// A storage error.
    pub fn len(&self) -> Result<u64, OutboxError> {
        let ch = &self.inner;
        ch.scheduler
            .transaction(|tx| Ok::<_, OutboxError>(tx.outbox_len(&ch.name)?))
    }

    /// Whether nothing is pending.
    ///
    /// # Errors
    /// A storage error.
    pub fn is_empty(&self) -> Result<bool, OutboxError> {
        Ok(self.len()? == 0)
    }

    /// How many corrupt rows of this channel are in quarantine.
    ///
    /// # Errors
    /// A storage error.
    pub fn quarantined(&self) -> Result<u64, OutboxError> {
        let ch = &self.inner;
        ch.scheduler
            .transaction(|tx| Ok::<_, OutboxError>(tx.outbox_quarantined_len(&ch.name)?))
    }

    /// Deletes this channel's quarantined rows; how many there were.
    ///
    /// # Errors
    /// A storage error.
    pub fn purge_quarantined(&self) -> Result<u64, OutboxError> {
        let ch = &self.inner;
        ch.scheduler
            .transaction(|tx| Ok::<_, OutboxError>(tx.outbox_purge_quarantined(&ch.name)?))
    }

    /// Tries `key`'s pending entry at once, whatever its due time, after
    /// waiting for a publish call in progress on the channel. The outcome
    /// says whether a value is still pending for the key afterwards and what
    /// the attempt did: delivered, retried, given up, undecodable
    /// (dead-lettered or dropped) or quarantined.
    ///
    /// # Errors
    /// [`OutboxError::InvalidKey`]; a storage error.
    pub async fn publish_now(&self, key: &str) -> Result<PublishOutcome, OutboxError> {
        check_key(key)?;
        let ch = &self.inner;
        let _busy = ch.busy.lock().await;
        let now = ch.scheduler.now_ms();
        let mut report = DeliveryReport::default();
        let permit = match ch.publisher.permits() {
            Some(permits) => match permits.acquire(1).await {
                Ok(permit) => Some(permit),
                Err(refused) => {
                    report.waiting_for_permit = Some(refused);
                    let pending = ch.scheduler.transaction(|tx| {
                        Ok::<_, OutboxError>(tx.outbox_get(&ch.name, key)?.is_some())
                    })?;
                    return Ok(PublishOutcome { pending, report });
                }
            },
            None => None,
        };
        let claimed = ch.scheduler.transaction(|tx| {
            let Some(row) = tx.outbox_get(&ch.name, key)? else {
                return Ok::<_, OutboxError>(Vec::new());
            };
            ch.claim(tx, vec![row], now, &mut report)
        })?;
        if !claimed.is_empty() {
            let outcomes = ch.publisher.attempt(claimed).await;
            ch.settle(outcomes, &mut report)?;
        }
        drop(permit);
        let pending = ch
            .scheduler
            .transaction(|tx| Ok::<_, OutboxError>(tx.outbox_get(&ch.name, key)?.is_some()))?;
        Ok(PublishOutcome { pending, report })
    }

    /// Delivers everything due now (what the alarm does) and reports what
    /// happened: delivered, retried, given up, undecodable, quarantined.
    ///
    /// # Errors
    /// A storage error; entries stay pending and are retried.
    pub async fn deliver_due(&self) -> Result<DeliveryReport, OutboxError> {
        let span = tracing::debug_span!("durability.outbox.deliver", channel = %self.inner.name);
        let report = self.inner.deliver_due().instrument(span).await?;
        if report.delivered + report.retried > 0 {
            tracing::debug!(
                event = "durability.outbox.delivered",
                channel = %self.inner.name,
                delivered = report.delivered,
                retried = report.retried,
                "outbox delivery run"
            );
        }
        Ok(report)
    }
}

impl<S, T, K> Capability for Attachment<S, T, K>
where
    S: Storage,
    for<'t> S::Tx<'t>: OutboxTx,
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    K: Sink<T>,
{
    fn run(&self, _now_ms: i64) -> BoxFuture<'_, ()> {
        let channel = self.0.upgrade();
        Box::pin(async move {
            let Some(channel) = channel else { return };
            let span = tracing::debug_span!("durability.outbox.deliver", channel = %channel.name);
            if let Err(error) = channel.deliver_due().instrument(span).await {
                tracing::warn!(
                    event = "durability.outbox.deliver_failed",
                    channel = %channel.name,
                    %error,
                    "outbox delivery failed; entries stay pending"
                );
            }
        })
    }
}

impl<S, T, K> Channel<S, T, K>
where
    S: Storage,
    for<'t> S::Tx<'t>: OutboxTx,
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    K: Sink<T>,
{
    fn after_commit(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        key: &str,
        version: u64,
        attempt: u32,
        kind: EventKind,
    ) {
        self.after_commit_counting(tx, 0, key, version, attempt, kind);
    }

    /// As [`Channel::after_commit`], and first reports a change of
    /// `pending` entries (none if 0) — one callback for both, as a stage
    /// queues one per entry.
    fn after_commit_counting(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        pending: i64,
        key: &str,
        version: u64,
        attempt: u32,
        kind: EventKind,
    ) {
        let change = (pending != 0).then(|| (self.pending.ticket(), Arc::clone(&self.pending)));
        let counter = self.publisher.metrics().counter(&kind).cloned();
        let hook = self.publisher.hook().cloned();
        let event = hook
            .is_some()
            .then(|| self.publisher.event(key, version, attempt, kind));
        tx.after_commit(move || {
            if let Some((ticket, known)) = change {
                known.changed(ticket, pending);
            }
            if let Some(counter) = counter {
                counter.increment(1);
            }
            if let Some(event) = event {
                emit(hook.as_ref(), &event);
            }
        });
    }

    /// Reports a change of the pending count after `tx` commits.
    fn pending_changed(&self, tx: &mut Transaction<'_, '_, S>, delta: i64) {
        let ticket = self.pending.ticket();
        let pending = Arc::clone(&self.pending);
        tx.after_commit(move || pending.changed(ticket, delta));
    }

    /// Reads the pending count from the store in `tx` and reports it after
    /// `tx` commits.
    fn pending_count(&self, tx: &mut Transaction<'_, '_, S>) -> Result<(), OutboxError> {
        let ticket = self.pending.ticket();
        let n = tx.outbox_len(&self.name)?;
        let pending = Arc::clone(&self.pending);
        tx.after_commit(move || pending.counted(ticket, n));
        Ok(())
    }

    async fn deliver_due(&self) -> Result<DeliveryReport, OutboxError> {
        let _busy = self.busy.lock().await;
        // Only entries due when this run started: an entry retried with no
        // delay waits for the next run instead of spinning this one.
        let start = self.scheduler.now_ms();
        let mut report = DeliveryReport::default();
        loop {
            let (permit, limit) = match self.permit(start).await? {
                Ok(permit) => permit,
                Err(refused) => {
                    report.waiting_for_permit = Some(refused);
                    return Ok(report);
                }
            };
            let mut quarantined = 0;
            let claimed = self.scheduler.transaction(|tx| {
                let due = tx.outbox_due(&self.name, start, limit)?;
                let before = report.quarantined.len();
                let claimed = self.claim(tx, due, start, &mut report)?;
                quarantined = report.quarantined.len() - before;
                if claimed.is_empty() && quarantined == 0 {
                    // The run's end: the pending gauge is counted from the
                    // store once per run (batches report their changes).
                    self.pending_count(tx)?;
                }
                Ok::<_, OutboxError>(claimed)
            })?;
            if claimed.is_empty() {
                // A batch of only corrupt rows: they are out of the way now,
                // so look again.
                if quarantined > 0 {
                    continue;
                }
                return Ok(report);
            }
            let outcomes = self.publisher.attempt(claimed).await;
            // Settled before the permit is given back: the delivery ran
            // under it from the claim to the settlement.
            self.settle(outcomes, &mut report)?;
            drop(permit);
        }
    }

    /// The permit for the next batch of the run started at `start` and the
    /// batch's size: with no permit source, none and the batch size; with
    /// one, a permit for what is due (up to a batch). Without a permit the
    /// channel's alarm moves to when the source said to ask again, and the
    /// entries stay pending, unclaimed (`Ok(Err(_))`).
    async fn permit(
        &self,
        start: i64,
    ) -> Result<Result<(Option<Permit>, usize), PermitError>, OutboxError> {
        let batch = self.publisher.batch_size();
        let Some(permits) = self.publisher.permits() else {
            return Ok(Ok((None, batch)));
        };
        let due = self.scheduler.transaction(|tx| {
            Ok::<_, OutboxError>(tx.outbox_due(&self.name, start, batch)?.len())
        })?;
        if due == 0 {
            // Nothing to deliver: the claim finds nothing and ends the run.
            return Ok(Ok((None, batch)));
        }
        match permits.acquire(due).await {
            Ok(permit) => {
                let limit = permit.entries().min(due);
                Ok(Ok((Some(permit), limit)))
            }
            Err(refused) => {
                self.wait_for_permit(&refused)?;
                Ok(Err(refused))
            }
        }
    }

    /// Moves the channel's alarm to when a refused permit may be asked for
    /// again (nothing else changes: the entries stay pending as they were).
    fn wait_for_permit(&self, refused: &PermitError) -> Result<(), OutboxError> {
        let at = self.scheduler.now_ms().saturating_add(refused.retry_in_ms);
        tracing::debug!(
            event = "durability.outbox.no_permit",
            channel = %self.name,
            retry_in_ms = refused.retry_in_ms,
            reason = %refused.reason,
            "no permit for a delivery; entries stay pending"
        );
        self.scheduler.transaction(|tx| {
            tx.set_due(&self.capability, Some(at))?;
            Ok::<_, OutboxError>(())
        })
    }

    /// Records the attempt of each entry before it starts: attempt count up,
    /// due again at the claim's deadline. A corrupt row is quarantined in
    /// the same transaction, so it never holds the due time in the past.
    /// One transaction for the batch.
    fn claim(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        due: Vec<StoredRow>,
        now: i64,
        report: &mut DeliveryReport,
    ) -> Result<Vec<Claimed>, OutboxError> {
        let deadline = self.publisher.claim_deadline(now);
        let mut claimed = Vec::with_capacity(due.len());
        let mut quarantined = Vec::new();
        for row in due {
            let stored = match row {
                StoredRow::Entry(stored) => stored,
                StoredRow::Corrupt(corrupt) => {
                    if tx.outbox_quarantine(&corrupt, now)? {
                        quarantined.push(corrupt);
                    }
                    continue;
                }
            };
            let claim = self.publisher.claim(stored);
            if tx.outbox_reschedule_if(Reschedule {
                channel: &self.name,
                key: &claim.stored.key,
                version: claim.stored.version,
                expected_attempt: claim.stored.attempt,
                attempt: claim.attempt,
                due_at: deadline,
                claimed_until: Some(deadline),
            })? {
                claimed.push(claim);
            }
        }
        let next = tx.outbox_next_due(&self.name)?;
        tx.set_due(&self.capability, next)?;
        if !quarantined.is_empty() {
            // Quarantined rows left the pending ones.
            self.pending_count(tx)?;
        }
        for corrupt in quarantined {
            self.report_quarantined(tx, &corrupt);
            report.quarantined.push(Quarantined {
                key: corrupt.key,
                reason: corrupt.reason,
            });
        }
        Ok(claimed)
    }

    fn report_quarantined(&self, tx: &mut Transaction<'_, '_, S>, corrupt: &CorruptEntry) {
        let (channel, key, reason) = (
            self.name.clone(),
            corrupt.key.clone(),
            corrupt.reason.clone(),
        );
        tx.after_commit(move || {
            tracing::error!(
                event = "durability.outbox.quarantined",
                %channel, %key, %reason,
                "corrupt outbox row moved to quarantine; the channel's other entries continue"
            );
        });
        self.after_commit(
            tx,
            &corrupt.key,
            0,
            0,
            EventKind::Quarantined {
                reason: corrupt.reason.clone(),
            },
        );
    }

    /// Settles a batch in one transaction, each entry guarded by the version
    /// and attempt it was claimed at ([`rules::settle`]), then reports the
    /// events.
    fn settle(
        &self,
        outcomes: Vec<Settlement>,
        report: &mut DeliveryReport,
    ) -> Result<(), OutboxError> {
        let now = self.scheduler.now_ms();
        let (settled, lateness) = self.scheduler.transaction(|tx| {
            let mut settled = Vec::with_capacity(outcomes.len());
            let mut lateness = Vec::new();
            let mut removed = 0_i64;
            for s in outcomes {
                let (key, version, attempt) = (s.stored.key.as_str(), s.stored.version, s.attempt);
                let (kind, fate) = match rules::settle(s.outcome) {
                    Settle::Remove { kind, fate } => {
                        if tx.outbox_remove_if(&self.name, key, version, attempt)? {
                            removed += 1;
                        }
                        if kind == EventKind::Delivered {
                            lateness.push(now.saturating_sub(s.stored.due_at));
                        }
                        (kind, fate)
                    }
                    Settle::Reschedule {
                        error,
                        requested,
                        fate,
                    } => {
                        let next_at = self.publisher.retry_at(key, attempt, requested, now);
                        // A newer value staged meanwhile replaced this
                        // attempt: nothing to retry, and no event to report.
                        if !tx.outbox_reschedule_if(Reschedule {
                            channel: &self.name,
                            key,
                            version,
                            expected_attempt: attempt,
                            attempt,
                            due_at: next_at,
                            claimed_until: None,
                        })? {
                            continue;
                        }
                        (EventKind::RetryScheduled { next_at, error }, fate)
                    }
                };
                settled.push(Settled::new(s.stored, attempt, kind, fate, s.undecodable));
            }
            let next = tx.outbox_next_due(&self.name)?;
            tx.set_due(&self.capability, next)?;
            // The rows this batch removed, not a count of the channel: a
            // count reads every pending row, so a drain would cost the
            // square of its backlog.
            if removed > 0 {
                self.pending_changed(tx, -removed);
            }
            Ok::<_, OutboxError>((settled, lateness))
        })?;
        // Recorded once the settlements committed, as the events are.
        for ms in lateness {
            self.publisher.delivered_late_by(ms);
        }
        self.publisher.report_settled(settled, report);
        Ok(())
    }
}

#[cfg(test)]
mod permit_tests;
