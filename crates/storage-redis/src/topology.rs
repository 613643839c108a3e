//! Redis topology publishers and read store.
//!
//! | key | type | meaning |
//! |---|---|---|
//! | `<prefix><group>` | string | the group's encoded snapshot, as the client reads it |
//! | `<prefix><group>:versions` | hash coordinator → version | highest version seen (versioned publisher only) |
//!
//! - [`RedisPublisher`]: plain `SET`/`DEL`, a key-value store. The
//!   coordinator's write records bound how long an abandoned older write
//!   may land over a newer snapshot (the landing window).
//! - [`RedisVersionedPublisher`]: one Lua script per write or delete keeps
//!   only the highest version per group and coordinator, so a late older
//!   write can never overwrite a newer snapshot, and a late write can never
//!   resurrect a deleted group. This removes the landing-window bound.
//! - [`RedisReadStore`] reads with `GET`.
//!
//! Keys of one script are not hash-tagged together, so these target a
//! single Redis (or a proxy), not Redis Cluster.
//!
//! A failed publisher call says whether its outcome is known
//! ([`durability_topology::PublishError`]): an error reply from the server
//! or a command refused on the client is a rejection (nothing was applied);
//! a timeout, a dropped connection, an I/O or parse error is an unknown
//! outcome (the command may have been applied, or may still be), so the
//! coordinator keeps its write record. [`connect`] sets no response timeout
//! of its own: the coordinator's attempt timeout (and the client's read
//! timeout) bound every call, so a redis-rs timeout (500 ms by default)
//! never cuts a write short of the attempt timeout.

use durability_topology::{
    BoxError, EncodedSnapshot, PublishError, Publisher, Snapshot, SnapshotDeletion,
};
use durability_topology_client::ReadStore;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, ErrorKind, RedisError, Script};

/// A versioned change: applied only when the group's versions hash
/// (`KEYS[2]`) holds nothing for coordinator `ARGV[1]` at version `ARGV[2]`
/// or later, which it then records. With a snapshot in `ARGV[3]` the change
/// `SET`s it at `KEYS[1]`; without one it `DEL`s `KEYS[1]`. Replies 1 when
/// applied, 0 when stale.
const VERSIONED: &str = "
local hv = redis.call('HGET', KEYS[2], ARGV[1])
if hv and tonumber(hv) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
return 1
";

/// Opens a connection manager on `url` with no response timeout of its own
/// (the callers bound every call: the coordinator's attempt timeout, the
/// client's read timeout).
///
/// # Errors
/// The URL is invalid or Redis is unreachable.
pub async fn connect(url: &str) -> Result<ConnectionManager, RedisError> {
    let client = redis::Client::open(url)?;
    let config = ConnectionManagerConfig::new().set_response_timeout(None);
    ConnectionManager::new_with_config(client, config).await
}

/// Classifies a failed call: a refusal the server answered, or one made on
/// the client before sending, is a rejection; anything else (timeout,
/// dropped connection, I/O, an unreadable or unexpected reply) may have
/// been applied.
fn publish_error(error: RedisError) -> PublishError {
    let rejected = !error.is_timeout()
        && !error.is_io_error()
        && !error.is_connection_dropped()
        && matches!(
            error.kind(),
            ErrorKind::Server(_)
                | ErrorKind::Extension
                | ErrorKind::Client
                | ErrorKind::InvalidClientConfig
                | ErrorKind::AuthenticationFailed
        );
    if rejected {
        PublishError::rejected(error)
    } else {
        PublishError::unknown(error)
    }
}

fn snapshot_key(prefix: &str, group: &str) -> String {
    format!("{prefix}{group}")
}

fn versions_key(prefix: &str, group: &str) -> String {
    format!("{prefix}{group}:versions")
}

/// The plain key-value publisher: `SET` and `DEL`.
#[derive(Clone)]
pub struct RedisPublisher {
    conn: ConnectionManager,
    prefix: String,
}

