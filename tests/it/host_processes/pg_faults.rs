//! Issue 35, item 6 and the rest of its process tests: `pg-object-host`
//! processes (each in a working directory of its own, sharing only the
//! PostgreSQL server) under call load while the server restarts, while a
//! host drains on SIGTERM, and while the primary of a primary + synchronous
//! standby pair is SIGKILLed and the standby promoted. Every acknowledged
//! write is checked against the stored rows, every commit against the
//! claims the hosts printed (task, generation), and every call's answer
//! against what it may have written: an `ok` is stored, a `not_started`
//! refusal wrote nothing, only an `unknown` outcome may have. Each test
//! prints what it tried.

use std::collections::BTreeMap;

use durability_storage_postgres::testkit::cluster::Cluster;

use super::postgres::{Db, check, pair, runtime, runtime_schema_and_db, stored};
use super::{Proc, TTL_S};
use crate::host_processes::now;

/// How many writes each answer of a host allows, per object: an `ok`
/// exactly its writes, an `unknown` outcome from none up to them, a
/// `not_started` refusal none. `incr` and `hold` write once, `slow` twice.
#[derive(Debug, Default, Clone, Copy)]
struct Bounds {
    min: usize,
    max: usize,
    ok: usize,
    unknown: usize,
    not_started: usize,
}

