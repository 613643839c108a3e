//! `cargo xtask demo` (migration scene) and `cargo xtask bench migration`.
//!
//! The demo rebalances a few thousand keys between SQLite file shards under
//! a live writer, crashes the rebalancing process in the middle, recovers
//! and verifies. The bench compares journaled moves with a naive copy /
//! delete / remap baseline, with and without a concurrent writer, and
//! measures that rebalance, verification and purge stream in pages.

#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use durability_migration::conformance::{FaultMappingStore, FaultMode, FaultPlan, FaultShard};
use durability_migration::{
    Clock, Dialect, Ident, ManualClock, MappingStore, MigrationConfig, RebalanceOptions, Router,
    Shard, Statement, SystemClock, Value, VerifyOptions, row,
};
use durability_storage_sqlite::migration::{SqliteMappingStore, SqliteShard};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[allow(clippy::disallowed_methods)] // wall-clock timing of a benchmark
fn instant() -> Instant {
    Instant::now()
}

const USERS: &str = "CREATE TABLE IF NOT EXISTS users (id TEXT PRIMARY KEY, name TEXT, n INTEGER)";

/// Creates shard files with `keys` rows on the first shard and the mapping
/// file pointing every key there (bulk, through rusqlite).
fn setup_files(dir: &Path, shards: usize, keys: usize) -> Result<(), BoxError> {
    std::fs::create_dir_all(dir)?;
    for i in 0..shards {
        let mut c = rusqlite::Connection::open(dir.join(format!("s{i}.db")))?;
        c.execute_batch(USERS)?;
        if i == 0 {
            let tx = c.transaction()?;
            {
                let mut st = tx.prepare("INSERT INTO users (id, name, n) VALUES (?1, ?2, 0)")?;
                for k in 0..keys {
                    st.execute(rusqlite::params![key(k), format!("user {k}")])?;
                }
            }
            tx.commit()?;
        }
    }
    drop(SqliteMappingStore::open(dir.join("map.db"))?);
    let mut m = rusqlite::Connection::open(dir.join("map.db"))?;
    let tx = m.transaction()?;
    {
        let mut st =
            tx.prepare("INSERT INTO durability_mapping (mkey, shard) VALUES (?1, 's0')")?;
        for k in 0..keys {
            st.execute(rusqlite::params![key(k)])?;
        }
    }
    tx.commit()?;
    Ok(())
}

fn key(k: usize) -> String {
    format!("user-{k:06}")
}

struct Files {
    shards: Vec<(String, Arc<SqliteShard>)>,
    mapping: Arc<SqliteMappingStore>,
}

fn open_files(dir: &Path, shards: usize) -> Result<Files, BoxError> {
    let shards = (0..shards)
        .map(|i| {
            Ok((
                format!("s{i}"),
                Arc::new(SqliteShard::open(dir.join(format!("s{i}.db")))?),
            ))
        })
        .collect::<Result<Vec<_>, BoxError>>()?;
    let mapping = Arc::new(SqliteMappingStore::open(dir.join("map.db"))?);
    Ok(Files { shards, mapping })
}

fn config(f: &Files, clock: Arc<dyn Clock>, plan: Option<&Arc<FaultPlan>>) -> MigrationConfig {
    let mapping: Arc<dyn MappingStore> = match plan {
        Some(p) => Arc::new(FaultMappingStore::new(f.mapping.clone(), Arc::clone(p))),
        None => f.mapping.clone(),
    };
    let mut c = MigrationConfig::new(mapping)
        .journal_shard("s0")
        .table("users")
        .clock(clock);
    for (name, s) in &f.shards {
        let shard: Arc<dyn Shard> = match plan {
            Some(p) => Arc::new(FaultShard::new(s.clone(), Arc::clone(p))),
            None => s.clone(),
        };
        c = c.shard(name.clone(), shard);
    }
    c
}

