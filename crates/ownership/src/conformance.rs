//! The conformance suite every [`LeaseStore`] backend runs.
//!
//! The suite is a list of named cases ([`CASES`]). A backend implements
//! [`Harness`] in its tests (how to expire a lease and plant a raw owner
//! record on that store) and its test file is one
//! [`ownership_conformance!`](crate::ownership_conformance) call, which emits
//! one `#[tokio::test]` per case. Each case uses its own storage id and
//! lifecycle, so one harness can also run every case ([`run_all`]). Cases
//! panic with their name on failure.

use std::future::Future;

use crate::error::OwnershipError;
use crate::record::{Generation, OwnerEndpoint, OwnerRecord};
use crate::scope::{ClassName, LifecycleId, OwnerScope, ShardCount, StorageId, TaskId};
use crate::store::{
    ClaimOutcome, Claimant, DeleteLock, LeaseStore, LifecycleAdmin, OwnerSnapshot, PresenceGroup,
};

pub use crate::hooked::{Action, Hook, HookedStore, Hooks, Method};

mod shard_count;

/// Lease time used by the suite: long enough never to expire on its own.
pub const TTL_MS: u64 = 60_000;

/// Store-side controls the suite needs from a backend.
pub trait Harness: Send + Sync {
    /// The store under test.
    type Store: LeaseStore + LifecycleAdmin;

    /// The store.
    fn store(&self) -> &Self::Store;

    /// Makes the owner lease of `scope` expire now, on the store (the
    /// generation counter stays).
    fn expire_owner(&self, scope: &OwnerScope) -> impl Future<Output = ()> + Send;

    /// Writes `raw` as the owner record of `scope` with a live lease, bypassing validation.
    fn put_raw_owner(&self, scope: &OwnerScope, raw: &[u8]) -> impl Future<Output = ()> + Send;

    /// The raw stored owner record (if any, live or not) and generation counter of `scope`.
    fn raw_state(&self, scope: &OwnerScope) -> impl Future<Output = RawState> + Send;

    /// Makes the presence record of `task` in `group` expire now, on the store.
    fn expire_presence(
        &self,
        group: &PresenceGroup,
        task: &TaskId,
    ) -> impl Future<Output = ()> + Send;

    /// Called after a case passed: removes what the case stored on a shared
    /// store. The default does nothing.
    fn finish(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Raw stored state of a scope, compared to prove that nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawState {
    /// The stored owner record bytes.
    pub owner: Option<Vec<u8>>,
    /// The stored generation counter.
    pub generation: Option<u64>,
}

/// The names of the cases [`run_all`] runs, in order.
pub const CASES: &[&str] = crate::ownership_conformance!(@cases names);

fn task(name: &str) -> TaskId {
    TaskId::new(name).expect("valid task id")
}

struct Case {
    scope: OwnerScope,
    lifecycle: LifecycleId,
}

async fn case<H: Harness>(h: &H, name: &str, prefix: &str) -> Case {
    let storage = StorageId::new(&format!("{prefix}-{}", name.len())).expect("valid storage id");
    let scope = OwnerScope::new(
        storage.clone(),
        ClassName::new("Room").expect("class"),
        3,
        ShardCount::default(),
    )
    .expect("valid scope");
    let lifecycle = LifecycleId::new(&format!("ns:{prefix}:{name}")).expect("valid lifecycle");
    h.store()
        .set_active_storage(&lifecycle, Some(&storage))
        .await
        .expect("set pointer");
    Case { scope, lifecycle }
}

async fn snap<H: Harness>(h: &H, c: &Case) -> OwnerSnapshot {
    h.store()
        .snapshot(&c.scope, &c.lifecycle)
        .await
        .expect("snapshot")
}

async fn claimed<H: Harness>(h: &H, c: &Case, t: &str) -> OwnerRecord {
    match h
        .store()
        .claim(&c.scope, &c.lifecycle, &task(t), TTL_MS)
        .await
        .expect("claim")
    {
        ClaimOutcome::Claimed(l) => {
            assert_eq!(l.record.task().as_str(), t);
            assert!(l.remaining_ms > 0 && l.remaining_ms <= TTL_MS);
            l.record
        }
        ClaimOutcome::Held(l) => panic!("expected a claim, scope held by {:?}", l.record.task()),
    }
}

impl Case {
    /// A record of this case's scope and lifecycle held by `t` at `generation`.
    fn record(&self, t: &str, generation: u64) -> OwnerRecord {
        let generation = Generation::new(generation).expect("generation");
        OwnerRecord::new(
            self.scope.clone(),
            self.lifecycle.clone(),
            task(t),
            generation,
        )
    }

    /// Another shard of this case's storage id and class.
    fn shard(&self, shard: u32) -> OwnerScope {
        let (storage, class) = (self.scope.storage_id().clone(), self.scope.class().clone());
        OwnerScope::new(storage, class, shard, ShardCount::default()).expect("scope")
    }
}

async fn claim_err<H: Harness>(h: &H, c: &Case, ttl_ms: u64) -> OwnershipError {
    h.store()
        .claim(&c.scope, &c.lifecycle, &task("a"), ttl_ms)
        .await
        .expect_err("claim refused")
}

/// The code of a refused renewal of `r` for [`TTL_MS`].
async fn renew_code<H: Harness>(h: &H, r: &OwnerRecord, what: &str) -> &'static str {
    h.store().renew(r, TTL_MS).await.expect_err(what).code()
}

/// The result codes of a batch, `Ok(())` for a success.
fn codes<T>(results: &[Result<T, OwnershipError>]) -> Vec<Result<(), &'static str>> {
    let code = |r: &Result<T, OwnershipError>| r.as_ref().map(|_| ()).map_err(|e| e.code());
    results.iter().map(code).collect()
}

