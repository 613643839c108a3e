//! The storage-free half of a channel: encoding, publishing claimed entries
//! to the sink (with the attempt timeout), dead-lettering, retry delays,
//! lifecycle events and metrics.
//!
//! [`Outbox`](crate::Outbox) drives it over an object's [`OutboxTx`](crate::OutboxTx);
//! a backend that keeps its own tables (the PostgreSQL outbox in the
//! caller's transaction) drives the same [`Publisher`], so what a channel
//! does with a claimed entry is written once.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use durability_scheduler::Permits;
use durability_time::{Clock, timeout_at};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::channel::{
    ChannelConfig, DeadLetter, DeadLetterFn, DeadReason, Entry, MAX_VALUE_BYTES, Sink,
    check_channel,
};
use crate::codec::{Codec, Postcard};
use crate::error::{OutboxError, SinkError};
use crate::event::{EventHook, EventKind, OutboxEvent, emit};
use crate::metrics::ChannelMetrics;
use crate::policy::{RetryPolicy, check_batch, check_delay, check_timeout, default_delay_ms};
use crate::report::{DeliveryReport, Fate, Quarantined, Undelivered};
use crate::rules::{self, Claimed, Outcome};
use crate::store::{CorruptEntry, StoredEntry};

/// One claimed entry's outcome, to settle.
#[derive(Debug, Clone, PartialEq)]
pub struct Settlement {
    /// The entry as claimed (version and expected attempt guard the write).
    pub stored: StoredEntry,
    /// The attempt number the claim recorded.
    pub attempt: u32,
    /// What the attempt came to.
    pub outcome: Outcome,
    /// Its value could not be decoded.
    pub undecodable: bool,
}

/// An entry whose settlement committed, to report
/// ([`Publisher::report_settled`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The key.
    pub key: String,
    /// The version settled.
    pub version: u64,
    /// The attempt settled.
    pub attempt: u32,
    /// The event to report.
    pub kind: EventKind,
    /// Where an undelivered entry went.
    pub fate: Option<Fate>,
    /// Its value could not be decoded.
    pub undecodable: bool,
}

impl Settled {
    /// The report of the entry `stored`, claimed at `attempt`, settled as
    /// `kind` (and `fate`, where it was not delivered).
    pub fn new(
        stored: StoredEntry,
        attempt: u32,
        kind: EventKind,
        fate: Option<Fate>,
        undecodable: bool,
    ) -> Self {
        Self {
            key: stored.key,
            version: stored.version,
            attempt,
            kind,
            fate,
            undecodable,
        }
    }
}

/// A channel's settings, codec, sink and clock: everything delivery needs
/// except storage.
pub struct Publisher<T, K> {
    name: String,
    attempt_timeout_ms: i64,
    batch_size: usize,
    retry: RetryPolicy,
    dead_letter: Option<DeadLetterFn<T>>,
    on_event: Option<EventHook>,
    metrics: ChannelMetrics,
    codec: Arc<dyn Codec<T>>,
    sink: K,
    clock: Arc<dyn Clock>,
    permits: Option<Arc<dyn Permits>>,
    /// The length of the last value encoded: the next encoding starts with
    /// that capacity, so a channel of like-sized values allocates once per
    /// value instead of growing the buffer.
    encoded_len: AtomicUsize,
}

