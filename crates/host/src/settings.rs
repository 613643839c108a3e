//! The host's settings: the `DO_*` variables, read from the
//! environment (or any lookup) or set in code.
//!
//! The ownership variables (`DO_OWNER_TTL_SECONDS`, `DO_OWNER_LEASE_GUARD_MS`,
//! `DO_DRAIN_IN_FLIGHT_TIMEOUT_MS`, `DO_DRAIN_TIMEOUT_MS`) are parsed by
//! `durability-ownership` ([`OwnershipSettings::from_lookup`]): an invalid
//! value falls back to its default with a logged warning
//! (`DO_OWNER_TTL_SECONDS` → 120 s, `DO_DRAIN_TIMEOUT_MS` → 10000 ms).
//! `DO_PREVENT_EVICTION` is the host's: unset or exactly `true` selects the
//! resident mode, exactly `false` the evictable mode, and any other value
//! refuses to start ([`HostError::InvalidSetting`]) before anything
//! runs. The alarm dispatcher's `WORKFLOWS_DO_ALARM_RETRY_DELAY_MS`,
//! `_RETRY_MAX_DELAY_MS`, `_RETRY_JITTER`, `_RETRY_MAX_TRIES`,
//! `WORKFLOWS_DO_ALARM_CLAIM_LEASE_MS` and `WORKFLOWS_DISPATCH_TIMEOUT_MS`
//! are parsed by `durability-alarms` ([`DispatcherConfig::from_lookup`]),
//! with the same logged fallback.

use durability_alarms::DispatcherConfig;
use durability_ownership::OwnershipSettings;

use crate::error::HostError;

/// Environment variable naming the PostgreSQL database that holds a host's
/// objects, leases and alarm jobs (`postgres://user:password@host/db`;
/// see [`DatabaseSettings`]). Unset: the host's own choice of stores.
pub const ENV_DATABASE_URL: &str = "DO_DATABASE_URL";

/// Environment variable naming the schema of [`ENV_DATABASE_URL`]'s
/// tables (default [`DEFAULT_DATABASE_SCHEMA`]).
pub const ENV_DATABASE_SCHEMA: &str = "DO_DATABASE_SCHEMA";

/// Environment variable: how long (ms, a positive integer) a host on
/// PostgreSQL waits for a `COMMIT`'s reply before the call's outcome is
/// unknown (default 10000, `PostgresObjectOptions::commit_timeout`).
pub const ENV_DATABASE_COMMIT_TIMEOUT_MS: &str = "DO_DATABASE_COMMIT_TIMEOUT_MS";

/// The schema of the PostgreSQL stores when `DO_DATABASE_SCHEMA` is unset.
pub const DEFAULT_DATABASE_SCHEMA: &str = "durability";

/// Where a host on PostgreSQL alone keeps everything: one database URL and
/// one schema (`[a-z_][a-z0-9_]*`, at most 40 bytes, checked when the
/// stores connect). Every host of a deployment names the same database and
/// schema; none needs a directory shared with another.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseSettings {
    url: String,
    schema: String,
    commit_timeout_ms: Option<u64>,
}

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may hold a password.
        f.debug_struct("DatabaseSettings")
            .field("schema", &self.schema)
            .field("commit_timeout_ms", &self.commit_timeout_ms)
            .finish_non_exhaustive()
    }
}

impl DatabaseSettings {
    /// The database at `url`, tables in `schema`.
    pub fn new(url: &str, schema: &str) -> Self {
        Self {
            url: url.to_owned(),
            schema: schema.to_owned(),
            commit_timeout_ms: None,
        }
    }

    /// These settings with a commit deadline of `ms` milliseconds (see
    /// [`ENV_DATABASE_COMMIT_TIMEOUT_MS`]).
    #[must_use]
    pub fn with_commit_timeout_ms(mut self, ms: u64) -> Self {
        self.commit_timeout_ms = Some(ms);
        self
    }

    /// The commit deadline, when set (else the object store's default).
    pub fn commit_timeout_ms(&self) -> Option<u64> {
        self.commit_timeout_ms
    }

