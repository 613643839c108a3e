//! Settings of the ownership layer, parsed from `DO_*` variables.
//!
//! `DO_OWNER_TTL_SECONDS` is a canonical positive decimal of at most
//! 9007199254740 seconds (else 120 s); `DO_DRAIN_TIMEOUT_MS` a canonical
//! positive decimal of at most 2^53-1 ms (else 10000); `DO_OWNER_LEASE_GUARD_MS`
//! (default 1000) and `DO_DRAIN_IN_FLIGHT_TIMEOUT_MS` (default 8000) follow the
//! same safe-integer rule. Every fallback is logged.

use crate::scope::{MAX_SAFE_INTEGER, ShardCount};

/// Environment variable of the owner lease TTL in seconds.
pub const ENV_OWNER_TTL_SECONDS: &str = "DO_OWNER_TTL_SECONDS";
/// Environment variable of the lease guard in milliseconds.
pub const ENV_OWNER_LEASE_GUARD_MS: &str = "DO_OWNER_LEASE_GUARD_MS";
/// Environment variable of the drain in-flight wait in milliseconds.
pub const ENV_DRAIN_IN_FLIGHT_TIMEOUT_MS: &str = "DO_DRAIN_IN_FLIGHT_TIMEOUT_MS";
/// Environment variable of the supervisor-side drain timeout in milliseconds.
pub const ENV_DRAIN_TIMEOUT_MS: &str = "DO_DRAIN_TIMEOUT_MS";

/// Default owner lease TTL in seconds.
pub const DEFAULT_OWNER_TTL_SECONDS: u64 = 120;
/// Largest owner lease TTL in seconds (its milliseconds stay a safe integer).
pub const MAX_OWNER_TTL_SECONDS: u64 = 9_007_199_254_740;
/// Default lease guard in milliseconds.
pub const DEFAULT_LEASE_GUARD_MS: u64 = 1000;
/// Default drain in-flight wait in milliseconds.
pub const DEFAULT_DRAIN_IN_FLIGHT_TIMEOUT_MS: u64 = 8000;
/// Default supervisor-side drain timeout in milliseconds.
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 10_000;

pub use durability_time::parse_canonical_positive;

fn setting(name: &'static str, raw: Option<&str>, max: u64, default: u64) -> u64 {
    match raw {
        None => default,
        Some(raw) => parse_canonical_positive(raw, max).unwrap_or_else(|| {
            tracing::warn!(
                event = "durability.ownership.setting_fallback",
                setting = name,
                value = raw,
                fallback = default,
                "invalid setting, using the default"
            );
            default
        }),
    }
}

/// The owner lease TTL in milliseconds from a raw `DO_OWNER_TTL_SECONDS`.
pub fn owner_ttl_ms(raw: Option<&str>) -> u64 {
    setting(
        ENV_OWNER_TTL_SECONDS,
        raw,
        MAX_OWNER_TTL_SECONDS,
        DEFAULT_OWNER_TTL_SECONDS,
    ) * 1000
}

/// The supervisor drain timeout in milliseconds from a raw `DO_DRAIN_TIMEOUT_MS`.
pub fn drain_timeout_ms(raw: Option<&str>) -> u64 {
    setting(
        ENV_DRAIN_TIMEOUT_MS,
        raw,
        MAX_SAFE_INTEGER,
        DEFAULT_DRAIN_TIMEOUT_MS,
    )
}