/// The bounds of each (host, object) from the host's answer lines.
fn bounds(p: &Proc) -> BTreeMap<String, Bounds> {
    let mut out: BTreeMap<String, Bounds> = BTreeMap::new();
    for (_, l) in p.lines() {
        let mut words = l.split_whitespace();
        let (Some(verdict), Some(cmd), Some(name)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        let writes = match cmd {
            "incr" | "hold" => 1,
            "slow" => 2,
            _ => continue,
        };
        let b = out.entry(name.to_owned()).or_default();
        match verdict {
            "ok" => {
                b.ok += 1;
                b.min += writes;
                b.max += writes;
            }
            "err" if l.contains(" outcome=unknown ") => {
                b.unknown += 1;
                b.max += writes;
            }
            "err" => b.not_started += 1,
            _ => {}
        }
    }
    out
}

/// Checks every answer of `hosts` against the writes stored under their
/// task; returns the violations and prints each host's tally.
pub(super) fn outcome_violations(db: &Db, hosts: &[&Proc], names: &[&str]) -> Vec<String> {
    let mut violations = Vec::new();
    for name in names {
        let rows = stored(db, name);
        for p in hosts {
            let b = bounds(p).get(*name).copied().unwrap_or_default();
            let writes = rows.writes.iter().filter(|w| w.1 == p.name()).count();
            eprintln!(
                "{name} on {}: {} ok, {} unknown, {} not started; {writes} writes stored",
                p.name(),
                b.ok,
                b.unknown,
                b.not_started
            );
            if writes < b.min || writes > b.max {
                violations.push(format!(
                    "{name}: {writes} writes by {} stored, its answers allow {}..={}",
                    p.name(),
                    b.min,
                    b.max
                ));
            }
        }
    }
    violations
}

/// Sends `per_object` `incr` commands for each of `names` at once (each
/// runs in a task of its own on the host: calls in flight together).
pub(super) fn burst(p: &mut Proc, names: &[&str], per_object: usize) {
    for _ in 0..per_object {
        for n in names {
            p.send(&format!("incr {n}"));
        }
    }
}

/// Waits until `p` answered every `incr` it was sent for `names`
/// (`sent` per object), then returns.
fn wait_answers(p: &Proc, names: &[&str], sent: usize) {
    for n in names {
        let end = now() + 60_000;
        while p.count(&format!("ok incr {n} ")) + p.count(&format!("err incr {n} ")) < sent {
            assert!(
                now() < end,
                "{}: {sent} answers on {n}: {:#?}",
                p.name(),
                p.lines()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// Calls `incr name` on the hosts in turn until one acknowledges it (a
/// host recovering from the database's loss refuses, or answers unknown,
/// for a while); panics after a minute. Returns the answer.
pub(super) fn incr_until_ok(hosts: &mut [&mut Proc], name: &str) -> String {
    let end = now() + 60_000;
    loop {
        for p in hosts.iter_mut() {
            let answer = p.run(&format!("incr {name}"));
            if answer.starts_with("ok ") {
                return answer;
            }
            eprintln!("{}: incr {name} not yet: {answer}", p.name());
        }
        assert!(now() < end, "no host acknowledged incr {name}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn sigterm_drain_under_load_finishes_in_flight_calls_and_the_survivor_claims_at_once() {
    let Some((_rt, _schema, db)) = runtime_schema_and_db() else {
        return;
    };
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    // A long lease: a move that waited for expiry would take 30 s.
    let ttl_s = 30;
    let (mut a, mut b) = pair(&db, &dirs, ttl_s);
    let names = ["d1", "d2", "d3", "d4"];
    for n in names {
        let answer = a.run_ok(&format!("incr {n}"));
        assert!(
            answer.starts_with(&format!("ok incr {n} value=1 ")),
            "{answer}"
        );
    }
    // In flight at the signal: a slow call per object (one write, a
    // 500 ms pause, a second write) and a burst of increments behind it.
    for n in names {
        a.send(&format!("slow {n} 500"));
    }
    for n in names {
        a.wait_line(&format!("slow-wrote {n} "));
    }
    burst(&mut a, &names, 5);
    let term = now();
    super::signal(a.child.id(), "TERM");
    let drained = a.wait_line("drained ");
    assert!(a.wait_exit().success(), "{:#?}", a.lines());
    let acquired = b.wait_n("acquired ", 16);
    let moved = acquired[15].0 - term;
    let slow_ok = a.count("ok slow ");
    let incr_ok = a.count("ok incr ") - names.len();
    let refused = a.count("err ");
    eprintln!(
        "tried: SIGTERM of host a (PostgreSQL, own directory, 16 shards, lease {ttl_s} s) with {} slow calls \
         mid-way and {} increments queued: {} ({} ms); {slow_ok} slow and {incr_ok} increments acknowledged, \
         {refused} refused; all 16 shards on b {moved} ms after the signal",
        names.len(),
        names.len() * 5,
        drained.1,
        drained.0 - term
    );
    assert_eq!(drained.1, "drained timed_out=false released=16");
    assert_eq!(
        slow_ok,
        names.len(),
        "the drain finished the calls in flight"
    );
    assert!(
        moved < 10_000,
        "the objects moved without waiting for the {ttl_s} s lease: {moved} ms"
    );
    for n in names {
        let before = stored(&db, n).n;
        let answer = b.run_ok(&format!("incr {n}"));
        assert!(
            answer.starts_with(&format!("ok incr {n} value={} ", before + 1)),
            "b continues from every stored write: {answer}"
        );
    }
    let mut violations = check(&db, &[&a, &b], &names);
    violations.extend(outcome_violations(&db, &[&a, &b], &names));
    assert!(violations.is_empty(), "{violations:#?}");
}

/// The objects the failure tests load, and the increments sent to each at
/// once around the failure.
const LOADED: [&str; 4] = ["r1", "r2", "r3", "r4"];
const BURST: usize = 10;

/// Loads `a` (which owns every shard): one acknowledged increment and a
/// timer due `timer_ms` later per object, then a burst of increments in
/// flight; returns once some of the burst was acknowledged.
fn load(a: &mut Proc, timer_ms: u64) {
    super::incr_with_alarms(a, &LOADED, timer_ms);
    burst(a, &LOADED, BURST);
    a.wait_n("ok incr ", LOADED.len() + 2);
}

/// Hosts `a` (owning every shard) and `b` (waiting) on schema `hosts` of
/// `url`, each in a directory of its own, `a` under [`load`].
fn loaded_pair(url: String, timer_ms: u64) -> (Db, [tempfile::TempDir; 2], Proc, Proc) {
    let db = Db {
        url,
        schema: "hosts".to_owned(),
    };
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (mut a, b) = pair(&db, &dirs, TTL_S);
    load(&mut a, timer_ms);
    (db, dirs, a, b)
}

/// After the database came back: every call sent was answered, the hosts
/// take new calls on every object, every alarm fired and was recorded,
/// and every answer and commit is accounted for.
fn resumed(db: &Db, a: &mut Proc, b: &mut Proc, alarms: bool) {
    wait_answers(a, &LOADED, BURST + 1);
    let errors: Vec<String> = a
        .lines()
        .into_iter()
        .map(|(_, l)| l)
        .filter(|l| l.starts_with("err "))
        .collect();
    eprintln!(
        "a answered {} calls ok, {} with an error; first error: {:?}",
        a.count("ok incr "),
        errors.len(),
        errors.first()
    );
    for n in LOADED {
        let answer = incr_until_ok(&mut [&mut *a, &mut *b], n);
        eprintln!("resumed: {answer}");
    }
    if alarms {
        let end = now() + 60_000;
        for n in LOADED {
            while a.count(&format!("fired {n} ")) + b.count(&format!("fired {n} ")) == 0 {
                assert!(now() < end, "the alarm of {n} never fired");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let fired = stored(db, n).fired;
            assert!(fired >= 1, "{n}: the firing is stored ({fired})");
            eprintln!("{n}: alarm fired and recorded {fired} time(s)");
        }
    }
    let mut violations = check(db, &[a, b], &LOADED);
    violations.extend(outcome_violations(db, &[a, b], &LOADED));
    assert!(violations.is_empty(), "{violations:#?}");
}

#[test]
fn a_postgres_restart_under_load_loses_no_acknowledged_call_and_the_hosts_resume() {
    let rt = runtime();
    let Some(mut cluster) = Cluster::init("host-restart") else {
        return;
    };
    rt.block_on(cluster.start());
    let (db, _dirs, mut a, mut b) = loaded_pair(cluster.url(), 1500);
    let crashed = now();
    cluster.crash();
    rt.block_on(cluster.start());
    eprintln!(
        "tried: immediate shutdown (SIGQUIT, as pg_ctl stop -m immediate) of the private PostgreSQL \
         under {} increments in flight on host a (16 shards, lease {TTL_S} s; b waiting), each object \
         with an alarm due 1.5 s after it was set; server back {} ms later",
        LOADED.len() * BURST,
        now() - crashed
    );
    resumed(&db, &mut a, &mut b, true);
}

#[test]
fn the_primarys_loss_and_the_standbys_promotion_lose_no_acknowledged_call_or_alarm() {
    let rt = runtime();
    let Some(mut primary) = Cluster::init("host-primary") else {
        return;
    };
    // Every commit waits for the standby's flush (`synchronous_commit = on`
    // with a synchronous standby): what was acknowledged survives the
    // primary's loss.
    primary.configure(&["synchronous_standby_names = '*'", "synchronous_commit = on"]);
    rt.block_on(primary.start());
    let mut standby = primary.standby("host-standby");
    rt.block_on(standby.start());
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(&primary.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let end = now() + 60_000;
        while c
            .query_one(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 0
        {
            assert!(now() < end, "the standby never became synchronous");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    });
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let (db, _dirs, mut a, mut b) = loaded_pair(url, 3000);
    let killed = now();
    primary.kill();
    standby.promote();
    // The promoted standby inherited `synchronous_standby_names`: with no
    // standby of its own every commit would wait for one, forever (seen
    // as calls that never answer). With no new standby to attach, the
    // operator clears it, as here.
    rt.block_on(standby.set_synchronous_standby_names(""));
    eprintln!(
        "tried: SIGKILL of the primary (postmaster and every backend) under {} increments in flight on \
         host a (16 shards, lease {TTL_S} s; b waiting; a multi-host URL with \
         target_session_attrs=read-write), each object with an alarm due 3 s after it was set; the \
         synchronous standby promoted (and its synchronous_standby_names cleared) {} ms after the kill",
        LOADED.len() * BURST,
        now() - killed
    );
    resumed(&db, &mut a, &mut b, true);
}
