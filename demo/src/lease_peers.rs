//! Our Redis leases against their peers, for `cargo xtask bench ownership`.
//!
//! Three contenders do the same work on Redis on loopback, each on one
//! connection of its own, in interleaved rounds so that load from other
//! processes on a shared machine falls on all of them alike:
//!
//! - **ours**: [`RedisLeaseStore`] claim + release, and renew (every check
//!   kept: exact owner bytes, storage pointer, delete lock, generation,
//!   server time);
//! - **rslock** 0.10 (the most-used Rust Redis lock crate, no fencing):
//!   `lock` + `unlock`, and `extend`, on one server;
//! - **raw** redis-rs: `SET NX PX` + a compare-and-delete script, and a
//!   compare-and-expire script called by SHA.
//!
//! Each round runs every contender for `iterations` operations, in blocks of
//! [`BLOCK`] with the contenders' order rotating every block; a contender's
//! figure is its operations per second over all rounds, and the ratio is
//! ours over theirs (higher is better for us), with each round's ratio
//! printed beside it to show the spread.

#![allow(clippy::print_stdout, reason = "the bench prints its JSON lines")]

use std::error::Error;
use std::time::Duration;

use crate::ownership::start;

use durability_ownership::{
    ClaimOutcome, ClassName, Lease, LeaseStore, LifecycleAdmin, LifecycleId, OwnerScope,
    ShardCount, StorageId, TaskId,
};
use durability_storage_redis::ownership::RedisLeaseStore;
use redis::aio::MultiplexedConnection;

type BoxResult<T> = Result<T, Box<dyn Error>>;

const TTL_MS: u64 = 60_000;
const ROUNDS: usize = 3;
/// Operations per contender between two switches of contender.
const BLOCK: u64 = 100;

const RAW_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
const RAW_RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";

/// The contenders, in their order in the first round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Ours,
    Rslock,
    Raw,
}

impl Who {
    const ALL: [Who; 3] = [Who::Ours, Who::Rslock, Who::Raw];

    fn name(self) -> &'static str {
        match self {
            Who::Ours => "ours",
            Who::Rslock => "rslock",
            Who::Raw => "raw",
        }
    }
}

struct Contenders {
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