    /// `DO_DATABASE_URL`, `DO_DATABASE_SCHEMA` and
    /// `DO_DATABASE_COMMIT_TIMEOUT_MS` from a variable lookup: `None` when
    /// the URL is unset.
    ///
    /// # Errors
    /// [`HostError::InvalidSetting`] for a URL that is not `postgres://` or
    /// `postgresql://`, an empty schema, or a commit deadline that is not a
    /// positive integer.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, HostError> {
        let Some(url) = lookup(ENV_DATABASE_URL) else {
            return Ok(None);
        };
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(HostError::setting(
                ENV_DATABASE_URL,
                "must be a postgres:// or postgresql:// URL",
            ));
        }
        let schema =
            lookup(ENV_DATABASE_SCHEMA).unwrap_or_else(|| DEFAULT_DATABASE_SCHEMA.to_owned());
        if schema.is_empty() {
            return Err(HostError::setting(ENV_DATABASE_SCHEMA, "is empty"));
        }
        let commit_timeout_ms = match lookup(ENV_DATABASE_COMMIT_TIMEOUT_MS) {
            None => None,
            Some(raw) => match raw.parse::<u64>() {
                Ok(ms) if ms > 0 => Some(ms),
                _ => {
                    return Err(HostError::setting(
                        ENV_DATABASE_COMMIT_TIMEOUT_MS,
                        "must be a positive integer (milliseconds)",
                    ));
                }
            },
        };
        Ok(Some(Self {
            url,
            schema,
            commit_timeout_ms,
        }))
    }

    /// As [`DatabaseSettings::from_lookup`], from the process environment.
    ///
    /// # Errors
    /// As [`DatabaseSettings::from_lookup`].
    pub fn from_env() -> Result<Option<Self>, HostError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The database URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema.
    pub fn schema(&self) -> &str {
        &self.schema
    }
}

/// Environment variable selecting the residency mode.
pub const ENV_PREVENT_EVICTION: &str = "DO_PREVENT_EVICTION";
/// Environment variable: `false` turns shard balancing off (default `true`).
pub const ENV_BALANCE_SHARDS: &str = "DO_BALANCE_SHARDS";

/// Default idle time after which the evictable mode closes an object (the
/// upstream runtime's "about 10 seconds of inactivity"; not an SLA).
pub const DEFAULT_EVICTION_IDLE_MS: u64 = 10_000;

/// Bound of the host's advisory caches (10,000 entries).
pub const ADVISORY_CACHE_ENTRIES: usize = 10_000;

/// Default bound on the objects the resident mode keeps open (each holds a
/// connection and, on SQLite, file descriptors): past it, each owner-loop
/// cycle closes the least recently used idle objects.
pub const DEFAULT_MAX_RESIDENT_OBJECTS: usize = 10_000;

/// Whether idle objects stay open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Residency {
    /// Objects stay open while their scope is owned (`DO_PREVENT_EVICTION`
    /// unset or `true`; the default).
    #[default]
    Resident,
    /// Idle objects are closed and reopened on the next call, which is
    /// counted as a cold dispatch (`DO_PREVENT_EVICTION=false`).
    Evictable,
}

impl Residency {
    /// The mode's name in events and the probe.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Resident => "resident",
            Self::Evictable => "evictable",
        }
    }

    /// Parses a raw `DO_PREVENT_EVICTION`.
    ///
    /// # Errors
    /// [`HostError::InvalidSetting`] for anything but unset, `true` or `false`.
    pub fn parse(raw: Option<&str>) -> Result<Self, HostError> {
        match raw {
            None | Some("true") => Ok(Self::Resident),
            Some("false") => Ok(Self::Evictable),
            Some(other) => Err(HostError::setting(
                ENV_PREVENT_EVICTION,
                format!("{other:?} is neither \"true\" nor \"false\""),
            )),
        }
    }
}

/// Everything the host's loops are tuned by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostSettings {
    /// Leases, guard, drain budgets, shard count, admission mode.
    pub ownership: OwnershipSettings,
    /// The alarm dispatcher: retries, claim lease, dispatch timeout (its
    /// `stop_grace_ms` is capped at the drain's in-flight timeout).
    pub alarms: DispatcherConfig,
    /// Resident (default) or evictable.
    pub residency: Residency,
    /// Idle time before the evictable mode closes an object.
    pub eviction_idle_ms: u64,
    /// The most objects the resident mode keeps open (default
    /// [`DEFAULT_MAX_RESIDENT_OBJECTS`]): each owner-loop cycle closes the
    /// least recently used objects with no work in flight beyond it. Closing
    /// drops only in-memory state (the object's instance and its open
    /// storage handle); the next call reopens it from storage, fenced, with
    /// every pending alarm, outbox entry and row intact, and counts as cold.
    pub max_resident_objects: usize,
    /// Period of the owner loop (renew, claim, evict); `None`: a third of
    /// the owner TTL. Must be below the TTL minus the lease guard.
    pub renew_interval_ms: Option<u64>,
    /// Balanced ownership ([`crate::OwnPolicy::AllShards`] only; default
    /// `true`, `DO_BALANCE_SHARDS=false` turns it off): the live hosts of a
    /// class converge to an even share of its shards, a joining host gets
    /// its share by graceful hand-off, a dead host's shards spread over the
    /// survivors (`durability_ownership::balance`). Off, every host claims
    /// whichever shard is free.
    pub balance: bool,
}