impl<T, K> std::fmt::Debug for Publisher<T, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("channel", &self.name)
            .field("attempt_timeout_ms", &self.attempt_timeout_ms)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl<T, K> Publisher<T, K>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    K: Sink<T>,
{
    /// Validates `config` and builds the channel's publisher.
    ///
    /// # Errors
    /// [`OutboxError::InvalidChannel`] or [`OutboxError::InvalidPolicy`].
    pub fn new(
        config: ChannelConfig<T>,
        sink: K,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, OutboxError> {
        let parts = config.into_parts();
        check_channel(&parts.name)?;
        let timeout = check_timeout(parts.attempt_timeout_ms)?;
        let batch_size = check_batch(parts.batch_size)?;
        if parts.retry.max_attempts == Some(0) {
            return Err(OutboxError::InvalidPolicy {
                field: "max_attempts",
                reason: "must be at least 1".into(),
            });
        }
        Ok(Self {
            metrics: ChannelMetrics::new(&parts.name),
            name: parts.name,
            attempt_timeout_ms: i64::try_from(timeout).unwrap_or(i64::MAX),
            batch_size,
            retry: parts.retry,
            dead_letter: parts.dead_letter,
            on_event: parts.on_event,
            codec: parts.codec.unwrap_or_else(|| Arc::new(Postcard)),
            sink,
            clock,
            permits: parts.permits,
            encoded_len: AtomicUsize::new(0),
        })
    }

    /// The channel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Entries per publish call.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The current time on the channel's clock (Unix ms).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The channel's permit source ([`ChannelConfig::permits`]): a delivery
    /// loop holds one of its permits while a publish call runs.
    pub fn permits(&self) -> Option<&Arc<dyn Permits>> {
        self.permits.as_ref()
    }

    /// The channel's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Claims `stored` for an attempt ([`rules::claim`] with the channel's
    /// maximum attempts).
    pub fn claim(&self, stored: StoredEntry) -> Claimed {
        rules::claim(stored, self.retry.max_attempts)
    }

    /// When a claim made at `now` lapses.
    pub fn claim_deadline(&self, now: i64) -> i64 {
        rules::claim_deadline(now, self.attempt_timeout_ms)
    }

    pub(crate) fn metrics(&self) -> &ChannelMetrics {
        &self.metrics
    }

    pub(crate) fn hook(&self) -> Option<&EventHook> {
        self.on_event.as_ref()
    }

    /// The event of a key.
    pub(crate) fn event(
        &self,
        key: &str,
        version: u64,
        attempt: u32,
        kind: EventKind,
    ) -> OutboxEvent {
        OutboxEvent {
            channel: self.name.clone(),
            key: key.to_owned(),
            version,
            attempt,
            kind,
        }
    }

    /// Records and reports a lifecycle event now (call it after the
    /// transaction that made it happen committed).
    pub fn emit(&self, key: &str, version: u64, attempt: u32, kind: EventKind) {
        self.metrics.record(&kind);
        if self.on_event.is_some() {
            emit(
                self.on_event.as_ref(),
                &self.event(key, version, attempt, kind),
            );
        }
    }

    /// Records how late a delivered entry was (after its settlement
    /// committed).
    pub fn delivered_late_by(&self, ms: i64) {
        self.metrics.delivered_late_by(ms);
    }

    /// The stored bytes of `value`: the codec's format byte, then its
    /// payload, checked to read back.
    ///
    /// # Errors
    /// [`OutboxError::Encode`], [`OutboxError::ValueTooLarge`] or
    /// [`OutboxError::ValueDoesNotRoundTrip`].
    pub fn encode(&self, value: &T) -> Result<Vec<u8>, OutboxError> {
        let hint = self.encoded_len.load(Ordering::Relaxed);
        let out = encode_into(&*self.codec, value, hint)?;
        self.encoded_len.store(out.len(), Ordering::Relaxed);
        Ok(out)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, String> {
        let codec = &*self.codec;
        match bytes.split_first() {
            Some((&format, payload)) if format == codec.format() => {
                codec.decode(payload).map_err(|e| {
                    format!(
                        "the {} codec cannot decode the stored value: {e}",
                        codec.name()
                    )
                })
            }
            Some((format, _)) => Err(format!(
                "the stored value has format {format}; the channel's {} codec reads format {}",
                codec.name(),
                codec.format()
            )),
            None => Err("the stored value is empty".to_owned()),
        }
    }

    /// Publishes claimed entries (exhausted and undecodable ones go to the
    /// dead-letter sink) and returns each one's outcome, to settle.
    pub async fn attempt(&self, claimed: Vec<Claimed>) -> Vec<Settlement> {
        let mut outcomes: Vec<Settlement> = Vec::with_capacity(claimed.len());
        let mut batch: Vec<Entry<T>> = Vec::with_capacity(claimed.len());
        let mut batch_meta: Vec<StoredEntry> = Vec::with_capacity(claimed.len());
        for c in claimed {
            let (value, reason, error) = match self.decode(&c.stored.value) {
                Ok(value) if !c.exhausted => {
                    self.emit(
                        &c.stored.key,
                        c.stored.version,
                        c.attempt,
                        EventKind::AttemptStarted,
                    );
                    batch.push(Entry::new(
                        c.stored.key.clone(),
                        value,
                        c.stored.version,
                        c.attempt,
                    ));
                    batch_meta.push(c.stored);
                    continue;
                }
                Ok(value) => (
                    Some(value),
                    DeadReason::Exhausted,
                    format!("gave up after {} attempts", c.attempt),
                ),
                Err(error) => {
                    tracing::error!(
                        event = "durability.outbox.undecodable_entry",
                        channel = %self.name,
                        key = %c.stored.key,
                        version = c.stored.version,
                        %error,
                        "stored outbox value cannot be decoded; it is dead-lettered or dropped, never retried"
                    );
                    (None, DeadReason::Undecodable, error)
                }
            };
            let undecodable = matches!(reason, DeadReason::Undecodable);
            let outcome = self
                .dead_letter_one(&c.stored, c.attempt, value, reason, error)
                .await;
            outcomes.push(Settlement {
                stored: c.stored,
                attempt: c.attempt,
                outcome,
                undecodable,
            });
        }
        if !batch.is_empty() {
            self.publish(batch, batch_meta, &mut outcomes).await;
        }
        outcomes
    }

    async fn publish(
        &self,
        batch: Vec<Entry<T>>,
        batch_meta: Vec<StoredEntry>,
        outcomes: &mut Vec<Settlement>,
    ) {
        let deadline = self.claim_deadline(self.now_ms());
        let result = self
            .with_deadline(self.sink.publish(&batch), deadline)
            .await;
        for (entry, stored) in batch.into_iter().zip(batch_meta) {
            let attempt = entry.attempt();
            let outcome = match rules::verdict(&result, entry.retry_requested()) {
                Outcome::Retry { error, .. }
                    if rules::verdict_gives_up(attempt, self.retry.max_attempts) =>
                {
                    let gave_up = format!("gave up after {attempt} attempts");
                    let value = entry.into_value();
                    self.dead_letter_one(
                        &stored,
                        attempt,
                        Some(value),
                        DeadReason::Exhausted,
                        gave_up,
                    )
                    .await
                    .with_error(error)
                }
                other => other,
            };
            outcomes.push(Settlement {
                attempt,
                stored,
                outcome,
                undecodable: false,
            });
        }
    }

    async fn with_deadline<F>(&self, fut: F, deadline: i64) -> Result<(), String>
    where
        F: Future<Output = Result<(), SinkError>>,
    {
        match timeout_at(&*self.clock, deadline, fut).await {
            Ok(r) => r.map_err(|e| e.0),
            Err(_) => Err(format!(
                "attempt timed out after {} ms",
                self.attempt_timeout_ms
            )),
        }
    }

    /// Hands an entry to the dead-letter sink (or drops it, without one).
    async fn dead_letter_one(
        &self,
        stored: &StoredEntry,
        attempt: u32,
        value: Option<T>,
        reason: DeadReason,
        error: String,
    ) -> Outcome {
        let Some(sink) = &self.dead_letter else {
            return Outcome::Dropped { error };
        };
        let letter = DeadLetter {
            channel: self.name.clone(),
            key: stored.key.clone(),
            value,
            bytes: stored.value.clone(),
            version: stored.version,
            attempts: attempt,
            reason,
            error: error.clone(),
        };
        let deadline = self.claim_deadline(self.now_ms());
        match self.with_deadline(sink(letter), deadline).await {
            Ok(()) => Outcome::DeadLettered { error },
            Err(e) => Outcome::DeadLetterFailed {
                error: format!("dead-letter sink failed: {e}"),
            },
        }
    }

    /// When a rescheduled entry is due again: after the delay the sink
    /// asked for, else the channel's policy; a rejected delay is reported
    /// and replaced by the default backoff. Never below 1 ms, so a run
    /// never spins on one entry.
    pub fn retry_at(&self, key: &str, attempt: u32, requested: Option<f64>, now: i64) -> i64 {
        now.saturating_add(self.retry_delay(key, attempt, requested, now))
    }

    fn retry_delay(&self, key: &str, attempt: u32, requested: Option<f64>, now: i64) -> i64 {
        if let Some(ms) = requested {
            match check_delay(ms, now) {
                Ok(delay) => return delay.max(1),
                Err(reason) => self.report_bad_delay(key, &reason),
            }
        }
        match self.retry.delay_ms(attempt, now) {
            Ok(delay) => delay.max(1),
            Err(reason) => {
                self.report_bad_delay(key, &reason);
                let fallback = default_delay_ms(attempt, self.retry.jitter.unit());
                check_delay(fallback, now).unwrap_or(1).max(1)
            }
        }
    }

    fn report_bad_delay(&self, key: &str, reason: &str) {
        tracing::warn!(
            event = "durability.outbox.invalid_delay",
            channel = %self.name,
            %key,
            %reason,
            "retry delay rejected; using the default backoff"
        );
    }

    /// Reports a corrupt row moved to the quarantine (after the commit that
    /// moved it): logs it, emits [`EventKind::Quarantined`] and lists it in
    /// `report`.
    pub fn report_quarantined(&self, corrupt: CorruptEntry, report: &mut DeliveryReport) {
        tracing::error!(
            event = "durability.outbox.quarantined",
            channel = %self.name, key = %corrupt.key, reason = %corrupt.reason,
            "corrupt outbox row moved to quarantine; the channel's other entries continue"
        );
        self.emit(
            &corrupt.key,
            0,
            0,
            EventKind::Quarantined {
                reason: corrupt.reason.clone(),
            },
        );
        report.quarantined.push(Quarantined {
            key: corrupt.key,
            reason: corrupt.reason,
        });
    }

    /// Reports settlements that committed: counts them in `report`, logs
    /// retries and emits each one's event.
    pub fn report_settled(&self, settled: Vec<Settled>, report: &mut DeliveryReport) {
        for Settled {
            key,
            version,
            attempt,
            kind,
            fate,
            undecodable,
        } in settled
        {
            match (&kind, fate) {
                (EventKind::Delivered, _) => report.delivered += 1,
                (EventKind::RetryScheduled { error, .. }, None) => {
                    report.retried += 1;
                    tracing::debug!(
                        event = "durability.outbox.retry_scheduled",
                        channel = %self.name, %key, version, attempt, %error,
                        "outbox delivery failed; retry scheduled"
                    );
                }
                (
                    EventKind::RetryScheduled { error, .. }
                    | EventKind::DeadLettered { error }
                    | EventKind::Dropped { error },
                    Some(fate),
                ) => {
                    let lost = Undelivered {
                        key: key.clone(),
                        version,
                        error: error.clone(),
                        fate,
                    };
                    if undecodable {
                        report.undecodable.push(lost);
                    } else {
                        report.gave_up.push(lost);
                    }
                }
                _ => {}
            }
            self.emit(&key, version, attempt, kind);
        }
    }
}

/// The stored bytes of `value` under `codec`: its format byte, then its
/// payload, checked to read back.
pub(crate) fn encode_with<T: 'static>(
    codec: &dyn Codec<T>,
    value: &T,
) -> Result<Vec<u8>, OutboxError> {
    encode_into(codec, value, 0)
}

/// As [`encode_with`], into a buffer of at least 64 bytes or `capacity`
/// (up to the largest value allowed).
fn encode_into<T: 'static>(
    codec: &dyn Codec<T>,
    value: &T,
    capacity: usize,
) -> Result<Vec<u8>, OutboxError> {
    let mut out = Vec::with_capacity(capacity.clamp(64, MAX_VALUE_BYTES + 1));
    out.push(codec.format());
    codec
        .encode(value, &mut out)
        .map_err(|e| OutboxError::Encode(format!("{}: {e}", codec.name())))?;
    if out.len() > MAX_VALUE_BYTES {
        return Err(OutboxError::ValueTooLarge {
            size: out.len(),
            limit: MAX_VALUE_BYTES,
        });
    }
    codec
        .check_round_trip(value, &out[1..])
        .map_err(|e| OutboxError::ValueDoesNotRoundTrip {
            codec: codec.name(),
            reason: e.0,
        })?;
    Ok(out)
}

impl Outcome {
    fn with_error(self, last: String) -> Self {
        match self {
            Self::DeadLettered { .. } => Self::DeadLettered { error: last },
            Self::Dropped { .. } => Self::Dropped { error: last },
            other => other,
        }
    }
}
