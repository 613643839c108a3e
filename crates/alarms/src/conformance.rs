//! The conformance suites: [`INDEX_CASES`] for [`AlarmIndex`] backends and
//! [`TX_CASES`] for [`AlarmTx`] backends, plus the in-memory storage they are
//! checked against ([`memory_storage`]). A backend's test file runs a suite
//! with one macro call, [`alarm_index_conformance!`](crate::alarm_index_conformance)
//! or [`alarm_tx_conformance!`](crate::alarm_tx_conformance), which emits one
//! test per case; [`run_index`] and [`run_tx`] run a whole suite in one go.
//!
//! Each check panics with a message naming the broken rule. Index checks
//! pass `now` explicitly: a backend that reads its own clock (Redis `TIME`)
//! must be configured to use the caller's time for the suite.

use std::future::Future;

use durability_scheduler::testkit::MemoryStorage;
use durability_scheduler::{ObjectId, SchemaStep, SchemaTarget, Storage, StorageError, migrate};

use crate::SCHEMA;
use crate::index::{AlarmIndex, ClaimReady, IndexCounts, JobPageRequest, JobState, RetryJob};
use crate::store::{AlarmRow, AlarmTx};
use crate::token::Token;

/// The bodies of this crate's conformance macros (see `durability_scheduler`
/// and `durability_time`).
#[doc(hidden)]
pub use durability_scheduler::storage_suite;
#[doc(hidden)]
pub use durability_time::async_suite;

/// The schema steps the in-memory storage registers for alarms.
pub static MEMORY_STEPS: &[SchemaStep] = &[SchemaStep::new(1, "initial")];

/// A fresh in-memory object storage with the alarm schema registered.
pub fn memory_storage() -> MemoryStorage {
    MemoryStorage::new().with_schema(SCHEMA, MEMORY_STEPS)
}

const T0: i64 = 1_700_000_000_000;
const LEASE: i64 = 60_000;

fn obj(name: &str) -> ObjectId {
    ObjectId::new(name).expect("valid object id")
}

fn tok(s: &str) -> Token {
    Token::new(s).expect("valid token")
}

/// Object `a` with one job (`token`, due at `T0`), promoted and claimed at
/// `T0` under `run`.
/// Claims the next ready job at `now` under the run token `run`.
async fn claim_at<I: AlarmIndex>(ix: &I, now: i64, run: &str) -> Option<crate::index::Claim> {
    let ready = ClaimReady {
        now,
        lease_ms: LEASE,
        run: &tok(run),
    };
    ix.claim(ready).await.expect("claim")
}

async fn running_a<I: AlarmIndex>(ix: &I, token: &str, run: &str) -> ObjectId {
    let a = obj("a");
    ix.upsert(&a, &tok(token), T0).await.expect("upsert");
    ix.promote(T0, 10).await.expect("promote");
    claim_at(ix, T0, run).await.expect("claimed");
    a
}

/// Runs every [`AlarmIndex`] check, each on a fresh, empty index from `make`.
///
/// # Panics
/// On the first broken rule, naming it.
pub async fn run_index<I, F, Fut>(mut make: F)
where
    I: AlarmIndex,
    F: FnMut() -> Fut,
    Fut: Future<Output = I>,
{
    for name in INDEX_CASES {
        run_index_case(name, &make().await).await;
    }
}

/// The names of the [`AlarmIndex`] suite's cases, in order (each runs on a
/// fresh, empty index).
pub const INDEX_CASES: &[&str] = crate::alarm_index_conformance!(@cases names);

