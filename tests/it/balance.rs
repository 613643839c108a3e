//! Balanced ownership with processes: `object-host` processes (one per
//! host, each with its own working directory for its process state, over
//! one shared SQLite lease store, alarm index and object directory on this
//! machine) join, die and rejoin; the shard counts are printed over time and
//! must converge to an even split after each phase. A client writes counter
//! increments through whichever host owns each object, and at the end every
//! acknowledged write is read back from the object files and every commit
//! is checked against the claim history (the host had claimed that
//! generation, and no object ever committed under an older generation after
//! a newer one).
#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use durability_ownership::{ObjectName, ShardCount};

use crate::host_processes::{Proc, counter, field, now, signal, spawn as spawn_host};

/// Owner lease of every host (s): long next to the owner loop (200 ms), so
/// a shard that moves before it could expire moved by hand-off.
const TTL_S: u64 = 20;
/// Objects written in each phase.
const OBJECTS: usize = 24;

fn spawn(name: &str, dir: &Path, create: bool) -> Proc {
    let mut extra = vec!["own=all"];
    if create {
        extra.push("create=1");
    }
    let p = spawn_host(name, dir, TTL_S, &extra, &[("DO_BALANCE_SHARDS", "true")]);
    p.wait_line("ready");
    p
}

fn scope_of(name: &str) -> String {
    let shard = ShardCount::default().shard_of(&ObjectName::new(name));
    format!("st1:Counter:shard{shard}")
}

/// One committed increment, as its host acknowledged it.
#[derive(Debug, Clone)]
struct Commit {
    host: String,
    generation: u64,
    value: i64,
}

#[derive(Default)]
struct Client {
    acked: BTreeMap<String, Vec<Commit>>,
    unknown: BTreeMap<String, usize>,
    refusals: usize,
}

