//! Redis owner lease store.
//!
//! [`RedisLeaseStore`] implements [`LeaseStore`] and [`LifecycleAdmin`] with
//! these key families (under a configurable prefix):
//!
//! | key | type | meaning |
//! |---|---|---|
//! | `do:owner:scope:<scope>` | string, `PX` | owner record; Redis expiry is the lease |
//! | `do:owner:scope:<scope>:generation` | string | monotonic generation counter, never decremented |
//! | `worker:do-storage:<lifecycle>` | string | active storage pointer |
//! | `worker:delete-lock:<lifecycle>` | string | `whole` or `version` delete lock |
//! | `worker:do-shards:<storage id>` | string | the storage id's shard count, written once by its first claim (or `record_shard_count`) |
//! | `do:presence:<storage id>:<class>` | sorted set | presence records: task id scored by its expiry on the server's clock (ms) |
//! | `do:presence:<storage id>:<class>:values` | hash | presence values by task id |
//!
//! Claim, renew, release, snapshot and raising the generation floor
//! ([`LeaseStore::raise_generation_floor`]: `max(counter, floor)`, never
//! lower) are each one Lua script: one round
//! trip, atomic on the server. The lease is the owner key's own expiry
//! (`PX`/`PEXPIRE`), so it runs on the server's clock and never on the
//! caller's; claims report the remaining lease (`PTTL`) and snapshots the
//! server's `TIME`. Keys of one
//! script are not hash-tagged together, so the store targets a single Redis
//! (or a proxy), not Redis Cluster.
//!
//! The generation counters must survive: run Redis with AOF or RDB
//! persistence, or open every object through
//! `durability_ownership::fence_with_floor`, which raises a counter that a
//! `FLUSHALL` or a restart without persistence lost back above the object's
//! fence before anything is dispatched (an object never opened again keeps
//! its fence, which refuses every stale writer).

use durability_ownership::{
    BoxError, ClaimOutcome, Claimant, DeleteLock, Generation, Lease, LeaseStore, LifecycleAdmin,
    LifecycleId, OwnerRecord, OwnerScope, OwnerSnapshot, OwnershipError, Presence, PresenceEntry,
    PresenceGroup, RecordTemplate, ShardCount, StorageId, TaskId, check_lifecycle,
    check_shard_count, parse_generation_counter, parse_shard_count, ttl_refusals, validate_ttl,
};
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, FromRedisValue, Script, ScriptInvocation, Value};

/// Reads the server's `TIME` in milliseconds into `now` (snapshots only: the
/// lease itself is Redis key expiry, which already runs on the server clock).
const NOW: &str = "local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
";

/// Writes a presence record: KEYS (expiries, values), ARGV (task, value,
/// TTL). Expired records of the group are removed on the way.
const ANNOUNCE: &str = "
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, d in ipairs(dead) do
  redis.call('HDEL', KEYS[2], d)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
";

/// Lists the live presence records: KEYS (expiries, values); the reply is
/// (task, value, time left) per record, in expiry order.
const LIVE: &str = "
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  local v = redis.call('HGET', KEYS[2], live[i])
  if v then
    out[#out + 1] = live[i]
    out[#out + 1] = v
    out[#out + 1] = math.floor(tonumber(live[i + 1]) - now)
  end
end
return out
";

/// Removes a presence record: KEYS (expiries, values), ARGV (task).
const WITHDRAW: &str = "
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
";

static ANNOUNCE_SCRIPT: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(&format!("{NOW}{ANNOUNCE}")));
static LIVE_SCRIPT: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(&format!("{NOW}{LIVE}")));
static WITHDRAW_SCRIPT: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(WITHDRAW));

/// Claims a free scope. The common reply is flat: the new generation as an
/// integer (a table costs the server a measurable share of the call); the
/// other outcomes are tables naming themselves.
const CLAIM: &str = "
local v = redis.call('MGET', KEYS[4], KEYS[3], KEYS[1], KEYS[2])
local lock, ptr, cur, g = v[1], v[2], v[3], v[4]
if lock == 'whole' or ptr ~= ARGV[1] or (lock and lock ~= 'version') then
  return {'lifecycle', ptr, lock}
