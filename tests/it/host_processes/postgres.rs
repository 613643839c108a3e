//! Issue 35, item 3, with real `pg-object-host` processes: hosts on
//! PostgreSQL alone (leases, alarm jobs and objects in the test's own
//! schema; each host in a working directory of its own, none shared).
//! A host is SIGKILLed mid-call, or SIGSTOPped inside a transaction past
//! its lease; every acknowledged write is checked against the stored rows
//! and every commit against the claims the hosts printed (task,
//! generation). Skipped (said on stderr) without a PostgreSQL server,
//! unless `DURABILITY_REQUIRE_SERVICES=1`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use durability_storage_postgres::testkit::{TestSchema, url};

use super::{Proc, TTL_S, field, now, signal};
use crate::fence_processes::{Write, fence_violations};

pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Where a test's hosts keep everything: a database (its URL, possibly
/// naming several servers) and a schema in it.
pub(super) struct Db {
    pub(super) url: String,
    pub(super) schema: String,
}

impl Db {
    /// The test server's database, in the test's own schema.
    pub(super) fn of(schema: &TestSchema) -> Self {
        Self {
            url: url(),
            schema: schema.name().to_owned(),
        }
    }
}

/// A host process on the test's database, in a working directory of its
/// own, with owner lease `ttl_s`.
pub(super) fn spawn(name: &str, cwd: &Path, db: &Db, ttl_s: u64, extra: &[&str]) -> Proc {
    spawn_with(name, cwd, db, ttl_s, extra, &[])
}

