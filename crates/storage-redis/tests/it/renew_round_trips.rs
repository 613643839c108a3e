//! Round trips of the batched renew, counted by the server: a Redis of this
//! test's own (started on a free port, no persistence, stopped by pid), so
//! `INFO commandstats` sees only this test's calls. `renew_many` and
//! `Ownership::renew_all` over 1, 100 and 1,000 scopes take one script call
//! per 256 scopes; renewing one by one takes one per scope.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use durability_ownership::{
    ClaimOutcome, ClassName, LeaseStore, LifecycleAdmin, LifecycleId, ManualClock, OwnerRecord,
    OwnerScope, Ownership, OwnershipSettings, Resolution, ShardCount, StorageId, TaskId,
};
use durability_storage_redis::ownership::{RENEW_MANY_CHUNK, RedisLeaseStore};

/// A `redis-server` child process, killed (by its pid) on drop.
struct OwnRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_redis() -> Option<OwnRedis> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir =
        std::env::temp_dir().join(format!("durability-renew-rt-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let spawned = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("redis-server is required (DURABILITY_REQUIRE_SERVICES=1): {e}")
        }
        Err(e) => {
            eprintln!("skipped: cannot start redis-server: {e}");
            return None;
        }
    };
    // Wait for the server's own "ready" line, then keep draining its log.
    let stdout = child.stdout.take().unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut ready = Some(ready_tx);
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("Ready to accept connections")
                && let Some(tx) = ready.take()
            {
                let _ = tx.send(());
            }
        }
    });
    ready_rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("redis-server did not become ready");
    Some(OwnRedis { child, port, dir })
}

/// Script calls the server has executed so far (`EVALSHA`, `EVAL`, `SCRIPT`):
/// the client's round trips of the lease store, which sends nothing else.
async fn script_calls(store: &RedisLeaseStore) -> u64 {
    let mut c = store.connection();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            if !matches!(name, "cmdstat_evalsha" | "cmdstat_eval" | "cmdstat_script") {
                return None;
            }
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// A lease store on `redis` with lifecycle `ns:rt` pointing at storage `st-rt`.
async fn connect(redis: &OwnRedis) -> (RedisLeaseStore, LifecycleId, StorageId) {
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let store = RedisLeaseStore::connect(&url, "", ShardCount::default())
        .await
        .unwrap();
    let lifecycle = LifecycleId::new("ns:rt").unwrap();
    let storage = StorageId::new("st-rt").unwrap();
    store
        .set_active_storage(&lifecycle, Some(&storage))
        .await
        .unwrap();
    (store, lifecycle, storage)
}

fn scopes(storage: &StorageId, n: usize) -> Vec<OwnerScope> {
    (0..n)
        .map(|i| {
            OwnerScope::new(
                storage.clone(),
                ClassName::new(&format!("R{i}")).unwrap(),
                u32::try_from(i % 16).unwrap(),
                ShardCount::default(),
            )
            .unwrap()
        })
        .collect()
}

#[tokio::test]
async fn renew_many_takes_one_round_trip_per_256_scopes() {
    let Some(redis) = start_redis() else { return };
    let (store, lifecycle, storage) = connect(&redis).await;
    let task = TaskId::new("a").unwrap();
    let all = scopes(&storage, 1000);
    let mut records: Vec<OwnerRecord> = Vec::new();
    for s in &all {
        let ClaimOutcome::Claimed(l) = store.claim(s, &lifecycle, &task, 60_000).await.unwrap()
        else {
            panic!("fresh scope held")
        };
        records.push(l.record);
    }
    // Load both scripts once (a batch of one takes the one-record script),
    // so the counts below are the steady state.
    assert!(
        store
            .renew_many(&records[..2], 60_000)
            .await
            .iter()
            .all(Result::is_ok)
    );
    store.renew(&records[0], 60_000).await.unwrap();
    for n in [1_usize, 100, 1000] {
        let batch = &records[..n];
        let before = script_calls(&store).await;
        let results = store.renew_many(batch, 60_000).await;
        let batched = script_calls(&store).await - before;
        assert_eq!(results.len(), n);
        assert!(results.iter().all(Result::is_ok), "{n} scopes renewed");
        let before = script_calls(&store).await;
        for r in batch {
            store.renew(r, 60_000).await.unwrap();
        }
        let one_by_one = script_calls(&store).await - before;
        eprintln!("{n} scopes: renew_many {batched} round trips, renew one by one {one_by_one}");
        assert_eq!(batched, n.div_ceil(RENEW_MANY_CHUNK) as u64, "{n} scopes");
        assert_eq!(one_by_one, n as u64, "{n} scopes");
    }
}

#[tokio::test]
async fn renew_all_over_redis_takes_one_round_trip_per_256_scopes() {
    let Some(redis) = start_redis() else { return };
    let (store, lifecycle, storage) = connect(&redis).await;
    let settings = OwnershipSettings {
        owner_ttl_ms: 60_000,
        ..OwnershipSettings::default()
    };
    let mut claimed = 0;
    for n in [1_usize, 100, 1000] {
        let o = Ownership::new(
            store.clone(),
            ManualClock::new(0),
            TaskId::new(&format!("task-{n}")).unwrap(),
            settings,
        );
        let mine = &scopes(&storage, claimed + n)[claimed..];
        claimed += n;
        for s in mine {
            assert!(matches!(
                o.resolve(s, &lifecycle).await.unwrap(),
                Resolution::Local(_)
            ));
        }
        let before = script_calls(&store).await;
        let results = o.renew_all().await;
        let trips = script_calls(&store).await - before;
        assert_eq!(results.len(), n);
        assert!(results.iter().all(|(_, r)| r.is_ok()));
        // The first call may also load the script (NOSCRIPT, SCRIPT LOAD, EVALSHA).
        let chunks = n.div_ceil(RENEW_MANY_CHUNK) as u64;
        assert!(
            (chunks..=chunks + 2).contains(&trips),
            "{n} scopes: {trips} round trips"
        );
        let before = script_calls(&store).await;
        o.renew_all().await;
        assert_eq!(script_calls(&store).await - before, chunks, "{n} scopes");
    }
}
