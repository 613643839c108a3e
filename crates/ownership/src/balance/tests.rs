//! Tests of the balancing decision: a simulated cluster runs the pure rules
//! round by round (each host sees the others' presence as announced the
//! round before, claims succeed only on shards nobody holds, a dead host's
//! shards stay held until its lease expires), from arbitrary starts.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn t(s: &str) -> TaskId {
    TaskId::new(s).unwrap()
}

#[test]
fn presence_round_trips_and_refuses_malformed_values() {
    let count = ShardCount::default();
    let raw = encode_presence(&[7, 0, 3, 3]);
    assert_eq!(raw, b"1;0,3,7");
    assert_eq!(decode_presence(&raw, count).unwrap(), vec![0, 3, 7]);
    assert_eq!(decode_presence(b"1;", count).unwrap(), Vec::<u32>::new());
    for bad in [
        &b"2;1"[..],
        b"1;3,1",
        b"1;1,1",
        b"1;16",
        b"1;01",
        b"1;-1",
        b"1;a",
        b"\xff",
        b"",
    ] {
        let e = decode_presence(bad, count).unwrap_err();
        assert_eq!(e.code(), "invalid_input", "{bad:?}");
    }
}

#[test]
fn shares_differ_by_at_most_one_and_sum_to_the_total() {
    let live: Vec<TaskId> = ["c", "a", "b"].iter().map(|s| t(s)).collect();
    let shares: Vec<usize> = ["a", "b", "c"]
        .iter()
        .map(|s| share_of(&t(s), &live, 16).unwrap())
        .collect();
    assert_eq!(shares, vec![6, 5, 5], "sorted task ids get the +1 shards");
    assert_eq!(share_of(&t("z"), &live, 16), None);
}

#[test]
fn a_host_over_its_share_waits_for_a_stable_view_and_the_minimum_hold() {
    let shards: Vec<u32> = (0..4).collect();
    let held: Vec<HeldShard> = shards
        .iter()
        .map(|s| HeldShard {
            shard: *s,
            held_cycles: 5,
        })
        .collect();
    let peers = [Peer {
        task: t("b"),
        held: Some(vec![]),
    }];
    let view = |stable, held: &[HeldShard]| {
        decide(
            &BalanceView {
                me: &t("a"),
                shards: &shards,
                peers: &peers,
                held,
                stable_cycles: stable,
            },
            BalanceRules::default(),
        )
    };
    assert!(view(1, &held).hand_off.is_empty(), "live set just changed");
    assert_eq!(view(2, &held).hand_off, vec![3, 2]);
    let fresh: Vec<HeldShard> = held
        .iter()
        .map(|h| HeldShard {
            held_cycles: 1,
            ..*h
        })
        .collect();
    assert!(view(5, &fresh).hand_off.is_empty(), "held too briefly");
    // An unreadable peer record: live, needs unknown, so nothing is handed off to it.
    let unknown = [Peer {
        task: t("b"),
        held: None,
    }];
    let d = decide(
        &BalanceView {
            me: &t("a"),
            shards: &shards,
            peers: &unknown,
            held: &held,
            stable_cycles: 9,
        },
        BalanceRules::default(),
    );
    assert_eq!(d.share, 2);
    assert!(d.hand_off.is_empty());
}

/// A simulated cluster.
struct Sim {
    shards: Vec<u32>,
    /// Shard → holder (live or dead, until its lease expires).
    owner: BTreeMap<u32, String>,
    /// Live hosts and their balancers.
    hosts: BTreeMap<String, Balancer>,
    /// What each live host announced last round.
    announced: BTreeMap<String, Vec<u32>>,
    /// Moves so far (a hand-off counts one).
    moves: usize,
}

impl Sim {
    fn new(total: u32) -> Self {
        Self {
            shards: (0..total).collect(),
            owner: BTreeMap::new(),
            hosts: BTreeMap::new(),
            announced: BTreeMap::new(),
            moves: 0,
        }
    }

    fn join(&mut self, name: &str) {
        self.hosts
            .insert(name.to_owned(), Balancer::new(BalanceRules::default()));
        self.announced.insert(name.to_owned(), Vec::new());
    }

    fn kill(&mut self, name: &str) {
        self.hosts.remove(name);
        self.announced.remove(name);
    }

    /// The dead hosts' leases run out.
    fn expire_dead(&mut self) {
        let hosts = &self.hosts;
        self.owner.retain(|_, h| hosts.contains_key(h));
    }

    fn held(&self, name: &str) -> Vec<u32> {
        self.owner
            .iter()
            .filter(|(_, h)| *h == name)
            .map(|(s, _)| *s)
            .collect()
    }