/// A change to a lifecycle that refuses claims and renewals under it.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// The active storage pointer names another storage id.
    Moved,
    /// The active storage pointer is unset.
    Unset,
    /// A whole-lifecycle delete lock.
    Locked,
}

impl Refusal {
    const ALL: [Self; 3] = [Self::Moved, Self::Unset, Self::Locked];

    fn code(self) -> &'static str {
        match self {
            Self::Moved | Self::Unset => "storage_inactive",
            Self::Locked => "worker_delete_locked",
        }
    }

    async fn apply<H: Harness>(self, h: &H, c: &Case) {
        let other = StorageId::new("moved-storage").expect("id");
        let store = h.store();
        match self {
            Self::Moved => store.set_active_storage(&c.lifecycle, Some(&other)).await,
            Self::Unset => store.set_active_storage(&c.lifecycle, None).await,
            Self::Locked => {
                let lock = Some(DeleteLock::Whole);
                store.set_delete_lock(&c.lifecycle, lock).await
            }
        }
        .expect("lifecycle change");
    }

    /// Puts the case's lifecycle back: pointer at its storage id, no lock.
    async fn undo<H: Harness>(self, h: &H, c: &Case) {
        let store = h.store();
        let storage = Some(c.scope.storage_id());
        store
            .set_active_storage(&c.lifecycle, storage)
            .await
            .expect("pointer");
        store
            .set_delete_lock(&c.lifecycle, None)
            .await
            .expect("unlock");
    }
}

/// Runs every case against `h`. `prefix` keeps this run's names apart from
/// other runs on a shared store (`[A-Za-z0-9-]`, short).
pub async fn run_all<H: Harness>(h: &H, prefix: &str) {
    for name in CASES {
        run_case(h, name, prefix).await;
    }
}

