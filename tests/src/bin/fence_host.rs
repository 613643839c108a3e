//! A small "host" process for the process-level fencing tests
//! (`tests/it/fence_processes.rs`).
//!
//! It claims one owner scope on a Redis lease store, opens one SQLite object
//! database fenced through the claim, and commits numbered writes in a loop,
//! printing one line per step on stdout:
//!
//! - `claim gen=<g> t=<ms> holder=<record>`: a claim it won (`t`: the local
//!   clock when the claim had returned);
//! - `fenced gen=<g> t=<ms> holder=<record>`: the object database is fenced
//!   at that claim (through `fence_with_floor`, which may have claimed again);
//! - `fence-refused <error>`: fencing failed (it tries again);
//! - `in-tx n=<n> gen=<g>`: inside the transaction of write `n` (with
//!   `stall=<n>`, it then waits there 1.5 s before committing);
//! - `commit n=<n> gen=<g>` / `refused n=<n> gen=<g> <error>`: a write;
//! - `lost gen=<g> <error>`: a renew failed, the claim is dropped.
//!
//! Arguments, `key=value`: `redis` (URL), `prefix` (key prefix), `db` (the
//! object database path), `task` (task id), `ttl` (lease, ms, default
//! 2000), `guard` (lease guard, ms, default 200), `writes` (stop after this
//! many commits; 0 = forever), `stall` (the write to stall inside its
//! transaction), `fencing=off` (no object fence at all: for the checker's
//! own test), `pace` (ms between steps, default 20).
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::time::Duration;

use std::sync::Arc;

use durability_ownership::{
    ClaimOutcome, ClassName, Clock, FloorSettings, Lease, LeaseBudget, LeaseStore, LifecycleId,
    OwnerScope, ShardCount, StorageId, SystemClock, TaskId, fence_with_floor,
};
use durability_scheduler::Storage;
use durability_storage_redis::ownership::RedisLeaseStore;
use durability_storage_sqlite::{SqliteOptions, SqliteStorage};
use durability_tests::host_proc::{args, say};

/// The scope every host of a test run competes for.
fn scope() -> OwnerScope {
    OwnerScope::new(
        StorageId::new("st1").unwrap(),
        ClassName::new("Counter").unwrap(),
        0,
        ShardCount::default(),
    )
    .unwrap()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = args();
    let arg = |k: &str| args.get(k).cloned().unwrap_or_default();
    let ttl: u64 = arg("ttl").parse().unwrap_or(2000);
    let writes: u64 = arg("writes").parse().unwrap_or(0);
    let stall: u64 = arg("stall").parse().unwrap_or(0);
    let pace: u64 = arg("pace").parse().unwrap_or(20);
    let fencing = arg("fencing") != "off";
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let settings = FloorSettings {
        clock: Arc::clone(&clock),
        ttl_ms: ttl,
        guard_ms: arg("guard").parse().unwrap_or(200),
    };
    let task = TaskId::new(&arg("task")).unwrap();
    let lifecycle = LifecycleId::new("ns:fence").unwrap();
    let scope = scope();
    let store = RedisLeaseStore::connect(&arg("redis"), &arg("prefix"), ShardCount::default())
        .await
        .unwrap();
    // Hosts starting together race to create the database (and switch it to
    // WAL): try again until the file is open.
    let storage = loop {
        match SqliteStorage::open(arg("db"), SqliteOptions::default()) {
            Ok(s) => break s,
            Err(e) => {
                say(&format!("open-retry {e}"));
                tokio::time::sleep(Duration::from_millis(pace)).await;
            }
        }
    };
    // Another host may hold the write lock (paused inside its transaction):
    // a read needs no lock in WAL mode, so look first, and create the table
    // (retrying) only when it is missing.
    let exists = |db: &str| {
        rusqlite::Connection::open(db)
            .and_then(|c| {
                c.query_row(
                    "SELECT count(*) FROM sqlite_master WHERE name = 'writes'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .is_ok_and(|n| n > 0)
    };
    while !exists(&arg("db"))
        && storage
            .transaction(|tx| {
                tx.sql()
                    .execute_batch(
                        "CREATE TABLE IF NOT EXISTS writes (seq INTEGER PRIMARY KEY AUTOINCREMENT,
                     task TEXT NOT NULL, generation INTEGER NOT NULL, holder TEXT NOT NULL,
                     n INTEGER NOT NULL, t INTEGER NOT NULL)",
                    )
                    .map_err(|e| {
                        durability_scheduler::StorageError::backend("schema".to_owned(), e)
                    })
            })
            .is_err()
    {
        tokio::time::sleep(Duration::from_millis(pace)).await;
    }
    say("ready");
    let mut lease: Option<(Lease, Option<Arc<LeaseBudget>>)> = None;
    let mut n = 0_u64;
    let mut committed = 0_u64;
    loop {
        tokio::time::sleep(Duration::from_millis(pace)).await;
        let Some((current, budget)) = lease.clone() else {
            let asked_at = clock.now_ms();
            let claimed = match store.claim(&scope, &lifecycle, &task, ttl).await {
                Ok(ClaimOutcome::Claimed(l)) => l,
                // Our own claim, left over from a failed fencing attempt.
                Ok(ClaimOutcome::Held(l)) if l.record.task() == &task => l,
                Ok(ClaimOutcome::Held(_)) | Err(_) => continue,
            };
            say(&format!(
                "claim gen={} t={} holder={}",
                claimed.record.generation().get(),
                clock.now_ms(),
                claimed.record.encoded()
            ));
            if !fencing {
                lease = Some((claimed, None));
                continue;
            }
            match fence_with_floor(&store, &storage, &settings, claimed, asked_at).await {
                Ok(f) => {
                    say(&format!(
                        "fenced gen={} t={} holder={}",
                        f.lease.record.generation().get(),
                        clock.now_ms(),
                        f.lease.record.encoded()
                    ));
                    lease = Some((f.lease, Some(f.budget)));
                }
                Err(e) => say(&format!("fence-refused {e}")),
            }
            continue;
        };
        let record = &current.record;
        let g = record.generation().get();
        n += 1;
        let result = storage.transaction(|tx| {
            say(&format!("in-tx n={n} gen={g}"));
            if n == stall {
                // Stopped here by the test (SIGSTOP), inside the transaction.
                std::thread::sleep(Duration::from_millis(1500));
            }
            // The local clock as the write is made: its commit comes later.
            let t = clock.now_ms();
            tx.sql()
                .execute(
                    "INSERT INTO writes (task, generation, holder, n, t) VALUES (?1, ?2, ?3, ?4, ?5)",
                    rusqlite::params![
                        task.as_str(),
                        i64::try_from(g).unwrap(),
                        record.encoded(),
                        i64::try_from(n).unwrap(),
                        t
                    ],
                )
                .map(|_| ())
                .map_err(|e| durability_scheduler::StorageError::backend("write".to_owned(), e))
        });
        match result {
            Ok(()) => {
                committed += 1;
                say(&format!("commit n={n} gen={g}"));
                if writes > 0 && committed >= writes {
                    return;
                }
            }
            Err(e) => {
                say(&format!("refused n={n} gen={g} {e}"));
                lease = None;
                continue;
            }
        }
        let asked_at = clock.now_ms();
        match store.renew(record, ttl).await {
            Ok(renewed) => {
                if let Some(b) = &budget {
                    b.renewed(asked_at, &renewed);
                }
            }
            Err(e) => {
                say(&format!("lost gen={g} {e}"));
                lease = None;
            }
        }
    }
}