/// Runs the [`AlarmIndex`] case `name` on `ix` (fresh and empty).
///
/// # Panics
/// When the case fails (naming the broken rule), or when `name` is not in
/// [`INDEX_CASES`].
pub async fn run_index_case<I: AlarmIndex>(name: &str, ix: &I) {
    match name {
        "upsert_is_idempotent_and_replaces" => upsert_is_idempotent_and_replaces(ix).await,
        "delete_is_token_fenced" => delete_is_token_fenced(ix).await,
        "promote_moves_only_due_jobs_in_batches" => {
            promote_moves_only_due_jobs_in_batches(ix).await;
        }
        "claim_is_exclusive_and_earliest_first" => claim_is_exclusive_and_earliest_first(ix).await,
        "settlement_is_run_token_fenced" => settlement_is_run_token_fenced(ix).await,
        "retry_returns_to_due" => retry_returns_to_due(ix).await,
        "lease_expiry_returns_job_and_fences_old_run" => {
            lease_expiry_returns_job_and_fences_old_run(ix).await;
        }
        "upsert_during_run_is_not_swallowed" => upsert_during_run_is_not_swallowed(ix).await,
        "delete_during_run_cannot_be_resurrected" => {
            delete_during_run_cannot_be_resurrected(ix).await;
        }
        "claim_batch_claims_earliest_first_each_under_its_run" => {
            claim_batch_claims_earliest_first_each_under_its_run(ix).await;
        }
        "release_returns_a_claim_unused_and_is_run_token_fenced" => {
            release_returns_a_claim_unused_and_is_run_token_fenced(ix).await;
        }
        "jobs_with_prefix_pages_through_one_prefix" => {
            jobs_with_prefix_pages_through_one_prefix(ix).await;
        }
        other => panic!("no alarm index conformance case {other:?}"),
    }
}

async fn claim_batch_claims_earliest_first_each_under_its_run<I: AlarmIndex>(ix: &I) {
    for (name, at) in [("c", T0 + 3), ("a", T0 + 1), ("b", T0 + 2)] {
        ix.upsert(&obj(name), &tok(&format!("t{name}")), at)
            .await
            .expect("upsert");
    }
    ix.promote(T0 + 10, 10).await.expect("promote");
    let runs = [tok("r1"), tok("r2")];
    let claims = ix
        .claim_batch(T0 + 10, LEASE, &runs)
        .await
        .expect("claim batch");
    let got: Vec<(&str, Token, u32)> = claims
        .iter()
        .map(|c| (c.object.as_str(), c.run.clone(), c.tries))
        .collect();
    assert_eq!(
        got,
        vec![("a", tok("r1"), 1), ("b", tok("r2"), 1)],
        "earliest first, the i-th under the i-th run token"
    );
    let rest = ix
        .claim_batch(T0 + 10, LEASE, &[tok("r3"), tok("r4")])
        .await
        .expect("claim batch");
    assert_eq!(rest.len(), 1, "fewer when fewer are ready");
    assert_eq!(rest[0].object.as_str(), "c");
    assert!(
        ix.claim_batch(T0 + 10, LEASE, &[tok("r5")])
            .await
            .expect("claim batch")
            .is_empty()
    );
    assert!(
        ix.claim_batch(T0 + 10, LEASE, &[])
            .await
            .expect("claim batch")
            .is_empty()
    );
}

async fn release_returns_a_claim_unused_and_is_run_token_fenced<I: AlarmIndex>(ix: &I) {
    let a = obj("a");
    ix.upsert(&a, &tok("t"), T0).await.expect("upsert");
    ix.promote(T0, 10).await.expect("promote");
    let c = claim_at(ix, T0, "r1").await.expect("a claim");
    assert!(
        !ix.release(&a, &tok("other"), T0).await.expect("release"),
        "another run token cannot release"
    );
    assert!(ix.release(&a, &c.run, T0).await.expect("release"));
    assert!(
        !ix.release(&a, &c.run, T0).await.expect("release"),
        "released once"
    );
    ix.promote(T0, 10).await.expect("promote");
    let again = claim_at(ix, T0, "r2")
        .await
        .expect("claimable again at once, without waiting for the lease");
    assert_eq!(again.tries, 1, "the released claim used no try");
    assert!(
        !ix.finish(&a, &c.run).await.expect("finish"),
        "the released run is fenced out"
    );
}