/// [`spawn`], with more environment variables `env`.
pub(super) fn spawn_with(
    name: &str,
    cwd: &Path,
    db: &Db,
    ttl_s: u64,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Proc {
    let mut all = vec![
        ("DO_DATABASE_URL", db.url.as_str()),
        ("DO_DATABASE_SCHEMA", db.schema.as_str()),
    ];
    all.extend_from_slice(env);
    super::spawn_bin(
        env!("CARGO_BIN_EXE_pg-object-host"),
        name,
        cwd,
        ttl_s,
        extra,
        &all,
    )
}

/// `a` owning every shard (creating the storage pointer), then `b`
/// waiting to take over; each in its own directory.
pub(super) fn pair(db: &Db, dirs: &[tempfile::TempDir; 2], ttl_s: u64) -> (Proc, Proc) {
    let a = spawn("a", dirs[0].path(), db, ttl_s, &["own=all", "create=1"]);
    a.wait_line("ready");
    a.wait_n("acquired ", 16);
    let b = spawn("b", dirs[1].path(), db, ttl_s, &["own=all"]);
    b.wait_line("ready");
    (a, b)
}

/// A [`runtime`], a test's own schema made on it (keep both: dropped,
/// the schema goes) and its [`Db`], or `None` (said on stderr) without a
/// PostgreSQL server.
pub(super) fn runtime_schema_and_db() -> Option<(tokio::runtime::Runtime, TestSchema, Db)> {
    let rt = runtime();
    let schema = rt.block_on(TestSchema::create())?;
    let db = Db::of(&schema);
    Some((rt, schema, db))
}

/// A test's own schema and [`pair`]'s two hosts in it, and the runtime
/// that made the schema (dropped last).
struct Hosts {
    a: Proc,
    b: Proc,
    db: Db,
    _dirs: [tempfile::TempDir; 2],
    _schema: TestSchema,
    _rt: tokio::runtime::Runtime,
}

/// [`Hosts`] with owner lease [`TTL_S`], or `None` (said on stderr)
/// without a PostgreSQL server.
fn hosts() -> Option<Hosts> {
    let (rt, schema, db) = runtime_schema_and_db()?;
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (a, b) = pair(&db, &dirs, TTL_S);
    Some(Hosts {
        a,
        b,
        db,
        _dirs: dirs,
        _schema: schema,
        _rt: rt,
    })
}

/// One object's stored rows: its counter and its `writes` log.
pub(super) struct Stored {
    pub(super) n: i64,
    /// How many firings of its timer the object recorded.
    pub(super) fired: i64,
    pub(super) writes: Vec<(i64, String, i64, i64)>,
}

pub(super) fn stored(db: &Db, name: &str) -> Stored {
    runtime().block_on(async {
        let (c, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let s = db.schema.as_str();
        let seq: i64 = c
            .query_one(
                &format!("SELECT seq FROM {s}.durability_objects WHERE id = $1"),
                &[&format!("st1:Counter:{name}")],
            )
            .await
            .unwrap()
            .get(0);
        let own = format!("{s}_o{seq}");
        let n: i64 = c
            .query_one(&format!("SELECT n FROM {own}.counter"), &[])
            .await
            .unwrap()
            .get(0);
        let writes = c
            .query(
                &format!("SELECT seq, task, generation, n FROM {own}.writes ORDER BY seq"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect();
        let fired: i64 = c
            .query_one(&format!("SELECT count(*) FROM {own}.fired"), &[])
            .await
            .unwrap()
            .get(0);
        Stored { n, fired, writes }
    })
}

/// The claims each host printed, as (task, scope, generation).
fn claims(hosts: &[&Proc]) -> BTreeSet<(String, String, i64)> {
    hosts
        .iter()
        .flat_map(|p| {
            p.lines()
                .into_iter()
                .filter(|(_, l)| l.starts_with("acquired "))
                .map(|(_, l)| {
                    (
                        p.name().to_owned(),
                        field(&l, "scope").to_owned(),
                        field(&l, "gen").parse().unwrap(),
                    )
                })
        })
        .collect()
}

fn scope_of(name: &str) -> String {
    durability_tests::host_proc::counter_scope(name).to_string()
}

/// Checks every object named: each acknowledged increment (`ok incr` /
/// `ok slow` lines, by any host) is a stored write with its task,
/// generation and value; each stored write was made under a claim its
/// host printed for the object's scope; no generation was committed by two
/// hosts and none landed after a newer one. Returns the violations.
pub(super) fn check(db: &Db, hosts: &[&Proc], names: &[&str]) -> Vec<String> {
    let claims = claims(hosts);
    let mut violations = Vec::new();
    for name in names {
        let rows = stored(db, name);
        let scope = scope_of(name);
        let writes: Vec<Write> = rows
            .writes
            .iter()
            .map(|(seq, task, generation, _)| Write {
                seq: *seq,
                task: task.clone(),
                generation: *generation,
                holder: task.clone(),
            })
            .collect();
        violations.extend(
            fence_violations(&writes)
                .into_iter()
                .map(|v| format!("{name}: {v}")),
        );
        for (seq, task, generation, _) in &rows.writes {
            if !claims.contains(&(task.clone(), scope.clone(), *generation)) {
                violations.push(format!(
                    "{name}: write #{seq} by {task} at generation {generation} under no claim {task} printed"
                ));
            }
        }
        if rows.writes.last().map(|w| w.3) != Some(rows.n) {
            violations.push(format!("{name}: counter {} is not the last write", rows.n));
        }
        let stored: BTreeMap<i64, (String, i64)> = rows
            .writes
            .iter()
            .map(|(_, task, generation, n)| (*n, (task.clone(), *generation)))
            .collect();
        for p in hosts {
            for (_, l) in p.lines() {
                let acked = [format!("ok incr {name} "), format!("ok slow {name} ")];
                if !acked.iter().any(|a| l.starts_with(a.as_str())) {
                    continue;
                }
                let value: i64 = field(&l, "value").parse().unwrap();
                let generation: i64 = field(&l, "gen").parse().unwrap();
                if stored.get(&value) != Some(&(p.name().to_owned(), generation)) {
                    violations.push(format!(
                        "{name}: acknowledged {l:?} by {} is not a stored write ({:?})",
                        p.name(),
                        stored.get(&value)
                    ));
                }
            }
        }
    }
    violations
}

#[test]
fn sigkill_mid_call_moves_objects_and_alarms_to_the_survivor_with_every_write_accounted_for() {
    let Some(mut hosts) = hosts() else {
        return;
    };
    let Hosts { a, b, db, .. } = &mut hosts;
    let names = ["k1", "k2", "k3", "k4", "k5", "k6"];
    super::incr_with_alarms(a, &names, 1500);
    // Mid-call: the first write of `slow m1` committed, the second not yet.
    let answer = a.run_ok("incr m1");
    assert!(answer.starts_with("ok incr m1 value=1 "), "{answer}");
    a.send("slow m1 60000");
    a.wait_line("slow-wrote m1");
    let killed = now();
    signal(a.child.id(), "KILL");
    a.wait_exit();
    eprintln!(
        "tried: SIGKILL of host a (PostgreSQL only, own directory) owning 16 shards, mid-call on m1 \
         (one write committed, the call unanswered), {} objects with an alarm due 1.5 s later; lease {TTL_S} s",
        names.len()
    );
    super::alarms_fired_on_b(b, &names, killed);
    super::incr_again_on(b, &names);
    // m1: the killed call's committed write is kept, its second never ran.
    let answer = b.run_ok("incr m1");
    assert!(answer.starts_with("ok incr m1 value=3 "), "{answer}");
    let mut all = names.to_vec();
    all.push("m1");
    let violations = check(db, &[a, b], &all);
    assert!(violations.is_empty(), "{violations:#?}");
    let m1 = stored(db, "m1");
    eprintln!(
        "stored writes of m1 (seq, task, generation, n): {:?}; every acknowledged write stored, every commit under a printed claim",
        m1.writes
    );
    assert_eq!(b.count("fired "), names.len(), "nothing fired twice");
}

#[test]
fn sigstop_inside_a_transaction_past_the_lease_never_lands_and_the_new_owner_ends_it() {
    let Some(mut hosts) = hosts() else {
        return;
    };
    let Hosts { a, b, db, .. } = &mut hosts;
    let answer = a.run_ok("incr p1");
    assert!(answer.starts_with("ok incr p1 value=1 "), "{answer}");
    eprintln!(
        "tried: SIGSTOP of host a inside a transaction on p1 (a write made, not committed), lease {TTL_S} s"
    );
    super::pause_inside_until_taken_over(a, b, "hold p1 2000", "in-tx p1");
    // b's fence ends a's open transaction instead of waiting behind it.
    let started = now();
    let answer = b.run_ok("incr p1");
    let took = now() - started;
    eprintln!("b's first call on p1 (its claim ended a's session): {answer} in {took} ms");
    assert!(
        answer.starts_with("ok incr p1 value=2 "),
        "a's uncommitted write never landed: {answer}"
    );
    signal(a.child.id(), "CONT");
    let ended = a.wait_answer("hold p1");
    super::assert_refused(&ended, "hold p1", "a's paused transaction (a stale commit)");
    let answer = b.run_ok("incr p1");
    assert!(answer.starts_with("ok incr p1 value=3 "), "{answer}");
    let violations = check(db, &[a, b], &["p1"]);
    assert!(violations.is_empty(), "{violations:#?}");
    let p1 = stored(db, "p1");
    assert!(
        p1.writes.iter().filter(|w| w.1 == "a").count() == 1,
        "only a's committed write before the pause is stored: {:?}",
        p1.writes
    );
    signal(a.child.id(), "KILL");
}

#[test]
fn a_takeover_delivers_an_alarm_the_killed_host_committed_but_never_synced() {
    use durability_alarms::AlarmIndex as _;
    let Some(mut hosts) = hosts() else {
        return;
    };
    let Hosts { a, b, db, _rt, .. } = &mut hosts;
    let killed = super::crash_after_the_timers_commit(a, "u1");
    // The crash hit the window: the timer is committed in the object, the
    // index holds no job for it.
    let index = durability_host::store::postgres::PostgresAlarmIndex::connect(
        &db.url,
        &db.schema,
        Default::default(),
    )
    .unwrap();
    let id = durability_scheduler::ObjectId::new("st1:Counter:u1").unwrap();
    let job = _rt.block_on(index.job(&id)).unwrap();
    assert!(job.is_none(), "no index job after the crash: {job:?}");
    eprintln!(
        "tried: host a (PostgreSQL only) aborted inside a call right after committing u1's timer (before its alarm sync: no index job); b takes over with no call to u1"
    );
    super::alarms_fired_on_b(b, &["u1"], killed);
    assert_eq!(stored(db, "u1").fired, 1, "u1's firing is stored once");
}

#[test]
fn sigkill_inside_an_alarm_delivers_it_again_on_the_survivor_once() {
    let Some((_rt, _schema, db)) = runtime_schema_and_db() else {
        return;
    };
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut env = super::MID_ALARM_LEASE.to_vec();
    env.push((durability_tests::host_proc::ENV_FIRE_PAUSE_MS, "60000"));
    let mut a = spawn_with(
        "a",
        dirs[0].path(),
        &db,
        TTL_S,
        &["own=all", "create=1"],
        &env,
    );
    a.wait_line("ready");
    a.wait_n("acquired ", 16);
    let b = spawn_with(
        "b",
        dirs[1].path(),
        &db,
        TTL_S,
        &["own=all"],
        &super::MID_ALARM_LEASE,
    );
    b.wait_line("ready");
    let killed = super::kill_mid_alarm(&mut a, "f1");
    super::fired_again_on_b(&b, "f1", killed);
    // The killed firing wrote nothing; b's firing is the one stored.
    assert_eq!(stored(&db, "f1").fired, 1);
}
