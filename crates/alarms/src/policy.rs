//! Limits, defaults and the retry policy (seed 003's `WORKFLOWS_DO_ALARM_*`
//! settings).

use durability_time::{Backoff, Jitter, Random};

use crate::error::AlarmError;

/// Default number of tries before a failing alarm is discarded.
pub const DEFAULT_MAX_TRIES: u32 = 6;
/// Default first retry delay.
pub const DEFAULT_RETRY_DELAY_MS: i64 = 1_000;
/// Default cap on a retry delay.
pub const DEFAULT_RETRY_MAX_DELAY_MS: i64 = 300_000;
/// Default jitter: each delay is drawn from `d * (1 ± jitter)`.
pub const DEFAULT_RETRY_JITTER: f64 = 0.2;
/// Default claim lease (five minutes).
pub const DEFAULT_CLAIM_LEASE_MS: i64 = 300_000;
/// Default dispatch timeout; the claim lease is always kept above it.
pub const DEFAULT_DISPATCH_TIMEOUT_MS: i64 = 60_000;
/// The deadline of one alarm mutation against the backend.
pub const MUTATION_DEADLINE_MS: i64 = 5_000;
/// The deadline for reading a dispatch response body.
pub const RESPONSE_DEADLINE_MS: i64 = 5_000;
/// The cap on a dispatch response body.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024;
/// Jobs promoted per index call.
pub const DEFAULT_PROMOTE_BATCH: usize = 1_024;
/// Default cap on how long a delivery refused by a remote owner waits for
/// that owner's lease (`DispatcherConfig::owner_wait_max_ms`).
pub const DEFAULT_OWNER_WAIT_MAX_MS: i64 = 30_000;
/// Default interval of the per-object, per-outcome log rate limit.
pub const DEFAULT_LOG_INTERVAL_MS: i64 = 10_000;
/// The longest delay or lease accepted (2^31-1 ms).
pub const MAX_DELAY_MS: i64 = i32::MAX as i64;

/// Exponential backoff with jitter and a maximum number of tries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Delay after the first failed try (ms, > 0).
    pub base_delay_ms: i64,
    /// Cap on the delay before jitter (ms, ≥ base).
    pub max_delay_ms: i64,
    /// Jitter fraction in `0.0..=1.0`.
    pub jitter: f64,
    /// Tries before the alarm is discarded (≥ 1).
    pub max_tries: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base_delay_ms: DEFAULT_RETRY_DELAY_MS,
            max_delay_ms: DEFAULT_RETRY_MAX_DELAY_MS,
            jitter: DEFAULT_RETRY_JITTER,
            max_tries: DEFAULT_MAX_TRIES,
        }
    }
}

impl RetryPolicy {
    /// Checks every field.
    ///
    /// # Errors
    /// [`AlarmError::InvalidConfig`] naming the bad field.
    pub fn validate(&self) -> Result<(), AlarmError> {
        let bad = |reason: &str| {
            Err(AlarmError::InvalidConfig {
                reason: reason.to_owned(),
            })
        };
        if !(1..=MAX_DELAY_MS).contains(&self.base_delay_ms) {
            return bad("retry base delay must be in 1..=2^31-1 ms");
        }
        if !(self.base_delay_ms..=MAX_DELAY_MS).contains(&self.max_delay_ms) {
            return bad("retry max delay must be in base..=2^31-1 ms");
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return bad("retry jitter must be in 0.0..=1.0");
        }
        if self.max_tries == 0 {
            return bad("max tries must be at least 1");
        }
        Ok(())
    }