/// Live writer: bumps `n` of keys in turn through a router, remembering the
/// last acknowledged value per key.
fn spawn_writer(
    r: Arc<Router>,
    keys: usize,
    stop: Arc<AtomicBool>,
    cursor: Option<Arc<AtomicUsize>>,
) -> tokio::task::JoinHandle<(HashMap<String, i64>, u64)> {
    tokio::spawn(async move {
        let mut acked = HashMap::new();
        let mut refused = 0u64;
        let mut i: usize = 0;
        let mut v: i64 = 0;
        while !stop.load(Ordering::SeqCst) {
            i = match &cursor {
                // Follow the mover: write the key being moved or the next few.
                Some(c) => (c.load(Ordering::SeqCst) + (v as usize % 8)) % keys,
                None => (i + 7919) % keys,
            };
            v += 1;
            let k = key(i);
            match r.update(&k, "users", row([("n", v)])).await {
                Ok(1) => {
                    acked.insert(k, v);
                }
                Ok(_) => {}
                Err(e) if e.code() == "MIGRATION_CUTOVER_PENDING" => refused += 1,
                Err(e) => eprintln!("writer: {e}"),
            }
            if cursor.is_some() {
                tokio::time::sleep(Duration::from_micros(500)).await;
            } else {
                tokio::task::yield_now().await;
            }
        }
        (acked, refused)
    })
}

async fn count_live(f: &Files, k: &str) -> Result<(usize, Option<i64>), BoxError> {
    let st = Dialect::Sqlite.select_row(&Ident::new("users")?, &Ident::new("id")?, k);
    let mut n = 0;
    let mut val = None;
    for (_, s) in &f.shards {
        for r in s.query(&st).await? {
            n += 1;
            val = r.get("n").and_then(Value::as_integer);
        }
    }
    Ok((n, val))
}

/// The migration demo scene.
///
/// # Errors
/// Any failure of the scene, or a broken invariant.
pub(crate) async fn demo(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    demo_inner(dir)
        .await
        .map_err(|e| -> Box<dyn std::error::Error> { e })
}