impl Client {
    /// Writes one increment of `name` through whichever host takes it; a
    /// refusal that proves the call never started is retried on the next
    /// host, an unknown outcome is never replayed.
    fn incr(&mut self, hosts: &mut [Proc], name: &str) {
        for _ in 0..200 {
            for h in hosts.iter_mut() {
                let answer = h.run(&format!("incr {name}"));
                if answer.starts_with("ok ") {
                    self.acked.entry(name.to_owned()).or_default().push(Commit {
                        host: h.name().to_owned(),
                        generation: field(&answer, "gen").parse().unwrap(),
                        value: field(&answer, "value").parse().unwrap(),
                    });
                    return;
                }
                if answer.contains(" outcome=unknown ") {
                    eprintln!("{name}: outcome unknown, not replayed: {answer}");
                    *self.unknown.entry(name.to_owned()).or_default() += 1;
                    return;
                }
                self.refusals += 1;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{name}: no host took the write");
    }

    fn round(&mut self, hosts: &mut [Proc], phase: &str) {
        for i in 0..OBJECTS {
            self.incr(hosts, &format!("{phase}-{i}"));
            self.incr(hosts, &format!("all-{i}"));
        }
    }
}

/// The number of scopes `p` owns now (its probe).
fn scopes(p: &mut Proc) -> usize {
    let before = p.count("probe ");
    p.send("probe");
    let line = p.wait_n("probe ", before + 1).pop().unwrap().1;
    field(&line, "scopes").parse().unwrap()
}

/// Polls the hosts' probes until their counts are `want` (in host order),
/// printing every change; returns when they converged (test clock, ms).
fn converge(hosts: &mut [Proc], want: &[usize], phase: &str, since: i64) -> i64 {
    let end = now() + i64::try_from(TTL_S * 3 * 1000).unwrap();
    let mut last = Vec::new();
    loop {
        let counts: Vec<usize> = hosts.iter_mut().map(scopes).collect();
        if counts != last {
            let names: Vec<&str> = hosts.iter().map(Proc::name).collect();
            eprintln!(
                "{phase}: +{:>6} ms counts {:?} = {counts:?}",
                now() - since,
                names
            );
            last = counts.clone();
        }
        if counts == want {
            return now();
        }
        assert!(
            now() < end,
            "{phase}: no convergence to {want:?}: {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `(scope, generation, time)` of the lines of `p` starting with `kind`.
fn events(p: &Proc, kind: &str) -> Vec<(String, u64, i64)> {
    p.lines()
        .into_iter()
        .filter(|(_, l)| l.starts_with(&format!("{kind} scope=")))
        .map(|(t, l)| {
            (
                field(&l, "scope").to_owned(),
                field(&l, "gen").parse().unwrap(),
                t,
            )
        })
        .collect()
}

/// Every scope `joiners` acquired after `since` was released first by one
/// of `owners` at the generation just below: it moved by hand-off, never
/// by waiting for the lease to expire. Returns how many moved.
fn moved_by_hand_off(owners: &[&Proc], joiners: &[&Proc], since: i64) -> usize {
    let released: HashMap<(String, u64), i64> = owners
        .iter()
        .flat_map(|p| events(p, "released"))
        .map(|(s, g, t)| ((s, g), t))
        .collect();
    let mut moved = 0;
    for j in joiners {
        for (scope, generation, t) in events(j, "acquired") {
            if t < since {
                continue;
            }
            let before = released.get(&(scope.clone(), generation - 1));
            assert!(
                before.is_some_and(|r| *r <= t),
                "{}: {scope} gen {generation} was not handed off to it",
                j.name()
            );
            moved += 1;
        }
    }
    moved
}

#[test]
fn hosts_converge_to_an_even_split_after_join_kill_and_rejoin() {
    let dir = tempfile::tempdir().unwrap();
    let mut client = Client::default();
    let lease_ms = TTL_S * 1000;
    let start = now();
    let mut hosts = vec![spawn("h1", dir.path(), true)];
    converge(&mut hosts, &[16], "start h1", start);
    client.round(&mut hosts, "one");

    // Join: two hosts more; h1 hands off 10 shards, each moving at once.
    let joined = now();
    hosts.push(spawn("h2", dir.path(), false));
    hosts.push(spawn("h3", dir.path(), false));
    client.round(&mut hosts, "join");
    let done = converge(&mut hosts, &[6, 5, 5], "join h2 h3", joined);
    let moved = moved_by_hand_off(&[&hosts[0]], &[&hosts[1], &hosts[2]], joined);
    assert_eq!(moved, 10, "h1 handed off exactly its excess");
    eprintln!(
        "join: {moved} shards handed off, converged {} ms after the join (lease {lease_ms} ms: no lease could expire)",
        done - joined
    );
    client.round(&mut hosts, "three");

    // Kill -9 h2: its five shards spread over h1 and h3 once its lease ran out.
    let killed = now();
    let mut dead = hosts.remove(1);
    signal(dead.child.id(), "KILL");
    dead.wait_exit();
    let done = converge(&mut hosts, &[8, 8], "kill h2", killed);
    eprintln!(
        "kill: the dead host's shards spread {} ms after the kill (lease {lease_ms} ms)",
        done - killed
    );
    client.round(&mut hosts, "two");

    // Rejoin: h4 gets its share by hand-off from both survivors.
    let rejoined = now();
    hosts.push(spawn("h4", dir.path(), false));
    client.round(&mut hosts, "rejoin");
    let done = converge(&mut hosts, &[6, 5, 5], "rejoin h4", rejoined);
    let moved = moved_by_hand_off(&[&hosts[0], &hosts[1]], &[&hosts[2]], rejoined);
    assert_eq!(moved, 5, "h4 got its share by hand-off");
    eprintln!(
        "rejoin: {moved} shards handed off, converged {} ms after the join",
        done - rejoined
    );
    client.round(&mut hosts, "final");

    // No acknowledged write lost; no stale commit.
    let mut all: Vec<&Proc> = hosts.iter().collect();
    all.push(&dead);
    let claims: HashMap<(String, String, u64), ()> = all
        .iter()
        .flat_map(|p| {
            events(p, "acquired")
                .into_iter()
                .map(|(s, g, _)| ((p.name().to_owned(), s, g), ()))
        })
        .collect();
    let mut writes = 0;
    for (name, commits) in &client.acked {
        let stored = counter(dir.path(), name);
        let unknown = i64::try_from(client.unknown.get(name).copied().unwrap_or(0)).unwrap();
        let acked = i64::try_from(commits.len()).unwrap();
        assert!(
            stored >= acked && stored <= acked + unknown,
            "{name}: stored {stored}, acknowledged {acked}, unknown {unknown}"
        );
        let mut by_value = commits.clone();
        by_value.sort_by_key(|c| c.value);
        let mut newest = 0;
        for c in &by_value {
            assert!(
                claims.contains_key(&(c.host.clone(), scope_of(name), c.generation)),
                "{name}: {c:?} committed under a generation its host never claimed"
            );
            assert!(
                c.generation >= newest,
                "{name}: {c:?} committed after generation {newest}: stale"
            );
            newest = c.generation;
        }
        writes += commits.len();
    }
    eprintln!(
        "tried: start h1, add h2 h3, kill -9 h2, add h4 (lease {TTL_S} s, owner loop 200 ms); {writes} acknowledged writes on {} objects, {} refusals retried elsewhere, {} unknown outcomes; all read back, every commit under a claimed generation",
        client.acked.len(),
        client.refusals,
        client.unknown.values().sum::<usize>()
    );
    for h in &mut hosts {
        signal(h.child.id(), "TERM");
        h.wait_exit();
    }
}
