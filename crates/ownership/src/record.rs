//! The persisted owner record: its canonical encoding and its validation on read.
//!
//! A record is canonical JSON with the generation as its last field but
//! for the owner's optional endpoint, so a store can build it atomically
//! from a prefix, the bumped generation and a suffix ([`RecordTemplate`]).
//! Stores compare records by their exact bytes.

use std::fmt::Write as _;
use std::sync::Arc;

use serde::Deserialize;

use crate::error::OwnershipError;
use crate::scope::{
    ClassName, LifecycleId, MAX_SAFE_INTEGER, OwnerScope, ShardCount, StorageId, TaskId,
};

/// Version of the owner record format.
pub const RECORD_VERSION: u32 = 1;

/// A positive JavaScript-safe-integer owner generation. Never decreases per scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Generation(u64);

impl Generation {
    /// Validates a generation (1..=2^53-1).
    ///
    /// # Errors
    /// [`OwnershipError::InvalidInput`] when zero or above 2^53-1.
    pub fn new(g: u64) -> Result<Self, OwnershipError> {
        if g == 0 || g > MAX_SAFE_INTEGER {
            return Err(OwnershipError::invalid(
                "generation",
                format!("{g} not in 1..=2^53-1"),
            ));
        }
        Ok(Self(g))
    }

