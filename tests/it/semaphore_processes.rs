//! The semaphore holder and flow control across host processes
//! (`semaphore-host`): three hosts sharing only a directory (SQLite leases,
//! alarm index, objects) deliver one outbox channel under a cross-host
//! concurrency and rate limit; shards holding permits and the holder's own
//! host are killed with SIGKILL. Real processes, real time: every wait
//! polls with a deadline.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use durability_tests::process::{Proc, field, host_command, now};

const TOKEN: &str = "test-internal-token-0123456789";

/// Spawns one `semaphore-host` process and waits until it is ready.
fn spawn(name: &str, dir: &Path, extra: &[&str]) -> Proc {
    let mut command = host_command(env!("CARGO_BIN_EXE_semaphore-host"), name, dir, TOKEN);
    command
        .args(extra)
        .env("DO_OWNER_TTL_SECONDS", "2")
        .env("DO_OWNER_LEASE_GUARD_MS", "300");
    let p = Proc::spawn(name, command);
    p.wait_line("ready ");
    p
}

fn num(line: &str, key: &str) -> i64 {
    field(line, key).parse().unwrap()
}

/// Spawns hosts `a`, `b`, `c` one after the other and waits (real time,
/// with a deadline) until the shards were balanced: each later host
/// acquired shards the first handed off.
fn three_hosts(dir: &Path, extra: &[&str]) -> Vec<Proc> {
    let procs: Vec<Proc> = ["a", "b", "c"]
        .iter()
        .map(|t| spawn(t, dir, extra))
        .collect();
    for p in &procs[1..] {
        p.wait_line("acquired ");
    }
    procs[0].wait_n("released ", 2);
    procs
}

