//! The three contenders of the Redis lease comparison, doing the same work
//! on Redis, each on one connection of its own:
//!
//! - **ours**: [`RedisLeaseStore`] claim + release, and renew;
//! - **rslock** 0.10: `lock` + `unlock`, and `extend`, on one server;
//! - **raw** redis-rs: `SET NX PX` + a compare-and-delete script, and a
//!   compare-and-expire script.
//!
//! One home for both benches that run them: `cargo xtask bench ownership`
//! (`demo/src/lease_peers.rs`) and the `leases` group of `cargo xtask bench
//! peers` (`bench/peers/ours`, a workspace of its own, which compiles this
//! file with `#[path]`). Only the dependencies both have may appear here.

use std::error::Error;
use std::time::{Duration, Instant};

use durability_ownership::{
    ClaimOutcome, ClassName, Lease, LeaseStore, LifecycleAdmin, LifecycleId, OwnerScope,
    ShardCount, StorageId, TaskId,
};
use durability_storage_redis::ownership::RedisLeaseStore;
use redis::aio::MultiplexedConnection;

pub(crate) type BoxResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

const TTL_MS: u64 = 60_000;
/// Operations per contender between two switches of contender.
pub(crate) const BLOCK: u64 = 100;

const RAW_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
const RAW_RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
const RAW_VALUE: &[u8] = b"raw-owner-value-0123456789";

/// The contenders, in their order in the first block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Who {
    Ours,
    Rslock,
    Raw,
}

impl Who {
    pub(crate) const ALL: [Who; 3] = [Who::Ours, Who::Rslock, Who::Raw];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Who::Ours => "ours",
            Who::Rslock => "rslock",
            Who::Raw => "raw",
        }
    }
}

/// Per contender (in [`Who::ALL`]'s order), the time its operations took.
pub(crate) type Times = [Duration; 3];

#[allow(clippy::disallowed_methods, reason = "benchmarks measure wall time")]
fn start() -> Instant {
    Instant::now()
}

pub(crate) struct Contenders {
    store: RedisLeaseStore,
    lifecycle: LifecycleId,
    task: TaskId,
    scope: OwnerScope,
    rslock: rslock::LockManager,
    raw: MultiplexedConnection,
    raw_release: redis::Script,
    raw_renew: redis::Script,
    prefix: String,
}

impl Contenders {
    /// The contenders on the Redis server at `url`: ours on `store` (whose
    /// lifecycle `bench:peers` it points at storage `st-peers`), the raw
    /// keys under `prefix`.
    pub(crate) async fn connect(
        url: &str,
        store: RedisLeaseStore,
        prefix: &str,
    ) -> BoxResult<Self> {
        let lifecycle = LifecycleId::new("bench:peers")?;
        let storage = StorageId::new("st-peers")?;
        store.set_active_storage(&lifecycle, Some(&storage)).await?;
        let scope = OwnerScope::new(storage, ClassName::new("Peers")?, 0, ShardCount::default())?;
        let client = redis::Client::open(url)?;
        Ok(Self {
            store,
            lifecycle,
            task: TaskId::new("bench-peers")?,
            scope,
            rslock: rslock::LockManager::new(vec![url.to_owned()]),
            raw: client.get_multiplexed_async_connection().await?,
            raw_release: redis::Script::new(RAW_RELEASE),
            raw_renew: redis::Script::new(RAW_RENEW),
            prefix: prefix.to_owned(),
        })
    }

    /// `n` acquire + release pairs and `n` renewals per contender
    /// (connections, scripts loaded, allocator).
    pub(crate) async fn warm_up(&mut self, n: u64) -> BoxResult<()> {
        for who in Who::ALL {
            self.pairs(who, n).await?;
            self.renews(who, n).await?;
        }
        Ok(())
    }