/// Runs the case `name` against `h`, under the names [`run_all`] gives it
/// (`prefix` followed by the case's position in [`CASES`]).
///
/// # Panics
/// When the case fails (naming it), or when `name` is not in [`CASES`].
pub async fn run_case<H: Harness>(h: &H, name: &str, prefix: &str) {
    let Some(i) = CASES.iter().position(|c| *c == name) else {
        panic!("unknown case {name}");
    };
    let name = &CASES[i];
    {
        let c = case(h, name, &format!("{prefix}{i}")).await;
        match *name {
            "claim_on_empty_scope_starts_at_generation_1" => {
                let r = claimed(h, &c, "a").await;
                assert_eq!(r.generation().get(), 1, "{name}");
                assert_eq!(r.scope(), &c.scope, "{name}");
            }
            "claim_while_held_returns_the_holder" => {
                let r = claimed(h, &c, "a").await;
                for t in ["a", "b"] {
                    match h
                        .store()
                        .claim(&c.scope, &c.lifecycle, &task(t), TTL_MS)
                        .await
                        .expect("claim")
                    {
                        ClaimOutcome::Held(l) => assert_eq!(l.record, r, "{name}"),
                        ClaimOutcome::Claimed(_) => panic!("{name}: claimed a live scope"),
                    }
                }
                assert_eq!(
                    snap(h, &c).await.generation,
                    1,
                    "{name}: no bump while held"
                );
            }
            "claim_after_expiry_bumps_the_generation" => {
                let mut last = 0;
                for t in ["a", "b", "a", "c"] {
                    let r = claimed(h, &c, t).await;
                    assert!(
                        r.generation().get() > last,
                        "{name}: generation must increase"
                    );
                    last = r.generation().get();
                    h.expire_owner(&c.scope).await;
                }
                assert_eq!(last, 4, "{name}");
                assert_eq!(snap(h, &c).await.generation, 4, "{name}");
            }
            "renew_compares_the_exact_record" => {
                let r = claimed(h, &c, "a").await;
                let l = h.store().renew(&r, TTL_MS).await.expect("renew");
                assert_eq!(l.record, r, "{name}");
                assert!(l.remaining_ms > TTL_MS / 2, "{name}: refreshed");
                let forged = c.record("a", r.generation().get() + 1);
                let code = renew_code(h, &forged, "forged generation").await;
                assert_eq!(code, "stale_owner", "{name}");
                h.expire_owner(&c.scope).await;
                assert_eq!(
                    renew_code(h, &r, "expired").await,
                    "stale_owner",
                    "{name}: an expired lease cannot be renewed"
                );
                let r2 = claimed(h, &c, "b").await;
                let code = renew_code(h, &r, "taken over").await;
                assert_eq!(code, "stale_owner", "{name}");
                assert_eq!(
                    snap(h, &c).await.owner.map(|l| l.record),
                    Some(r2),
                    "{name}: new owner untouched"
                );
            }
            "renew_checks_the_lifecycle" => {
                let r = claimed(h, &c, "a").await;
                for refusal in Refusal::ALL {
                    refusal.apply(h, &c).await;
                    let code = renew_code(h, &r, "refused").await;
                    assert_eq!(code, refusal.code(), "{name}: {refusal:?}");
                    refusal.undo(h, &c).await;
                }
                h.store().renew(&r, TTL_MS).await.expect("renew after undo");
            }
            "claim_checks_the_lifecycle_and_writes_nothing" => {
                let before = snap_raw(h, &c).await;
                for refusal in Refusal::ALL {
                    refusal.apply(h, &c).await;
                    let e = claim_err(h, &c, TTL_MS).await;
                    assert_eq!(e.code(), refusal.code(), "{name}: {refusal:?}");
                    refusal.undo(h, &c).await;
                }
                assert_eq!(snap_raw(h, &c).await, before, "{name}: nothing written");
                let empty = RawState {
                    owner: None,
                    generation: None,
                };
                assert_eq!(before, empty, "{name}");
            }
            "version_lock_does_not_interrupt" => {
                h.store()
                    .set_delete_lock(&c.lifecycle, Some(DeleteLock::Version))
                    .await
                    .expect("lock");
                let r = claimed(h, &c, "a").await;
                h.store()
                    .renew(&r, TTL_MS)
                    .await
                    .expect("renew under a version lock");
                assert_eq!(
                    snap(h, &c).await.delete_lock,
                    Some(DeleteLock::Version),
                    "{name}"
                );
            }
            "release_is_exact_and_keeps_the_generation" => {
                let r = claimed(h, &c, "a").await;
                let forged = c.record("b", r.generation().get());
                assert!(
                    !h.store().release(&forged).await.expect("release"),
                    "{name}: foreign record"
                );
                assert!(snap(h, &c).await.owner.is_some(), "{name}");
                assert!(h.store().release(&r).await.expect("release"), "{name}");
                assert!(
                    !h.store().release(&r).await.expect("release"),
                    "{name}: idempotent"
                );
                let s = snap(h, &c).await;
                assert!(s.owner.is_none(), "{name}");
                assert_eq!(s.generation, 1, "{name}: generation kept");
                assert_eq!(claimed(h, &c, "b").await.generation().get(), 2, "{name}");
            }
            "malformed_records_fail_closed" => {
                let foreign_scope = OwnerScope::new(
                    c.scope.storage_id().clone(),
                    c.scope.class().clone(),
                    4,
                    ShardCount::default(),
                )
                .expect("scope");
                let foreign = OwnerRecord::new(
                    foreign_scope,
                    c.lifecycle.clone(),
                    task("x"),
                    Generation::new(9).expect("g"),
                );
                let raws: Vec<Vec<u8>> = vec![
                    b"garbage".to_vec(),
                    vec![0xff, 0x00, 0xfe],
                    foreign.encoded().as_bytes().to_vec(),
                    b"{\"v\":1}".to_vec(),
                ];
                for raw in raws {
                    h.put_raw_owner(&c.scope, &raw).await;
                    let before = snap_raw(h, &c).await;
                    let e = claim_err(h, &c, TTL_MS).await;
                    assert_eq!(
                        e.code(),
                        "invalid_owner_record",
                        "{name}: claim over {raw:?}"
                    );
                    let e = h
                        .store()
                        .snapshot(&c.scope, &c.lifecycle)
                        .await
                        .expect_err("malformed");
                    assert_eq!(
                        e.code(),
                        "invalid_owner_record",
                        "{name}: snapshot over {raw:?}"
                    );
                    let honest = c.record("a", 1);
                    let code = renew_code(h, &honest, "malformed").await;
                    assert_eq!(code, "stale_owner", "{name}");
                    assert_eq!(
                        snap_raw(h, &c).await,
                        before,
                        "{name}: nothing written over {raw:?}"
                    );
                }
            }
            "snapshot_reads_everything" => {
                let s = snap(h, &c).await;
                assert!(
                    s.owner.is_none() && s.generation == 0 && s.delete_lock.is_none(),
                    "{name}"
                );
                assert_eq!(
                    s.active_storage.as_ref(),
                    Some(c.scope.storage_id()),
                    "{name}"
                );
                assert!(s.store_now_ms > 0, "{name}");
                let r = claimed(h, &c, "a").await;
                let s = snap(h, &c).await;
                let owner = s.owner.expect("owner");
                assert_eq!(owner.record, r, "{name}");
                assert!(
                    owner.remaining_ms > 0 && owner.remaining_ms <= TTL_MS,
                    "{name}"
                );
                assert_eq!(s.generation, 1, "{name}");
            }
            "bad_ttl_is_refused_before_any_write" => {
                let before = snap_raw(h, &c).await;
                for ttl in [0, crate::scope::MAX_SAFE_INTEGER + 1] {
                    let e = claim_err(h, &c, ttl).await;
                    assert_eq!(e.code(), "invalid_input", "{name}: claim ttl {ttl}");
                }
                assert_eq!(snap_raw(h, &c).await, before, "{name}: nothing written");
                let r = claimed(h, &c, "a").await;
                let before = snap_raw(h, &c).await;
                let e = h.store().renew(&r, 0).await.expect_err("ttl");
                assert_eq!(e.code(), "invalid_input", "{name}: renew ttl 0");
                assert_eq!(snap_raw(h, &c).await, before, "{name}: nothing written");
                let remaining = snap(h, &c).await.owner.expect("owner").remaining_ms;
                assert!(remaining > TTL_MS / 2, "{name}: lease untouched");
            }
            "renew_many_matches_renew_one_by_one" => renew_many_case(h, &c, name).await,
            "a_claim_records_the_shard_count_and_refuses_another" => {
                shard_count::claim_records_and_refuses(h, &c, name).await;
            }
            "the_shard_count_is_kept_per_storage_id" => {
                shard_count::kept_per_storage_id(h, &c, name).await;
            }
            "raise_generation_floor_never_lowers_and_keeps_the_owner" => {
                let raise = async |n: u64| {
                    let floor = Generation::new(n).expect("generation");
                    h.store().raise_generation_floor(&c.scope, floor).await
                };
                // On a scope that never had a counter (a wiped store).
                assert_eq!(raise(4).await.expect("floor"), 4, "{name}: from nothing");
                assert_eq!(snap(h, &c).await.generation, 4, "{name}");
                let r = claimed(h, &c, "a").await;
                assert_eq!(
                    r.generation().get(),
                    5,
                    "{name}: a claim goes above the floor"
                );
                let before = snap_raw(h, &c).await;
                assert_eq!(raise(3).await.expect("floor"), 5, "{name}: never lowers");
                assert_eq!(snap_raw(h, &c).await, before, "{name}: nothing written");
                assert_eq!(raise(9).await.expect("floor"), 9, "{name}");
                let s = snap(h, &c).await;
                assert_eq!(s.generation, 9, "{name}");
                assert_eq!(s.owner.expect("owner").record, r, "{name}: the owner stays");
                h.expire_owner(&c.scope).await;
                assert_eq!(claimed(h, &c, "b").await.generation().get(), 10, "{name}");
            }
            "a_claimed_endpoint_is_stored_renewed_and_released_exactly" => {
                let endpoint = OwnerEndpoint::new("http://10.1.2.3:7001").expect("endpoint");
                let r = match h
                    .store()
                    .claim_as(
                        &c.scope,
                        Claimant::new(&c.lifecycle, &task("a"), TTL_MS)
                            .with_endpoint(Some(&endpoint)),
                    )
                    .await
                    .expect("claim")
                {
                    ClaimOutcome::Claimed(l) => l.record,
                    ClaimOutcome::Held(l) => panic!("{name}: held by {:?}", l.record.task()),
                };
                assert_eq!(r.endpoint(), Some(&endpoint), "{name}");
                let raw = snap_raw(h, &c).await;
                assert_eq!(
                    raw.owner.as_deref(),
                    Some(r.encoded().as_bytes()),
                    "{name}: the stored bytes are the record's"
                );
                let s = snap(h, &c).await;
                let held = s.owner.expect("owner").record;
                assert_eq!(held, r, "{name}: read back with its endpoint");
                assert_eq!(held.endpoint(), Some(&endpoint), "{name}");
                // The same task and generation without the endpoint is
                // another record: renew and release refuse it.
                let bare = c.record("a", r.generation().get());
                assert!(
                    h.store().renew(&bare, TTL_MS).await.is_err(),
                    "{name}: renew is exact"
                );
                assert!(
                    !h.store().release(&bare).await.expect("release"),
                    "{name}: release is exact"
                );
                assert_eq!(
                    h.store().renew(&r, TTL_MS).await.expect("renew").record,
                    r,
                    "{name}"
                );
                assert!(h.store().release(&r).await.expect("release"), "{name}");
                assert!(snap(h, &c).await.owner.is_none(), "{name}: released");
            }
            "presence_lists_live_tasks_and_expires" => presence_case(h, &c, name).await,
            "claim_many_matches_claim_one_by_one" => claim_many_case(h, &c, name).await,
            other => panic!("unknown case {other}"),
        }
    }
}

