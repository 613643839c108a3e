//! Redis key → shard mapping store for `durability-migration`.
//!
//! Mappings live in one hash (`{prefix}:map`, key → shard) with a sorted-set
//! index (`{prefix}:idx`, every member at score 0) that gives ordered,
//! paged scans by key. Both keys share one hash tag so a cluster keeps them
//! in one slot; every write updates both atomically in a Lua script.

use durability_migration::{BackendFuture, MappingStore};
use redis::Script;
use redis::aio::ConnectionManager;

const PUT: &str = r"
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return 1";

const PUT_IF_ABSENT: &str = r"
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('ZADD', KEYS[2], 0, ARGV[1])
end
return redis.call('HGET', KEYS[1], ARGV[1])";

const REMOVE: &str = r"
local n = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return n";

/// Key → shard mappings in Redis.
#[derive(Clone)]
pub struct RedisMappingStore {
    conn: ConnectionManager,
    map_key: String,
    idx_key: String,
    put: Script,
    put_if_absent: Script,
    remove: Script,
}

durability_time::debug_fields!(RedisMappingStore { map_key });

impl RedisMappingStore {
    /// A store on an existing connection manager, under `prefix`.
    pub fn new(conn: ConnectionManager, prefix: &str) -> Self {
        Self {
            conn,
            map_key: format!("{{{prefix}}}:map"),
            idx_key: format!("{{{prefix}}}:idx"),
            put: Script::new(PUT),
            put_if_absent: Script::new(PUT_IF_ABSENT),
            remove: Script::new(REMOVE),
        }
    }

    /// Connects to `url` and builds a store under `prefix`.
    ///
    /// # Errors
    /// The Redis error when the URL is invalid or the server unreachable.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(url)?;
        let conn = ConnectionManager::new(client).await?;
        Ok(Self::new(conn, prefix))
    }

    /// Deletes every mapping of this store (tests, teardown).
    ///
    /// # Errors
    /// The Redis error.
    pub async fn clear(&self) -> Result<(), redis::RedisError> {
        let mut c = self.conn.clone();
        redis::cmd("DEL")
            .arg(&self.map_key)
            .arg(&self.idx_key)
            .query_async::<()>(&mut c)
            .await
    }

    /// Runs one of the store's scripts on its two keys (`KEYS[1]` the map,
    /// `KEYS[2]` the index) with `args` as `ARGV`.
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        args: &[&str],
    ) -> Result<T, redis::RedisError> {
        let mut inv = script.key(&self.map_key);
        inv.key(&self.idx_key);
        for arg in args {
            inv.arg(*arg);
        }
        let mut c = self.conn.clone();
        inv.invoke_async(&mut c).await
    }
}

impl MappingStore for RedisMappingStore {
    fn get<'a>(&'a self, key: &'a str) -> BackendFuture<'a, Option<String>> {
        Box::pin(async move {
            let mut c = self.conn.clone();
            let v: Option<String> = redis::cmd("HGET")
                .arg(&self.map_key)
                .arg(key)
                .query_async(&mut c)
                .await?;
            Ok(v)
        })
    }

    fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()> {
        Box::pin(async move {
            let _: i64 = self.run(&self.put, &[key, shard]).await?;
            Ok(())
        })
    }

    fn put_if_absent<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, String> {
        Box::pin(async move {
            let v: String = self.run(&self.put_if_absent, &[key, shard]).await?;
            Ok(v)
        })
    }

    fn remove<'a>(&'a self, key: &'a str) -> BackendFuture<'a, bool> {
        Box::pin(async move {
            let n: i64 = self.run(&self.remove, &[key]).await?;
            Ok(n > 0)
        })
    }

    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BackendFuture<'a, Vec<(String, String)>> {
        Box::pin(async move {
            let mut c = self.conn.clone();
            let min = after.map_or_else(|| "-".to_owned(), |a| format!("({a}"));
            let keys: Vec<String> = redis::cmd("ZRANGEBYLEX")
                .arg(&self.idx_key)
                .arg(min)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(limit)
                .query_async(&mut c)
                .await?;
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            let shards: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(&self.map_key)
                .arg(&keys)
                .query_async(&mut c)
                .await?;
            Ok(keys
                .into_iter()
                .zip(shards)
                .filter_map(|(k, s)| s.map(|s| (k, s)))
                .collect())
        })
    }
}