    /// The backoff this policy computes through: `base · 2^(tries-1)`
    /// capped at `max_delay_ms`, spread by `± jitter`, `max_tries` tries.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(self.base_delay_ms, self.max_delay_ms)
            .jitter(Jitter::Around(self.jitter))
            .max_tries(self.max_tries)
    }

    /// The delay before jitter after the `tries`-th failed try.
    pub fn base_delay(&self, tries: u32) -> i64 {
        self.backoff().ceiling_ms(tries)
    }

    /// The inclusive bounds a jittered delay after the `tries`-th failed try
    /// falls in (never above 2^31-1 ms).
    pub fn bounds(&self, tries: u32) -> (i64, i64) {
        let (lo, hi) = self.backoff().bounds(tries);
        (lo, hi.min(MAX_DELAY_MS))
    }

    /// A jittered delay after the `tries`-th failed try, drawn from `random`.
    pub fn delay_ms(&self, tries: u32, random: &Random) -> i64 {
        let (lo, hi) = self.bounds(tries);
        random.range_inclusive(lo, hi)
    }
}

/// The dispatcher's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DispatcherConfig {
    /// Retry policy for definite failures.
    pub retry: RetryPolicy,
    /// Claim lease; raised to `dispatch_timeout_ms + 1` when below it.
    pub claim_lease_ms: i64,
    /// How long one dispatch may run before its outcome counts as unknown.
    pub dispatch_timeout_ms: i64,
    /// Jobs promoted per index call.
    pub promote_batch: usize,
    /// Longest sleep of [`crate::Dispatcher::run`] between ticks (other
    /// hosts may add jobs).
    pub poll_ms: i64,
    /// Shortest pause between ticks of [`crate::Dispatcher::run`] when work
    /// is already due (an immediate retry must not spin).
    pub idle_ms: i64,
    /// Longest wait before retrying a delivery that never started because
    /// another task holds the owner lease (the wait is that lease's time
    /// left, capped here): a dead owner's scope is retried when its lease
    /// can be taken over, not in a hot loop.
    pub owner_wait_max_ms: i64,
    /// Repeated never-started and owner-elsewhere lines are logged at most
    /// once per object and outcome per this interval (the next line counts
    /// the suppressed ones).
    pub log_interval_ms: i64,
    /// Seed of the jitter RNG (`None`: from the OS).
    pub seed: Option<u64>,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            claim_lease_ms: DEFAULT_CLAIM_LEASE_MS,
            dispatch_timeout_ms: DEFAULT_DISPATCH_TIMEOUT_MS,
            promote_batch: DEFAULT_PROMOTE_BATCH,
            poll_ms: 1_000,
            idle_ms: 100,
            owner_wait_max_ms: DEFAULT_OWNER_WAIT_MAX_MS,
            log_interval_ms: DEFAULT_LOG_INTERVAL_MS,
            seed: None,
        }
    }
}

impl DispatcherConfig {
    /// Checks every field.
    ///
    /// # Errors
    /// [`AlarmError::InvalidConfig`] naming the bad field.
    pub fn validate(&self) -> Result<(), AlarmError> {
        self.retry.validate()?;
        let bad = |reason: &str| {
            Err(AlarmError::InvalidConfig {
                reason: reason.to_owned(),
            })
        };
        if !(1..MAX_DELAY_MS).contains(&self.dispatch_timeout_ms) {
            return bad("dispatch timeout must be in 1..2^31-1 ms");
        }
        if !(1..=MAX_DELAY_MS).contains(&self.claim_lease_ms) {
            return bad("claim lease must be in 1..=2^31-1 ms");
        }
        if self.promote_batch == 0 || self.promote_batch > 100_000 {
            return bad("promote batch must be in 1..=100000");
        }
        if !(1..=MAX_DELAY_MS).contains(&self.poll_ms)
            || !(0..=MAX_DELAY_MS).contains(&self.idle_ms)
        {
            return bad("poll and idle intervals must be in range");
        }
        if !(0..=MAX_DELAY_MS).contains(&self.owner_wait_max_ms) {
            return bad("owner wait cap must be in 0..=2^31-1 ms");
        }
        if !(0..=MAX_DELAY_MS).contains(&self.log_interval_ms) {
            return bad("log interval must be in 0..=2^31-1 ms");
        }
        Ok(())
    }

    /// The claim lease actually used: always above the dispatch timeout.
    pub fn effective_lease_ms(&self) -> i64 {
        self.claim_lease_ms.max(self.dispatch_timeout_ms + 1)
    }
}
