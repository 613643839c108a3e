//! Channel settings: attempt timeouts, batch size, retry delays, maximum
//! attempts. Everything is validated when the channel is built.

use std::fmt;
use std::sync::Arc;

use durability_time::{Backoff, Jitter, MAX_SAFE_INTEGER, Random};

use crate::error::OutboxError;

/// Default duration of one publish attempt: 30 seconds.
pub const DEFAULT_ATTEMPT_TIMEOUT_MS: u64 = 30_000;
/// Longest attempt timeout accepted: 2^31-1 ms (a JavaScript timer's limit,
/// kept so stored deadlines mean the same in every implementation).
pub const MAX_ATTEMPT_TIMEOUT_MS: u64 = (1 << 31) - 1;
/// Default number of entries per publish call.
pub const DEFAULT_BATCH_SIZE: usize = 100;
/// Largest batch accepted.
pub const MAX_BATCH_SIZE: usize = 1_000;
/// First retry delay of the default backoff.
pub const BASE_DELAY_MS: i64 = 1_000;
/// Cap of the default backoff: 5 minutes.
pub const MAX_DELAY_MS: i64 = 300_000;

/// The default backoff: 1 s doubling to 5 minutes, each delay scaled by a
/// factor drawn uniformly from `[0.5, 1)`, retrying forever.
pub const DEFAULT_BACKOFF: Backoff =
    Backoff::new(BASE_DELAY_MS, MAX_DELAY_MS).jitter(Jitter::Under(0.5));

/// A retry delay function: attempt number (1 for the first failure) to
/// milliseconds.
pub type DelayFn = Arc<dyn Fn(u32) -> f64 + Send + Sync>;

/// How failed attempts are retried.
#[derive(Clone, Default)]
pub struct RetryPolicy {
    /// A custom delay; the default is jittered exponential backoff.
    pub delay: Option<DelayFn>,
    /// Stop after this many attempts (then dead-letter or drop). `None`, the
    /// default, retries forever.
    pub max_attempts: Option<u32>,
    /// The random source of the default backoff's jitter (the operating
    /// system's by default; tests seed or fix it).
    pub jitter: Random,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("delay", &self.delay.as_ref().map(|_| "custom"))
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

/// The default backoff before attempt `attempt + 1`: `min(5 min, 1 s ·
/// 2^(attempt-1))`, scaled by a factor drawn uniformly from `[0.5, 1)`.
pub fn default_delay_ms(attempt: u32, unit_random: f64) -> f64 {
    DEFAULT_BACKOFF.delay_for_unit(attempt, unit_random)
}

impl RetryPolicy {
    /// The delay after the `attempt`-th failed attempt, validated: `Err`
    /// names why a custom delay was rejected.
    pub(crate) fn delay_ms(&self, attempt: u32, now: i64) -> Result<i64, String> {
        let ms = match &self.delay {
            Some(delay) => delay(attempt),
            None => default_delay_ms(attempt, self.jitter.unit()),
        };
        check_delay(ms, now)
    }
}

/// Validates a delay in milliseconds against the time it starts from.
pub(crate) fn check_delay(ms: f64, now: i64) -> Result<i64, String> {
    if !ms.is_finite() {
        return Err(format!("delay {ms} is not finite"));
    }
    if ms < 0.0 {
        return Err(format!("delay {ms} is negative"));
    }
    let ms = ms.ceil();
    #[allow(clippy::cast_precision_loss)]
    let room = (MAX_SAFE_INTEGER - now.max(0)) as f64;
    if ms > room {
        return Err(format!("delay {ms} pushes the due time past 2^53-1"));
    }
    #[allow(clippy::cast_possible_truncation)]
    Ok(ms as i64)
}

/// Validates an attempt timeout: `1..=2^31-1` ms.
pub(crate) fn check_timeout(ms: u64) -> Result<u64, OutboxError> {
    check_one_to("attempt_timeout_ms", ms, MAX_ATTEMPT_TIMEOUT_MS)
}

/// Validates a batch size: `1..=1000`.
pub(crate) fn check_batch(n: usize) -> Result<usize, OutboxError> {
    check_one_to("batch_size", n, MAX_BATCH_SIZE)
}

/// `value` when it is in `1..=max`; otherwise the policy error for `field`.
fn check_one_to<T>(field: &'static str, value: T, max: T) -> Result<T, OutboxError>
where
    T: Copy + PartialOrd + From<u8> + fmt::Display,
{
    if value < T::from(1) || value > max {
        return Err(OutboxError::InvalidPolicy {
            field,
            reason: format!("must be in 1..={max}, got {value}"),
        });
    }
    Ok(value)
}
