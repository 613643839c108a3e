//! Limits, defaults and the retry policy (the `WORKFLOWS_DO_ALARM_*`
//! settings).
//!
//! [`DispatcherConfig::from_env`] reads the seed's variables:
//! `WORKFLOWS_DO_ALARM_RETRY_DELAY_MS` (first retry delay, default 1000),
//! `WORKFLOWS_DO_ALARM_RETRY_MAX_DELAY_MS` (cap, default 300000),
//! `WORKFLOWS_DO_ALARM_RETRY_JITTER` (a decimal in `0..=1`, default 0.2),
//! `WORKFLOWS_DO_ALARM_RETRY_MAX_TRIES` (default 6),
//! `WORKFLOWS_DO_ALARM_CLAIM_LEASE_MS` (default 300000) and
//! `WORKFLOWS_DISPATCH_TIMEOUT_MS` (default 60000). Durations and counts are
//! canonical positive decimals of at most 2^31-1 (ms); a value that breaks
//! the rule falls back to its default with a `durability.alarms.setting_fallback`
//! warning naming the variable, as the `DO_*` settings do. A cap below the
//! first delay is raised to it (also logged); the claim lease is kept above
//! the dispatch timeout as [`DispatcherConfig::effective_lease_ms`] says.

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
/// Default number of deliveries one dispatcher runs at once.
pub const DEFAULT_CONCURRENCY: usize = 32;
/// Default time a stopping dispatcher gives its in-flight deliveries to
/// finish before it releases their claims (the
/// `DO_DRAIN_IN_FLIGHT_TIMEOUT_MS` default).
pub const DEFAULT_STOP_GRACE_MS: i64 = 8_000;
/// The default owner lease (`DO_OWNER_TTL_SECONDS` falls back to 120).
pub const SEED_OWNER_TTL_MS: i64 = 120_000;
/// Default interval of the per-object, per-outcome log rate limit.
pub const DEFAULT_LOG_INTERVAL_MS: i64 = 10_000;
/// The longest delay or lease accepted (2^31-1 ms).
pub const MAX_DELAY_MS: i64 = i32::MAX as i64;

/// Variable of the first retry delay in milliseconds.
pub const ENV_RETRY_DELAY_MS: &str = "WORKFLOWS_DO_ALARM_RETRY_DELAY_MS";
/// Variable of the retry delay cap in milliseconds.
pub const ENV_RETRY_MAX_DELAY_MS: &str = "WORKFLOWS_DO_ALARM_RETRY_MAX_DELAY_MS";
/// Variable of the retry jitter fraction (`0..=1`).
pub const ENV_RETRY_JITTER: &str = "WORKFLOWS_DO_ALARM_RETRY_JITTER";
/// Variable of the tries before an alarm is discarded.
pub const ENV_RETRY_MAX_TRIES: &str = "WORKFLOWS_DO_ALARM_RETRY_MAX_TRIES";
/// Variable of the claim lease in milliseconds.
pub const ENV_CLAIM_LEASE_MS: &str = "WORKFLOWS_DO_ALARM_CLAIM_LEASE_MS";
/// Variable of the dispatch timeout in milliseconds.
pub const ENV_DISPATCH_TIMEOUT_MS: &str = "WORKFLOWS_DISPATCH_TIMEOUT_MS";

/// Logs that `setting` held an unusable `value` and `fallback` is used.
fn fallback<T: std::fmt::Display>(setting: &str, value: &str, fallback: T, why: &str) -> T {
    tracing::warn!(
        event = "durability.alarms.setting_fallback",
        setting,
        value,
        fallback = %fallback,
        "{why}, using the default"
    );
    fallback
}

/// A positive millisecond or count setting (`1..=2^31-1`), else `default`.
fn positive(lookup: &impl Fn(&str) -> Option<String>, name: &str, default: i64) -> i64 {
    let Some(raw) = lookup(name) else {
        return default;
    };
    durability_time::parse_canonical_positive(&raw, MAX_DELAY_MS.unsigned_abs())
        .and_then(|v| i64::try_from(v).ok())
        .unwrap_or_else(|| fallback(name, &raw, default, "invalid setting"))
}