async fn demo_inner(dir: &Path) -> Result<(), BoxError> {
    const KEYS: usize = 3000;
    let dir = dir.join("migration-demo");
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "== migration: rebalance {KEYS} keys from 1 to 3 SQLite shards under a live writer =="
    );
    setup_files(&dir, 3, KEYS)?;
    let f = open_files(&dir, 3)?;
    let clock = ManualClock::new(SystemClock.now_ms());
    let writer_router = Arc::new(Router::new(
        config(&f, Arc::new(clock.clone()), None).mapping_cache_ttl_ms(0),
    )?);
    writer_router.init().await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(Arc::clone(&writer_router), KEYS, Arc::clone(&stop), None);

    let plan = FaultPlan::new();
    let crashing = Router::new(config(&f, Arc::new(clock.clone()), Some(&plan)))?;
    crashing.init().await?;
    let crash_at = 3 * 1000 + 5;
    plan.arm(crash_at, FaultMode::After);
    println!(
        "process A: rebalancing; it will crash at its write #{crash_at} (after the write lands)"
    );
    let opts = RebalanceOptions {
        page_size: 200,
        ..RebalanceOptions::default()
    };
    match crashing.rebalance(opts.clone()).await {
        Ok(rep) => println!(
            "process A: rebalance returned: moved {}, failed {}",
            rep.moved,
            rep.failed.len()
        ),
        Err(e) => println!("process A: crashed: {e}"),
    }
    println!(
        "process A: crashed = {}, after {} writes",
        plan.tripped(),
        plan.writes()
    );
    drop(crashing);

    clock.advance(31_000);
    let b = Router::new(config(&f, Arc::new(clock.clone()), None))?;
    b.init().await?;
    let rep = b.recover_migrations().await?;
    println!(
        "process B: recovery examined {}, committed {}, aborted {}, released {}, skipped {}, failed {}",
        rep.examined.len(),
        rep.committed.len(),
        rep.aborted.len(),
        rep.released.len(),
        rep.skipped.len(),
        rep.failed.len()
    );
    let rep = b.rebalance(opts).await?;
    println!(
        "process B: rebalance finished: {} planned, {} moved, {} failed",
        rep.planned,
        rep.moved,
        rep.failed.len()
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, Ordering::SeqCst);
    let (acked, refused) = writer.await?;
    println!(
        "writer: {} keys with acknowledged writes, {refused} writes refused with MIGRATION_CUTOVER_PENDING (not acknowledged)",
        acked.len()
    );
    let v = b
        .verify_migrations(VerifyOptions {
            repair: true,
            ..VerifyOptions::default()
        })
        .await?;
    println!(
        "verify (repair): clean = {}, repaired {}",
        v.clean,
        v.repaired.len()
    );
    let mut per_shard: HashMap<String, usize> = HashMap::new();
    let mut lost = 0;
    for k in 0..KEYS {
        let k = key(k);
        let (n, val) = count_live(&f, &k).await?;
        if n != 1 {
            return Err(format!("key {k} has {n} live rows").into());
        }
        if let Some(a) = acked.get(&k)
            && val != Some(*a)
        {
            lost += 1;
        }
        let shard = b.route(&k).await?.unwrap_or_default();
        *per_shard.entry(shard).or_default() += 1;
        if b.get(&k, "users").await?.is_none() {
            return Err(format!("key {k} unreadable").into());
        }
    }
    let mut dist: Vec<_> = per_shard.into_iter().collect();
    dist.sort();
    println!("keys per shard: {dist:?}");
    println!("every key readable, exactly one live row each, acknowledged writes lost: {lost}");
    if lost != 0 || !v.clean {
        return Err("migration demo invariant broken".into());
    }
    Ok(())
}

struct MoveRun {
    keys_per_s: f64,
    lost: usize,
}