durability_time::debug_fields!(RedisPublisher { prefix });

impl RedisPublisher {
    /// A publisher writing under `prefix`.
    pub fn new(conn: ConnectionManager, prefix: impl Into<String>) -> Self {
        Self {
            conn,
            prefix: prefix.into(),
        }
    }

    /// The key a group's snapshot is stored under.
    pub fn key(&self, group: &str) -> String {
        snapshot_key(&self.prefix, group)
    }
}

impl Publisher for RedisPublisher {
    async fn write(
        &self,
        snapshot: &Snapshot,
        encoded: &EncodedSnapshot,
    ) -> Result<(), PublishError> {
        let mut conn = self.conn.clone();
        let () = conn
            .set(self.key(&snapshot.group), encoded.as_bytes())
            .await
            .map_err(publish_error)?;
        Ok(())
    }

    async fn delete(&self, deletion: SnapshotDeletion<'_>) -> Result<(), PublishError> {
        let mut conn = self.conn.clone();
        let _: i64 = conn
            .del(self.key(deletion.group))
            .await
            .map_err(publish_error)?;
        Ok(())
    }
}

/// A publisher keeping only the highest version per group and coordinator
/// (one Lua script per call).
#[derive(Clone)]
pub struct RedisVersionedPublisher {
    conn: ConnectionManager,
    prefix: String,
    script: Script,
}

durability_time::debug_fields!(RedisVersionedPublisher { prefix });

impl RedisVersionedPublisher {
    /// A version-aware publisher writing under `prefix`.
    pub fn new(conn: ConnectionManager, prefix: impl Into<String>) -> Self {
        Self {
            conn,
            prefix: prefix.into(),
            script: Script::new(VERSIONED),
        }
    }

    /// The key a group's snapshot is stored under.
    pub fn key(&self, group: &str) -> String {
        snapshot_key(&self.prefix, group)
    }

    /// Runs [`VERSIONED`] for `group`: a `snapshot` to write, or `None` to
    /// delete the group's snapshot.
    async fn apply(
        &self,
        group: &str,
        coordinator: &str,
        version: u64,
        snapshot: Option<&[u8]>,
    ) -> Result<(), PublishError> {
        let mut invocation = self.script.key(snapshot_key(&self.prefix, group));
        invocation
            .key(versions_key(&self.prefix, group))
            .arg(coordinator)
            .arg(version);
        if let Some(snapshot) = snapshot {
            invocation.arg(snapshot);
        }
        let mut conn = self.conn.clone();
        let _: i64 = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(publish_error)?;
        Ok(())
    }
}

impl Publisher for RedisVersionedPublisher {
    async fn write(
        &self,
        snapshot: &Snapshot,
        encoded: &EncodedSnapshot,
    ) -> Result<(), PublishError> {
        self.apply(
            &snapshot.group,
            &snapshot.coordinator,
            snapshot.version,
            Some(encoded.as_bytes()),
        )
        .await
    }

    async fn delete(&self, deletion: SnapshotDeletion<'_>) -> Result<(), PublishError> {
        self.apply(deletion.group, deletion.coordinator, deletion.version, None)
            .await
    }
}

/// Reads published snapshots with `GET`.
#[derive(Clone)]
pub struct RedisReadStore {
    conn: ConnectionManager,
    prefix: String,
}

durability_time::debug_fields!(RedisReadStore { prefix });

impl RedisReadStore {
    /// A read store under `prefix` (the publisher's prefix).
    pub fn new(conn: ConnectionManager, prefix: impl Into<String>) -> Self {
        Self {
            conn,
            prefix: prefix.into(),
        }
    }
}

impl ReadStore for RedisReadStore {
    async fn read(&self, group: &str) -> Result<Option<Vec<u8>>, BoxError> {
        let mut conn = self.conn.clone();
        let v: Option<Vec<u8>> = conn.get(snapshot_key(&self.prefix, group)).await?;
        Ok(v)
    }
}
