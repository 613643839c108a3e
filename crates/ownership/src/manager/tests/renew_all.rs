//! Tests of `renew_all`: one batched store call for every owned scope, each
//! result applied as a single renew applies it.

use std::sync::Mutex as StdMutex;

use super::*;

/// Counts `renew` and `renew_many` calls; fails the renew of one scope with
/// an unavailable store when asked.
struct Batching {
    inner: Arc<InMemoryLeaseStore<ManualClock>>,
    renews: Arc<AtomicUsize>,
    batches: Arc<AtomicUsize>,
    unavailable: Arc<StdMutex<Option<OwnerScope>>>,
}

impl Batching {
    fn failing(&self, record: &OwnerRecord) -> bool {
        self.unavailable
            .lock()
            .expect("lock")
            .as_ref()
            .is_some_and(|s| s == record.scope())
    }
}

impl LeaseStore for Batching {
    async fn claim(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
        task: &TaskId,
        ttl_ms: u64,
    ) -> Result<ClaimOutcome, OwnershipError> {
        self.inner.claim(scope, lifecycle, task, ttl_ms).await
    }
    async fn renew(&self, record: &OwnerRecord, ttl_ms: u64) -> Result<Lease, OwnershipError> {
        self.renews.fetch_add(1, Ordering::SeqCst);
        self.inner.renew(record, ttl_ms).await
    }
    async fn renew_many(
        &self,
        records: &[OwnerRecord],
        ttl_ms: u64,
    ) -> Vec<Result<Lease, OwnershipError>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        let mut out = self.inner.renew_many(records, ttl_ms).await;
        for (r, result) in records.iter().zip(out.iter_mut()) {
            if self.failing(r) {
                *result = Err(OwnershipError::StoreUnavailable {
                    source: "injected".into(),
                });
            }
        }
        out
    }
    async fn release(&self, record: &OwnerRecord) -> Result<bool, OwnershipError> {
        self.inner.release(record).await
    }
    async fn snapshot(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<OwnerSnapshot, OwnershipError> {
        self.inner.snapshot(scope, lifecycle).await
    }
}

#[tokio::test]
async fn renew_all_is_one_batch_and_applies_each_result_like_renew() {
    let f = fixture().await;
    let renews = Arc::new(AtomicUsize::new(0));
    let batches = Arc::new(AtomicUsize::new(0));
    let unavailable = Arc::new(StdMutex::new(None));
    let store = Batching {
        inner: Arc::clone(&f.store),
        renews: Arc::clone(&renews),
        batches: Arc::clone(&batches),
        unavailable: Arc::clone(&unavailable),
    };
    let o = Ownership::new(
        store,
        f.clock.clone(),
        TaskId::new("a").expect("task"),
        settings(),
    );
    let moved_lifecycle = LifecycleId::new("ns:moved").expect("lifecycle");
    let storage = StorageId::new("st1").expect("storage");
    f.store
        .set_active_storage(&moved_lifecycle, Some(&storage))
        .await
        .expect("pointer");
    let mut scopes = Vec::new();
    for n in 0..16 {
        let scope =
            OwnerScope::parse(&format!("st1:Room:shard{n}"), ShardCount::default()).expect("scope");
        let lifecycle = if n == 7 {
            &moved_lifecycle
        } else {
            &f.lifecycle
        };
        assert!(matches!(
            o.resolve(&scope, lifecycle).await.expect("resolve"),
            Resolution::Local(_)
        ));
        scopes.push(scope);
    }
    f.clock.advance(4_000);
    let results = o.renew_all().await;
    assert_eq!(batches.load(Ordering::SeqCst), 1, "one batched store call");
    assert_eq!(renews.load(Ordering::SeqCst), 0, "no renew per scope");
    assert_eq!(results.len(), 16);
    assert!(results.iter().all(|(_, r)| r.is_ok()));
    assert!(
        o.probe()
            .scopes
            .iter()
            .all(|s| s.lease_remaining_ms == 10_000),
        "every local deadline moved"
    );

    // A lifecycle refusal forgets its scope; an unavailable store keeps it
    // until its deadline; the other scopes are renewed.
    let moved = StorageId::new("st2").expect("storage");
    f.store
        .set_active_storage(&moved_lifecycle, Some(&moved))
        .await
        .expect("pointer");
    *unavailable.lock().expect("lock") = Some(scopes[3].clone());
    f.clock.advance(4_000);
    let results = o.renew_all().await;
    assert_eq!(batches.load(Ordering::SeqCst), 2);
    for (scope, r) in &results {
        let code = r.as_ref().err().map(OwnershipError::code);
        let want = match scope {
            s if s == &scopes[7] => Some("storage_inactive"),
            s if s == &scopes[3] => Some("owner_store_unavailable"),
            _ => None,
        };
        assert_eq!(code, want, "{scope}");
    }
    let probe = o.probe();
    assert_eq!(probe.scopes.len(), 15, "the moved scope is forgotten");
    for s in &probe.scopes {
        let want = if s.scope == scopes[3].to_string() {
            6_000
        } else {
            10_000
        };
        assert_eq!(s.lease_remaining_ms, want, "{}", s.scope);
    }
}