async fn upsert_is_idempotent_and_replaces<I: AlarmIndex>(ix: &I) {
    let a = obj("a");
    assert!(
        ix.upsert(&a, &tok("t1"), T0).await.expect("upsert"),
        "first upsert changes"
    );
    assert!(
        !ix.upsert(&a, &tok("t1"), T0).await.expect("upsert"),
        "same token and time is a no-op"
    );
    assert!(
        ix.upsert(&a, &tok("t2"), T0 + 5).await.expect("upsert"),
        "new token replaces"
    );
    let job = ix.job(&a).await.expect("job").expect("job exists");
    assert_eq!(
        (job.token, job.due_at, job.state, job.tries),
        (tok("t2"), T0 + 5, JobState::Due, 0)
    );
    assert_eq!(
        ix.counts().await.expect("counts"),
        IndexCounts {
            scheduled: 1,
            ready: 0
        },
        "one job per object"
    );
    assert_eq!(ix.next_due().await.expect("next"), Some(T0 + 5));
    assert_eq!(ix.job(&obj("missing")).await.expect("job"), None);
}

async fn jobs_with_prefix_pages_through_one_prefix<I: AlarmIndex>(ix: &I) {
    // 25 jobs of storage `s1` in every state, neighbours that share a
    // leading substring but not the prefix, and glob characters that a
    // pattern-matching backend must take literally.
    let mut expected = std::collections::BTreeMap::new();
    for i in 0..25 {
        let name = format!("s1:C:o{i:02}");
        ix.upsert(&obj(&name), &tok(&format!("t{i}")), T0 + i)
            .await
            .expect("upsert");
        expected.insert(name, format!("t{i}"));
    }
    for name in ["s10:C:x", "s1;C:y", "s:C:z", "r1:C:w", "s*:C:g", "s?:C:q"] {
        ix.upsert(&obj(name), &tok("other"), T0)
            .await
            .expect("upsert");
    }
    // Some are ready, one is running: listing covers every state.
    ix.promote(T0 + 4, 5).await.expect("promote");
    let claimed = claim_at(ix, T0 + 4, "run").await.expect("a ready job");
    let mut seen = std::collections::BTreeMap::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = ix
            .jobs_with_prefix(JobPageRequest::first("s1:", 4).after(cursor.as_deref()))
            .await
            .expect("list jobs");
        pages += 1;
        assert!(pages <= 200, "paging ends");
        for (object, view) in page.jobs {
            assert!(
                object.as_str().starts_with("s1:"),
                "only the prefix's jobs are listed, got {object}"
            );
            if object == claimed.object {
                assert_eq!(
                    view.state,
                    JobState::Running,
                    "a running job is listed as running"
                );
            }
            seen.insert(object.as_str().to_owned(), view.token.as_str().to_owned());
        }
        match page.cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(
        seen, expected,
        "every job of the prefix, once, with its token"
    );
    let glob = ix
        .jobs_with_prefix(JobPageRequest::first("s*:", 100))
        .await
        .expect("list jobs");
    let names: Vec<&str> = glob.jobs.iter().map(|(o, _)| o.as_str()).collect();
    assert_eq!(names, ["s*:C:g"], "a prefix is literal, not a pattern");
    let none = ix
        .jobs_with_prefix(JobPageRequest::first("absent:", 10))
        .await
        .expect("list jobs");
    assert!(none.jobs.is_empty() && none.cursor.is_none());
    assert!(
        matches!(
            ix.jobs_with_prefix(JobPageRequest::first("s1:", 0)).await,
            Err(crate::AlarmError::InvalidConfig { .. })
        ),
        "a zero limit is refused"
    );
}

async fn delete_is_token_fenced<I: AlarmIndex>(ix: &I) {
    let a = obj("a");
    ix.upsert(&a, &tok("t1"), T0).await.expect("upsert");
    assert!(
        !ix.delete(&a, &tok("other")).await.expect("delete"),
        "wrong token deletes nothing"
    );
    assert!(ix.job(&a).await.expect("job").is_some());
    assert!(
        ix.delete(&a, &tok("t1")).await.expect("delete"),
        "matching token deletes"
    );
    assert!(
        !ix.delete(&a, &tok("t1")).await.expect("delete"),
        "delete is idempotent"
    );
    assert_eq!(ix.counts().await.expect("counts").total(), 0);
    assert_eq!(ix.next_due().await.expect("next"), None);
}

