//! Conformance cases of the shard count recorded per storage id.

use super::{Case, Harness, TTL_MS, claimed, snap, snap_raw, task};
use crate::error::OwnershipError;
use crate::record::OwnerRecord;
use crate::scope::{OwnerScope, ShardCount, StorageId};
use crate::store::{LeaseStore, LifecycleAdmin};

fn under(c: &Case, shard: u32, count: u32) -> OwnerScope {
    OwnerScope::new(
        c.scope.storage_id().clone(),
        c.scope.class().clone(),
        shard,
        ShardCount::new(count).expect("count"),
    )
    .expect("scope")
}

fn assert_mismatch(e: &OwnershipError, recorded: u32, requested: u32, name: &str) {
    match e {
        OwnershipError::ShardCountMismatch {
            recorded: r,
            requested: q,
            ..
        } => assert_eq!((*r, *q), (recorded, requested), "{name}: counts named"),
        other => panic!("{name}: expected shard_count_mismatch, got {other:?}"),
    }
    assert!(!e.is_retryable(), "{name}: a configuration refusal");
}

/// The first claim records its count; a claim, renew or start-up check
/// under another count is refused and writes nothing.
pub(super) async fn claim_records_and_refuses<H: Harness>(h: &H, c: &Case, name: &str) {
    assert_eq!(snap(h, c).await.shard_count, None, "{name}: none yet");
    let r = claimed(h, c, "a").await;
    assert_eq!(
        snap(h, c).await.shard_count,
        Some(ShardCount::default()),
        "{name}: recorded by the claim"
    );
    // The same host id under 8 shards, and a shard only 8 shards name.
    let same_key = under(c, 3, 8);
    let other_key = under(c, 5, 8);
    let before = (snap_raw(h, c).await, h.raw_state(&other_key).await);
    for scope in [&same_key, &other_key] {
        let e = h
            .store()
            .claim(scope, &c.lifecycle, &task("b"), TTL_MS)
            .await
            .expect_err("another count");
        assert_mismatch(&e, 16, 8, name);
        let e = h
            .store()
            .record_shard_count(scope, &c.lifecycle)
            .await
            .expect_err("another count at start");
        assert_mismatch(&e, 16, 8, name);
    }
    // A record with the same bytes, held under the other count.
    let forged = OwnerRecord::new(same_key, c.lifecycle.clone(), task("a"), r.generation());
    assert_eq!(forged.encoded(), r.encoded(), "{name}: same bytes");
    let e = h
        .store()
        .renew(&forged, TTL_MS)
        .await
        .expect_err("renew under another count");
    assert_mismatch(&e, 16, 8, name);
    let after = (snap_raw(h, c).await, h.raw_state(&other_key).await);
    assert_eq!(after, before, "{name}: refusals wrote nothing");
    h.store()
        .record_shard_count(&c.scope, &c.lifecycle)
        .await
        .expect("the recorded count passes");
    h.store().renew(&r, TTL_MS).await.expect("renew");
}

/// The count belongs to the storage id: it stays across pointer moves,
/// another storage id records its own, and the start-up check records it
/// like a claim.
pub(super) async fn kept_per_storage_id<H: Harness>(h: &H, c: &Case, name: &str) {
    let recorded = async || snap(h, c).await.shard_count.map(ShardCount::get);
    let eight = under(c, 3, 8);
    h.store()
        .record_shard_count(&eight, &c.lifecycle)
        .await
        .expect("record 8");
    assert_eq!(recorded().await, Some(8), "{name}: recorded at start");
    let e = h
        .store()
        .claim(&c.scope, &c.lifecycle, &task("a"), TTL_MS)
        .await
        .expect_err("16 after 8");
    assert_mismatch(&e, 8, 16, name);
    let other = StorageId::new(&format!("{}-next", c.scope.storage_id().as_str())).expect("id");
    let next = OwnerScope::new(
        other.clone(),
        c.scope.class().clone(),
        3,
        ShardCount::default(),
    )
    .expect("scope");
    let e = h
        .store()
        .record_shard_count(&next, &c.lifecycle)
        .await
        .expect_err("inactive");
    assert_eq!(e.code(), "storage_inactive", "{name}");
    h.store()
        .set_active_storage(&c.lifecycle, Some(&other))
        .await
        .expect("move");
    let r = match h
        .store()
        .claim(&next, &c.lifecycle, &task("a"), TTL_MS)
        .await
        .expect("claim under the next storage id")
    {
        crate::store::ClaimOutcome::Claimed(l) => l.record,
        crate::store::ClaimOutcome::Held(l) => panic!("{name}: held by {:?}", l.record),
    };
    assert_eq!(
        h.store()
            .snapshot(&next, &c.lifecycle)
            .await
            .expect("snapshot")
            .shard_count,
        Some(ShardCount::default()),
        "{name}: its own count"
    );
    h.store().renew(&r, TTL_MS).await.expect("renew");
    h.store()
        .set_active_storage(&c.lifecycle, Some(c.scope.storage_id()))
        .await
        .expect("back");
    assert_eq!(
        recorded().await,
        Some(8),
        "{name}: kept across pointer moves"
    );
}
