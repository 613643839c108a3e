//! Process-level fencing tests: real `fence-host` processes (the `tests`
//! package's binary) on the test's own `redis-server` (a free port, a temp
//! dir, no persistence) and one SQLite object database in a shared temp dir.
//! Holders are paused with SIGSTOP, the Redis is wiped (`FLUSHALL`) or
//! restarted, and the stored SQLite state is checked afterwards.
//!
//! Without `redis-server` on the `PATH` the tests say they skipped, unless
//! `DURABILITY_REQUIRE_SERVICES=1`.
#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use durability_ownership::{
    Clock, LifecycleAdmin, LifecycleId, ShardCount, StorageId, SystemClock,
};
use durability_storage_postgres::testkit::cluster::signal;
use durability_storage_redis::ownership::RedisLeaseStore;
use durability_tests::process::Proc;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` of the test's own, without persistence.
struct Redis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Redis {
    /// Starts one, or `None` when `redis-server` is not installed.
    fn start(dir: &Path) -> Option<Self> {
        let port = free_port();
        let mut r = Self {
            child: Self::spawn(port, dir)?,
            port,
            dir: dir.to_owned(),
        };
        r.wait_ready();
        Some(r)
    }

    fn spawn(port: u16, dir: &Path) -> Option<Child> {
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn wait_ready(&mut self) {
        let clock = SystemClock::new();
        let end = clock.now_ms() + 10_000;
        while clock.now_ms() < end {
            if let Ok(client) = redis::Client::open(self.url())
                && let Ok(mut c) = client.get_connection()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    fn flushall(&self) {
        let mut c = redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("FLUSHALL").query::<()>(&mut c).unwrap();
    }

    /// Stops the server by pid (SIGKILL: nothing is saved) and starts it
    /// again on the same port: every key is gone.
    fn restart(&mut self) {
        self.stop();
        self.child = Self::spawn(self.port, &self.dir).unwrap();
        self.wait_ready();
    }

    fn stop(&mut self) {
        signal(self.child.id(), "KILL");
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop();
        }
    }
}

/// One `fence-host` process and the lines it printed (stdout; its stderr
/// goes to the test's).
struct Host {
    name: &'static str,
    proc: Proc,
}

impl Host {
    fn spawn(name: &'static str, redis: &Redis, db: &Path, extra: &[&str]) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_fence-host"))
            .arg(format!("redis={}", redis.url()))
            .arg("prefix=t:")
            .arg(format!("db={}", db.display()))
            .arg(format!("task={name}"))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Self {
            name,
            proc: Proc::of(name, child),
        }
    }

    fn lines(&self) -> Vec<String> {
        self.proc.texts()
    }

    fn count(&self, prefix: &str) -> usize {
        self.proc.count(prefix)
    }

    /// Waits (real time: these are real processes) until `done` holds for
    /// the lines printed after line `from`.
    fn wait(&self, what: &str, from: usize, done: impl Fn(&[String]) -> bool) {
        self.proc.wait_until(what, |lines| {
            let after: Vec<String> = lines[from.min(lines.len())..]
                .iter()
                .map(|(_, l)| l.clone())
                .collect();
            done(&after).then_some(())
        });
    }

    fn wait_commits(&self, n: usize) {
        let from = self.lines().len();
        self.wait(&format!("{n} commits"), from, |l| {
            l.iter().filter(|l| l.starts_with("commit ")).count() >= n
        });
    }

    /// Stops the process between two transactions (not inside one: a
    /// holder stopped inside its transaction holds the object database's
    /// write lock, which is finding 2's test); returns how many lines it had
    /// printed.
    fn pause(&self) -> usize {
        loop {
            signal(self.proc.child.id(), "STOP");
            // The process is stopped: whatever it printed reaches the reader.
            std::thread::sleep(Duration::from_millis(50));
            let lines = self.lines();
            if !lines.last().is_some_and(|l| l.starts_with("in-tx ")) {
                return lines.len();
            }
            self.resume();
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the process wherever it is (inside a transaction too).
    fn pause_anywhere(&self) {
        signal(self.proc.child.id(), "STOP");
    }

    fn resume(&self) {
        signal(self.proc.child.id(), "CONT");
    }

    /// Resumes the host paused at line `paused` (see [`Host::pause`]) and
    /// waits until it reports its late write refused or lost: the lines
    /// it printed since the pause.
    fn resume_until_refused(&self, paused: usize) -> Vec<String> {
        self.resume();
        eprintln!("resumed {}", self.name);
        self.wait(&format!("{} refused late write", self.name), paused, |l| {
            l.iter()
                .any(|l| l.starts_with("refused ") || l.starts_with("lost "))
        });
        self.lines()[paused..].to_vec()
    }
}

fn redis_or_skip(dir: &Path, test: &str) -> Option<Redis> {
    match Redis::start(dir) {
        Some(r) => Some(r),
        None if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("{test}: redis-server is required (DURABILITY_REQUIRE_SERVICES=1)")
        }
        None => {
            eprintln!("{test}: skipped: redis-server is not installed");
            None
        }
    }
}

/// The control plane's part: point the lifecycle at the storage (again,
/// after a wipe).
fn set_pointer(redis: &Redis) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = RedisLeaseStore::connect(&redis.url(), "t:", ShardCount::default())
            .await
            .unwrap();
        store
            .set_active_storage(
                &LifecycleId::new("ns:fence").unwrap(),
                Some(&StorageId::new("st1").unwrap()),
            )
            .await
            .unwrap();
    });
}

/// A committed write as stored in the object database.
#[derive(Debug)]
pub(crate) struct Write {
    pub(crate) seq: i64,
    pub(crate) task: String,
    pub(crate) generation: i64,
    pub(crate) holder: String,
}

fn stored_writes(db: &Path) -> Vec<Write> {
    let c = rusqlite::Connection::open(db).unwrap();
    let mut st = c
        .prepare("SELECT seq, task, generation, holder FROM writes ORDER BY seq")
        .unwrap();
    st.query_map([], |r| {
        Ok(Write {
            seq: r.get(0)?,
            task: r.get(1)?,
            generation: r.get(2)?,
            holder: r.get(3)?,
        })
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// Violations of the fence: a generation committed by two holders, or a
/// write that landed after a newer generation had committed.
pub(crate) fn fence_violations(writes: &[Write]) -> Vec<String> {
    let mut violations = Vec::new();
    let mut holders: std::collections::BTreeMap<i64, (String, String)> = Default::default();
    let mut top = 0;
    for w in writes {
        let (task, holder) = holders
            .entry(w.generation)
            .or_insert_with(|| (w.task.clone(), w.holder.clone()));
        if *holder != w.holder {
            violations.push(format!(
                "write #{} by {} at generation {}: generation already committed by {task}",
                w.seq, w.task, w.generation
            ));
        }
        if w.generation < top {
            violations.push(format!(
                "write #{} by {} at generation {} landed after generation {top}",
                w.seq, w.task, w.generation
            ));
        }
        top = top.max(w.generation);
    }
    violations
}

/// Finding 1: the lease store loses its data (FLUSHALL, then a restart of a
/// Redis without persistence) while a holder is paused. Claims start again
/// at generation 1; no generation may be committed by two holders and the
/// paused holder's late writes must be refused.
#[test]
fn a_wiped_or_restarted_lease_store_never_lets_two_holders_commit_one_generation() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut redis) = redis_or_skip(dir.path(), "fence_processes") else {
        return;
    };
    let db = dir.path().join("object.db");
    set_pointer(&redis);

    let a = Host::spawn("task-a", &redis, &db, &[]);
    a.wait_commits(3);
    let a_paused = a.pause();
    eprintln!("paused task-a after {} commits", a.count("commit "));
    redis.flushall();
    set_pointer(&redis);
    eprintln!("wiped the lease store (FLUSHALL)");

    let b = Host::spawn("task-b", &redis, &db, &[]);
    b.wait_commits(3);
    let a_late = a.resume_until_refused(a_paused);

    let b_paused = b.pause();
    eprintln!("paused task-b after {} commits", b.count("commit "));
    redis.restart();
    set_pointer(&redis);
    eprintln!("restarted the lease store (no persistence)");
    let a_commits = a.count("commit ");
    a.wait("a commits again", 0, |l| {
        l.iter().filter(|l| l.starts_with("commit ")).count() >= a_commits + 3
    });
    let b_late = b.resume_until_refused(b_paused);
    drop(a);
    drop(b);

    let writes = stored_writes(&db);
    let violations = fence_violations(&writes);
    let gens: std::collections::BTreeSet<i64> = writes.iter().map(|w| w.generation).collect();
    eprintln!(
        "{} writes committed under generations {gens:?}; task-a after resume: {a_late:?}; task-b after resume: {b_late:?}",
        writes.len()
    );
    assert!(violations.is_empty(), "fence violations: {violations:#?}");
    for (who, late) in [("task-a", &a_late), ("task-b", &b_late)] {
        let first = late.iter().find(|l| {
            l.starts_with("commit ") || l.starts_with("refused ") || l.starts_with("lost ")
        });
        assert!(
            first.is_some_and(|l| !l.starts_with("commit ")),
            "{who}'s first step after its pause must not commit: {late:?}"
        );
    }
}

/// Finding 2: a holder stopped inside its fenced transaction (holding the
/// object database's write lock) past its lease. The new owner claims and
/// tries to fence (each attempt ends after the busy timeout with a
/// retryable owner race); the old holder is resumed and its commit must be
/// refused (rolled back by the pre-commit lease budget check), and the new
/// owner's writes stand.
#[test]
fn a_holder_paused_inside_its_transaction_past_its_lease_is_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let Some(redis) = redis_or_skip(dir.path(), "fence_processes") else {
        return;
    };
    let db = dir.path().join("object.db");
    set_pointer(&redis);
    let lease = ["ttl=800", "guard=200"];
    let a = Host::spawn("task-a", &redis, &db, &[lease[0], lease[1], "stall=4"]);
    a.wait("the stalled transaction", 0, |l| {
        l.iter().any(|l| l.starts_with("in-tx n=4 "))
    });
    a.pause_anywhere();
    eprintln!("paused task-a inside the transaction of write 4");
    let b = Host::spawn("task-b", &redis, &db, &lease);
    b.wait("a claim after task-a's lease ran out", 0, |l| {
        l.iter().any(|l| l.starts_with("claim "))
    });
    b.wait("a fencing attempt blocked by task-a's lock", 0, |l| {
        l.iter().any(|l| l.starts_with("fence-refused "))
    });
    eprintln!(
        "task-b claimed; its fence waited for task-a's write lock: {:?}",
        b.lines()
    );
    a.resume();
    eprintln!("resumed task-a");
    a.wait("task-a's stalled write settles", 0, |l| {
        l.iter()
            .any(|l| l.starts_with("refused n=4 ") || l.starts_with("commit n=4 "))
    });
    b.wait_commits(3);
    let a_lines = a.lines();
    drop(a);
    drop(b);
    let writes = stored_writes(&db);
    eprintln!(
        "task-a: {:?}; {} writes stored",
        &a_lines[a_lines.len().saturating_sub(3)..],
        writes.len()
    );
    assert!(
        a_lines
            .iter()
            .any(|l| l.starts_with("refused n=4 ") && l.contains("stale owner")),
        "task-a's late commit must be refused as a stale owner: {a_lines:?}"
    );
    let first_b = writes.iter().position(|w| w.task == "task-b").unwrap();
    let (a_gen, b_gen) = (writes[0].generation, writes[first_b].generation);
    // After its refusal task-a claims again; on a loaded machine task-b may
    // miss a renew and lose its 800 ms lease, and task-a may then own the
    // scope at a newer generation. Nothing of task-a's old generation may
    // land after task-b's first write.
    assert!(
        writes[first_b..]
            .iter()
            .all(|w| w.task == "task-b" || w.generation > b_gen),
        "task-a committed at its old generation after task-b took over: {writes:?}"
    );
    assert_eq!(
        writes
            .iter()
            .filter(|w| w.task == "task-a" && w.generation == a_gen)
            .count(),
        3,
        "task-a's writes 1..=3 stand, its stalled write 4 does not: {writes:?}"
    );
    assert!(
        writes.iter().filter(|w| w.task == "task-b").count() >= 3,
        "task-b's writes stand"
    );
    assert!(fence_violations(&writes).is_empty(), "{writes:?}");
}

/// Deterministic xorshift64: the schedule of pauses is reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A claim as its holder logged it: generation and the local time (ms)
/// by which the claim had been made.
#[derive(Debug)]
struct LoggedClaim {
    task: &'static str,
    generation: i64,
    by_ms: i64,
}

fn logged_claims(host: &Host) -> Vec<LoggedClaim> {
    host.lines()
        .iter()
        .filter(|l| l.starts_with("claim ") || l.starts_with("fenced "))
        .filter_map(|l| {
            let field = |k: &str| {
                l.split(' ')
                    .find_map(|f| f.strip_prefix(k))
                    .and_then(|v| v.parse::<i64>().ok())
            };
            Some(LoggedClaim {
                task: host.name,
                generation: field("gen=")?,
                by_ms: field("t=")?,
            })
        })
        .collect()
}

/// Every committed write must have been made while its writer's claim was
/// the newest claim: a write made (its `t`, before its commit) after a
/// newer claim had been made is a stale write, wherever it falls relative
/// to the new owner's first fenced transaction.
fn lock_set_violations(db: &Path, claims: &[LoggedClaim]) -> Vec<String> {
    let c = rusqlite::Connection::open(db).unwrap();
    let mut st = c
        .prepare("SELECT seq, task, generation, t FROM writes ORDER BY seq")
        .unwrap();
    let rows: Vec<(i64, String, i64, i64)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut violations = Vec::new();
    for (seq, task, generation, t) in rows {
        if !claims
            .iter()
            .any(|c| c.task == task && c.generation == generation)
        {
            violations.push(format!(
                "write #{seq} by {task} under an unlogged claim {generation}"
            ));
        }
        if let Some(newer) = claims
            .iter()
            .find(|c| c.generation > generation && c.by_ms < t)
        {
            violations.push(format!(
                "write #{seq} by {task} at generation {generation} made at {t} after {} claimed generation {} (by {})",
                newer.task, newer.generation, newer.by_ms
            ));
        }
    }
    violations
}

/// One seeded run of the lock-set test on real processes: three hosts on
/// the test's own Redis compete for one scope; the schedule pauses and
/// resumes them with SIGSTOP/SIGCONT (between transactions or inside one)
/// for `steps` steps of 100 ms. Returns the violations, the claims and the
/// number of committed writes.
fn lock_set_run(seed: u64, fencing: bool, steps: usize) -> Option<(Vec<String>, usize, usize)> {
    let dir = tempfile::tempdir().unwrap();
    let redis = redis_or_skip(dir.path(), "lock_set_on_processes")?;
    let db = dir.path().join("object.db");
    set_pointer(&redis);
    let mut args = vec!["ttl=500", "guard=150", "pace=10"];
    if !fencing {
        args.push("fencing=off");
    }
    let hosts = [
        Host::spawn("task-a", &redis, &db, &args),
        Host::spawn("task-b", &redis, &db, &args),
        Host::spawn("task-c", &redis, &db, &args),
    ];
    let mut paused = [false; 3];
    let mut rng = Rng(seed);
    let (mut pauses, mut inside) = (0, 0);
    // Prologue, the same every run: the first holder is paused between two
    // transactions until another host has claimed, then resumed.
    hosts[0].wait("3 commits by any host", 0, |_| {
        hosts.iter().map(|h| h.count("commit ")).sum::<usize>() >= 3
    });
    let first = (0..3)
        .max_by_key(|&h| {
            logged_claims(&hosts[h])
                .iter()
                .map(|c| c.generation)
                .max()
                .unwrap_or(0)
        })
        .unwrap();
    let before: usize = hosts.iter().map(|h| h.count("claim ")).sum();
    hosts[first].pause();
    pauses += 1;
    let other = (first + 1) % 3;
    hosts[other].wait("a takeover", 0, |_| {
        hosts.iter().map(|h| h.count("claim ")).sum::<usize>() > before
    });
    hosts[first].resume();
    for _ in 0..steps {
        // Mostly the current holder (the newest claim logged), so that most
        // pauses outlive a lease that someone else then claims.
        let holder = (0..3).max_by_key(|&h| {
            logged_claims(&hosts[h])
                .iter()
                .map(|c| c.generation)
                .max()
                .unwrap_or(0)
        });
        let i = match holder {
            Some(h) if rng.next(4) != 0 => h,
            _ => usize::try_from(rng.next(3)).unwrap(),
        };
        match rng.next(4) {
            0 | 1 if !paused[i] && paused.iter().filter(|p| **p).count() < 2 => {
                let h = &hosts[i];
                h.pause_anywhere();
                std::thread::sleep(Duration::from_millis(20));
                if h.lines().last().is_some_and(|l| l.starts_with("in-tx ")) {
                    inside += 1;
                }
                paused[i] = true;
                pauses += 1;
            }
            2 if paused[i] => {
                hosts[i].resume();
                paused[i] = false;
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for (h, p) in hosts.iter().zip(paused) {
        if p {
            h.resume();
        }
    }
    std::thread::sleep(Duration::from_millis(700));
    for h in &hosts {
        h.pause_anywhere();
    }
    std::thread::sleep(Duration::from_millis(50));
    let claims: Vec<LoggedClaim> = hosts.iter().flat_map(logged_claims).collect();
    let refused: usize = hosts.iter().map(|h| h.count("refused ")).sum();
    drop(hosts);
    let violations = lock_set_violations(&db, &claims);
    let writes: usize = stored_writes(&db).len();
    eprintln!(
        "lock_set seed {seed} fencing {}: {pauses} pauses ({inside} inside a transaction), {} claims, {writes} writes committed, {refused} refused, {} violations",
        if fencing { "on" } else { "off" },
        claims.len(),
        violations.len()
    );
    Some((violations, claims.len(), writes))
}

/// Finding 4: the lock-set test on separate processes. With fencing, no
/// committed write was made after a newer claim; with fencing off
/// (`fencing=off`: no object fence, no lease budget) the same checker must
/// find violations. The default run is one seed of 3 s each way;
/// `DURABILITY_LOCK_SET_SEEDS=<n>` runs `n` seeds (`cargo xtask verify`'s
/// filter selects this test by its name).
#[test]
fn lock_set_on_processes_holds_with_fencing_and_is_caught_without() {
    let seeds: u64 = std::env::var("DURABILITY_LOCK_SET_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for k in 0..seeds {
        let seed = 0x9E37_79B9_7F4A_7C15_u64.wrapping_add(k.wrapping_mul(7919));
        let Some((violations, claims, writes)) = lock_set_run(seed, true, 30) else {
            return;
        };
        assert!(
            violations.is_empty(),
            "seed {seed}: fenced run violated: {violations:#?}"
        );
        assert!(
            claims > 3 && writes > 20,
            "seed {seed}: too little happened"
        );
        let (violations, _, _) = lock_set_run(seed, false, 30).unwrap();
        assert!(
            !violations.is_empty(),
            "seed {seed}: the checker missed stale writes with fencing off"
        );
    }
}