async fn promote_moves_only_due_jobs_in_batches<I: AlarmIndex>(ix: &I) {
    for i in 0..5 {
        ix.upsert(&obj(&format!("o{i}")), &tok("t"), T0 + i)
            .await
            .expect("upsert");
    }
    ix.upsert(&obj("late"), &tok("t"), T0 + 1_000)
        .await
        .expect("upsert");
    assert_eq!(
        ix.promote(T0 - 1, 10).await.expect("promote"),
        0,
        "nothing due yet"
    );
    assert_eq!(
        ix.promote(T0 + 10, 2).await.expect("promote"),
        2,
        "batch limit"
    );
    assert_eq!(
        ix.promote(T0 + 10, 10).await.expect("promote"),
        3,
        "the rest of the due jobs"
    );
    assert_eq!(
        ix.counts().await.expect("counts"),
        IndexCounts {
            scheduled: 1,
            ready: 5
        }
    );
    let job = ix.job(&obj("o0")).await.expect("job").expect("exists");
    assert_eq!(job.state, JobState::Ready);
    assert_eq!(
        ix.next_due().await.expect("next"),
        Some(T0),
        "ready jobs count at their due time"
    );
}

async fn claim_is_exclusive_and_earliest_first<I: AlarmIndex>(ix: &I) {
    ix.upsert(&obj("b"), &tok("tb"), T0 + 2)
        .await
        .expect("upsert");
    ix.upsert(&obj("a"), &tok("ta"), T0 + 1)
        .await
        .expect("upsert");
    assert_eq!(claim_at(ix, T0 + 10, "r0").await, None, "due is not ready");
    ix.promote(T0 + 10, 10).await.expect("promote");
    let c1 = claim_at(ix, T0 + 10, "r1").await.expect("a claim");
    assert_eq!(
        (c1.object.as_str(), c1.token.clone(), c1.due_at, c1.tries),
        ("a", tok("ta"), T0 + 1, 1)
    );
    assert_eq!(c1.run, tok("r1"));
    assert_eq!(c1.lease_until, T0 + 10 + LEASE);
    let c2 = claim_at(ix, T0 + 10, "r2").await.expect("b claim");
    assert_eq!(c2.object.as_str(), "b");
    assert_eq!(
        claim_at(ix, T0 + 10, "r3").await,
        None,
        "each job claimed once"
    );
    let job = ix.job(&obj("a")).await.expect("job").expect("exists");
    assert_eq!(job.state, JobState::Running);
    assert_eq!(
        ix.promote(T0 + 11, 10).await.expect("promote"),
        0,
        "a live lease is not promoted"
    );
}

async fn settlement_is_run_token_fenced<I: AlarmIndex>(ix: &I) {
    let a = obj("a");
    ix.upsert(&a, &tok("t"), T0).await.expect("upsert");
    assert!(
        !ix.finish(&a, &tok("r")).await.expect("finish"),
        "a due job cannot be finished"
    );
    ix.promote(T0, 10).await.expect("promote");
    assert!(
        !ix.finish(&a, &tok("r")).await.expect("finish"),
        "a ready job cannot be finished"
    );
    claim_at(ix, T0, "r").await.expect("claimed");
    assert!(
        !ix.finish(&a, &tok("other")).await.expect("finish"),
        "wrong run token"
    );
    assert!(
        !ix.retry(RetryJob {
            object: &a,
            run: &tok("other"),
            now: T0,
            delay_ms: 5,
            tries: 1
        })
        .await
        .expect("retry"),
        "wrong run token"
    );
    assert!(
        ix.finish(&a, &tok("r")).await.expect("finish"),
        "right run token"
    );
    assert!(
        !ix.finish(&a, &tok("r")).await.expect("finish"),
        "finish is once"
    );
    assert_eq!(ix.job(&a).await.expect("job"), None);
    assert_eq!(ix.counts().await.expect("counts").total(), 0);
}