/// The jitter fraction, a finite decimal in `0..=1`, else `default`.
fn jitter(lookup: &impl Fn(&str) -> Option<String>, default: f64) -> f64 {
    let Some(raw) = lookup(ENV_RETRY_JITTER) else {
        return default;
    };
    let plain =
        !raw.is_empty() && raw.len() <= 32 && raw.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    raw.parse::<f64>()
        .ok()
        .filter(|j| plain && (0.0..=1.0).contains(j))
        .unwrap_or_else(|| fallback(ENV_RETRY_JITTER, &raw, default, "invalid setting"))
}

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
    /// Deliveries one dispatcher runs at once (at most one per object);
    /// claims are taken in batches of up to this many.
    pub concurrency: usize,
    /// How long [`crate::Dispatcher::stop`] lets in-flight deliveries finish
    /// before it cancels them and releases their claims.
    pub stop_grace_ms: i64,
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
            concurrency: DEFAULT_CONCURRENCY,
            stop_grace_ms: DEFAULT_STOP_GRACE_MS,
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
        if self.concurrency == 0 || self.concurrency > 10_000 {
            return bad("concurrency must be in 1..=10000");
        }
        if !(0..=MAX_DELAY_MS).contains(&self.stop_grace_ms) {
            return bad("stop grace must be in 0..=2^31-1 ms");
        }
        Ok(())
    }

    /// The defaults with the seed's `WORKFLOWS_*` variables applied, read
    /// through `lookup` (for example `|k| std::env::var(k).ok()`). An
    /// invalid value falls back to its default with a warning; a cap below
    /// the first delay is raised to it, also with a warning. The result
    /// always passes [`DispatcherConfig::validate`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let defaults = Self::default();
        let base_delay_ms = positive(&lookup, ENV_RETRY_DELAY_MS, defaults.retry.base_delay_ms);
        let mut max_delay_ms =
            positive(&lookup, ENV_RETRY_MAX_DELAY_MS, defaults.retry.max_delay_ms);
        if max_delay_ms < base_delay_ms {
            max_delay_ms = fallback(
                ENV_RETRY_MAX_DELAY_MS,
                &max_delay_ms.to_string(),
                base_delay_ms,
                "retry cap below the first delay",
            );
        }
        let max_tries = positive(
            &lookup,
            ENV_RETRY_MAX_TRIES,
            i64::from(defaults.retry.max_tries),
        );
        Self {
            retry: RetryPolicy {
                base_delay_ms,
                max_delay_ms,
                jitter: jitter(&lookup, defaults.retry.jitter),
                max_tries: u32::try_from(max_tries).unwrap_or(defaults.retry.max_tries),
            },
            claim_lease_ms: positive(&lookup, ENV_CLAIM_LEASE_MS, defaults.claim_lease_ms),
            dispatch_timeout_ms: positive(
                &lookup,
                ENV_DISPATCH_TIMEOUT_MS,
                defaults.dispatch_timeout_ms,
            )
            .min(MAX_DELAY_MS - 1),
            ..defaults
        }
    }

    /// [`DispatcherConfig::from_lookup`] over the process environment.
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The claim lease actually used: always above the dispatch timeout.
    pub fn effective_lease_ms(&self) -> i64 {
        self.claim_lease_ms.max(self.dispatch_timeout_ms + 1)
    }

    /// A faster failover profile, for deployments whose alarm handlers are
    /// short: claim lease 30 s, dispatch timeout 10 s, poll 200 ms (idle
    /// 20 ms), first retry after 250 ms capped at 30 s, owner wait capped at
    /// 5 s; tries, jitter, batch sizes and concurrency as the defaults. Pair
    /// it with a short owner lease (`OwnershipSettings::owner_ttl_ms`, for
    /// example 15 s): the failover budget is then 15 s + 30 s + 0.2 s ≈ 45 s
    /// instead of the defaults' 120 s + 300 s + 1 s ≈ 7 minutes.
    ///
    /// The trade-off: a handler running longer than 10 s counts as outcome
    /// unknown (its claim is held until the lease runs out); one running
    /// longer than 30 s may overlap its own redelivery (alarm bodies are
    /// at-least-once); the index is polled five times a second per
    /// dispatcher; and a short owner lease needs renewals that keep up
    /// (a renewal stall of one lease period moves ownership).
    pub fn fast() -> Self {
        Self {
            retry: RetryPolicy {
                base_delay_ms: 250,
                max_delay_ms: 30_000,
                ..RetryPolicy::default()
            },
            claim_lease_ms: 30_000,
            dispatch_timeout_ms: 10_000,
            poll_ms: 200,
            idle_ms: 20,
            owner_wait_max_ms: 5_000,
            ..Self::default()
        }
    }

    /// The worst-case time before another host delivers an alarm whose
    /// claim was held by a host that died (it cannot release it), given the
    /// owner lease `owner_ttl_ms`: the dead owner's lease runs out, the
    /// claim lease runs out, and a dispatcher's next poll finds the job.
    /// A job not claimed when its host died waits only for the owner lease
    /// and a poll; a host that stops gracefully releases its claims, so its
    /// jobs move at once.
    pub fn failover_budget_ms(&self, owner_ttl_ms: i64) -> i64 {
        owner_ttl_ms
            .saturating_add(self.effective_lease_ms())
            .saturating_add(self.poll_ms)
    }
}

#[cfg(test)]
mod tests;
