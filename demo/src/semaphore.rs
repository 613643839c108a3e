//! `cargo xtask bench semaphore`: the semaphore against a Redis-scripted
//! semaphore measured in the same run.
//!
//! - **ours**: `durability-semaphore` on one SQLite object file
//!   (`synchronous=NORMAL`, WAL), called in process (no host, no router):
//!   each acquire and each release is one transaction of the holder object.
//! - **redis**: the common Lua semaphore on Redis on loopback, one
//!   connection: a sorted set of grants scored by lease deadline; acquire
//!   drops expired grants and adds one below the capacity, release removes
//!   it and pushes a wake token on a list that waiters block on (`BLPOP`).
//!
//! Figures: acquire+release pairs per second (ratio ours/redis: higher is
//! better for us), and the wake-up latency of a queued waiter: from the
//! release call of the holder of the only permit to the waiter holding its
//! grant (ratio ours/redis: lower is better for us). Ours wakes the waiter
//! through the semaphore's event hook (as the host's holder does), Redis
//! through `BLPOP`. Rounds are interleaved so machine load falls on both.

#![allow(clippy::print_stdout, reason = "the bench prints its JSON lines")]

use std::sync::Arc;
use std::time::Instant;

use durability_scheduler::{ObjectContext, ObjectId, Scheduler, SystemClock};
use durability_semaphore::{Acquire, Acquired, PoolConfig, Semaphore, SemaphoreConfig};
use durability_storage_sqlite::{SqliteOptions, SqliteStorage, Synchronous};
use redis::aio::MultiplexedConnection;
use serde_json::json;
use tokio::sync::Notify;

use crate::Result;
use crate::bench::figure;

const ROUNDS: usize = 3;
const PAIRS: u64 = 500;
const WAKES: u64 = 50;
const CAPACITY: u64 = 10;

const ACQUIRE: &str = "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[1] + ARGV[2], ARGV[3]) return 1 end
return 0";
const RELEASE: &str = "redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], 1) redis.call('LTRIM', KEYS[2], -1, -1) return 1";

type Sem = Semaphore<SqliteStorage>;

struct Ours {
    sem: Sem,
    wake: Arc<Notify>,
    next: u64,
}

impl Ours {
    fn open(path: &std::path::Path) -> Result<Self> {
        let options = SqliteOptions {
            synchronous: Synchronous::Normal,
            ..SqliteOptions::default()
        };
        let storage = SqliteStorage::open(path, options)?;
        let ctx = ObjectContext::with_clock(
            ObjectId::new("bench-semaphore")?,
            Arc::new(storage),
            Arc::new(SystemClock),
        );
        let scheduler = Scheduler::new(ctx)?;
        let wake = Arc::new(Notify::new());
        let signal = Arc::clone(&wake);
        let config = SemaphoreConfig::default().on_event(move |_| signal.notify_waiters());
        let sem = Semaphore::attach(&scheduler, config)?;
        scheduler.transaction(|tx| sem.configure(tx, "pairs", PoolConfig::new(CAPACITY)))?;
        scheduler.transaction(|tx| sem.configure(tx, "one", PoolConfig::new(1)))?;
        Ok(Self { sem, wake, next: 0 })
    }

    /// Acquires one permit of `pool` (waiting on the event hook while
    /// queued) and returns its grant id.
    async fn acquire(&mut self, pool: &str, holder: &str) -> Result<u64> {
        self.next += 1;
        let req = Acquire::new(pool, format!("k{}", self.next), holder, 1).lease_ms(60_000);
        let s = self.sem.scheduler();
        loop {
            let notified = self.wake.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            match s.transaction(|tx| self.sem.acquire(tx, &req))? {
                Acquired::Granted(g) => return Ok(g.id),
                Acquired::Queued { .. } => notified.await,
                Acquired::Finished { .. } => return Err("request finished ungranted".into()),
            }
        }
    }

    fn release(&self, holder: &str, id: u64) -> Result {
        let s = self.sem.scheduler();
        s.transaction(|tx| self.sem.release(tx, holder, id))?;
        Ok(())
    }
}

struct Theirs {
    con: MultiplexedConnection,
    waiter: MultiplexedConnection,
    acquire: redis::Script,
    release: redis::Script,
    prefix: String,
    next: u64,
}

impl Theirs {
    async fn open(url: &str) -> Result<Self> {
        let client = redis::Client::open(url)?;
        Ok(Self {
            con: client.get_multiplexed_async_connection().await?,
            waiter: client.get_multiplexed_async_connection().await?,
            acquire: redis::Script::new(ACQUIRE),
            release: redis::Script::new(RELEASE),
            prefix: format!("bench:sem:{}", std::process::id()),
            next: 0,
        })
    }

    async fn try_acquire(&mut self, pool: &str, cap: u64) -> Result<Option<String>> {
        self.next += 1;
        let id = format!("g{}", self.next);
        let now: i64 = durability_scheduler::Clock::now_ms(&SystemClock);
        let got: i64 = self
            .acquire
            .key(format!("{}:{pool}", self.prefix))
            .arg(now)
            .arg(60_000)
            .arg(&id)
            .arg(cap)
            .invoke_async(&mut self.con)
            .await?;
        Ok((got == 1).then_some(id))
    }

