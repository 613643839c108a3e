//! Tests of the drain bound: `drain_timeout_ms` bounds the whole drain, the
//! wait for admitted work and the releases, on the ownership's clock.

use std::sync::atomic::AtomicBool;

use super::*;
use crate::hooked::{Action, Method};

/// A store whose release of one scope hangs (never answers) while `hang` is set.
type HangingRelease = HookedStore<Arc<InMemoryLeaseStore<ManualClock>>>;

fn shard(n: u32) -> OwnerScope {
    OwnerScope::parse(&format!("st1:Room:shard{n}"), ShardCount::default()).expect("scope")
}

struct Hanging {
    f: Fixture,
    o: Ownership<HangingRelease, ManualClock>,
    hang: Arc<AtomicBool>,
    hooks: Hooks,
    generations: Vec<Generation>,
}

/// Task `a` owns shards 1, 2 and 3 with 60 s leases (they outlive every
/// drain here); releasing shard 2 hangs.
async fn hanging(s: OwnershipSettings) -> Hanging {
    let s = OwnershipSettings {
        owner_ttl_ms: 60_000,
        ..s
    };
    let f = fixture().await;
    let hang = Arc::new(AtomicBool::new(true));
    let hooks = Hooks::new();
    let (hang_on, flag) = (shard(2), Arc::clone(&hang));
    hooks.set(move |method, scope| {
        if method == Method::Release && flag.load(Ordering::SeqCst) && scope == Some(&hang_on) {
            Action::Hang
        } else {
            Action::Pass
        }
    });
    let store = HookedStore::new(Arc::clone(&f.store), hooks.clone());
    let o = Ownership::new(store, f.clock.clone(), TaskId::new("a").expect("task"), s);
    let mut generations = Vec::new();
    for n in [3, 1, 2] {
        match o.resolve(&shard(n), &f.lifecycle).await.expect("resolve") {
            Resolution::Local(g) => generations.push(g),
            other => panic!("expected local ownership, got {other:?}"),
        }
    }
    Hanging {
        f,
        o,
        hang,
        hooks,
        generations,
    }
}

async fn owner_task(f: &Fixture, scope: &OwnerScope) -> Option<String> {
    f.store
        .snapshot(scope, &f.lifecycle)
        .await
        .expect("snapshot")
        .owner
        .map(|l| l.record.task().as_str().to_owned())
}

#[tokio::test]
async fn a_drain_whose_release_hangs_returns_at_the_drain_timeout_and_keeps_the_rest() {
    let h = hanging(settings()).await; // drain_timeout_ms 10000 (the default)
    assert_eq!(settings().drain_timeout_ms, 10_000);
    let drain = spawn_drain(&h.o);
    settle().await;
    h.f.clock.advance(9_999);
    settle().await;
    assert!(!drain.is_finished(), "the bound is 10000 ms");
    h.f.clock.advance(1);
    settle().await;
    assert!(
        drain.is_finished(),
        "the drain must return within drain_timeout_ms even when a release hangs"
    );
    let report = drain.await.expect("drain task");
    let g1 = h.generations[1];
    assert_eq!(
        report,
        DrainReport::ReleaseTimedOut {
            released: vec![(shard(1), g1)],
            not_released: vec![],
            in_doubt: vec![shard(2)],
            kept: vec![shard(3)],
        }
    );
    assert!(report.timed_out());
    assert_eq!(h.hooks.calls(Method::Release), 2, "shard3 never sent");
    assert_eq!(
        owner_task(&h.f, &shard(1)).await,
        None,
        "released stays released"
    );
    assert_eq!(owner_task(&h.f, &shard(2)).await.as_deref(), Some("a"));
    assert_eq!(owner_task(&h.f, &shard(3)).await.as_deref(), Some("a"));
    let probe: Vec<String> = h.o.probe().scopes.into_iter().map(|s| s.scope).collect();
    assert_eq!(
        probe,
        vec!["st1:Room:shard2", "st1:Room:shard3"],
        "kept leases"
    );
    assert_eq!(
        h.o.admit(&shard(3), h.generations[0])
            .await
            .expect_err("draining")
            .code(),
        "draining",
        "nothing is admitted on a kept lease"
    );

    // Once the store answers again, a second drain releases what was kept.
    h.hang.store(false, Ordering::SeqCst);
    assert_eq!(
        h.o.drain().await,
        DrainReport::Drained {
            released: vec![(shard(2), h.generations[2]), (shard(3), h.generations[0])],
            not_released: vec![],
        }
    );
    assert_eq!(owner_task(&h.f, &shard(2)).await, None);
    assert_eq!(owner_task(&h.f, &shard(3)).await, None);
}

#[tokio::test]
async fn the_drain_timeout_also_bounds_the_in_flight_wait() {
    let s = OwnershipSettings {
        drain_timeout_ms: 5_000,
        drain_in_flight_timeout_ms: 8_000,
        ..settings()
    };
    let h = hanging(s).await;
    let g = h.generations[1];
    let permit = h.o.admit(&shard(1), g).await.expect("admitted");
    let drain = spawn_drain(&h.o);
    settle().await;
    h.f.clock.advance(4_999);
    settle().await;
    assert!(!drain.is_finished());
    h.f.clock.advance(1);
    settle().await;
    assert!(
        drain.is_finished(),
        "bounded by drain_timeout_ms, not 8000 ms"
    );
    assert_eq!(
        drain.await.expect("drain task"),
        DrainReport::TimedOut { in_flight: 1 }
    );
    assert_eq!(h.hooks.calls(Method::Release), 0, "every lease kept");
    assert_eq!(h.o.probe().scopes.len(), 3);
    drop(permit);
}

#[tokio::test]
async fn the_releases_get_the_time_the_wait_left() {
    // Work finishes at 7000 ms of an 8000 ms wait: the releases have until
    // 10000 ms, so a hanging one ends the drain 3000 ms after the work.
    let h = hanging(settings()).await;
    let permit =
        h.o.admit(&shard(1), h.generations[1])
            .await
            .expect("admitted");
    let drain = spawn_drain(&h.o);
    settle().await;
    h.f.clock.advance(7_000);
    drop(permit);
    settle().await;
    assert!(!drain.is_finished(), "shard2's release hangs");
    h.f.clock.advance(2_999);
    settle().await;
    assert!(!drain.is_finished());
    h.f.clock.advance(1);
    settle().await;
    assert!(drain.is_finished(), "bounded by drain_timeout_ms");
    let report = drain.await.expect("drain task");
    assert!(
        matches!(report, DrainReport::ReleaseTimedOut { .. }),
        "{report:?}"
    );
}
