//! Issue 32, item 4: two processes with one task id must not take each
//! other's scopes back and forth; the later one detects the other and stops.

use super::*;

fn expect_duplicate(e: &OwnershipError, task: &str) {
    match e {
        OwnershipError::DuplicateTaskId { task_id, .. } => assert_eq!(task_id, task),
        other => panic!("expected duplicate_task_id, got {other:?}"),
    }
    assert!(e.to_string().contains(task), "{e}");
}

#[tokio::test]
async fn a_second_process_with_the_same_task_id_is_refused_and_takes_nothing() {
    let f = fixture().await;
    let first = f.task_at("t-1", "http://10.0.0.1:7001");
    let g = f.claim(&first).await;
    let second = f.task_at("t-1", "http://10.0.0.2:7001");
    // First sight: the record might be a crashed predecessor's.
    let e = second
        .resolve(&f.scope, &f.lifecycle)
        .await
        .expect_err("held by the other run");
    assert_eq!(e.code(), "owner_race");
    // The first process renews: its lease end moves on the store's clock.
    f.clock.advance(2000);
    first.renew(&f.scope).await.expect("renew");
    let e = second
        .resolve(&f.scope, &f.lifecycle)
        .await
        .expect_err("duplicate");
    expect_duplicate(&e, "t-1");
    assert!(!e.is_retryable());
    // From then on every resolution of the second process is refused.
    expect_duplicate(&second.duplicate_task().expect("remembered"), "t-1");
    let other = OwnerScope::parse("st1:Room:shard2", ShardCount::default()).expect("scope");
    expect_duplicate(
        &second
            .resolve(&other, &f.lifecycle)
            .await
            .expect_err("refused"),
        "t-1",
    );
    // No ping-pong: the first process kept its claim at its generation.
    let held = f.snapshot().await.owner.expect("owner");
    assert_eq!(held.record.generation(), g);
    assert_eq!(
        held.record.endpoint().map(OwnerEndpoint::as_str),
        Some("http://10.0.0.1:7001")
    );
    assert_eq!(first.renew(&f.scope).await.expect("renew"), g);
    assert!(
        f.store.raw_state(&other).0.is_none(),
        "the refused process claimed nothing"
    );
}

#[tokio::test]
async fn a_duplicate_without_an_endpoint_is_not_adopted_as_this_process() {
    // Both processes write byte-identical records (same task, no endpoint):
    // before the fix the second adopted the first's claim and both owned it.
    let f = fixture().await;
    let (first, g) = f.claimed("same").await;
    let second = f.task("same");
    assert_eq!(f.refused(&second).await, "owner_race");
    assert_eq!(
        second
            .admit(&f.scope, g)
            .await
            .expect_err("not owned")
            .code(),
        "stale_owner"
    );
    f.clock.advance(1500);
    first.renew(&f.scope).await.expect("renew");
    expect_duplicate(
        &second
            .resolve(&f.scope, &f.lifecycle)
            .await
            .expect_err("duplicate"),
        "same",
    );
    let permit = first
        .admit(&f.scope, g)
        .await
        .expect("the first still owns");
    assert_eq!(permit.generation(), g);
}

#[tokio::test]
async fn a_record_this_process_wrote_is_adopted_after_it_was_forgotten() {
    let f = fixture().await;
    let (a, g) = f.claimed("a").await;
    a.forget(&f.scope);
    assert_eq!(f.claim(&a).await, g, "re-adopted at the same generation");
    assert!(a.duplicate_task().is_none());
}