end
local c = redis.call('GET', KEYS[5])
if c and c ~= ARGV[5] then
  return {'shards', c}
end
if cur then
  return {'held', cur, redis.call('PTTL', KEYS[1])}
end
if g and (not string.match(g, '^[1-9][0-9]*$') or #g > 16 or tonumber(g) >= 9007199254740991) then
  return {'badgen', g}
end
if not c then
  redis.call('SET', KEYS[5], ARGV[5])
end
local n = redis.call('INCR', KEYS[2])
local rec = ARGV[2] .. string.format('%d', n) .. ARGV[3]
redis.call('SET', KEYS[1], rec, 'PX', ARGV[4])
return n
";

const RELEASE: &str = "
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

const RAISE_FLOOR: &str = "
local g = redis.call('GET', KEYS[1])
if g and (not string.match(g, '^[1-9][0-9]*$') or #g > 16 or tonumber(g) > 9007199254740991) then
  return {'badgen'}
end
local floor = tonumber(ARGV[1])
if g == false or tonumber(g) < floor then
  redis.call('SET', KEYS[1], ARGV[1])
  return {'raised', ARGV[1]}
end
return {'kept', g}
";

const SNAPSHOT: &str = "
return {now, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]),
  redis.call('GET', KEYS[3]), redis.call('GET', KEYS[4]), redis.call('GET', KEYS[5])}
";

/// The start-up check: KEYS (pointer, lock, count), ARGV (storage id,
/// count). The lifecycle checks of a claim, then the recorded count:
/// `1` when it matches or was recorded now.
const RECORD_COUNT: &str = "
local v = redis.call('MGET', KEYS[2], KEYS[1], KEYS[3])
local lock, ptr, c = v[1], v[2], v[3]
if lock == 'whole' or ptr ~= ARGV[1] or (lock and lock ~= 'version') then
  return {'lifecycle', ptr, lock}
end
if c and c ~= ARGV[2] then
  return {'shards', c}
end
if not c then
  redis.call('SET', KEYS[3], ARGV[2])
end
return 1
";

/// The renew check of one record, shared by [`RENEW_ONE`] and
/// [`RENEW_MANY`]: the exact owner bytes (which carry the generation; a lease
/// that ran out on the server's clock is gone, so it is stale), the active
/// storage pointer, the delete lock and the storage id's shard count, then
/// `PEXPIRE`. Returns `1` renewed, `0` stale, `{'lifecycle', pointer, lock}`
/// refused by the lifecycle records, or `{'shards', count}` refused by the
/// recorded count.
const RENEW_CHECK: &str = "
local function renew(owner, ptr_key, lock_key, count_key, rec, storage, count, ttl)
  local v = redis.call('MGET', owner, lock_key, ptr_key, count_key)
  if v[1] ~= rec then
    return 0
  end
  local lock, ptr = v[2], v[3]
  if lock == 'whole' or ptr ~= storage or (lock and lock ~= 'version') then
    return {'lifecycle', ptr, lock}
  end
  if v[4] and v[4] ~= count then
    return {'shards', v[4]}
  end
  redis.call('PEXPIRE', owner, ttl)
  return 1
end
";

/// Renews one record (`renew`, and a batch of one): KEYS are (owner,
/// pointer, lock, count), ARGV (TTL, record, storage id, count); the reply
/// is the check's own, not wrapped in a batch.
const RENEW_ONE: &str = "
return renew(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3], ARGV[4], ARGV[1])
";

/// Renews a batch: KEYS are (owner, pointer, lock, count) per record;
/// ARGV[1] is the TTL, then (record, storage id, count) per record. One
/// reply per record.
const RENEW_MANY: &str = "
local out = {}
for i = 1, #KEYS / 4 do
  local k = (i - 1) * 4
  local a = (i - 1) * 3 + 1
  out[i] = renew(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], ARGV[a + 1], ARGV[a + 2],
    ARGV[a + 3], ARGV[1])
