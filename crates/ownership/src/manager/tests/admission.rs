//! Tests of the admission modes: the default snapshot check sees lifecycle
//! changes at the very next admission; the cached mode does no I/O.

use super::*;
use crate::store::DeleteLock;

#[test]
fn admission_defaults_to_the_snapshot_check() {
    assert_eq!(OwnershipSettings::default().admission, Admission::Snapshot);
    assert_eq!(
        OwnershipSettings::from_lookup(|_| None).admission,
        Admission::Snapshot
    );
}

#[tokio::test]
async fn default_admission_refuses_a_whole_delete_lock_at_the_next_admission() {
    let f = fixture().await;
    let (a, g) = f.claimed("a").await;
    drop(
        a.admit(&f.scope, g)
            .await
            .expect("admitted before the lock"),
    );
    f.lock(Some(DeleteLock::Whole)).await;
    let e = a.admit(&f.scope, g).await.expect_err("whole delete lock");
    assert_eq!(e.code(), "worker_delete_locked");
    assert_eq!(a.in_flight(), 0, "nothing admitted");
    assert!(a.probe().scopes.is_empty(), "the locked scope is forgotten");
}

#[tokio::test]
async fn default_admission_refuses_a_storage_pointer_move_at_the_next_admission() {
    let f = fixture().await;
    let (a, g) = f.claimed("a").await;
    drop(
        a.admit(&f.scope, g)
            .await
            .expect("admitted before the move"),
    );
    f.point_at(Some("st2")).await;
    let e = a.admit(&f.scope, g).await.expect_err("pointer moved");
    assert_eq!(e.code(), "storage_inactive");
    assert_eq!(a.in_flight(), 0, "nothing admitted");
    assert!(a.probe().scopes.is_empty(), "the moved scope is forgotten");

    // A removed pointer is refused the same way.
    let b = f.task("b");
    f.point_at(Some("st1")).await;
    f.store.expire_owner(&f.scope);
    let gb = f.claim(&b).await;
    f.point_at(None).await;
    let e = b.admit(&f.scope, gb).await.expect_err("pointer removed");
    assert_eq!(e.code(), "storage_inactive");
}

#[tokio::test]
async fn default_admission_reads_one_snapshot_and_admits_under_a_version_lock() {
    let f = fixture().await;
    let (a, g) = f.claimed("a").await;
    f.lock(Some(DeleteLock::Version)).await;
    let before = f.calls.total();
    for _ in 0..10 {
        let p = a
            .admit(&f.scope, g)
            .await
            .expect("a version lock does not interrupt");
        assert_eq!(p.generation(), g);
    }
    assert_eq!(
        f.calls.total(),
        before + 10,
        "one snapshot per admission, nothing else"
    );
}

#[tokio::test]
async fn default_admission_below_the_guard_reads_a_snapshot_then_renews() {
    let f = fixture().await;
    let (a, g) = f.claimed("a").await;
    f.clock.advance(9_500);
    let before = f.calls.total();
    let p = a.admit(&f.scope, g).await.expect("renewed and admitted");
    assert_eq!(p.generation(), g);
    assert_eq!(f.calls.total(), before + 2, "one snapshot, one renew");
    assert_eq!(a.probe().scopes[0].lease_remaining_ms, 10_000);
}

#[tokio::test]
async fn default_admission_refuses_an_expired_local_lease_without_io() {
    let f = fixture().await;
    let (a, g) = f.claimed("a").await;
    f.clock.advance(10_000);
    let before = f.calls.total();
    let e = a.admit(&f.scope, g).await.expect_err("expired");
    assert_eq!(e.code(), "lease_expired");
    assert_eq!(f.calls.total(), before, "no round trip");
}

#[tokio::test]
async fn cached_admission_does_no_io_and_accepts_lifecycle_staleness() {
    let f = fixture().await;
    let a = f.cached_task("a");
    let g = f.claim(&a).await;
    f.lock(Some(DeleteLock::Whole)).await;
    let before = f.calls.total();
    drop(
        a.admit(&f.scope, g)
            .await
            .expect("cached admission does not see the lock"),
    );
    assert_eq!(f.calls.total(), before, "no store call");
    // The checked admission and the next renew see it.
    assert_eq!(
        a.admit_checked(&f.scope, g)
            .await
            .expect_err("checked")
            .code(),
        "worker_delete_locked"
    );
    assert_eq!(
        a.admit(&f.scope, g).await.expect_err("forgotten").code(),
        "stale_owner"
    );
}