/// How [`crate::Ownership::admit`] checks a dispatch before admitting it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Admission {
    /// The owner-side assertion (the default): every admission first
    /// reads the owner record, generation, active storage pointer, whole-delete
    /// lock and the store's clock in one snapshot (one store round trip), and
    /// refuses the work when the record is not exactly this task's, the
    /// pointer moved or a whole-delete lock is held. A delete lock or pointer
    /// move is seen by the very next admission.
    #[default]
    Snapshot,
    /// No I/O with ample budget: admission trusts the last claim, renew or
    /// snapshot of the scope and checks only the task, the generation and the
    /// local lease budget. It accepts staleness: a whole-delete lock, a
    /// storage pointer move, or an owner record removed or replaced on the
    /// store before its lease ran out, written since the last successful
    /// claim, renew or snapshot, is not seen until the next renew (the
    /// supervisor's periodic renew, the lease-guard renew below
    /// `lease_guard_ms`, or the watchdog's). Until then, for up to one lease
    /// TTL (`owner_ttl_ms`, 120 s by default), work keeps being admitted for
    /// a deleted or moved storage. A lease that ran out on the store is never
    /// trusted: the local deadline is never later than the store's expiry.
    /// Commits of a fenced object database are still refused for a stale
    /// generation (`check_generation` in `durability-storage-sqlite`).
    Cached,
}

/// Settings of [`crate::Ownership`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnershipSettings {
    /// Owner lease TTL in milliseconds.
    pub owner_ttl_ms: u64,
    /// Remaining lease budget below which admission renews first, and how long
    /// before expiry the watchdog rechecks ownership.
    pub lease_guard_ms: u64,
    /// How long a drain waits for admitted work before giving up.
    pub drain_in_flight_timeout_ms: u64,
    /// The supervisor's bound on the whole drain call.
    pub drain_timeout_ms: u64,
    /// Shards per class.
    pub shard_count: ShardCount,
    /// How admission checks a dispatch ([`Admission::Snapshot`] by default).
    pub admission: Admission,
}

impl Default for OwnershipSettings {
    fn default() -> Self {
        Self {
            owner_ttl_ms: DEFAULT_OWNER_TTL_SECONDS * 1000,
            lease_guard_ms: DEFAULT_LEASE_GUARD_MS,
            drain_in_flight_timeout_ms: DEFAULT_DRAIN_IN_FLIGHT_TIMEOUT_MS,
            drain_timeout_ms: DEFAULT_DRAIN_TIMEOUT_MS,
            shard_count: ShardCount::default(),
            admission: Admission::default(),
        }
    }
}

impl OwnershipSettings {
    /// Settings from a variable lookup (for example `|k| std::env::var(k).ok()`);
    /// invalid values fall back to their defaults with a warning. A guard not
    /// below the TTL is clamped to half the TTL, also with a warning.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| lookup(k);
        let owner_ttl_ms = owner_ttl_ms(get(ENV_OWNER_TTL_SECONDS).as_deref());
        let mut lease_guard_ms = setting(
            ENV_OWNER_LEASE_GUARD_MS,
            get(ENV_OWNER_LEASE_GUARD_MS).as_deref(),
            MAX_SAFE_INTEGER,
            DEFAULT_LEASE_GUARD_MS,
        );
        if lease_guard_ms >= owner_ttl_ms {
            let clamped = owner_ttl_ms / 2;
            tracing::warn!(
                event = "durability.ownership.setting_fallback",
                setting = ENV_OWNER_LEASE_GUARD_MS,
                value = lease_guard_ms,
                fallback = clamped,
                "lease guard not below the owner TTL, using half the TTL"
            );
            lease_guard_ms = clamped;
        }
        Self {
            owner_ttl_ms,
            lease_guard_ms,
            drain_in_flight_timeout_ms: setting(
                ENV_DRAIN_IN_FLIGHT_TIMEOUT_MS,
                get(ENV_DRAIN_IN_FLIGHT_TIMEOUT_MS).as_deref(),
                MAX_SAFE_INTEGER,
                DEFAULT_DRAIN_IN_FLIGHT_TIMEOUT_MS,
            ),
            drain_timeout_ms: drain_timeout_ms(get(ENV_DRAIN_TIMEOUT_MS).as_deref()),
            shard_count: ShardCount::default(),
            admission: Admission::default(),
        }
    }

    /// Settings from the process environment.
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests;
