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

/// Task `a` holding the scope, admitted once (the permit dropped).
async fn admitted_once(f: &Fixture) -> (Task, Generation) {
    let (a, g) = f.claimed("a").await;
    drop(
        a.admit(&f.scope, g)
            .await
            .expect("admitted before the change"),
    );
    (a, g)
}

/// Asserts that `a`'s next admission at `g` is refused with `code`, admits
/// nothing and forgets the scope.
async fn assert_refused_and_forgotten(f: &Fixture, a: &Task, g: Generation, code: &str) {
    assert_eq!(f.admit_refused(a, g).await, code);
    assert_eq!(a.in_flight(), 0, "nothing admitted");
    assert!(
        a.probe().scopes.is_empty(),
        "the refused scope is forgotten"
    );
}

#[tokio::test]
async fn default_admission_refuses_a_whole_delete_lock_at_the_next_admission() {
    let f = fixture().await;
    let (a, g) = admitted_once(&f).await;
    f.lock(Some(DeleteLock::Whole)).await;
    assert_refused_and_forgotten(&f, &a, g, "worker_delete_locked").await;
}

#[tokio::test]
async fn default_admission_refuses_a_storage_pointer_move_at_the_next_admission() {
    let f = fixture().await;
    let (a, g) = admitted_once(&f).await;
    f.point_at(Some("st2")).await;
    assert_refused_and_forgotten(&f, &a, g, "storage_inactive").await;

    // A removed pointer is refused the same way.
    let b = f.task("b");
    f.point_at(Some("st1")).await;
    f.store.expire_owner(&f.scope);
    let gb = f.claim(&b).await;
    f.point_at(None).await;
    assert_eq!(f.admit_refused(&b, gb).await, "storage_inactive");
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
    assert_admission_below_guard_renews(&f, &a, g, 2, "one snapshot, one renew").await;
}

#[tokio::test]
async fn default_admission_refuses_an_expired_local_lease_without_io() {
    let f = fixture().await;
    let (a, g) = f.claimed("a").await;
    f.clock.advance(10_000);
    let before = f.calls.total();
    assert_eq!(f.admit_refused(&a, g).await, "lease_expired");
    assert_eq!(f.calls.total(), before, "no round trip");
}

#[tokio::test]
async fn cached_admission_does_no_io_and_accepts_lifecycle_staleness() {
    let f = fixture().await;
    let (a, g) = f.cached_claimed("a").await;
    f.lock(Some(DeleteLock::Whole)).await;
    let before = f.calls.total();
    drop(
        a.admit(&f.scope, g)
            .await
            .expect("cached admission does not see the lock"),
    );
    assert_eq!(f.calls.total(), before, "no store call");
    // The checked admission and the next renew see it.
    assert_eq!(f.checked_refused(&a, g).await, "worker_delete_locked");
    assert_eq!(f.admit_refused(&a, g).await, "stale_owner");
}