    /// One round: every live host, in `order`, observes and acts.
    fn round(&mut self, order: &[String]) {
        let mut next = BTreeMap::new();
        for name in order {
            if !self.hosts.contains_key(name) {
                continue;
            }
            let me = t(name);
            let peers: Vec<Peer> = self
                .announced
                .iter()
                .filter(|(n, _)| *n != name)
                .map(|(n, held)| Peer {
                    task: t(n),
                    held: Some(held.clone()),
                })
                .collect();
            let held = self.held(name);
            let shards = self.shards.clone();
            let d = self
                .hosts
                .get_mut(name)
                .unwrap()
                .cycle("C", &me, &shards, &peers, &held);
            for s in d.hand_off {
                assert_eq!(self.owner.remove(&s).as_deref(), Some(name.as_str()));
                self.moves += 1;
            }
            for s in d.claim {
                self.owner.entry(s).or_insert_with(|| name.clone());
            }
            next.insert(name.clone(), self.held(name));
        }
        self.announced = next;
    }

    fn counts(&self) -> BTreeMap<String, usize> {
        self.hosts
            .keys()
            .map(|h| (h.clone(), self.held(h).len()))
            .collect()
    }

    fn balanced(&self) -> bool {
        let counts = self.counts();
        let all_owned = self.owner.len() == self.shards.len()
            && self.owner.values().all(|h| self.hosts.contains_key(h));
        let live: Vec<TaskId> = counts.keys().map(|h| t(h)).collect();
        let exact = counts
            .iter()
            .all(|(h, c)| share_of(&t(h), &live, self.shards.len()) == Some(*c));
        let min = counts.values().min().copied().unwrap_or(0);
        let max = counts.values().max().copied().unwrap_or(0);
        all_owned && exact && max - min <= 1
    }

    /// Runs rounds (host order rotated by `seed`) until balanced, then checks
    /// that ten more rounds move nothing.
    fn converge(&mut self, seed: usize) -> usize {
        let mut order: Vec<String> = self.hosts.keys().cloned().collect();
        for round in 0..60 {
            if self.balanced() {
                let moves = self.moves;
                let before = self.owner.clone();
                for _ in 0..10 {
                    self.round(&order);
                }
                assert_eq!(self.moves, moves, "moved after converging");
                assert_eq!(self.owner, before, "ownership changed after converging");
                return round;
            }
            let len = order.len().max(1);
            order.rotate_left(seed % len);
            self.round(&order);
        }
        panic!("no convergence: {:?}", self.counts());
    }
}

#[test]
fn join_kill_rejoin_converges_each_phase() {
    let mut sim = Sim::new(16);
    sim.join("h1");
    sim.converge(0);
    assert_eq!(sim.counts().values().copied().collect::<Vec<_>>(), [16]);
    sim.join("h2");
    sim.join("h3");
    sim.converge(1);
    let handed = sim.moves;
    assert_eq!(handed, 10, "h1 hands off exactly its excess (16 - 6)");
    sim.kill("h2");
    sim.round(&["h1".into(), "h3".into()]);
    sim.expire_dead();
    sim.converge(1);
    assert_eq!(
        sim.moves, handed,
        "a dead host's shards spread without hand-offs"
    );
    sim.join("h4");
    sim.converge(0);
    let counts: BTreeSet<usize> = sim.counts().values().copied().collect();
    assert_eq!(counts, BTreeSet::from([5, 6]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// From any start (any hosts holding any shards), the cluster converges
    /// to an even split within one, every shard owned, and then nothing
    /// moves; each shard moved at most once per host over the share.
    #[test]
    fn converges_from_any_start_without_oscillation(
        total in 1u32..40,
        hosts in 1usize..7,
        start in proptest::collection::vec(0usize..8, 0..40),
        seed in 0usize..7,
        dead in 0usize..3,
    ) {
        let mut sim = Sim::new(total);
        let names: Vec<String> = (0..hosts).map(|i| format!("h{i}")).collect();
        for n in &names {
            sim.join(n);
        }
        for (shard, h) in start.iter().enumerate().take(total as usize) {
            if *h < hosts {
                sim.owner.insert(shard as u32, names[*h].clone());
            }
        }
        sim.converge(seed);
        let moves = sim.moves;
        prop_assert!(moves <= total as usize, "{moves} hand-offs for {total} shards");
        // Kill some hosts (never all): their shards spread after expiry.
        for n in names.iter().take(dead.min(hosts - 1)) {
            sim.kill(n);
        }
        let order: Vec<String> = sim.hosts.keys().cloned().collect();
        sim.round(&order);
        sim.expire_dead();
        sim.converge(seed);
        prop_assert_eq!(sim.moves, moves, "survivors need no hand-offs");
    }
}