async fn snap_raw<H: Harness>(h: &H, c: &Case) -> RawState {
    h.raw_state(&c.scope).await
}

/// Emits one `#[tokio::test]` per case of the lease store conformance suite
/// ([`conformance::CASES`](crate::conformance::CASES)), in a module named
/// `$module`. Each test awaits `$harness` (an expression evaluated in the
/// test, inside the new module, which sees the caller's items through
/// `use super::*`) for an `Option` of a
/// [`Harness`](crate::conformance::Harness), returns when it is `None` (a
/// service that is not there), and otherwise runs the case under the name
/// prefix `$prefix`, then calls [`Harness::finish`](crate::conformance::Harness::finish).
///
/// ```text
/// durability_ownership::ownership_conformance!(conformance, "mem", async { Some(memory_harness()) });
/// ```
#[macro_export]
macro_rules! ownership_conformance {
    (@cases $($then:tt)*) => {
        $crate::ownership_conformance! { @$($then)* [
            claim_on_empty_scope_starts_at_generation_1
            claim_while_held_returns_the_holder
            claim_after_expiry_bumps_the_generation
            renew_compares_the_exact_record
            renew_checks_the_lifecycle
            claim_checks_the_lifecycle_and_writes_nothing
            version_lock_does_not_interrupt
            release_is_exact_and_keeps_the_generation
            malformed_records_fail_closed
            snapshot_reads_everything
            bad_ttl_is_refused_before_any_write
            renew_many_matches_renew_one_by_one
            raise_generation_floor_never_lowers_and_keeps_the_owner
            a_claimed_endpoint_is_stored_renewed_and_released_exactly
            a_claim_records_the_shard_count_and_refuses_another
            the_shard_count_is_kept_per_storage_id
            presence_lists_live_tasks_and_expires
            claim_many_matches_claim_one_by_one
        ] }
    };
    (@names [$($case:ident)*]) => { &[$(stringify!($case)),*] };
    (@tests $module:ident ($prefix:expr, $harness:expr) [$($case:ident)*]) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let Some(h) = $harness.await else {
                        return;
                    };
                    $crate::conformance::run_case(&h, stringify!($case), $prefix).await;
                    $crate::conformance::Harness::finish(&h).await;
                }
            )*
        }
    };
    ($module:ident, $prefix:expr, $harness:expr $(,)?) => {
        $crate::ownership_conformance! { @cases tests $module ($prefix, $harness) }
    };
}

