//! Balanced ownership on one manual clock: hosts owning every shard
//! (`OwnPolicy::AllShards`) converge to an even split by graceful hand-off
//! while the clock stands still (so no lease could expire), objects keep
//! their state across the move, and a drained host's shards spread at once.

use durability_host::OwnPolicy;
use durability_ownership::Clock as _;

use crate::support::{Counter, TestHost, World};

async fn counts(hosts: &[&TestHost]) -> Vec<usize> {
    hosts.iter().map(|h| h.probe().scopes.len()).collect()
}

/// Owner cycles of every host, in turn, until the counts are `want`
/// (at most `rounds` rounds); returns the scopes handed off meanwhile.
async fn cycles(hosts: &[&TestHost], want: &[usize], rounds: usize) -> usize {
    let mut handed_off = 0;
    for _ in 0..rounds {
        if counts(hosts).await == want {
            return handed_off;
        }
        for h in hosts {
            handed_off += h.owner_cycle().await.handed_off.len();
        }
    }
    assert_eq!(
        counts(hosts).await,
        want,
        "no convergence in {rounds} rounds"
    );
    handed_off
}

async fn incr(hosts: &[&TestHost], name: &str) -> i64 {
    for h in hosts {
        let scope = h.scope_for("Counter", name).unwrap().to_string();
        if h.probe().scopes.iter().any(|s| s.scope == scope) {
            return h
                .transaction::<Counter, _, _>("Counter", name, |c, tx| c.incr(tx))
                .await
                .unwrap();
        }
    }
    panic!("no host owns {name}");
}

#[tokio::test]
async fn joining_hosts_get_their_share_by_hand_off_before_any_lease_could_expire() {
    let w = World::new();
    let a = w.all_shards("a").await;
    assert_eq!(cycles(&[&a], &[16], 3).await, 0);
    let names: Vec<String> = (0..24).map(|i| format!("o{i}")).collect();
    for n in &names {
        assert_eq!(incr(&[&a], n).await, 1);
    }
    let start = w.clock.now_ms_u64();
    let b = w.all_shards("b").await;
    let c = w.all_shards("c").await;
    let handed = cycles(&[&a, &b, &c], &[6, 5, 5], 10).await;
    assert_eq!(handed, 10, "a handed off exactly its excess");
    assert_eq!(
        w.clock.now_ms_u64(),
        start,
        "the clock never moved: no lease expired"
    );
    let generations: Vec<u64> = b.probe().scopes.iter().map(|s| s.generation).collect();
    assert!(
        generations.iter().all(|g| *g == 2),
        "one claim after a's: {generations:?}"
    );
    for n in &names {
        assert_eq!(
            incr(&[&a, &b, &c], n).await,
            2,
            "{n}: state moved with the shard"
        );
    }
    // A few more cycles move nothing.
    for _ in 0..5 {
        for h in [&a, &b, &c] {
            let r = h.owner_cycle().await;
            assert!(r.handed_off.is_empty() && r.claimed.is_empty(), "{r:?}");
        }
    }
    // A drained host withdraws its presence and releases its leases: the
    // survivors take its shards at once, evenly.
    c.shutdown().await;
    assert_eq!(cycles(&[&a, &b], &[8, 8], 5).await, 0);
    assert_eq!(w.clock.now_ms_u64(), start);
    for n in &names {
        assert_eq!(incr(&[&a, &b], n).await, 3, "{n}");
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn balancing_off_keeps_first_come_ownership() {
    let w = World::new();
    let mut s = crate::support::settings();
    s.balance = false;
    let a = durability_host::Host::start(w.config("a").own(OwnPolicy::AllShards).settings(s))
        .await
        .unwrap();
    a.owner_cycle().await;
    let b = durability_host::Host::start(w.config("b").own(OwnPolicy::AllShards).settings(s))
        .await
        .unwrap();
    for _ in 0..5 {
        a.owner_cycle().await;
        b.owner_cycle().await;
    }
    assert_eq!(counts(&[&a, &b]).await, [16, 0]);
    a.shutdown().await;
    b.shutdown().await;
}