end
return out
";

/// Scopes per `RENEW_MANY` call: one round trip renews up to this many.
pub const RENEW_MANY_CHUNK: usize = 256;

static RENEW_MANY_SCRIPT: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(&format!("{RENEW_CHECK}{RENEW_MANY}")));

static RENEW_ONE_SCRIPT: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(&format!("{RENEW_CHECK}{RENEW_ONE}")));

/// Maps a Redis error: a refused connection never reached the server;
/// anything else may have been applied.
fn redis_error(e: redis::RedisError) -> OwnershipError {
    if e.is_connection_refusal() {
        OwnershipError::StoreUnavailable {
            source: Box::new(e) as BoxError,
        }
    } else {
        OwnershipError::OwnerUnavailable {
            source: Box::new(e) as BoxError,
        }
    }
}

fn protocol(reason: &str) -> OwnershipError {
    OwnershipError::OwnerUnavailable {
        source: Box::<dyn std::error::Error + Send + Sync>::from(reason.to_owned()),
    }
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// Decodes a stored active storage pointer (absent: none).
fn storage_pointer(
    ptr: Option<&Value>,
    lifecycle: &LifecycleId,
) -> Result<Option<StorageId>, OwnershipError> {
    ptr.and_then(bytes)
        .map(|raw| {
            std::str::from_utf8(raw)
                .map_err(|e| e.to_string())
                .and_then(|s| StorageId::new(s).map_err(|e| e.to_string()))
                .map_err(|reason| OwnershipError::InvalidLifecycleState {
                    lifecycle: lifecycle.as_str().to_owned(),
                    reason,
                })
        })
        .transpose()
}

/// An owner lease store on Redis.
#[derive(Clone)]
pub struct RedisLeaseStore {
    conn: ConnectionManager,
    prefix: String,
    count: ShardCount,
    claim: Script,
    release: Script,
    snapshot: Script,
    raise_floor: Script,
    record_count: Script,
}

durability_time::debug_fields!(RedisLeaseStore { prefix });

impl RedisLeaseStore {
    /// A store on `conn` whose keys all start with `prefix` (may be empty).
    pub fn new(conn: ConnectionManager, prefix: &str, count: ShardCount) -> Self {
        Self {
            conn,
            prefix: prefix.to_owned(),
            count,
            claim: Script::new(CLAIM),
            release: Script::new(RELEASE),
            snapshot: Script::new(&format!("{NOW}{SNAPSHOT}")),
            raise_floor: Script::new(RAISE_FLOOR),
            record_count: Script::new(RECORD_COUNT),
        }
    }

    /// Connects to `url` and builds a store with `prefix`.
    ///
    /// # Errors
    /// [`OwnershipError::StoreUnavailable`] when Redis cannot be reached.
    pub async fn connect(
        url: &str,
        prefix: &str,
        count: ShardCount,
    ) -> Result<Self, OwnershipError> {
        // The errors name the store and the cause, never the URL (it may
        // hold a password): the address once it parsed.
        let unavailable = |what: String| {
            move |e: redis::RedisError| OwnershipError::StoreUnavailable {
                source: format!("{what}: {e}").into(),
            }
        };
        let client = redis::Client::open(url).map_err(unavailable(
            "the Redis lease store's URL is invalid".to_owned(),
        ))?;
        let at = format!(
            "the Redis lease store at {}",
            client.get_connection_info().addr()
        );
        let conn = ConnectionManager::new(client)
            .await
            .map_err(unavailable(format!("{at} cannot be reached")))?;
        Ok(Self::new(conn, prefix, count))
    }

    /// The connection (shared with clones of this store).
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// The keys of `group`'s presence records: (expiries, values).
    pub fn presence_keys(&self, group: &PresenceGroup) -> (String, String) {
        let z = format!("{}do:presence:{}", self.prefix, group.key());
        let h = format!("{z}:values");
        (z, h)
    }

    /// The key prefix of this store.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The owner record key of `scope`.
    pub fn owner_key(&self, scope: &OwnerScope) -> String {
        format!("{}do:owner:scope:{}", self.prefix, scope.host_id())
    }

    /// The generation counter key of `scope`.
    pub fn generation_key(&self, scope: &OwnerScope) -> String {
        format!(
            "{}do:owner:scope:{}:generation",
            self.prefix,
            scope.host_id()
        )
    }

    /// The active storage pointer key of `lifecycle`.
    pub fn storage_pointer_key(&self, lifecycle: &LifecycleId) -> String {
        format!("{}worker:do-storage:{}", self.prefix, lifecycle.as_str())
    }

    /// The delete lock key of `lifecycle`.
    pub fn delete_lock_key(&self, lifecycle: &LifecycleId) -> String {
        format!("{}worker:delete-lock:{}", self.prefix, lifecycle.as_str())
    }

    /// The shard count key of `storage`.
    pub fn shard_count_key(&self, storage: &StorageId) -> String {
        format!("{}worker:do-shards:{}", self.prefix, storage.as_str())
    }

    /// The refusal for a `{'shards', count}` reply: the recorded count
    /// differs from `scope`'s (or is not a valid count).
    fn shards_error(scope: &OwnerScope, recorded: Option<&Value>) -> OwnershipError {
        match parse_shard_count(recorded.and_then(bytes), scope.storage_id())
            .and_then(|c| check_shard_count(scope, c))
        {
            Err(e) => e,
            // The script saw a count the check accepts: treat as a race.
            Ok(()) => OwnershipError::OwnerRace {
                scope: scope.to_string(),
            },
        }
    }

    fn lifecycle_error(
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
        ptr: Option<&Value>,
        lock: Option<&Value>,
    ) -> OwnershipError {
        let lock = match lock.and_then(bytes) {
            Some(raw) => match DeleteLock::parse(raw, lifecycle) {
                Ok(l) => Some(l),
                Err(e) => return e,
            },
            None => None,
        };
        let active = match storage_pointer(ptr, lifecycle) {
            Ok(active) => active,
            Err(e) => return e,
        };
        match check_lifecycle(scope.storage_id(), lifecycle, active.as_ref(), lock) {
            Err(e) => e,
            // The script saw a lifecycle change that the check does not: treat as a race.
            Ok(()) => OwnershipError::OwnerRace {
                scope: scope.to_string(),
            },
        }
    }

    fn lease(
        &self,
        scope: &OwnerScope,
        raw: &[u8],
        pttl: Option<i64>,
    ) -> Result<Lease, OwnershipError> {
        let record = OwnerRecord::decode(raw, scope, self.count)?;
        let Some(pttl) = pttl.and_then(|p| u64::try_from(p).ok()) else {
            return Err(OwnershipError::InvalidOwnerRecord {
                scope: scope.to_string(),
                reason: "owner record has no lease expiry".to_owned(),
            });
        };
        Ok(Lease {
            record,
            remaining_ms: pttl,
        })
    }
}

impl LeaseStore for RedisLeaseStore {
    async fn claim_as(
        &self,
        scope: &OwnerScope,
        claimant: Claimant<'_>,
    ) -> Result<ClaimOutcome, OwnershipError> {
        validate_ttl(claimant.ttl_ms)?;
        let template =
            RecordTemplate::new(scope, claimant.lifecycle, claimant.task, claimant.endpoint);
        let reply: Value = self
            .invoke(
                self.claim
                    .key(self.owner_key(scope))
                    .key(self.generation_key(scope))
                    .key(self.storage_pointer_key(claimant.lifecycle))
                    .key(self.delete_lock_key(claimant.lifecycle))
                    .key(self.shard_count_key(scope.storage_id()))
                    .arg(scope.storage_id().as_str())
                    .arg(&template.prefix)
                    .arg(&template.suffix)
                    .arg(claimant.ttl_ms)
                    .arg(scope.shard_count().get()),
            )
            .await?;
        let reply = match reply {
            Value::Int(n) => {
                // The script wrote exactly `prefix + n + suffix`: the record
                // built here from the same template has the same bytes.
                let n = u64::try_from(n)
                    .map_err(|_| protocol("claim reply with a negative generation"))?;
                let generation = Generation::new(n)?;
                let record = template.record(
                    scope.clone(),
                    claimant.lifecycle.clone(),
                    claimant.task.clone(),
                    claimant.endpoint.cloned(),
                    generation,
                );
                return Ok(ClaimOutcome::Claimed(Lease {
                    record,
                    remaining_ms: claimant.ttl_ms,
                }));
            }
            Value::Array(reply) => reply,
            _ => return Err(protocol("unknown claim reply")),
        };
        match reply.first().and_then(bytes) {
            Some(b"held") => {
                let raw = reply
                    .get(1)
                    .and_then(bytes)
                    .ok_or_else(|| protocol("held reply without record"))?;
                Ok(ClaimOutcome::Held(self.lease(
                    scope,
                    raw,
                    reply.get(2).and_then(int),
                )?))
            }
            Some(b"lifecycle") => Err(Self::lifecycle_error(
                scope,
                claimant.lifecycle,
                reply.get(1),
                reply.get(2),
            )),
            Some(b"shards") => Err(Self::shards_error(scope, reply.get(1))),
            Some(b"badgen") => Err(OwnershipError::InvalidLifecycleState {
                lifecycle: scope.to_string(),
                reason: "generation counter is not a positive safe integer below 2^53-1".to_owned(),
            }),
            _ => Err(protocol("unknown claim reply")),
        }
    }

    /// A batch of one (the `RENEW_ONE` script): one round trip, the same checks.
    async fn renew(&self, record: &OwnerRecord, ttl_ms: u64) -> Result<Lease, OwnershipError> {
        validate_ttl(ttl_ms)?;
        self.renew_chunk(std::slice::from_ref(record), ttl_ms)
            .await
            .pop()
            .unwrap_or_else(|| Err(protocol("renew reply without the record")))
    }

    async fn release(&self, record: &OwnerRecord) -> Result<bool, OwnershipError> {
        let n: i64 = self
            .invoke(
                self.release
                    .key(self.owner_key(record.scope()))
                    .arg(record.encoded()),
            )
            .await?;
        Ok(n == 1)
    }

    async fn snapshot(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<OwnerSnapshot, OwnershipError> {
        let reply: Vec<Value> = self
            .invoke(
                self.snapshot
                    .key(self.owner_key(scope))
                    .key(self.generation_key(scope))
                    .key(self.storage_pointer_key(lifecycle))
                    .key(self.delete_lock_key(lifecycle))
                    .key(self.shard_count_key(scope.storage_id())),
            )
            .await?;
        let now = reply
            .first()
            .and_then(int)
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| protocol("snapshot without server time"))?;
        let owner = match reply.get(1).and_then(bytes) {
            Some(raw) => Some(self.lease(scope, raw, reply.get(2).and_then(int))?),
            None => None,
        };
        let generation = parse_generation_counter(reply.get(3).and_then(bytes), scope)?;
        let bad = |reason: String| OwnershipError::InvalidLifecycleState {
            lifecycle: lifecycle.as_str().to_owned(),
            reason,
        };
        let active_storage = storage_pointer(reply.get(4), lifecycle)?;
        let delete_lock = reply
            .get(5)
            .and_then(bytes)
            .map(|raw| DeleteLock::parse(raw, lifecycle))
            .transpose()?;
        let shard_count = parse_shard_count(reply.get(6).and_then(bytes), scope.storage_id())?;
        if let Some(o) = &owner
            && Generation::new(generation).map_or(true, |g| g < o.record.generation())
        {
            return Err(bad(
                "owner generation is ahead of the generation counter".to_owned()
            ));
        }
        Ok(OwnerSnapshot {
            store_now_ms: now,
            owner,
            generation,
            active_storage,
            delete_lock,
            shard_count,
        })
    }

    /// One `RENEW_MANY` script call per [`RENEW_MANY_CHUNK`] records: a
    /// round trip renews up to 256 scopes, each with every check of
    /// [`LeaseStore::renew`], atomically on the server.
    async fn renew_many(
        &self,
        records: &[OwnerRecord],
        ttl_ms: u64,
    ) -> Vec<Result<Lease, OwnershipError>> {
        if let Some(refused) = ttl_refusals(records.len(), ttl_ms) {
            return refused;
        }
        let mut out = Vec::with_capacity(records.len());
        for chunk in records.chunks(RENEW_MANY_CHUNK) {
            out.extend(self.renew_chunk(chunk, ttl_ms).await);
        }
        out
    }

    async fn raise_generation_floor(
        &self,
        scope: &OwnerScope,
        floor: Generation,
    ) -> Result<u64, OwnershipError> {
        self.raise_floor(scope, floor).await
    }

    async fn write_presence(&self, presence: Presence<'_>) -> Result<(), OwnershipError> {
        let (z, h) = self.presence_keys(presence.group());
        let _: i64 = self
            .invoke(
                ANNOUNCE_SCRIPT
                    .key(z)
                    .key(h)
                    .arg(presence.task().as_str())
                    .arg(presence.value())
                    .arg(presence.ttl_ms()),
            )
            .await?;
        Ok(())
    }

    async fn withdraw(&self, group: &PresenceGroup, task: &TaskId) -> Result<bool, OwnershipError> {
        let (z, h) = self.presence_keys(group);
        let n: i64 = self
            .invoke(WITHDRAW_SCRIPT.key(z).key(h).arg(task.as_str()))
            .await?;
        Ok(n == 1)
    }

    async fn live_tasks(
        &self,
        group: &PresenceGroup,
    ) -> Result<Vec<PresenceEntry>, OwnershipError> {
        let (z, h) = self.presence_keys(group);
        let reply: Vec<Value> = self.invoke(LIVE_SCRIPT.key(z).key(h)).await?;
        let mut out = Vec::new();
        for entry in reply.chunks(3) {
            let [task, value, left] = entry else {
                return Err(protocol("presence reply not in triples"));
            };
            let task = bytes(task).and_then(|t| std::str::from_utf8(t).ok());
            let value = bytes(value).ok_or_else(|| protocol("presence without a value"))?;
            let left = int(left).and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
            out.extend(task.and_then(|t| PresenceEntry::stored(t, value.to_vec(), left)));
        }
        out.sort_by(|a, b| a.task.cmp(&b.task));
        Ok(out)
    }

    async fn record_shard_count(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<(), OwnershipError> {
        let reply: Value = self
            .invoke(
                self.record_count
                    .key(self.storage_pointer_key(lifecycle))
                    .key(self.delete_lock_key(lifecycle))
                    .key(self.shard_count_key(scope.storage_id()))
                    .arg(scope.storage_id().as_str())
                    .arg(scope.shard_count().get()),
            )
            .await?;
        let Value::Array(reply) = reply else {
            return match reply {
                Value::Int(1) => Ok(()),
                _ => Err(protocol("unknown shard count reply")),
            };
        };
        match reply.first().and_then(bytes) {
            Some(b"lifecycle") => Err(Self::lifecycle_error(
                scope,
                lifecycle,
                reply.get(1),
                reply.get(2),
            )),
            Some(b"shards") => Err(Self::shards_error(scope, reply.get(1))),
            _ => Err(protocol("unknown shard count reply")),
        }
    }
}

impl RedisLeaseStore {
    /// One round trip over `records` (at most [`RENEW_MANY_CHUNK`]):
    /// `RENEW_ONE` for one record, `RENEW_MANY` for more.
    async fn renew_chunk(
        &self,
        records: &[OwnerRecord],
        ttl_ms: u64,
    ) -> Vec<Result<Lease, OwnershipError>> {
        // One record (every `renew`) takes the script without the batch
        // loop and its reply table; the check is the same Lua function.
        let one = records.len() == 1;
        let mut invocation = if one {
            RENEW_ONE_SCRIPT.prepare_invoke()
        } else {
            RENEW_MANY_SCRIPT.prepare_invoke()
        };
        invocation.arg(ttl_ms);
        for record in records {
            invocation
                .key(self.owner_key(record.scope()))
                .key(self.storage_pointer_key(record.lifecycle()))
                .key(self.delete_lock_key(record.lifecycle()))
                .key(self.shard_count_key(record.scope().storage_id()))
                .arg(record.encoded())
                .arg(record.scope().storage_id().as_str())
                .arg(record.scope().shard_count().get());
        }
        let mut conn = self.conn.clone();
        let replies = match invocation.invoke_async::<Value>(&mut conn).await {
            Ok(reply) if one => vec![reply],
            Ok(Value::Array(replies)) => replies,
            Ok(_) => {
                return records
                    .iter()
                    .map(|_| Err(protocol("renew batch reply is not an array")))
                    .collect();
            }
            Err(e) => {
                // Every record of the chunk shares the call's fate.
                let (refused, text) = (e.is_connection_refusal(), e.to_string());
                let mut first = Some(redis_error(e));
                return records
                    .iter()
                    .map(|_| {
                        Err(first.take().unwrap_or_else(|| {
                            let source = BoxError::from(text.clone());
                            if refused {
                                OwnershipError::StoreUnavailable { source }
                            } else {
                                OwnershipError::OwnerUnavailable { source }
                            }
                        }))
                    })
                    .collect();
            }
        };
        records
            .iter()
            .enumerate()
            .map(|(i, record)| {
                let scope = record.scope();
                match replies.get(i) {
                    Some(Value::Int(1)) => Ok(Lease {
                        record: record.clone(),
                        remaining_ms: ttl_ms,
                    }),
                    Some(Value::Int(0)) => Err(OwnershipError::StaleOwner {
                        scope: scope.to_string(),
                    }),
                    Some(Value::Array(reply))
                        if reply.first().and_then(bytes) == Some(b"lifecycle") =>
                    {
                        Err(Self::lifecycle_error(
                            scope,
                            record.lifecycle(),
                            reply.get(1),
                            reply.get(2),
                        ))
                    }
                    Some(Value::Array(reply))
                        if reply.first().and_then(bytes) == Some(b"shards") =>
                    {
                        Err(Self::shards_error(scope, reply.get(1)))
                    }
                    Some(_) => Err(protocol("unknown renew reply")),
                    None => Err(protocol("renew batch reply without this record")),
                }
            })
            .collect()
    }

    /// Runs `invocation` on the shared connection, a failure classified by
    /// [`redis_error`].
    async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, OwnershipError> {
        let mut conn = self.conn.clone();
        invocation
            .invoke_async(&mut conn)
            .await
            .map_err(redis_error)
    }

    /// Sets `key` to `value`, or deletes it when `value` is none.
    async fn set_or_delete(&self, key: String, value: Option<&str>) -> Result<(), OwnershipError> {
        let mut conn = self.conn.clone();
        match value {
            Some(v) => conn.set::<_, _, ()>(key, v).await,
            None => conn.del::<_, ()>(key).await,
        }
        .map_err(redis_error)
    }

    async fn raise_floor(
        &self,
        scope: &OwnerScope,
        floor: Generation,
    ) -> Result<u64, OwnershipError> {
        let reply: Vec<Value> = self
            .invoke(
                self.raise_floor
                    .key(self.generation_key(scope))
                    .arg(floor.get().to_string()),
            )
            .await?;
        match reply.first().and_then(bytes) {
            Some(b"raised" | b"kept") => reply
                .get(1)
                .and_then(int)
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| protocol("floor reply without generation")),
            Some(b"badgen") => Err(OwnershipError::InvalidLifecycleState {
                lifecycle: scope.to_string(),
                reason: "generation counter is not a positive safe integer".to_owned(),
            }),
            _ => Err(protocol("unknown floor reply")),
        }
    }
}

impl LifecycleAdmin for RedisLeaseStore {
    async fn set_active_storage(
        &self,
        lifecycle: &LifecycleId,
        storage: Option<&StorageId>,
    ) -> Result<(), OwnershipError> {
        self.set_or_delete(
            self.storage_pointer_key(lifecycle),
            storage.map(StorageId::as_str),
        )
        .await
    }

    async fn set_delete_lock(
        &self,
        lifecycle: &LifecycleId,
        lock: Option<DeleteLock>,
    ) -> Result<(), OwnershipError> {
        self.set_or_delete(
            self.delete_lock_key(lifecycle),
            lock.map(DeleteLock::as_str),
        )
        .await
    }
}

impl RedisLeaseStore {
    /// Lists the live owner leases under this store's prefix, a page at a
    /// time: `SCAN` over the owner keys (about `limit` keys per page, as
    /// `SCAN` counts), then each record and its `PTTL`, so the lease left
    /// is on the server's clock. Start with `cursor: None` and pass back the
    /// page's cursor until it is `None`. A lease present for the whole
    /// listing is listed at least once (`SCAN` may list it twice); a key
    /// that expires meanwhile is left out. Each record is decoded strictly;
    /// an invalid one is listed with its problem. Read-only.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidInput`] for a `limit` of 0 or a cursor that
    /// is not a `SCAN` cursor; [`OwnershipError::StoreUnavailable`] when
    /// Redis fails (nothing is written either way).
    pub async fn list_leases(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<durability_ownership::listing::LeaseListing, OwnershipError> {
        use durability_ownership::listing::{LeaseListing, LeaseReport, validate_list_limit};
        validate_list_limit(limit)?;
        let start: u64 = match cursor {
            None => 0,
            Some(c) => c.parse().map_err(|_| OwnershipError::InvalidInput {
                what: "cursor",
                reason: format!("{c:?} is not a scan cursor"),
            })?,
        };
        let unavailable = |e: redis::RedisError| OwnershipError::StoreUnavailable {
            source: Box::new(e) as BoxError,
        };
        let key_prefix = format!("{}do:owner:scope:", self.prefix);
        let mut conn = self.conn.clone();
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(start)
            .arg("MATCH")
            .arg(crate::scan::prefix_pattern(&key_prefix))
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let keys: Vec<String> = keys
            .into_iter()
            .filter(|k| !k.ends_with(":generation"))
            .collect();
        let mut leases = Vec::with_capacity(keys.len());
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
            }
            let values: Vec<Value> = pipe.query_async(&mut conn).await.map_err(unavailable)?;
            for (key, pair) in keys.iter().zip(values.chunks(2)) {
                let [record, ttl] = pair else { continue };
                // Generation counters share the owner keys' prefix
                // (`<owner key>:generation`); a host id ends in `shard<N>`.
                let Some(scope) = key
                    .strip_prefix(&key_prefix)
                    .filter(|scope| !scope.ends_with(":generation"))
                else {
                    continue;
                };
                let raw = match record {
                    Value::BulkString(b) => b.as_slice(),
                    // Expired or deleted between SCAN and GET.
                    Value::Nil => continue,
                    _ => b"",
                };
                let left = match ttl {
                    Value::Int(ms) if *ms > 0 => ms.unsigned_abs(),
                    Value::Int(-2) => continue,
                    _ => 0,
                };
                let mut report = LeaseReport::from_stored(scope, raw, left, self.count);
                if left == 0 && report.problem.is_none() {
                    report.problem = Some("owner key has no expiry".to_owned());
                }
                leases.push(report);
            }
        }
        leases.sort_by(|a, b| a.scope.cmp(&b.scope));
        Ok(LeaseListing {
            leases,
            cursor: (next != 0).then(|| next.to_string()),
        })
    }
}