    /// `blocks` blocks of [`BLOCK`] pairs and renewals per contender, the
    /// contenders' order rotating every block (starting `offset` places
    /// on), so that a burst of load from another process falls on all
    /// three alike; returns each contender's total time of pairs and of
    /// renewals.
    pub(crate) async fn rotate(&mut self, blocks: u64, offset: usize) -> BoxResult<(Times, Times)> {
        let mut pairs = [Duration::ZERO; 3];
        let mut renews = [Duration::ZERO; 3];
        for block in 0..usize::try_from(blocks)? {
            for k in 0..Who::ALL.len() {
                let i = (k + block + offset) % Who::ALL.len();
                pairs[i] += self.pairs(Who::ALL[i], BLOCK).await?;
                renews[i] += self.renews(Who::ALL[i], BLOCK).await?;
            }
        }
        Ok((pairs, renews))
    }

    /// Our claim of the scope (only the benchmark claims it, so a held
    /// scope is an error).
    async fn claim_ours(&self) -> BoxResult<Lease> {
        let ClaimOutcome::Claimed(lease) = self
            .store
            .claim(&self.scope, &self.lifecycle, &self.task, TTL_MS)
            .await?
        else {
            return Err("our claim found the scope held".into());
        };
        Ok(lease)
    }

    /// `n` acquire + release pairs; returns the time they took.
    async fn pairs(&mut self, who: Who, n: u64) -> BoxResult<Duration> {
        let t = start();
        match who {
            Who::Ours => {
                for _ in 0..n {
                    let lease = self.claim_ours().await?;
                    if !self.store.release(&lease.record).await? {
                        return Err("our release found no lease".into());
                    }
                }
            }
            Who::Rslock => {
                let resource = format!("{}rslock:pair", self.prefix);
                let ttl = Duration::from_millis(TTL_MS);
                for _ in 0..n {
                    let lock = self
                        .rslock
                        .lock(resource.as_bytes(), ttl)
                        .await
                        .map_err(|e| format!("rslock lock: {e}"))?;
                    self.rslock.unlock(&lock).await;
                }
            }
            Who::Raw => {
                let key = format!("{}raw:pair", self.prefix);
                for _ in 0..n {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(RAW_VALUE)
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL_MS)
                        .query_async(&mut self.raw)
                        .await?;
                    let del: i64 = self
                        .raw_release
                        .key(&key)
                        .arg(RAW_VALUE)
                        .invoke_async(&mut self.raw)
                        .await?;
                    if set.is_none() || del != 1 {
                        return Err("raw SET NX PX / compare-and-delete failed".into());
                    }
                }
            }
        }
        Ok(t.elapsed())
    }

    /// `n` renewals of one held lease; returns the time they took.
    async fn renews(&mut self, who: Who, n: u64) -> BoxResult<Duration> {
        match who {
            Who::Ours => {
                let lease = self.claim_ours().await?;
                let t = start();
                for _ in 0..n {
                    self.store.renew(&lease.record, TTL_MS).await?;
                }
                let elapsed = t.elapsed();
                self.store.release(&lease.record).await?;
                Ok(elapsed)
            }
            Who::Rslock => {
                let resource = format!("{}rslock:renew", self.prefix);
                let ttl = Duration::from_millis(TTL_MS);
                let lock = self
                    .rslock
                    .lock(resource.as_bytes(), ttl)
                    .await
                    .map_err(|e| format!("rslock lock: {e}"))?;
                let t = start();
                for _ in 0..n {
                    self.rslock
                        .extend(&lock, ttl)
                        .await
                        .map_err(|e| format!("rslock extend: {e}"))?;
                }
                let elapsed = t.elapsed();
                self.rslock.unlock(&lock).await;
                Ok(elapsed)
            }
            Who::Raw => {
                let key = format!("{}raw:renew", self.prefix);
                let () = redis::cmd("SET")
                    .arg(&key)
                    .arg(RAW_VALUE)
                    .arg("PX")
                    .arg(TTL_MS)
                    .query_async(&mut self.raw)
                    .await?;
                let t = start();
                for _ in 0..n {
                    let ok: i64 = self
                        .raw_renew
                        .key(&key)
                        .arg(RAW_VALUE)
                        .arg(TTL_MS)
                        .invoke_async(&mut self.raw)
                        .await?;
                    if ok != 1 {
                        return Err("raw compare-and-expire failed".into());
                    }
                }
                Ok(t.elapsed())
            }
        }
    }
}