impl Default for HostSettings {
    fn default() -> Self {
        Self {
            ownership: OwnershipSettings::default(),
            alarms: DispatcherConfig::default(),
            residency: Residency::default(),
            eviction_idle_ms: DEFAULT_EVICTION_IDLE_MS,
            max_resident_objects: DEFAULT_MAX_RESIDENT_OBJECTS,
            renew_interval_ms: None,
            balance: true,
        }
    }
}

impl HostSettings {
    /// Settings from a variable lookup (for example `|k| std::env::var(k).ok()`).
    ///
    /// # Errors
    /// [`HostError::InvalidSetting`] for a bad `DO_PREVENT_EVICTION`; the
    /// ownership variables fall back with a logged warning instead.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, HostError> {
        let residency = Residency::parse(lookup(ENV_PREVENT_EVICTION).as_deref())?;
        let balance = match lookup(ENV_BALANCE_SHARDS).as_deref() {
            None | Some("true") => true,
            Some("false") => false,
            Some(other) => {
                return Err(HostError::setting(
                    ENV_BALANCE_SHARDS,
                    format!("{other:?} is neither \"true\" nor \"false\""),
                ));
            }
        };
        Ok(Self {
            balance,
            ownership: OwnershipSettings::from_lookup(&lookup),
            alarms: DispatcherConfig::from_lookup(&lookup),
            residency,
            ..Self::default()
        })
    }

    /// Settings from the process environment.
    ///
    /// # Errors
    /// As [`HostSettings::from_lookup`].
    pub fn from_env() -> Result<Self, HostError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The owner loop's period.
    pub fn renew_interval(&self) -> u64 {
        self.renew_interval_ms
            .unwrap_or(self.ownership.owner_ttl_ms / 3)
            .max(1)
    }

    /// How long a dead host's shards may stay unowned: its lease runs out
    /// (the owner TTL, on the store's clock), then a survivor claims them
    /// at its next owner-loop cycle (one renew interval). Logged at start
    /// (`durability.host.residency_configured`) and shown by the probe.
    pub fn failover_budget_ms(&self) -> u64 {
        self.ownership
            .owner_ttl_ms
            .saturating_add(self.renew_interval())
    }

    /// Checks the settings set in code.
    ///
    /// # Errors
    /// [`HostError::InvalidSetting`] naming the field.
    pub fn validate(&self) -> Result<(), HostError> {
        let o = &self.ownership;
        if o.owner_ttl_ms == 0 || o.owner_ttl_ms > durability_ownership::MAX_SAFE_INTEGER {
            return Err(HostError::setting(
                "owner_ttl_ms",
                "must be in 1..=2^53-1 ms",
            ));
        }
        if o.lease_guard_ms >= o.owner_ttl_ms {
            return Err(HostError::setting(
                "lease_guard_ms",
                "must be below the owner TTL",
            ));
        }
        if o.drain_timeout_ms == 0 || o.drain_in_flight_timeout_ms == 0 {
            return Err(HostError::setting(
                "drain_timeout_ms",
                "drain timeouts must be positive",
            ));
        }
        let interval = self.renew_interval();
        if interval >= o.owner_ttl_ms.saturating_sub(o.lease_guard_ms) {
            return Err(HostError::setting(
                "renew_interval_ms",
                format!(
                    "{interval} ms does not renew before the lease guard ({} ms TTL, {} ms guard)",
                    o.owner_ttl_ms, o.lease_guard_ms
                ),
            ));
        }
        if self.max_resident_objects == 0 {
            return Err(HostError::setting(
                "max_resident_objects",
                "must be at least 1",
            ));
        }
        if self.residency == Residency::Evictable && self.eviction_idle_ms == 0 {
            return Err(HostError::setting(
                "eviction_idle_ms",
                "must be positive in the evictable mode",
            ));
        }
        Ok(())
    }
}
