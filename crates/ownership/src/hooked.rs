//! [`HookedStore`]: a lease store wrapper for tests, re-exported from the
//! `conformance` module.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::OwnershipError;
use crate::record::{Generation, OwnerRecord};
use crate::scope::{LifecycleId, OwnerScope, StorageId, TaskId};
use crate::store::{
    ClaimOutcome, Claimant, DeleteLock, Lease, LeaseStore, LifecycleAdmin, OwnerSnapshot, Presence,
    PresenceEntry, PresenceGroup,
};

/// A method of [`LeaseStore`] or [`LifecycleAdmin`], as [`HookedStore`] counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// [`LeaseStore::claim`].
    Claim,
    /// [`LeaseStore::renew`].
    Renew,
    /// [`LeaseStore::renew_many`] (counted once per call).
    RenewMany,
    /// [`LeaseStore::release`].
    Release,
    /// [`LeaseStore::snapshot`].
    Snapshot,
    /// [`LeaseStore::raise_generation_floor`].
    RaiseGenerationFloor,
    /// [`LifecycleAdmin::set_active_storage`].
    SetActiveStorage,
    /// [`LifecycleAdmin::set_delete_lock`].
    SetDeleteLock,
}

const METHODS: usize = 8;

impl Method {
    fn index(self) -> usize {
        self as usize
    }
}

/// What a hook makes one call do.
#[derive(Debug)]
pub enum Action {
    /// Delegate to the wrapped store.
    Pass,
    /// Answer this error without calling the wrapped store (nothing written).
    Fail(OwnershipError),
    /// Call the wrapped store, then answer this error instead of its reply
    /// (a lost reply: the write may have happened).
    Lose(OwnershipError),
    /// Never answer (the call's future stays pending until dropped).
    Hang,
}

/// A hook: given the method and the scope it concerns (none for the
/// lifecycle-admin methods), what the call does. For `renew_many` the hook is
/// asked once per record.
pub type Hook = dyn Fn(Method, Option<&OwnerScope>) -> Action + Send + Sync;

/// Shared counters and hook of one or more [`HookedStore`]s (clone it to share).
#[derive(Clone, Default)]
pub struct Hooks {
    inner: Arc<HooksInner>,
}

durability_time::debug_fields!(Hooks {});

#[derive(Default)]
struct HooksInner {
    calls: [AtomicUsize; METHODS],
    hook: Mutex<Option<Arc<Hook>>>,
}