async fn retry_returns_to_due<I: AlarmIndex>(ix: &I) {
    let a = running_a(ix, "t", "r").await;
    assert!(
        ix.retry(RetryJob {
            object: &a,
            run: &tok("r"),
            now: T0 + 1,
            delay_ms: 500,
            tries: 1
        })
        .await
        .expect("retry")
    );
    let job = ix.job(&a).await.expect("job").expect("exists");
    assert_eq!(
        (job.state, job.tries, job.due_at),
        (JobState::Due, 1, T0),
        "due time of the row is kept"
    );
    assert_eq!(
        ix.next_due().await.expect("next"),
        Some(T0 + 501),
        "due again after the delay"
    );
    assert_eq!(ix.promote(T0 + 500, 10).await.expect("promote"), 0);
    assert_eq!(ix.promote(T0 + 501, 10).await.expect("promote"), 1);
    let c = claim_at(ix, T0 + 501, "r2").await.expect("claimed");
    assert_eq!(c.tries, 2, "tries carry over");
    assert!(
        !ix.retry(RetryJob {
            object: &a,
            run: &tok("r"),
            now: T0,
            delay_ms: 0,
            tries: 1
        })
        .await
        .expect("retry"),
        "old run is fenced"
    );
}

async fn lease_expiry_returns_job_and_fences_old_run<I: AlarmIndex>(ix: &I) {
    let a = running_a(ix, "t", "r1").await;
    assert_eq!(
        ix.next_due().await.expect("next"),
        Some(T0 + LEASE),
        "running is indexed at lease expiry"
    );
    assert_eq!(ix.promote(T0 + LEASE - 1, 10).await.expect("promote"), 0);
    assert_eq!(
        ix.promote(T0 + LEASE, 10).await.expect("promote"),
        1,
        "expired lease is ready again"
    );
    assert!(
        !ix.finish(&a, &tok("r1")).await.expect("finish"),
        "expired run cannot settle"
    );
    let c = claim_at(ix, T0 + LEASE, "r2").await.expect("reclaimed");
    assert_eq!((c.tries, c.token.clone()), (2, tok("t")));
    assert!(ix.finish(&a, &tok("r2")).await.expect("finish"));
}

async fn upsert_during_run_is_not_swallowed<I: AlarmIndex>(ix: &I) {
    let a = running_a(ix, "t1", "r1").await;
    ix.upsert(&a, &tok("t2"), T0 + 100)
        .await
        .expect("upsert while running");
    assert!(
        !ix.finish(&a, &tok("r1")).await.expect("finish"),
        "the old run cannot complete the new job"
    );
    let job = ix.job(&a).await.expect("job").expect("new job survives");
    assert_eq!(
        (job.token, job.state, job.tries),
        (tok("t2"), JobState::Due, 0)
    );
    assert_eq!(ix.next_due().await.expect("next"), Some(T0 + 100));
}

async fn delete_during_run_cannot_be_resurrected<I: AlarmIndex>(ix: &I) {
    let a = running_a(ix, "t1", "r1").await;
    assert!(
        ix.delete(&a, &tok("t1"))
            .await
            .expect("delete while running")
    );
    assert!(
        !ix.retry(RetryJob {
            object: &a,
            run: &tok("r1"),
            now: T0,
            delay_ms: 0,
            tries: 1
        })
        .await
        .expect("retry"),
        "retry cannot resurrect"
    );
    assert!(!ix.finish(&a, &tok("r1")).await.expect("finish"));
    assert_eq!(ix.job(&a).await.expect("job"), None);
    assert_eq!(ix.counts().await.expect("counts").total(), 0);
}

/// Runs every [`AlarmTx`] check on fresh storages from `make` (the alarm
/// schema is applied first).
///
/// # Panics
/// On the first broken rule, naming it.
pub fn run_tx<S>(make: impl Fn() -> S)
where
    S: Storage,
    for<'t> S::Tx<'t>: AlarmTx,
{
    for name in TX_CASES {
        run_tx_case(name, &make);
    }
}

/// The names of the [`AlarmTx`] suite's cases, in order (each runs on a
/// fresh storage).
pub const TX_CASES: &[&str] = crate::alarm_tx_conformance!(@cases names);

/// Runs the [`AlarmTx`] case `name` on a fresh storage from `make`, with the
/// alarm schema applied.
///
/// # Panics
/// When the case fails (naming the broken rule), or when `name` is not in
/// [`TX_CASES`].
pub fn run_tx_case<S>(name: &str, make: impl Fn() -> S)
where
    S: Storage,
    for<'t> S::Tx<'t>: AlarmTx,
{
    let s = make();
    migrate(&s, SCHEMA, &SchemaTarget::Latest).expect("alarm schema applies");
    match name {
        "row_roundtrip" => row_roundtrip(&s),
        "rollback_leaves_row" => rollback_leaves_row(&s),
        "schema_reverts_and_reapplies" => schema_reverts_and_reapplies(&s),
        other => panic!("no alarm row conformance case {other:?}"),
    }
}