    async fn release(&mut self, pool: &str, id: &str) -> Result {
        let _: i64 = self
            .release
            .key(format!("{}:{pool}", self.prefix))
            .key(format!("{}:{pool}:wake", self.prefix))
            .arg(id)
            .invoke_async(&mut self.con)
            .await?;
        Ok(())
    }

    async fn clear(&mut self) -> Result {
        let keys: Vec<String> = ["pairs", "pairs:wake", "one", "one:wake"]
            .iter()
            .map(|k| format!("{}:{k}", self.prefix))
            .collect();
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut self.con)
            .await?;
        Ok(())
    }
}

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn pairs_ours(ours: &mut Ours) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..PAIRS {
        let id = ours.acquire("pairs", "s").await?;
        ours.release("s", id)?;
    }
    Ok(PAIRS as f64 / t.elapsed().as_secs_f64())
}

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn pairs_theirs(theirs: &mut Theirs) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..PAIRS {
        let id = theirs
            .try_acquire("pairs", CAPACITY)
            .await?
            .ok_or("the redis pool is full")?;
        theirs.release("pairs", &id).await?;
    }
    Ok(PAIRS as f64 / t.elapsed().as_secs_f64())
}

/// Median wake-up latency (µs) of a waiter queued behind the only permit.
#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn wake_ours(ours: &mut Ours) -> Result<f64> {
    let mut samples = Vec::new();
    for _ in 0..WAKES {
        let id = ours.acquire("one", "holder").await?;
        let sem = ours.sem.clone();
        let wake = Arc::clone(&ours.wake);
        let mut waiter = Ours {
            sem,
            wake,
            next: ours.next + 1_000_000,
        };
        ours.next += 1;
        let task = tokio::spawn(async move {
            let id = waiter
                .acquire("one", "waiter")
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((Instant::now(), waiter, id))
        });
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let released = Instant::now();
        ours.release("holder", id)?;
        let (granted, waiter, wid) = task.await??;
        ours.next = waiter.next + 1;
        samples.push(granted.duration_since(released).as_secs_f64() * 1e6);
        ours.release("waiter", wid)?;
    }
    Ok(crate::bench::median(&mut samples))
}

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn wake_theirs(theirs: &mut Theirs) -> Result<f64> {
    let mut samples = Vec::new();
    let wake_key = format!("{}:one:wake", theirs.prefix);
    for _ in 0..WAKES {
        theirs.clear().await?;
        let id = theirs.try_acquire("one", 1).await?.ok_or("one is held")?;
        let mut waiter_con = theirs.waiter.clone();
        let key = wake_key.clone();
        let script = redis::Script::new(ACQUIRE);
        let pool = format!("{}:one", theirs.prefix);
        let task = tokio::spawn(async move {
            let mut n = 0_u64;
            loop {
                n += 1;
                let now: i64 = durability_scheduler::Clock::now_ms(&SystemClock);
                let got: i64 = script
                    .key(&pool)
                    .arg(now)
                    .arg(60_000)
                    .arg(format!("w{n}"))
                    .arg(1)
                    .invoke_async(&mut waiter_con)
                    .await?;
                if got == 1 {
                    return Ok::<_, redis::RedisError>(Instant::now());
                }
                let _: Option<(String, String)> = redis::cmd("BLPOP")
                    .arg(&key)
                    .arg(5)
                    .query_async(&mut waiter_con)
                    .await?;
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let released = Instant::now();
        theirs.release("one", &id).await?;
        let granted = task.await??;
        samples.push(granted.duration_since(released).as_secs_f64() * 1e6);
    }
    theirs.clear().await?;
    Ok(crate::bench::median(&mut samples))
}

/// Runs the scene and prints its figures.
pub(crate) async fn bench(redis_url: &str) -> Result {
    let dir = tempfile::tempdir()?;
    let mut ours = Ours::open(&dir.path().join("holder.sqlite"))?;
    let mut theirs = Theirs::open(redis_url).await?;
    theirs.clear().await?;
    let (mut po, mut pt, mut wo, mut wt) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            po.push(pairs_ours(&mut ours).await?);
            pt.push(pairs_theirs(&mut theirs).await?);
        } else {
            pt.push(pairs_theirs(&mut theirs).await?);
            po.push(pairs_ours(&mut ours).await?);
        }
        wo.push(wake_ours(&mut ours).await?);
        wt.push(wake_theirs(&mut theirs).await?);
    }
    let (po, pt) = (crate::bench::median(&mut po), crate::bench::median(&mut pt));
    let (wo, wt) = (crate::bench::median(&mut wo), crate::bench::median(&mut wt));
    eprintln!(
        "semaphore: acquire+release {po:.0}/s vs redis {pt:.0}/s; waiter wake-up {wo:.0} µs vs redis {wt:.0} µs"
    );
    let n = PAIRS * ROUNDS as u64;
    let extra = json!({"ours": "durability-semaphore on SQLite (synchronous=NORMAL), in process",
        "baseline_is": "Lua semaphore on Redis (sorted set), one connection"});
    figure(
        "semaphore.acquire_release_per_s",
        po,
        pt,
        "pairs/s",
        "higher",
        n,
        extra.clone(),
    );
    figure(
        "semaphore.waiter_wakeup_us",
        wo,
        wt,
        "us (median)",
        "lower",
        WAKES * ROUNDS as u64,
        extra,
    );
    Ok(())
}