    /// The generation number.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// The longest endpoint an owner record carries, in bytes.
pub const MAX_OWNER_ENDPOINT_BYTES: usize = 256;

/// The endpoint an owner advertises in its record, where other tasks reach
/// it (`http://host:port`). Checked here for its grammar only: at most
/// [`MAX_OWNER_ENDPOINT_BYTES`] of visible ASCII without quotes or
/// backslashes, starting with `http://`, so the record stays canonical
/// JSON. Which addresses a caller accepts is the caller's policy (the host
/// checks every endpoint it reads against its allowlist before it sends
/// anything there).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerEndpoint(String);

impl OwnerEndpoint {
    /// Validates an endpoint's grammar.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidInput`] otherwise.
    pub fn new(raw: &str) -> Result<Self, OwnershipError> {
        let ok = raw.len() > "http://".len()
            && raw.len() <= MAX_OWNER_ENDPOINT_BYTES
            && raw.starts_with("http://")
            && raw
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
        if !ok {
            return Err(OwnershipError::invalid(
                "endpoint",
                format!(
                    "{:?} is not http://… of at most {MAX_OWNER_ENDPOINT_BYTES} visible ASCII bytes without quotes or backslashes",
                    raw.chars().take(64).collect::<String>()
                ),
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The endpoint.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The record naming the owner of a scope.
///
/// Cloning is a reference-count increment: leases, permits and renew
/// batches hand the same record around without copying its strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRecord(Arc<RecordFields>);

#[derive(Debug, PartialEq, Eq)]
struct RecordFields {
    scope: OwnerScope,
    lifecycle: LifecycleId,
    task: TaskId,
    endpoint: Option<OwnerEndpoint>,
    generation: Generation,
    encoded: String,
}

/// The encoding of a record without its generation: `prefix + generation + suffix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordTemplate {
    /// Bytes before the generation digits.
    pub prefix: String,
    /// Bytes after the generation digits.
    pub suffix: String,
}

impl RecordTemplate {
    /// The template of the record `task` (advertising `endpoint`) would
    /// write for `scope`.
    pub fn new(
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
        task: &TaskId,
        endpoint: Option<&OwnerEndpoint>,
    ) -> Self {
        // Every field's grammar excludes quotes, backslashes and control
        // characters, so no JSON escaping is needed and the bytes are canonical.
        let prefix = format!(
            "{{\"v\":{RECORD_VERSION},\"ownerKey\":\"{key}\",\"hostId\":\"{key}\",\"storageId\":\"{storage}\",\
             \"class\":\"{class}\",\"shard\":{shard},\"lifecycle\":\"{lifecycle}\",\"taskId\":\"{task}\",\
             \"generation\":",
            key = scope.host_id(),
            storage = scope.storage_id().as_str(),
            class = scope.class().as_str(),
            shard = scope.shard(),
            lifecycle = lifecycle.as_str(),
            task = task.as_str(),
        );
        // The endpoint's grammar excludes quotes, backslashes and control
        // characters too.
        let suffix = match endpoint {
            Some(e) => format!(",\"endpoint\":\"{}\"}}", e.as_str()),
            None => "}".to_owned(),
        };
        Self { prefix, suffix }
    }

    /// The record whose bytes are `prefix + generation + suffix`: what a
    /// store wrote from this template when it bumped the counter to
    /// `generation`. The fields must be the ones the template was built
    /// from (a store has them at hand; building the template again would
    /// only copy its strings).
    pub fn record(
        self,
        scope: OwnerScope,
        lifecycle: LifecycleId,
        task: TaskId,
        endpoint: Option<OwnerEndpoint>,
        generation: Generation,
    ) -> OwnerRecord {
        debug_assert_eq!(
            self,
            RecordTemplate::new(&scope, &lifecycle, &task, endpoint.as_ref())
        );
        let mut encoded = self.prefix;
        // Writing into a String cannot fail.
        let _ = write!(encoded, "{}{}", generation.get(), self.suffix);
        OwnerRecord(Arc::new(RecordFields {
            scope,
            lifecycle,
            task,
            endpoint,
            generation,
            encoded,
        }))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    v: u32,
    #[serde(rename = "ownerKey")]
    owner_key: String,
    #[serde(rename = "hostId")]
    host_id: String,
    #[serde(rename = "storageId")]
    storage_id: String,
    class: String,
    shard: u32,
    lifecycle: String,
    #[serde(rename = "taskId")]
    task_id: String,
    generation: u64,
    #[serde(default)]
    endpoint: Option<String>,
}

impl OwnerRecord {
    /// A record for `task` owning `scope` at `generation` (no endpoint).
    pub fn new(
        scope: OwnerScope,
        lifecycle: LifecycleId,
        task: TaskId,
        generation: Generation,
    ) -> Self {
        Self::with_endpoint(scope, lifecycle, task, None, generation)
    }

    /// A record for `task`, reachable at `endpoint`, owning `scope` at
    /// `generation`.
    pub fn with_endpoint(
        scope: OwnerScope,
        lifecycle: LifecycleId,
        task: TaskId,
        endpoint: Option<OwnerEndpoint>,
        generation: Generation,
    ) -> Self {
        RecordTemplate::new(&scope, &lifecycle, &task, endpoint.as_ref())
            .record(scope, lifecycle, task, endpoint, generation)
    }

    /// Decodes and validates a record read under `expected` scope.
    ///
    /// The record must be the canonical encoding, every field must pass its
    /// grammar, and its owner key, host id, storage id, class and shard must
    /// reconstruct `expected`.
    ///
    /// The record is read under `expected`'s own shard count (a record
    /// carries no count: the lifecycle record holds the storage id's one
    /// count); `count`, the store's configured count, is not consulted.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidOwnerRecord`] otherwise: the scope fails closed.
    pub fn decode(
        raw: &[u8],
        expected: &OwnerScope,
        count: ShardCount,
    ) -> Result<Self, OwnershipError> {
        let _ = count;
        let bad = |reason: String| OwnershipError::InvalidOwnerRecord {
            scope: expected.to_string(),
            reason,
        };
        let wire: Wire =
            serde_json::from_slice(raw).map_err(|e| bad(format!("not an owner record: {e}")))?;
        if wire.v != RECORD_VERSION {
            return Err(bad(format!("unknown record version {}", wire.v)));
        }
        let field = |e: OwnershipError| bad(e.to_string());
        let scope = OwnerScope::new(
            StorageId::new(&wire.storage_id).map_err(field)?,
            ClassName::new(&wire.class).map_err(field)?,
            wire.shard,
            expected.shard_count(),
        )
        .map_err(field)?;
        if &scope != expected
            || wire.owner_key != expected.host_id()
            || wire.host_id != expected.host_id()
        {
            return Err(bad(
                "record does not reconstruct the scope it was read under".to_owned(),
            ));
        }
        let lifecycle = LifecycleId::new(&wire.lifecycle).map_err(field)?;
        let task = TaskId::new(&wire.task_id).map_err(field)?;
        let generation = Generation::new(wire.generation).map_err(field)?;
        let endpoint = wire
            .endpoint
            .as_deref()
            .map(OwnerEndpoint::new)
            .transpose()
            .map_err(field)?;
        let record = Self::with_endpoint(scope, lifecycle, task, endpoint, generation);
        if record.0.encoded.as_bytes() != raw {
            return Err(bad("record is not in canonical form".to_owned()));
        }
        Ok(record)
    }

    /// The owned scope.
    pub fn scope(&self) -> &OwnerScope {
        &self.0.scope
    }

    /// The lifecycle whose storage pointer and delete lock guard the scope.
    pub fn lifecycle(&self) -> &LifecycleId {
        &self.0.lifecycle
    }

    /// The owning task.
    pub fn task(&self) -> &TaskId {
        &self.0.task
    }

    /// The owner generation.
    pub fn generation(&self) -> Generation {
        self.0.generation
    }

    /// The endpoint the owner advertises, if any (grammar-checked only:
    /// check it against your own policy before sending anything there).
    pub fn endpoint(&self) -> Option<&OwnerEndpoint> {
        self.0.endpoint.as_ref()
    }

    /// The exact stored bytes.
    pub fn encoded(&self) -> &str {
        &self.0.encoded
    }
}

#[cfg(test)]
mod tests;