impl Hooks {
    /// No hook, no calls counted.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls of `method` so far.
    pub fn calls(&self, method: Method) -> usize {
        self.inner
            .calls
            .get(method.index())
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// Calls of every method so far.
    pub fn total(&self) -> usize {
        self.inner
            .calls
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .sum()
    }

    /// Sets the hook every later call asks first.
    pub fn set(
        &self,
        hook: impl Fn(Method, Option<&OwnerScope>) -> Action + Send + Sync + 'static,
    ) {
        *self.lock() = Some(Arc::new(hook));
    }

    /// Removes the hook: every later call passes through.
    pub fn clear(&self) {
        *self.lock() = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<Hook>>> {
        self.inner
            .hook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn count(&self, method: Method) {
        if let Some(c) = self.inner.calls.get(method.index()) {
            c.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn action(&self, method: Method, scope: Option<&OwnerScope>) -> Action {
        let hook = self.lock().clone();
        hook.map_or(Action::Pass, |h| h(method, scope))
    }
}

/// A [`LeaseStore`] and [`LifecycleAdmin`] that delegates every method to `S`,
/// counts calls per method, and lets a test fail, lose the reply of, or hang a
/// chosen call (see [`Hooks::set`]).
pub struct HookedStore<S> {
    inner: S,
    hooks: Hooks,
}

impl<S> std::fmt::Debug for HookedStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedStore").finish_non_exhaustive()
    }
}

impl<S> HookedStore<S> {
    /// Wraps `inner` with `hooks` (shared with every store holding a clone).
    pub fn new(inner: S, hooks: Hooks) -> Self {
        Self { inner, hooks }
    }

    /// The counters and hook.
    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn call<T, F>(
        &self,
        method: Method,
        scope: Option<&OwnerScope>,
        f: F,
    ) -> Result<T, OwnershipError>
    where
        F: Future<Output = Result<T, OwnershipError>>,
    {
        self.hooks.count(method);
        match self.hooks.action(method, scope) {
            Action::Pass => f.await,
            Action::Fail(e) => Err(e),
            Action::Lose(e) => {
                let _ = f.await;
                Err(e)
            }
            Action::Hang => std::future::pending().await,
        }
    }
}

impl<S: LeaseStore> LeaseStore for HookedStore<S> {
    async fn claim_as(
        &self,
        scope: &OwnerScope,
        claimant: Claimant<'_>,
    ) -> Result<ClaimOutcome, OwnershipError> {
        let f = self.inner.claim_as(scope, claimant);
        self.call(Method::Claim, Some(scope), f).await
    }

    async fn renew(&self, record: &OwnerRecord, ttl_ms: u64) -> Result<Lease, OwnershipError> {
        let f = self.inner.renew(record, ttl_ms);
        self.call(Method::Renew, Some(record.scope()), f).await
    }

    async fn renew_many(
        &self,
        records: &[OwnerRecord],
        ttl_ms: u64,
    ) -> Vec<Result<Lease, OwnershipError>> {
        self.hooks.count(Method::RenewMany);
        let actions: Vec<Action> = records
            .iter()
            .map(|r| self.hooks.action(Method::RenewMany, Some(r.scope())))
            .collect();
        if actions.iter().any(|a| matches!(a, Action::Hang)) {
            return std::future::pending().await;
        }
        let sent: Vec<OwnerRecord> = records
            .iter()
            .zip(&actions)
            .filter(|(_, a)| !matches!(a, Action::Fail(_)))
            .map(|(r, _)| r.clone())
            .collect();
        let mut replies = self.inner.renew_many(&sent, ttl_ms).await.into_iter();
        actions
            .into_iter()
            .map(|a| match a {
                Action::Fail(e) => Err(e),
                Action::Lose(e) => {
                    let _ = replies.next();
                    Err(e)
                }
                Action::Pass | Action::Hang => replies.next().unwrap_or_else(|| {
                    Err(OwnershipError::StoreUnavailable {
                        source: "renew_many answered too few results".into(),
                    })
                }),
            })
            .collect()
    }

    async fn release(&self, record: &OwnerRecord) -> Result<bool, OwnershipError> {
        let f = self.inner.release(record);
        self.call(Method::Release, Some(record.scope()), f).await
    }

    async fn snapshot(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<OwnerSnapshot, OwnershipError> {
        let f = self.inner.snapshot(scope, lifecycle);
        self.call(Method::Snapshot, Some(scope), f).await
    }

    async fn raise_generation_floor(
        &self,
        scope: &OwnerScope,
        floor: Generation,
    ) -> Result<u64, OwnershipError> {
        let f = self.inner.raise_generation_floor(scope, floor);
        self.call(Method::RaiseGenerationFloor, Some(scope), f)
            .await
    }

    /// Not hooked: forwarded as is.
    async fn write_presence(&self, presence: Presence<'_>) -> Result<(), OwnershipError> {
        self.inner.write_presence(presence).await
    }

    /// Not hooked: forwarded as is.
    async fn withdraw(&self, group: &PresenceGroup, task: &TaskId) -> Result<bool, OwnershipError> {
        self.inner.withdraw(group, task).await
    }

    /// Not hooked: forwarded as is.
    async fn live_tasks(
        &self,
        group: &PresenceGroup,
    ) -> Result<Vec<PresenceEntry>, OwnershipError> {
        self.inner.live_tasks(group).await
    }

    /// Not hooked: forwarded as is.
    async fn record_shard_count(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<(), OwnershipError> {
        self.inner.record_shard_count(scope, lifecycle).await
    }
}

impl<S: LifecycleAdmin> LifecycleAdmin for HookedStore<S> {
    async fn set_active_storage(
        &self,
        lifecycle: &LifecycleId,
        storage: Option<&StorageId>,
    ) -> Result<(), OwnershipError> {
        let f = self.inner.set_active_storage(lifecycle, storage);
        self.call(Method::SetActiveStorage, None, f).await
    }

    async fn set_delete_lock(
        &self,
        lifecycle: &LifecycleId,
        lock: Option<DeleteLock>,
    ) -> Result<(), OwnershipError> {
        let f = self.inner.set_delete_lock(lifecycle, lock);
        self.call(Method::SetDeleteLock, None, f).await
    }
}