/// Records in a [`LeaseStore::renew_many`] batch: more than one Redis chunk
/// (256 scopes) of live, expired, foreign, forged, moved and locked records.
const BATCH: u32 = 300;

/// A mixed batch gives, record by record, exactly what `renew` gives alone,
/// and writes nothing for the records it refuses.
async fn renew_many_case<H: Harness>(h: &H, c: &Case, name: &str) {
    let storage = c.scope.storage_id().clone();
    let moved = LifecycleId::new(&format!("{}:moved", c.lifecycle.as_str())).expect("lifecycle");
    let locked = LifecycleId::new(&format!("{}:locked", c.lifecycle.as_str())).expect("lifecycle");
    for l in [&moved, &locked] {
        h.store()
            .set_active_storage(l, Some(&storage))
            .await
            .expect("set pointer");
    }
    let mut records = Vec::new();
    let mut expected: Vec<Option<&'static str>> = Vec::new();
    let mut refused_scopes = Vec::new();
    for i in 0..BATCH {
        let scope = OwnerScope::new(
            storage.clone(),
            ClassName::new(&format!("B{i}")).expect("class"),
            i % 16,
            ShardCount::default(),
        )
        .expect("scope");
        let kind = i % 6;
        let lifecycle = match kind {
            3 => &moved,
            4 => &locked,
            _ => &c.lifecycle,
        };
        let holder = if kind == 2 { "b" } else { "a" };
        let held = match h
            .store()
            .claim(&scope, lifecycle, &task(holder), TTL_MS)
            .await
            .expect("claim")
        {
            ClaimOutcome::Claimed(l) => l.record,
            ClaimOutcome::Held(_) => panic!("{name}: fresh scope held"),
        };
        let (record, code) = match kind {
            0 => (held, None),
            1 => {
                h.expire_owner(&scope).await;
                (held, Some("stale_owner"))
            }
            2 => (
                OwnerRecord::new(
                    scope.clone(),
                    c.lifecycle.clone(),
                    task("a"),
                    held.generation(),
                ),
                Some("stale_owner"),
            ),
            3 => (held, Some("storage_inactive")),
            4 => (held, Some("worker_delete_locked")),
            _ => (
                OwnerRecord::new(
                    scope.clone(),
                    c.lifecycle.clone(),
                    task("a"),
                    Generation::new(held.generation().get() + 1).expect("gen"),
                ),
                Some("stale_owner"),
            ),
        };
        if matches!(kind, 1 | 2 | 5) {
            refused_scopes.push(scope);
        }
        records.push(record);
        expected.push(code);
    }
    // A duplicate live record and a scope nobody ever claimed.
    records.push(records[0].clone());
    expected.push(None);
    let unclaimed = OwnerScope::new(
        storage.clone(),
        ClassName::new("Unclaimed").expect("class"),
        0,
        ShardCount::default(),
    )
    .expect("scope");
    records.push(OwnerRecord::new(
        unclaimed,
        c.lifecycle.clone(),
        task("a"),
        Generation::new(1).expect("gen"),
    ));
    expected.push(Some("stale_owner"));
    let other = StorageId::new("moved-storage").expect("id");
    h.store()
        .set_active_storage(&moved, Some(&other))
        .await
        .expect("pointer");
    h.store()
        .set_delete_lock(&locked, Some(DeleteLock::Whole))
        .await
        .expect("lock");

    let mut before = Vec::new();
    for s in &refused_scopes {
        before.push(h.raw_state(s).await);
    }
    let batch = h.store().renew_many(&records, TTL_MS).await;
    assert_eq!(batch.len(), records.len(), "{name}: one result per record");
    let mut after = Vec::new();
    for s in &refused_scopes {
        after.push(h.raw_state(s).await);
    }
    assert_eq!(after, before, "{name}: refused records wrote nothing");
    let mut one_by_one = Vec::new();
    for r in &records {
        one_by_one.push(h.store().renew(r, TTL_MS).await);
    }
    let shape = |r: &Result<crate::store::Lease, OwnershipError>| match r {
        Ok(l) => {
            assert!(l.remaining_ms > TTL_MS / 2, "{name}: refreshed");
            Ok(l.record.clone())
        }
        Err(e) => Err(e.code()),
    };
    for (i, ((many, one), code)) in batch.iter().zip(&one_by_one).zip(&expected).enumerate() {
        assert_eq!(shape(many), shape(one), "{name}: record {i}");
        match (many, code) {
            (Ok(l), None) => assert_eq!(&l.record, &records[i], "{name}: record {i}"),
            (Err(e), Some(code)) => assert_eq!(e.code(), *code, "{name}: record {i}"),
            (got, want) => panic!("{name}: record {i}: got {:?}, want {want:?}", shape(got)),
        }
    }
    for (i, r) in records
        .iter()
        .enumerate()
        .filter(|(i, _)| expected[*i].is_none())
    {
        let owner = h
            .store()
            .snapshot(r.scope(), r.lifecycle())
            .await
            .expect("snapshot")
            .owner
            .expect("owner");
        assert_eq!(&owner.record, r, "{name}: record {i} still owned");
    }

    assert!(
        h.store().renew_many(&[], TTL_MS).await.is_empty(),
        "{name}: empty batch"
    );
    let live = records[0].clone();
    let before = h.raw_state(live.scope()).await;
    let bad = h.store().renew_many(&[live.clone(), live.clone()], 0).await;
    assert_eq!(codes(&bad), [Err("invalid_input"); 2], "{name}: bad ttl");
    assert_eq!(
        h.raw_state(live.scope()).await,
        before,
        "{name}: nothing written"
    );
}