/// Sends `command` to the hosts in turn until one answers `ok` (only the
/// owner of an object runs a transaction on it), within a deadline.
fn on_owner(procs: &mut [Proc], command: &str, what: &str) -> String {
    let end = now() + 30_000;
    loop {
        for p in procs.iter_mut() {
            let line = p.ask_for(command, what);
            if line.starts_with("ok ") {
                return line;
            }
        }
        assert!(now() < end, "no host ran {command}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

const N: i64 = 2;
const R: usize = 5;
const INTERVAL_MS: i64 = 1_000;
/// The rate is granted on the holder's clock; a sink sees each delivery
/// later by its own grant-to-publish latency, so a sink window shorter
/// than the interval by this much holds at most R.
const RATE_TOLERANCE_MS: i64 = 250;

#[test]
fn three_hosts_deliver_one_channel_under_a_cross_host_concurrency_and_rate_limit() {
    let dir = tempfile::tempdir().unwrap();
    let extra = [&*format!("interval={INTERVAL_MS}"), "work=300"];
    let mut procs = three_hosts(dir.path(), &extra);
    for (pool, capacity) in [("conc", N), ("rate", i64::try_from(R).unwrap())] {
        let args = format!(r#"{{"pool":"{pool}","capacity":{capacity}}}"#);
        on_owner(
            &mut procs,
            &format!("call limits configure {args}"),
            "call limits configure",
        );
    }
    let (objects, per_object) = (9, 4);
    let mut keys = BTreeSet::new();
    for o in 0..objects {
        on_owner(
            &mut procs,
            &format!("stage p{o} {per_object}"),
            &format!("stage p{o}"),
        );
        keys.extend((0..per_object).map(|i| format!("p{o}-{i}")));
    }
    let end = now() + 120_000;
    let delivered = loop {
        let ended: BTreeSet<String> = procs
            .iter()
            .flat_map(Proc::texts)
            .filter(|l| l.starts_with("end "))
            .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
            .collect();
        if ended == keys || now() > end {
            break ended;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(delivered, keys, "every entry delivered");

    // Concurrency: starts and ends of every publish on every host.
    let mut events: Vec<(i64, i64)> = Vec::new();
    let mut starts: Vec<i64> = Vec::new();
    let mut hosts_used = BTreeSet::new();
    for p in &procs {
        for l in p.texts() {
            if l.starts_with("start ") {
                events.push((num(&l, "at"), 1));
                starts.push(num(&l, "at"));
                hosts_used.insert(field(&l, "task").to_owned());
            } else if l.starts_with("end ") {
                events.push((num(&l, "at"), -1));
            }
        }
    }
    // At one millisecond an end comes first: the permit is given back
    // only after the end was printed.
    events.sort_unstable();
    let (mut in_flight, mut most) = (0, 0);
    for (_, d) in &events {
        in_flight += d;
        most = most.max(in_flight);
    }
    starts.sort_unstable();
    let window = |len: i64| {
        (0..starts.len())
            .map(|i| {
                starts[i..]
                    .iter()
                    .take_while(|s| **s < starts[i] + len)
                    .count()
            })
            .max()
            .unwrap_or(0)
    };
    let (tolerant, full) = (window(INTERVAL_MS - RATE_TOLERANCE_MS), window(INTERVAL_MS));
    let span = starts.last().unwrap() - starts.first().unwrap();
    eprintln!(
        "deliveries={} hosts={hosts_used:?} most_in_flight={most} (N={N}) most_per_{}ms={tolerant} most_per_{INTERVAL_MS}ms={full} (R={R}) span_ms={span}",
        starts.len(),
        INTERVAL_MS - RATE_TOLERANCE_MS
    );
    assert!(most <= N, "at most {N} in flight, saw {most}");
    assert!(tolerant <= R, "at most {R} per window, saw {tolerant}");
    assert!(
        hosts_used.len() > 1,
        "deliveries ran on several hosts: {hosts_used:?}"
    );
}

const LEASE_MS: i64 = 3_000;
const CAPACITY: i64 = 3;

/// Every `granted` line of every host as (granted at, lease deadline), both
/// on the holder's clock (a grant is never renewed: it began `LEASE_MS`
/// before its deadline).
fn grants(procs: &[&Proc]) -> Vec<(i64, i64)> {
    procs
        .iter()
        .flat_map(|p| p.texts())
        .filter(|l| l.starts_with("granted "))
        .map(|l| {
            let until = num(&l, "lease_until");
            (until - LEASE_MS, until)
        })
        .collect()
}

#[test]
fn killed_shards_and_a_killed_holder_host_never_let_live_grants_exceed_the_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = three_hosts(dir.path(), &[]);
    let args = format!(r#"{{"pool":"kill","capacity":{CAPACITY}}}"#);
    on_owner(
        &mut procs,
        &format!("call limits configure {args}"),
        "call limits configure",
    );
    let who = procs[0].ask_for("call limits whoami {}", "call limits whoami");
    let holder_task = who.split('"').nth(3).unwrap().to_owned();
    let holder_at = procs.iter().position(|p| p.name() == holder_task).unwrap();
    let (shard_at, waiter_at) = match holder_at {
        0 => (1, 2),
        1 => (0, 2),
        _ => (0, 1),
    };
    eprintln!(
        "holder on {holder_task}, shard {}, waiter {}",
        procs[shard_at].name(),
        procs[waiter_at].name()
    );

    // A shard takes every permit, then dies holding them.
    for k in ["s1", "s2", "s3"] {
        procs[shard_at].send(&format!("hold kill {k} {LEASE_MS}"));
    }
    let held: Vec<String> = procs[shard_at]
        .wait_n("granted ", 3)
        .into_iter()
        .map(|(_, l)| l)
        .collect();
    procs[waiter_at].send(&format!("hold kill w1 {LEASE_MS}"));
    procs[shard_at].kill();
    let dead_until = held.iter().map(|l| num(l, "lease_until")).max().unwrap();
    let first_until = held.iter().map(|l| num(l, "lease_until")).min().unwrap();
    let w1 = procs[waiter_at].wait_line("granted ").1;
    let w1_granted = num(&w1, "lease_until") - LEASE_MS;
    eprintln!(
        "dead shard's leases end {first_until}..={dead_until}; waiter granted at {w1_granted} (+{} ms)",
        w1_granted - first_until
    );
    assert!(
        w1_granted >= first_until,
        "not before a dead shard's lease ended"
    );
    assert!(
        w1_granted <= dead_until + 2_000,
        "a dead shard's permit returned within its lease (+2 s for the wake and the call)"
    );

    // The holder's host dies; the holder reopens on a survivor from its
    // stored rows, and the waiter's further requests are granted there.
    procs[holder_at].kill();
    for k in ["w2", "w3", "w4"] {
        procs[waiter_at].send(&format!("hold kill {k} {LEASE_MS}"));
    }
    procs[waiter_at].wait_within("4 grants", 60_000, |lines| {
        (lines
            .iter()
            .filter(|(_, l)| l.starts_with("granted "))
            .count()
            >= 4)
            .then_some(())
    });
    assert!(
        procs[waiter_at]
            .texts()
            .iter()
            .all(|l| !l.starts_with("refused")),
        "{:#?}",
        procs[waiter_at].texts()
    );

    let all: Vec<&Proc> = procs.iter().collect();
    let history = grants(&all);
    assert_eq!(history.len(), 7, "{history:?}");
    let most = history
        .iter()
        .map(|(at, _)| history.iter().filter(|(s, e)| s <= at && at < e).count())
        .max()
        .unwrap();
    eprintln!(
        "grants={} most_live={most} (capacity {CAPACITY})",
        history.len()
    );
    assert!(
        i64::try_from(most).unwrap() <= CAPACITY,
        "live grants exceeded the capacity: {history:?}"
    );
}
