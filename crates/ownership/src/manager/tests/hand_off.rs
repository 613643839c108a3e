//! Tests of the graceful hand-off of one scope and of `claim_many`.

use super::*;

fn shard(n: u32) -> OwnerScope {
    OwnerScope::parse(&format!("st1:Room:shard{n}"), ShardCount::default()).expect("scope")
}

/// A hand-off refuses new work on just that scope, waits for its admitted
/// work, releases the exact lease, and the next task claims at once at a
/// higher generation while the first task's other scope keeps working.
#[tokio::test]
async fn a_hand_off_drains_just_its_scope_and_releases_at_once() {
    let f = fixture().await;
    let a = f.task("a");
    let b = f.task("b");
    let claimed = a.claim_many(&[shard(1), shard(2)], &f.lifecycle).await;
    let gens: Vec<Generation> = claimed
        .iter()
        .map(|(_, r)| match r {
            Ok(Resolution::Local(g)) => *g,
            other => panic!("expected a claim, got {other:?}"),
        })
        .collect();
    let running = a.admit(&shard(1), gens[0]).await.expect("admitted");
    let far = f.clock.now_ms() + 1_000_000;
    let handing = tokio::spawn({
        let a = a.clone();
        async move { a.hand_off(&shard(1), far).await }
    });
    settle().await;
    assert!(!handing.is_finished(), "waits for the admitted work");
    let refused = a.admit(&shard(1), gens[0]).await.expect_err("leaving");
    assert_eq!(refused.code(), "draining");
    drop(
        a.admit(&shard(2), gens[1])
            .await
            .expect("another scope still admits"),
    );
    assert_eq!(a.in_flight_on(&shard(1)), 1);
    drop(running);
    let HandOff::Released(g) = handing.await.expect("joined") else {
        panic!("released");
    };
    assert_eq!(g, gens[0]);
    // No expiry wait: the clock never moved.
    match b.resolve(&shard(1), &f.lifecycle).await.expect("resolve") {
        Resolution::Local(next) => assert!(next > g, "a higher generation"),
        other => panic!("b claims at once, got {other:?}"),
    }
    let stale = a.admit(&shard(1), gens[0]).await.expect_err("handed off");
    assert_eq!(stale.code(), "stale_owner");
    assert!(matches!(
        a.hand_off(&shard(1), far).await,
        HandOff::NotOwned
    ));
}

/// Work that outlives the hand-off's deadline keeps the scope here, and
/// the scope admits again.
#[tokio::test]
async fn a_busy_hand_off_keeps_the_scope() {
    let f = fixture().await;
    let (a, g) = f.claimed("a").await;
    let running = a.admit(&f.scope, g).await.expect("admitted");
    let out = a.hand_off(&f.scope, f.clock.now_ms()).await;
    assert!(matches!(out, HandOff::Busy { in_flight: 1 }), "{out:?}");
    drop(running);
    drop(a.admit(&f.scope, g).await.expect("admits again"));
    let snap = f
        .store
        .snapshot(&f.scope, &f.lifecycle)
        .await
        .expect("snap");
    assert_eq!(
        snap.owner.map(|l| l.record.generation()),
        Some(g),
        "lease kept"
    );
}

/// `claim_many` adopts what this process holds and reports other owners.
#[tokio::test]
async fn claim_many_applies_each_outcome_as_resolve_does() {
    let f = fixture().await;
    let a = f.task("a");
    let (_b, _) = f.claimed("b").await; // shard 1, held to the end
    let out = a
        .claim_many(&[shard(1), shard(2), shard(2)], &f.lifecycle)
        .await;
    assert!(matches!(out[0].1, Ok(Resolution::Remote { .. })), "{out:?}");
    assert!(matches!(out[1].1, Ok(Resolution::Local(_))), "{out:?}");
    assert_eq!(out[1].1.as_ref().ok(), out[2].1.as_ref().ok(), "adopted");
    assert_eq!(a.probe().scopes.len(), 1);
    drop(a.drain().await);
    let out = a.claim_many(&[shard(3)], &f.lifecycle).await;
    assert_eq!(
        out[0].1.as_ref().map(|_| ()).map_err(OwnershipError::code),
        Err("draining")
    );
}