/// Presence records: announced, replaced, listed sorted with their values
/// while live, withdrawn, expired on the store's clock, kept per group, and
/// bad input refused with nothing written.
async fn presence_case<H: Harness>(h: &H, c: &Case, name: &str) {
    let storage = c.scope.storage_id().clone();
    let group = PresenceGroup::new(storage.clone(), ClassName::new("Room").expect("class"));
    let other = PresenceGroup::new(storage, ClassName::new("Hall").expect("class"));
    let live = |g: PresenceGroup| async move {
        h.store()
            .live_tasks(&g)
            .await
            .expect("live tasks")
            .into_iter()
            .map(|e| {
                assert!(e.remaining_ms > 0 && e.remaining_ms <= TTL_MS, "{name}");
                (e.task.as_str().to_owned(), e.value)
            })
            .collect::<Vec<_>>()
    };
    let announce = async |g: &PresenceGroup, t: &str, v: &[u8], ttl_ms: u64| {
        h.store().announce(g, &task(t), v, ttl_ms).await
    };
    let withdraw =
        async |g: &PresenceGroup, t: &str| h.store().withdraw(g, &task(t)).await.expect("withdraw");
    assert!(live(group.clone()).await.is_empty(), "{name}: empty group");
    for (t, v) in [("b", &b"1;1"[..]), ("a", b"1;0"), ("c", b"1;")] {
        announce(&group, t, v, TTL_MS).await.expect("announce");
    }
    announce(&other, "d", b"1;2", TTL_MS)
        .await
        .expect("announce");
    announce(&group, "a", b"1;0,5", TTL_MS)
        .await
        .expect("replace");
    let own = |t: &str, v: &[u8]| (t.to_owned(), v.to_vec());
    assert_eq!(
        live(group.clone()).await,
        vec![own("a", b"1;0,5"), own("b", b"1;1"), own("c", b"1;")],
        "{name}: sorted, replaced, this group only"
    );
    assert_eq!(live(other.clone()).await, vec![own("d", b"1;2")], "{name}");
    for (ttl, value) in [
        (0, vec![]),
        (TTL_MS, vec![b'x'; crate::balance::MAX_PRESENCE_BYTES + 1]),
    ] {
        let e = announce(&group, "e", &value, ttl)
            .await
            .expect_err("bad input");
        assert_eq!(e.code(), "invalid_input", "{name}");
    }
    assert!(withdraw(&group, "c").await, "{name}");
    assert!(!withdraw(&group, "c").await, "{name}: gone");
    h.expire_presence(&group, &task("b")).await;
    assert_eq!(
        live(group.clone()).await,
        vec![own("a", b"1;0,5")],
        "{name}: expired and withdrawn records are not live"
    );
    announce(&group, "b", b"1;", TTL_MS)
        .await
        .expect("announce again");
    assert_eq!(live(group).await.len(), 2, "{name}: announced again");
    assert!(withdraw(&other, "d").await, "{name}");
}