fn row_roundtrip<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: AlarmTx,
{
    let row = AlarmRow {
        at: T0,
        token: tok("t1"),
        fence: None,
    };
    s.transaction(|tx| {
        assert_eq!(tx.alarm_row()?, None, "no row at first");
        tx.put_alarm_row(&row)?;
        Ok::<_, StorageError>(())
    })
    .expect("put");
    assert_eq!(
        s.transaction(|tx| tx.alarm_row()).expect("read"),
        Some(row.clone())
    );
    let fenced = AlarmRow {
        fence: Some(tok("f1")),
        ..row
    };
    s.transaction(|tx| tx.put_alarm_row(&fenced))
        .expect("replace");
    assert_eq!(
        s.transaction(|tx| tx.alarm_row()).expect("read"),
        Some(fenced),
        "fence round-trips"
    );
    assert!(s.transaction(|tx| tx.delete_alarm_row()).expect("delete"));
    assert!(
        !s.transaction(|tx| tx.delete_alarm_row()).expect("delete"),
        "second delete finds nothing"
    );
    assert_eq!(s.transaction(|tx| tx.alarm_row()).expect("read"), None);
    let max = AlarmRow {
        at: durability_scheduler::MAX_SAFE_INTEGER,
        token: tok("x"),
        fence: None,
    };
    s.transaction(|tx| tx.put_alarm_row(&max))
        .expect("max time");
    assert_eq!(
        s.transaction(|tx| tx.alarm_row()).expect("read"),
        Some(max),
        "safe-integer max round-trips"
    );
}

fn rollback_leaves_row<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: AlarmTx,
{
    let row = AlarmRow {
        at: T0,
        token: tok("keep"),
        fence: None,
    };
    s.transaction(|tx| tx.put_alarm_row(&row)).expect("put");
    let r: Result<(), StorageError> = s.transaction(|tx| {
        tx.put_alarm_row(&AlarmRow {
            at: 1,
            token: tok("gone"),
            fence: None,
        })?;
        Err(StorageError::corrupt("roll back"))
    });
    assert!(r.is_err());
    assert_eq!(
        s.transaction(|tx| tx.alarm_row()).expect("read"),
        Some(row),
        "rollback keeps the row"
    );
}

fn schema_reverts_and_reapplies<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: AlarmTx,
{
    migrate(s, SCHEMA, &SchemaTarget::Nothing).expect("revert");
    migrate(s, SCHEMA, &SchemaTarget::Latest).expect("reapply");
    assert_eq!(s.transaction(|tx| tx.alarm_row()).expect("read"), None);
}

/// Which backend failure a [`FaultIndex`] injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// [`crate::AlarmError::BackendUnavailable`], before the inner call.
    Unavailable,
    /// [`crate::AlarmError::BackendFailed`], before the inner call.
    Failed,
    /// [`crate::AlarmError::ResultUnknown`] *after* the inner call applied.
    UnknownAfter,
    /// [`crate::AlarmError::ResultUnknown`] without calling the inner index.
    UnknownBefore,
    /// Never answers (a hung backend: the caller's deadline decides).
    Hang,
}

/// Which call of an [`AlarmIndex`] a [`GatedIndex`] hands its gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexCall {
    /// An object's own write: `upsert` or `delete`.
    ObjectWrite,
    /// Any other call (the dispatcher's promote, claim, settle and reads).
    Other,
}

/// The inner index's answer to one call, as an [`IndexGate`] receives it
/// (not yet started).
pub type GatedCall<'a, T> =
    std::pin::Pin<Box<dyn Future<Output = Result<T, crate::AlarmError>> + Send + 'a>>;