async fn run_journaled(dir: &Path, n: usize, with_writer: bool) -> Result<MoveRun, BoxError> {
    setup_files(dir, 2, n)?;
    let f = open_files(dir, 2)?;
    let r = Arc::new(Router::new(config(&f, Arc::new(SystemClock), None))?);
    r.init().await?;
    let stop = Arc::new(AtomicBool::new(false));
    let cursor = Arc::new(AtomicUsize::new(0));
    let writer = with_writer.then(|| {
        spawn_writer(
            Arc::clone(&r),
            n,
            Arc::clone(&stop),
            Some(Arc::clone(&cursor)),
        )
    });
    let t = instant();
    for k in 0..n {
        cursor.store(k, Ordering::SeqCst);
        let k = key(k);
        let mut tries = 0;
        loop {
            match r.reassign_shard(&k, "s1", "users").await {
                Ok(_) => break,
                Err(e) if e.is_retryable() && tries < 50 => tries += 1,
                Err(e) => return Err(e.into()),
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let lost = match writer {
        Some(w) => {
            let (acked, _) = w.await?;
            let mut lost = 0;
            for (k, v) in acked {
                if count_live(&f, &k).await?.1 != Some(v) {
                    lost += 1;
                }
            }
            lost
        }
        None => 0,
    };
    Ok(MoveRun {
        keys_per_s: n as f64 / secs,
        lost,
    })
}

/// The naive baseline: copy, delete the source, update the mapping. No
/// journal, no fence. Its writer routes by mapping and writes unfenced.
async fn run_naive(dir: &Path, n: usize, with_writer: bool) -> Result<MoveRun, BoxError> {
    setup_files(dir, 2, n)?;
    let f = Arc::new(open_files(dir, 2)?);
    let d = Dialect::Sqlite;
    let (t_users, t_id) = (Ident::new("users")?, Ident::new("id")?);
    let stop = Arc::new(AtomicBool::new(false));
    let cursor = Arc::new(AtomicUsize::new(0));
    let writer = with_writer.then(|| {
        let f = Arc::clone(&f);
        let stop = Arc::clone(&stop);
        let cursor = Arc::clone(&cursor);
        tokio::spawn(async move {
            let mut acked: HashMap<String, i64> = HashMap::new();
            let mut v = 0i64;
            while !stop.load(Ordering::SeqCst) {
                let i = (cursor.load(Ordering::SeqCst) + (v as usize % 8)) % n;
                v += 1;
                let k = key(i);
                if let Ok(Some(s)) = f.mapping.get(&k).await
                    && let Some((_, shard)) = f.shards.iter().find(|(name, _)| *name == s)
                {
                    // A plain routed update: no fence.
                    let st = Statement::with_params(
                        "UPDATE users SET n = ?1 WHERE id = ?2",
                        vec![Value::Integer(v), Value::from(k.as_str())],
                    );
                    if let Ok(1) = shard.execute(&st).await {
                        acked.insert(k, v);
                    }
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            acked
        })
    });
    let (src, dst) = (&f.shards[0].1, &f.shards[1].1);
    let t = instant();
    for k in 0..n {
        cursor.store(k, Ordering::SeqCst);
        let k = key(k);
        let rows = src.query(&d.select_row(&t_users, &t_id, &k)).await?;
        let Some(r) = rows.into_iter().next() else {
            continue;
        };
        let cols: Vec<(Ident, Value)> = r
            .iter()
            .map(|(c, v)| Ok((Ident::new(c)?, v.clone())))
            .collect::<Result<_, BoxError>>()?;
        dst.execute(&d.insert_row(&t_users, &cols)).await?;
        // The I/O boundaries a networked mover has between its steps.
        tokio::task::yield_now().await;
        src.execute(&d.delete_key(&t_users, &t_id, &k)).await?;
        tokio::task::yield_now().await;
        f.mapping.put(&k, "s1").await?;
    }
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let lost = match writer {
        Some(w) => {
            let acked = w.await?;
            let mut lost = 0;
            for (k, v) in acked {
                if count_live(&f, &k).await?.1 != Some(v) {
                    lost += 1;
                }
            }
            lost
        }
        None => 0,
    };
    Ok(MoveRun {
        keys_per_s: n as f64 / secs,
        lost,
    })
}

fn rss_reset() {
    // Resets the peak RSS (VmHWM) of this process (Linux).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Sets up `n` mapped keys whose moves are journaled and archived (bulk),
/// then measures the peak RSS of a rebalance dry run, a verification and a
/// purge over them.
async fn stream_rss(dir: &Path, n: usize) -> Result<u64, BoxError> {
    setup_files(dir, 2, n)?;
    {
        // Journal and archive rows as n finished moves would leave them.
        let f = open_files(dir, 2)?;
        let r = Router::new(config(&f, Arc::new(SystemClock), None))?;
        r.init().await?;
    }
    let mut c = rusqlite::Connection::open(dir.join("s0.db"))?;
    let tx = c.transaction()?;
    {
        let mut op = tx.prepare(
            "INSERT INTO durability_migration_ops (op_id, scope, mkey, tables, source, target, state, attempts, digests, owner, live_until_ms, retain_ms, retire_at_ms, created_ms, updated_ms, finished_ms, purged) \
             VALUES (?1, 'default', ?2, 'users', 's1', 's0', 'retired', 0, 'users=-', 'bench', 0, 0, 0, 0, 0, 0, 0)",
        )?;
        let mut tomb = tx.prepare(
            "INSERT INTO durability_retired (op_id, tname, mkey, scope, moved_to, payload, digest, retired_ms) VALUES (?1, 'users', ?2, 'default', 's1', x'00', '-', 0)",
        )?;
        for k in 0..n {
            let id = format!("op-{k:08}");
            op.execute(rusqlite::params![id, key(k)])?;
            tomb.execute(rusqlite::params![id, format!("gone-{k}")])?;
        }
    }
    tx.commit()?;
    drop(c);
    let f = open_files(dir, 2)?;
    let r = Router::new(config(&f, Arc::new(SystemClock), None))?;
    rss_reset();
    let base = peak_rss_kib();
    let plan = r
        .rebalance(RebalanceOptions {
            dry_run: true,
            page_size: 500,
            ..RebalanceOptions::default()
        })
        .await?;
    let v = r.verify_migrations(VerifyOptions::default()).await?;
    let p = r.purge_retired().await?;
    let peak = peak_rss_kib();
    eprintln!(
        "  n={n}: planned {} moves, verify clean={}, purged {}, peak RSS {peak} KiB (start {base} KiB)",
        plan.planned, v.clean, p.purged_count
    );
    Ok(peak)
}

fn json_line(
    name: &str,
    value: f64,
    baseline: f64,
    unit: &str,
    target: &str,
    n: usize,
    extra: &str,
) {
    let ratio = if baseline > 0.0 {
        value / baseline
    } else {
        0.0
    };
    println!(
        "{{\"name\":\"{name}\",\"value\":{value:.1},\"baseline\":{baseline:.1},\"unit\":\"{unit}\",\"ratio\":{ratio:.3},\"target\":\"{target}\",\"n\":{n},\"backend\":\"sqlite\",\"synchronous\":\"NORMAL\"{extra}}}"
    );
}

/// `cargo xtask bench migration`: JSON lines on stdout, commentary on stderr.
///
/// # Errors
/// Any failure of a run, or lost acknowledged writes on the journaled path.
pub(crate) async fn bench(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    bench_inner(dir)
        .await
        .map_err(|e| -> Box<dyn std::error::Error> { e })
}

async fn bench_inner(dir: &Path) -> Result<(), BoxError> {
    const N: usize = 10_000;
    let dir = dir.join("migration-bench");
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("migration bench: {N} keys, SQLite file shards, synchronous=NORMAL");
    let ours = run_journaled(&dir.join("ours"), N, false).await?;
    let naive = run_naive(&dir.join("naive"), N, false).await?;
    eprintln!(
        "  journaled {:.0} keys/s, naive {:.0} keys/s",
        ours.keys_per_s, naive.keys_per_s
    );
    json_line(
        "migration.move",
        ours.keys_per_s,
        naive.keys_per_s,
        "keys/s",
        ">=0.25",
        N,
        "",
    );
    let ours_w = run_journaled(&dir.join("ours-w"), N, true).await?;
    let naive_w = run_naive(&dir.join("naive-w"), N, true).await?;
    eprintln!(
        "  with a concurrent writer: journaled {:.0} keys/s ({} lost writes), naive {:.0} keys/s ({} lost writes)",
        ours_w.keys_per_s, ours_w.lost, naive_w.keys_per_s, naive_w.lost
    );
    json_line(
        "migration.move_concurrent_writer",
        ours_w.keys_per_s,
        naive_w.keys_per_s,
        "keys/s",
        ">=0.25",
        N,
        &format!(
            ",\"lost_writes\":{},\"baseline_lost_writes\":{}",
            ours_w.lost, naive_w.lost
        ),
    );
    eprintln!("streaming (rebalance dry run + verify + purge):");
    let small = stream_rss(&dir.join("rss-10k"), 10_000).await?;
    let large = stream_rss(&dir.join("rss-100k"), 100_000).await?;
    json_line(
        "migration.stream_peak_rss",
        large as f64,
        small as f64,
        "KiB",
        "<=1.2",
        100_000,
        ",\"baseline_n\":10000",
    );
    if ours_w.lost != 0 {
        return Err(format!("journaled moves lost {} acknowledged writes", ours_w.lost).into());
    }
    Ok(())
}