    /// `iterations` acquire + release pairs; returns the time they took.
    async fn pairs(&mut self, who: Who, iterations: u64) -> BoxResult<Duration> {
        let t = start();
        match who {
            Who::Ours => {
                for _ in 0..iterations {
                    let lease = self.claim_ours().await?;
                    if !self.store.release(&lease.record).await? {
                        return Err("our release found no lease".into());
                    }
                }
            }
            Who::Rslock => {
                let resource = format!("{}rslock:pair", self.prefix);
                let ttl = Duration::from_millis(TTL_MS);
                for _ in 0..iterations {
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
                let value = b"raw-owner-value-0123456789";
                for _ in 0..iterations {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(value)
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL_MS)
                        .query_async(&mut self.raw)
                        .await?;
                    let del: i64 = self
                        .raw_release
                        .key(&key)
                        .arg(value)
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

    /// `iterations` renews of one held lease; returns the time they took.
    async fn renews(&mut self, who: Who, iterations: u64) -> BoxResult<Duration> {
        let t;
        match who {
            Who::Ours => {
                let lease = self.claim_ours().await?;
                t = start();
                for _ in 0..iterations {
                    self.store.renew(&lease.record, TTL_MS).await?;
                }
                let elapsed = t.elapsed();
                self.store.release(&lease.record).await?;
                return Ok(elapsed);
            }
            Who::Rslock => {
                let resource = format!("{}rslock:renew", self.prefix);
                let ttl = Duration::from_millis(TTL_MS);
                let lock = self
                    .rslock
                    .lock(resource.as_bytes(), ttl)
                    .await
                    .map_err(|e| format!("rslock lock: {e}"))?;
                t = start();
                for _ in 0..iterations {
                    self.rslock
                        .extend(&lock, ttl)
                        .await
                        .map_err(|e| format!("rslock extend: {e}"))?;
                }
                let elapsed = t.elapsed();
                self.rslock.unlock(&lock).await;
                return Ok(elapsed);
            }
            Who::Raw => {
                let key = format!("{}raw:renew", self.prefix);
                let value = b"raw-owner-value-0123456789";
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(value)
                    .arg("PX")
                    .arg(TTL_MS)
                    .query_async(&mut self.raw)
                    .await?;
                t = start();
                for _ in 0..iterations {
                    let ok: i64 = self
                        .raw_renew
                        .key(&key)
                        .arg(value)
                        .arg(TTL_MS)
                        .invoke_async(&mut self.raw)
                        .await?;
                    if ok != 1 {
                        return Err("raw compare-and-expire failed".into());
                    }
                }
            }
        }
        Ok(t.elapsed())
    }
}

fn per_second(n: u64, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// Runs the comparison: `iterations` operations per contender per round,
/// [`ROUNDS`] interleaved rounds. Prints one JSON line per figure.
///
/// # Errors
/// Redis failures, or a contender whose operation did not do what it should.
pub(crate) async fn bench(
    redis_url: &str,
    store: &RedisLeaseStore,
    iterations: u64,
) -> BoxResult<()> {
    let lifecycle = LifecycleId::new("bench:peers")?;
    let storage = StorageId::new("st-peers")?;
    store.set_active_storage(&lifecycle, Some(&storage)).await?;
    let scope = OwnerScope::new(storage, ClassName::new("Peers")?, 0, ShardCount::default())?;
    let client = redis::Client::open(redis_url)?;
    let mut c = Contenders {
        store: store.clone(),
        lifecycle,
        task: TaskId::new("bench-peers")?,
        scope,
        rslock: rslock::LockManager::new(vec![redis_url.to_owned()]),
        raw: client.get_multiplexed_async_connection().await?,
        raw_release: redis::Script::new(RAW_RELEASE),
        raw_renew: redis::Script::new(RAW_RENEW),
        prefix: store.prefix().to_owned(),
    };
    // Warm up: connections, scripts loaded, allocator.
    for who in Who::ALL {
        c.pairs(who, 500).await?;
        c.renews(who, 500).await?;
    }
    // Blocks of BLOCK operations, the contenders' order rotating every
    // block, so that a burst of load from another process falls on all
    // three alike; per round, each contender's total time.
    let blocks = (iterations / BLOCK).max(1);
    let ops = blocks * BLOCK;
    let mut pairs = [[Duration::ZERO; 3]; ROUNDS];
    let mut renews = [[Duration::ZERO; 3]; ROUNDS];
    for round in 0..ROUNDS {
        for block in 0..blocks as usize {
            for k in 0..Who::ALL.len() {
                let i = (k + block + round) % Who::ALL.len();
                pairs[round][i] += c.pairs(Who::ALL[i], BLOCK).await?;
                renews[round][i] += c.renews(Who::ALL[i], BLOCK).await?;
            }
        }
    }
    for (what, rounds, target) in [
        ("acquire_release", pairs, ">=1.0 rslock, >=0.9 raw"),
        ("renew", renews, ">=1.0 rslock, >=0.95 raw"),
    ] {
        let rate =
            |i: usize| -> Vec<f64> { rounds.iter().map(|r| per_second(ops, r[i])).collect() };
        let total = |i: usize| per_second(ops * ROUNDS as u64, rounds.iter().map(|r| r[i]).sum());
        let ours = total(0);
        let mut line = format!("{what}: ours {ours:.0}/s");
        for i in [1, 2] {
            let theirs = total(i);
            let round_ratios: Vec<f64> = rate(0)
                .iter()
                .zip(rate(i))
                .map(|(o, t)| (o / t * 1000.0).round() / 1000.0)
                .collect();
            line.push_str(&format!(
                ", {} {theirs:.0}/s ({:.3}x; rounds {round_ratios:?})",
                Who::ALL[i].name(),
                ours / theirs
            ));
            let v = serde_json::json!({
                "name": format!("ownership.peers.{what}.vs_{}", Who::ALL[i].name()),
                "value": ours.round(),
                "baseline": theirs.round(),
                "unit": "ops/s",
                "ratio": ((ours / theirs) * 1000.0).round() / 1000.0,
                "round_ratios": round_ratios,
                "higher_is_better": true,
                "target": target,
                "rounds": ROUNDS,
                "n": ops,
                "backend": "redis",
            });
            println!("{v}");
        }
        eprintln!("{line}");
    }
    Ok(())
}