/// What a [`GatedIndex`] runs every call through: the gate decides whether
/// and when the inner call runs, and what the caller sees.
pub trait IndexGate: Send + Sync + 'static {
    /// Runs (or not) `call`, the inner index's answer to a call of kind
    /// `kind`.
    fn pass<T: Send>(
        &self,
        kind: IndexCall,
        call: GatedCall<'_, T>,
    ) -> impl Future<Output = Result<T, crate::AlarmError>> + Send;
}

/// An [`AlarmIndex`] wrapper that runs each required call of `inner`
/// through `gate` (faults, crashes, a connection pool); the provided
/// methods keep their defaults, so they run over the gated calls.
#[derive(Debug)]
pub struct GatedIndex<I, G> {
    /// The wrapped index.
    pub inner: I,
    /// The gate of every call.
    pub gate: G,
}

impl<I: AlarmIndex, G: IndexGate> GatedIndex<I, G> {
    /// `inner` behind `gate`.
    pub fn gated(inner: I, gate: G) -> Self {
        Self { inner, gate }
    }
}

impl<I: AlarmIndex, G: IndexGate> AlarmIndex for GatedIndex<I, G> {
    async fn upsert(
        &self,
        object: &ObjectId,
        token: &Token,
        due_at: i64,
    ) -> Result<bool, crate::AlarmError> {
        let call = self.inner.upsert(object, token, due_at);
        self.gate.pass(IndexCall::ObjectWrite, Box::pin(call)).await
    }
    async fn delete(&self, object: &ObjectId, token: &Token) -> Result<bool, crate::AlarmError> {
        let call = self.inner.delete(object, token);
        self.gate.pass(IndexCall::ObjectWrite, Box::pin(call)).await
    }
    async fn job(&self, object: &ObjectId) -> Result<Option<crate::JobView>, crate::AlarmError> {
        self.gate
            .pass(IndexCall::Other, Box::pin(self.inner.job(object)))
            .await
    }
    async fn promote(&self, now: i64, limit: usize) -> Result<usize, crate::AlarmError> {
        let call = self.inner.promote(now, limit);
        self.gate.pass(IndexCall::Other, Box::pin(call)).await
    }
    async fn claim(
        &self,
        claim: ClaimReady<'_>,
    ) -> Result<Option<crate::Claim>, crate::AlarmError> {
        self.gate
            .pass(IndexCall::Other, Box::pin(self.inner.claim(claim)))
            .await
    }
    async fn finish(&self, object: &ObjectId, run: &Token) -> Result<bool, crate::AlarmError> {
        let call = self.inner.finish(object, run);
        self.gate.pass(IndexCall::Other, Box::pin(call)).await
    }
    async fn retry(&self, retry: RetryJob<'_>) -> Result<bool, crate::AlarmError> {
        self.gate
            .pass(IndexCall::Other, Box::pin(self.inner.retry(retry)))
            .await
    }
    async fn next_due(&self) -> Result<Option<i64>, crate::AlarmError> {
        self.gate
            .pass(IndexCall::Other, Box::pin(self.inner.next_due()))
            .await
    }
    async fn counts(&self) -> Result<IndexCounts, crate::AlarmError> {
        self.gate
            .pass(IndexCall::Other, Box::pin(self.inner.counts()))
            .await
    }
    async fn jobs_with_prefix(
        &self,
        page: JobPageRequest<'_>,
    ) -> Result<crate::JobPage, crate::AlarmError> {
        let call = self.inner.jobs_with_prefix(page);
        self.gate.pass(IndexCall::Other, Box::pin(call)).await
    }
}

/// The gate of a [`FaultIndex`]: injects queued failures into the next
/// object writes and counts them; every other call passes.
#[derive(Debug, Default)]
pub struct Faults {
    queued: std::sync::Mutex<std::collections::VecDeque<Fault>>,
    calls: std::sync::atomic::AtomicU64,
}

impl IndexGate for Faults {
    async fn pass<T: Send>(
        &self,
        kind: IndexCall,
        call: GatedCall<'_, T>,
    ) -> Result<T, crate::AlarmError> {
        if kind != IndexCall::ObjectWrite {
            return call.await;
        }
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let next = self
            .queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop_front();
        match next {
            None => call.await,
            Some(Fault::Unavailable) => {
                Err(crate::AlarmError::unavailable("injected: unavailable"))
            }
            Some(Fault::Failed) => Err(crate::AlarmError::failed("injected: rejected")),
            Some(Fault::UnknownBefore) => Err(crate::AlarmError::unknown("injected: lost request")),
            Some(Fault::UnknownAfter) => {
                call.await?;
                Err(crate::AlarmError::unknown("injected: lost reply"))
            }
            Some(Fault::Hang) => std::future::pending().await,
        }
    }
}

