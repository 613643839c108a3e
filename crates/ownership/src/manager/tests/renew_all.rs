//! Tests of `renew_all`: one batched store call for every owned scope, each
//! result applied as a single renew applies it.

use std::sync::Mutex as StdMutex;

use super::*;
use crate::hooked::{Action, Method};

#[tokio::test]
async fn renew_all_is_one_batch_and_applies_each_result_like_renew() {
    let f = fixture().await;
    // Counts `renew` and `renew_many` calls; loses the renew reply of one
    // scope with an unavailable store when asked.
    let hooks = Hooks::new();
    let unavailable: Arc<StdMutex<Option<OwnerScope>>> = Arc::new(StdMutex::new(None));
    let failing = Arc::clone(&unavailable);
    hooks.set(move |method, scope| {
        let fail = failing.lock().expect("lock");
        if method == Method::RenewMany && scope.is_some() && fail.as_ref() == scope {
            Action::Lose(OwnershipError::StoreUnavailable {
                source: "injected".into(),
            })
        } else {
            Action::Pass
        }
    });
    let store = HookedStore::new(Arc::clone(&f.store), hooks.clone());
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
    assert_eq!(hooks.calls(Method::RenewMany), 1, "one batched store call");
    assert_eq!(hooks.calls(Method::Renew), 0, "no renew per scope");
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
    assert_eq!(hooks.calls(Method::RenewMany), 2);
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