/// `claim_many` answers per scope what `claim_as` alone would: claims free
/// scopes (bumping each generation), reports live holders, claims a scope
/// named twice once, refuses a locked lifecycle or a bad TTL for every scope
/// with nothing written.
async fn claim_many_case<H: Harness>(h: &H, c: &Case, name: &str) {
    let scope = |n: u32| c.shard(n);
    let held = h
        .store()
        .claim(&scope(4), &c.lifecycle, &task("b"), TTL_MS)
        .await
        .expect("claim");
    let ClaimOutcome::Claimed(held) = held else {
        panic!("{name}: fresh scope held");
    };
    let scopes = [scope(0), scope(1), scope(4), scope(0)];
    let endpoint = OwnerEndpoint::new("http://127.0.0.1:1").expect("endpoint");
    let out = h
        .store()
        .claim_many(
            &scopes,
            Claimant::new(&c.lifecycle, &task("a"), TTL_MS).with_endpoint(Some(&endpoint)),
        )
        .await;
    assert_eq!(out.len(), scopes.len(), "{name}: one result per scope");
    let mut claimed = Vec::new();
    for (i, r) in out.iter().enumerate() {
        match (i, r) {
            (0 | 1, Ok(ClaimOutcome::Claimed(l))) => {
                assert_eq!(l.record.scope(), &scopes[i], "{name}");
                assert_eq!(l.record.generation().get(), 1, "{name}");
                assert_eq!(l.record.endpoint(), Some(&endpoint), "{name}");
                claimed.push(l.record.clone());
            }
            (2, Ok(ClaimOutcome::Held(l))) => assert_eq!(l.record, held.record, "{name}"),
            (3, Ok(ClaimOutcome::Held(l))) => assert_eq!(l.record, claimed[0], "{name}"),
            (i, other) => panic!("{name}: scope {i}: {other:?}"),
        }
    }
    for r in &claimed {
        let owner = h
            .store()
            .snapshot(r.scope(), &c.lifecycle)
            .await
            .expect("snapshot");
        assert_eq!(owner.owner.map(|l| l.record).as_ref(), Some(r), "{name}");
    }
    h.expire_owner(&scope(1)).await;
    let again = h
        .store()
        .claim_many(&[scope(1)], Claimant::new(&c.lifecycle, &task("c"), TTL_MS))
        .await;
    match again.as_slice() {
        [Ok(ClaimOutcome::Claimed(l))] => assert_eq!(l.record.generation().get(), 2, "{name}"),
        other => panic!("{name}: {other:?}"),
    }
    let before = h.raw_state(&scope(7)).await;
    let bad = h
        .store()
        .claim_many(
            &[scope(7), scope(8)],
            Claimant::new(&c.lifecycle, &task("a"), 0),
        )
        .await;
    assert_eq!(codes(&bad), [Err("invalid_input"); 2], "{name}");
    Refusal::Locked.apply(h, c).await;
    let locked = h
        .store()
        .claim_many(
            &[scope(7), scope(8)],
            Claimant::new(&c.lifecycle, &task("a"), TTL_MS),
        )
        .await;
    assert_eq!(codes(&locked), [Err("worker_delete_locked"); 2], "{name}");
    assert_eq!(
        h.raw_state(&scope(7)).await,
        before,
        "{name}: nothing written"
    );
    assert!(
        h.store()
            .claim_many(&[], Claimant::new(&c.lifecycle, &task("a"), TTL_MS))
            .await
            .is_empty(),
        "{name}: empty batch"
    );
}