/// An [`AlarmIndex`] wrapper that injects failures into its next object
/// writes and counts them (crash and fault tests).
pub type FaultIndex<I> = GatedIndex<I, Faults>;

impl<I: AlarmIndex> GatedIndex<I, Faults> {
    /// Wraps `inner` with no faults queued.
    pub fn new(inner: I) -> Self {
        Self::gated(inner, Faults::default())
    }

    /// Queues a fault for the next mutating call (`upsert`, `delete`).
    pub fn fail_next(&self, fault: Fault) {
        self.gate
            .queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back(fault);
    }

    /// Object writes made so far.
    pub fn calls(&self) -> u64 {
        self.gate.calls.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The wrapped index.
    pub fn inner(&self) -> &I {
        &self.inner
    }
}

/// Emits one `#[tokio::test]` per case of the [`AlarmIndex`](crate::AlarmIndex)
/// conformance suite ([`conformance::INDEX_CASES`](crate::conformance::INDEX_CASES)),
/// in a module named `$module`. Each test awaits `$make` (an expression
/// evaluated in the test, inside the new module, which sees the caller's
/// items through `use super::*`) for an `Option` of a fresh, empty index and
/// a guard kept alive for the case (`()` when there is none); it returns
/// when that is `None` (a service that is not there), and otherwise runs the
/// case, then awaits `$finish(&index)` when given (cleanup on a shared
/// server).
///
/// ```text
/// durability_alarms::alarm_index_conformance!(on_memory, async { Some((MemoryAlarmIndex::new(), ())) });
/// ```
#[macro_export]
macro_rules! alarm_index_conformance {
    (@cases $($then:tt)*) => {
        $crate::alarm_index_conformance! { @$($then)* [
            upsert_is_idempotent_and_replaces
            delete_is_token_fenced
            promote_moves_only_due_jobs_in_batches
            claim_is_exclusive_and_earliest_first
            settlement_is_run_token_fenced
            retry_returns_to_due
            lease_expiry_returns_job_and_fences_old_run
            upsert_during_run_is_not_swallowed
            delete_during_run_cannot_be_resurrected
            claim_batch_claims_earliest_first_each_under_its_run
            release_returns_a_claim_unused_and_is_run_token_fenced
            jobs_with_prefix_pages_through_one_prefix
        ] }
    };
    (@names [$($case:ident)*]) => { &[$(stringify!($case)),*] };
    (@tests $module:ident ($make:expr, $finish:expr) [$($case:ident)*]) => {
        $crate::conformance::async_suite! {
            $module, $crate::conformance::run_index_case, (), $make, $finish, [$($case)*]
        }
    };
    ($module:ident, $make:expr, finish = $finish:expr $(,)?) => {
        $crate::alarm_index_conformance! { @cases tests $module ($make, $finish) }
    };
    ($module:ident, $make:expr $(,)?) => {
        $crate::alarm_index_conformance! { @cases tests $module ($make, |_| async {}) }
    };
}

/// Emits one `#[test]` per case of the [`AlarmTx`](crate::AlarmTx)
/// conformance suite ([`conformance::TX_CASES`](crate::conformance::TX_CASES)),
/// in a module named `$module`, each running the case on fresh storages from
/// the factory `$make` (an expression evaluated in each test, inside the new
/// module, which sees the caller's items through `use super::*`).
///
/// ```text
/// durability_alarms::alarm_tx_conformance!(rows_on_memory, durability_alarms::conformance::memory_storage);
/// ```
#[macro_export]
macro_rules! alarm_tx_conformance {
    ($($args:tt)*) => {
        $crate::conformance::storage_suite! { $crate::conformance::run_tx_case, [
            row_roundtrip
            rollback_leaves_row
            schema_reverts_and_reapplies
        ], $($args)* }
    };
}
