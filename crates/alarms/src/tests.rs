//! Unit tests: error codes, the in-memory suites, and the object side and
//! dispatcher on the in-memory storage and index with a manual clock.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use durability_scheduler::testkit::MemoryStorage;
use durability_scheduler::{
    Clock, MAX_SAFE_INTEGER, ManualClock, ObjectContext, ObjectId, Scheduler, Storage,
};
use futures::FutureExt;

use crate::conformance::{
    Fault, FaultIndex, GatedCall, GatedIndex, IndexCall, IndexGate, memory_storage,
};
use crate::*;

const START: i64 = 1_700_000_000_000;

type Ix = FaultIndex<MemoryAlarmIndex>;

#[derive(Clone, Default)]
struct Handler {
    fired: Arc<Mutex<Vec<Fired>>>,
    fail: Arc<AtomicU32>,
}

impl AlarmHandler for Handler {
    async fn alarm(&self, fired: Fired) -> Result<(), BoxError> {
        self.fired.lock().unwrap().push(fired);
        if take_one(&self.fail) {
            return Err("handler failed".into());
        }
        Ok(())
    }
}

/// Takes one of the failures `left` to inject, if any are left.
fn take_one(left: &AtomicU32) -> bool {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

struct Obj {
    alarms: Alarms<MemoryStorage, Ix>,
    handler: Handler,
}

#[derive(Default)]
struct Host {
    objects: Mutex<BTreeMap<ObjectId, Arc<Obj>>>,
    never_started: AtomicU32,
    unknown: AtomicU32,
}

impl Dispatch for Host {
    async fn dispatch(&self, d: Delivery) -> DispatchOutcome {
        if take_one(&self.never_started) {
            return DispatchOutcome::NeverStarted {
                reason: "owner unreachable".into(),
            };
        }
        let obj = self.objects.lock().unwrap().get(&d.object).cloned();
        let Some(obj) = obj else {
            return DispatchOutcome::Gone;
        };
        let out = obj.alarms.deliver(&d, &obj.handler).await;
        if take_one(&self.unknown) {
            return DispatchOutcome::Unknown {
                reason: "response lost".into(),
            };
        }
        out
    }
}

struct World {
    clock: ManualClock,
    index: Arc<Ix>,
    host: Arc<Host>,
    dispatcher: Dispatcher<Ix, Host>,
}

fn config() -> DispatcherConfig {
    DispatcherConfig {
        seed: Some(7),
        ..DispatcherConfig::default()
    }
}

fn world() -> World {
    let clock = ManualClock::new(START);
    let index = Arc::new(FaultIndex::new(MemoryAlarmIndex::new()));
    let host = Arc::new(Host::default());
    let dispatcher = Dispatcher::new(
        Arc::clone(&index),
        Arc::clone(&host),
        Arc::new(clock.clone()),
        config(),
    )
    .unwrap();
    World {
        clock,
        index,
        host,
        dispatcher,
    }
}

/// A [`world`] and its object `a`.
fn world_with_a() -> (World, Arc<Obj>) {
    let w = world();
    let o = w.object("a");
    (w, o)
}

impl World {
    fn object(&self, name: &str) -> Arc<Obj> {
        let id = ObjectId::new(name).unwrap();
        let ctx = ObjectContext::with_clock(
            id.clone(),
            Arc::new(memory_storage()),
            Arc::new(self.clock.clone()),
        );
        let sched = Scheduler::new(ctx).unwrap();
        let obj = Arc::new(Obj {
            alarms: Alarms::new(&sched, Arc::clone(&self.index)).unwrap(),
            handler: Handler::default(),
        });
        self.host
            .objects
            .lock()
            .unwrap()
            .insert(id, Arc::clone(&obj));
        obj
    }

    async fn job(&self, obj: &Obj) -> Option<JobView> {
        self.index.job(obj.alarms.object()).await.unwrap()
    }
}

fn row(obj: &Obj) -> Option<AlarmRow> {
    obj.alarms
        .storage()
        .transaction(|tx| tx.alarm_row())
        .unwrap()
}

#[test]
fn error_codes_are_unique_and_listed() {
    let set: BTreeSet<_> = AlarmError::CODES.iter().collect();
    assert_eq!(set.len(), AlarmError::CODES.len(), "codes are unique");
    let samples = [
        AlarmError::InvalidTime { at: -1 },
        AlarmError::unavailable("x"),
        AlarmError::failed("x"),
        AlarmError::unknown("x"),
        AlarmError::SyncTransaction,
        AlarmError::NestedTransaction,
        AlarmError::TransactionClosed,
    ];
    for e in &samples {
        assert!(AlarmError::CODES.contains(&e.code()), "{} listed", e.code());
    }
    assert_eq!(AlarmError::unknown("x").code(), "do_alarm_result_unknown");
    assert_eq!(
        AlarmError::unavailable("x").code(),
        "do_alarm_backend_unavailable"
    );
    assert_eq!(AlarmError::failed("x").code(), "do_alarm_backend_failed");
    assert!(!AlarmError::InvalidTime { at: 0 }.is_retryable());
    assert!(AlarmError::unknown("x").is_retryable());
}

#[test]
fn errors_and_futures_are_send_sync() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<AlarmError>();
    assert_send_sync::<Dispatcher<Ix, Host>>();
    fn assert_send<T: Send>(_: &T) {}
    let w = world();
    let tick = w.dispatcher.tick();
    assert_send(&tick);
}

#[tokio::test]
async fn memory_index_passes_the_conformance_suite() {
    conformance::run_index(|| async { MemoryAlarmIndex::new() }).await;
}

#[test]
fn memory_rows_pass_the_conformance_suite() {
    conformance::run_tx(memory_storage);
}

#[test]
fn retry_delays_grow_and_stay_within_jitter() {
    let p = RetryPolicy::default();
    assert_eq!(p.base_delay(1), 1_000);
    assert_eq!(p.base_delay(3), 4_000);
    assert_eq!(p.base_delay(30), p.max_delay_ms, "capped");
    let rng = durability_time::Random::seeded(1);
    for tries in 1..12 {
        let (lo, hi) = p.bounds(tries);
        for _ in 0..200 {
            let d = p.delay_ms(tries, &rng);
            assert!((lo..=hi).contains(&d), "{d} within {lo}..={hi}");
        }
    }
    let bad = RetryPolicy { jitter: 1.5, ..p };
    assert_eq!(
        bad.validate().unwrap_err().code(),
        "do_alarm_invalid_config"
    );
    let zero = RetryPolicy { max_tries: 0, ..p };
    assert!(zero.validate().is_err());
    let c = DispatcherConfig {
        claim_lease_ms: 10,
        dispatch_timeout_ms: 1_000,
        ..DispatcherConfig::default()
    };
    assert_eq!(
        c.effective_lease_ms(),
        1_001,
        "lease clamped above the dispatch timeout"
    );
    assert_eq!(DispatcherConfig::default().effective_lease_ms(), 300_000);
}

#[tokio::test]
async fn set_get_delete_reach_the_index_with_row_tokens() {
    let (w, o) = world_with_a();
    o.alarms.set_alarm(START + 10).await.unwrap();
    assert_eq!(o.alarms.get_alarm().await.unwrap(), Some(START + 10));
    let r = row(&o).unwrap();
    let job = w.job(&o).await.unwrap();
    assert_eq!(
        (job.token, job.due_at),
        (r.token.clone(), START + 10),
        "job carries the row token"
    );
    o.alarms.set_alarm(START + 20).await.unwrap();
    let r2 = row(&o).unwrap();
    assert_ne!(r2.token, r.token, "a new row gets a new token");
    assert_eq!(w.job(&o).await.unwrap().token, r2.token);
    o.alarms.delete_alarm().await.unwrap();
    assert_eq!(row(&o), None);
    assert_eq!(w.job(&o).await, None);
    assert_eq!(o.alarms.get_alarm().await.unwrap(), None);
}

#[tokio::test]
async fn invalid_times_change_nothing() {
    let (w, o) = world_with_a();
    o.alarms.set_alarm(START).await.unwrap();
    let before = (row(&o), w.job(&o).await, w.index.calls());
    for bad in [-1, MAX_SAFE_INTEGER + 1, i64::MAX, i64::MIN] {
        let e = o.alarms.set_alarm(bad).await.unwrap_err();
        assert_eq!(e.code(), "do_alarm_invalid_time");
        let e = o
            .alarms
            .transaction(|t| t.set_alarm(bad))
            .await
            .unwrap_err();
        assert_eq!(e.code(), "do_alarm_invalid_time");
    }
    assert_eq!(
        (row(&o), w.job(&o).await, w.index.calls()),
        before,
        "state unchanged"
    );
    o.alarms.set_alarm(MAX_SAFE_INTEGER).await.unwrap();
    o.alarms.set_alarm(0).await.unwrap();
}

#[tokio::test]
async fn definite_set_failures_restore_the_previous_alarm() {
    for fault in [Fault::Unavailable, Fault::Failed] {
        let w = world();
        let o = w.object("a");
        o.alarms.set_alarm(START + 1).await.unwrap();
        let before = (row(&o), w.job(&o).await);
        w.index.fail_next(fault);
        let e = o.alarms.set_alarm(START + 2).await.unwrap_err();
        assert!(matches!(
            e,
            AlarmError::BackendUnavailable { .. } | AlarmError::BackendFailed { .. }
        ));
        assert_eq!(
            (row(&o), w.job(&o).await),
            before,
            "{fault:?}: nothing changed"
        );
    }
}

#[tokio::test]
async fn unknown_set_keeps_the_new_row_and_get_alarm_repairs_it() {
    let (w, o) = world_with_a();
    w.index.fail_next(Fault::UnknownBefore);
    let e = o.alarms.set_alarm(START + 5).await.unwrap_err();
    assert_eq!(e.code(), "do_alarm_result_unknown");
    assert_eq!(w.job(&o).await, None, "the request never landed");
    assert_eq!(o.alarms.get_alarm().await.unwrap(), Some(START + 5));
    let r = row(&o).unwrap();
    assert_eq!(
        w.job(&o).await.unwrap().token,
        r.token,
        "read repair rewrote the job"
    );
    let calls = w.index.calls();
    assert_eq!(o.alarms.get_alarm().await.unwrap(), Some(START + 5));
    assert_eq!(
        w.index.calls(),
        calls,
        "repair is idempotent: no second write"
    );
    // A failing repair is swallowed.
    w.index
        .inner()
        .delete(o.alarms.object(), &r.token)
        .await
        .unwrap();
    w.index.fail_next(Fault::Unavailable);
    assert_eq!(o.alarms.get_alarm().await.unwrap(), Some(START + 5));
    assert_eq!(w.job(&o).await, None);
}

#[tokio::test]
async fn failed_deletes_lift_their_fence_and_unknown_ones_say_so() {
    for fault in [Fault::Unavailable, Fault::Failed, Fault::UnknownAfter] {
        let w = world();
        let o = w.object("a");
        o.alarms.set_alarm(START + 1).await.unwrap();
        let before = row(&o);
        w.index.fail_next(fault);
        let e = o.alarms.delete_alarm().await.unwrap_err();
        assert_eq!(
            row(&o),
            before,
            "{fault:?}: token-fenced compensation restored the row"
        );
        if fault == Fault::UnknownAfter {
            assert!(e.is_result_unknown());
            assert_eq!(w.job(&o).await, None, "the backend job is already gone");
            o.alarms.delete_alarm().await.unwrap();
            assert_eq!(row(&o), None, "calling delete again settles it");
        } else {
            assert!(w.job(&o).await.is_some(), "{fault:?}: backend unchanged");
        }
    }
}

#[tokio::test]
async fn a_hung_backend_hits_the_five_second_deadline() {
    let (w, o) = world_with_a();
    w.index.fail_next(Fault::Hang);
    let alarms = o.alarms.clone();
    let call = tokio::spawn(async move { alarms.set_alarm(START + 1).await });
    while w.clock.next_wake().is_none() {
        tokio::task::yield_now().await;
    }
    assert_eq!(w.clock.next_wake(), Some(START + MUTATION_DEADLINE_MS));
    w.clock.advance(MUTATION_DEADLINE_MS);
    let e = call.await.unwrap().unwrap_err();
    assert_eq!(e.code(), "do_alarm_result_unknown");
}

#[tokio::test]
async fn transactions_coalesce_into_one_effect_after_commit() {
    let (w, o) = world_with_a();
    // Set then delete with no baseline: local only, nothing sent.
    o.alarms
        .transaction(|t| {
            t.set_alarm(START + 1)?;
            assert_eq!(t.get_alarm()?, Some(START + 1));
            t.delete_alarm()
        })
        .await
        .unwrap();
    assert_eq!(w.index.calls(), 0, "no backend call");
    assert_eq!(row(&o), None);
    // Two sets: one upsert of the last.
    o.alarms
        .transaction(|t| {
            t.set_alarm(START + 1)?;
            t.set_alarm(START + 2)
        })
        .await
        .unwrap();
    assert_eq!(w.index.calls(), 1, "one coalesced upsert");
    assert_eq!(w.job(&o).await.unwrap().due_at, START + 2);
    // With a baseline: set then delete sends the baseline's delete.
    o.alarms
        .transaction(|t| {
            t.set_alarm(START + 3)?;
            t.delete_alarm()
        })
        .await
        .unwrap();
    assert_eq!(w.index.calls(), 2);
    assert_eq!(w.job(&o).await, None);
    assert_eq!(row(&o), None);
}

#[tokio::test]
async fn rollback_drops_effects_and_closes_the_transaction() {
    let (w, o) = world_with_a();
    o.alarms.set_alarm(START + 1).await.unwrap();
    let before = (row(&o), w.job(&o).await, w.index.calls());
    let closed = o
        .alarms
        .transaction(|t| {
            t.set_alarm(START + 9)?;
            t.rollback();
            Ok::<_, AlarmError>(t.set_alarm(START + 10).unwrap_err().code())
        })
        .await
        .unwrap();
    assert_eq!(closed, "do_alarm_transaction_closed");
    assert_eq!((row(&o), w.job(&o).await, w.index.calls()), before);
    // An Err rolls back too.
    let r: Result<(), AlarmError> = o
        .alarms
        .transaction(|t| {
            t.delete_alarm()?;
            Err(AlarmError::TransactionClosed)
        })
        .await;
    assert!(r.is_err());
    assert_eq!((row(&o), w.job(&o).await, w.index.calls()), before);
}

#[tokio::test]
async fn nested_and_synchronous_transactions_refuse_alarm_calls() {
    let (w, o) = world_with_a();
    let alarms = o.alarms.clone();
    let nested = o
        .alarms
        .transaction(|_t| {
            let inner = alarms
                .transaction(|t| t.set_alarm(START))
                .now_or_never()
                .expect("refused at once");
            Ok::<_, AlarmError>(inner.unwrap_err().code())
        })
        .await
        .unwrap();
    assert_eq!(nested, "do_alarm_nested_transaction");
    let storage = Arc::clone(o.alarms.storage());
    let codes = storage
        .transaction(|tx| {
            let a = o.alarms.set_alarm_sync(tx, START).unwrap_err().code();
            let b = o.alarms.delete_alarm_sync(tx).unwrap_err().code();
            let c = o.alarms.set_alarm_sync(tx, -5).unwrap_err().code();
            Ok::<_, AlarmError>((a, b, c, o.alarms.get_alarm_sync(tx)?))
        })
        .unwrap();
    assert_eq!(
        codes,
        (
            "do_alarm_sync_transaction",
            "do_alarm_sync_transaction",
            "do_alarm_invalid_time",
            None
        )
    );
    assert_eq!(w.index.calls(), 0);
}

#[tokio::test]
async fn concurrent_mutations_reach_the_backend_in_api_order() {
    let (w, o) = world_with_a();
    let mut handles = Vec::new();
    for i in 0..20 {
        let a = o.alarms.clone();
        handles.push(tokio::spawn(async move {
            if i % 3 == 2 {
                a.delete_alarm().await
            } else {
                a.set_alarm(START + i).await
            }
        }));
    }
    for h in handles {
        h.await.unwrap().unwrap();
    }
    let local = row(&o);
    let job = w.job(&o).await;
    match (local, job) {
        (None, None) => {}
        (Some(r), Some(j)) => assert_eq!(
            (r.token, r.at),
            (j.token, j.due_at),
            "backend matches the row"
        ),
        other => panic!("local and backend disagree: {other:?}"),
    }
}

#[tokio::test]
async fn a_due_alarm_is_delivered_once_and_completed() {
    let (w, o) = world_with_a();
    o.alarms.set_alarm(START + 100).await.unwrap();
    assert_eq!(w.dispatcher.tick().await.unwrap().claimed, 0, "not due yet");
    w.clock.advance(100);
    let report = w.dispatcher.tick().await.unwrap();
    assert_eq!((report.promoted, report.claimed), (1, 1));
    assert_eq!(o.handler.fired.lock().unwrap().len(), 1);
    assert_eq!(row(&o), None, "the row is cleared after success");
    assert_eq!(w.job(&o).await, None);
    assert_eq!(w.dispatcher.counters().snapshot().delivered, 1);
}

#[tokio::test]
async fn definite_failures_back_off_within_jitter_then_discard() {
    let (w, o) = world_with_a();
    o.handler.fail.store(100, Ordering::SeqCst);
    o.alarms.set_alarm(START).await.unwrap();
    let policy = w.dispatcher.config().retry;
    for tries in 1..=policy.max_tries {
        let report = w.dispatcher.tick().await.unwrap();
        assert_eq!(report.claimed, 1, "try {tries}");
        if tries == policy.max_tries {
            break;
        }
        let next = w.index.next_due().await.unwrap().unwrap();
        let (lo, hi) = policy.bounds(tries);
        let delay = next - w.clock.now_ms();
        assert!(
            (lo..=hi).contains(&delay),
            "try {tries}: delay {delay} within {lo}..={hi}"
        );
        assert_eq!(
            w.dispatcher.tick().await.unwrap().claimed,
            0,
            "nothing before the delay"
        );
        w.clock.set(next);
    }
    let fired = o.handler.fired.lock().unwrap().clone();
    assert_eq!(fired.len(), policy.max_tries as usize);
    assert!(fired.last().unwrap().final_attempt);
    assert_eq!(w.job(&o).await, None, "discarded");
    assert_eq!(
        row(&o),
        None,
        "the discarded row is cleared so repair cannot revive it"
    );
    let c = w.dispatcher.counters().snapshot();
    assert_eq!(
        (c.retry_scheduled, c.discarded),
        (u64::from(policy.max_tries) - 1, 1)
    );
}

#[tokio::test]
async fn never_started_retries_at_once_without_using_a_try() {
    let (w, o) = world_with_a();
    o.alarms.set_alarm(START).await.unwrap();
    w.host.never_started.store(10, Ordering::SeqCst);
    for _ in 0..10 {
        assert_eq!(
            w.dispatcher.tick().await.unwrap().claimed,
            1,
            "due again at once"
        );
    }
    assert_eq!(w.job(&o).await.unwrap().tries, 0, "no try used");
    w.dispatcher.tick().await.unwrap();
    assert_eq!(o.handler.fired.lock().unwrap().len(), 1);
    let c = w.dispatcher.counters().snapshot();
    assert_eq!((c.retried, c.delivered), (10, 1));
}

#[tokio::test]
async fn unknown_outcomes_keep_the_claim_until_the_lease_expires() {
    let (w, o) = world_with_a();
    o.handler.fail.store(1, Ordering::SeqCst);
    o.alarms.set_alarm(START).await.unwrap();
    w.host.unknown.store(1, Ordering::SeqCst);
    w.dispatcher.tick().await.unwrap();
    let lease = w.dispatcher.config().effective_lease_ms();
    assert_eq!(w.job(&o).await.unwrap().state, JobState::Running);
    w.clock.advance(lease - 1);
    assert_eq!(
        w.dispatcher.tick().await.unwrap().claimed,
        0,
        "no resample while the lease runs"
    );
    w.clock.advance(1);
    assert_eq!(
        w.dispatcher.tick().await.unwrap().claimed,
        1,
        "due again at lease expiry"
    );
    assert_eq!(o.handler.fired.lock().unwrap().len(), 2);
    assert_eq!(w.job(&o).await, None);
    assert_eq!(w.dispatcher.counters().snapshot().unknown, 1);
}

#[tokio::test]
async fn an_early_hint_keeps_the_row_and_reschedules() {
    let (w, o) = world_with_a();
    o.alarms.set_alarm(START + 1_000).await.unwrap();
    let r = row(&o).unwrap();
    // The backend believes the job is due now (clock skew between hosts).
    w.index
        .inner()
        .upsert(o.alarms.object(), &r.token, START)
        .await
        .unwrap();
    w.dispatcher.tick().await.unwrap();
    assert!(o.handler.fired.lock().unwrap().is_empty(), "not run early");
    assert_eq!(row(&o), Some(r), "row kept");
    assert_eq!(w.index.next_due().await.unwrap(), Some(START + 1_000));
    assert_eq!(w.dispatcher.counters().snapshot().not_due, 1);
    w.clock.advance(1_000);
    w.dispatcher.tick().await.unwrap();
    assert_eq!(o.handler.fired.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn alarms_of_gone_objects_are_discarded() {
    let (w, o) = world_with_a();
    o.alarms.set_alarm(START).await.unwrap();
    w.host.objects.lock().unwrap().clear();
    w.dispatcher.tick().await.unwrap();
    assert_eq!(w.job(&o).await, None);
    assert!(o.handler.fired.lock().unwrap().is_empty());
    assert_eq!(w.dispatcher.counters().snapshot().gone, 1);
}

/// A host whose delivery waits for a gate, so tests can act mid-flight.
struct Gated {
    inner: Arc<Host>,
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl Dispatch for Gated {
    async fn dispatch(&self, d: Delivery) -> DispatchOutcome {
        self.entered.notify_one();
        self.release.notified().await;
        self.inner.dispatch(d).await
    }
}

#[tokio::test]
async fn mutations_during_a_running_delivery_are_not_swallowed_or_resurrected() {
    let (w, o) = world_with_a();
    let gated = Arc::new(Gated {
        inner: Arc::clone(&w.host),
        entered: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
    });
    let d = Arc::new(
        Dispatcher::new(
            Arc::clone(&w.index),
            Arc::clone(&gated),
            Arc::new(w.clock.clone()),
            config(),
        )
        .unwrap(),
    );
    // Set during a running delivery: the new alarm survives the completion.
    o.alarms.set_alarm(START).await.unwrap();
    let d2 = Arc::clone(&d);
    let tick = tokio::spawn(async move { d2.tick().await });
    gated.entered.notified().await;
    o.alarms.set_alarm(START + 50).await.unwrap();
    gated.release.notify_one();
    tick.await.unwrap().unwrap();
    assert!(
        o.handler.fired.lock().unwrap().is_empty(),
        "stale token ignored"
    );
    assert_eq!(
        w.job(&o).await.unwrap().due_at,
        START + 50,
        "new alarm kept"
    );
    w.clock.advance(50);
    let d2 = Arc::clone(&d);
    let tick = tokio::spawn(async move { d2.tick().await });
    gated.entered.notified().await;
    gated.release.notify_one();
    tick.await.unwrap().unwrap();
    assert_eq!(
        o.handler.fired.lock().unwrap().len(),
        1,
        "the new alarm ran"
    );
    assert_eq!(row(&o), None);
    // Delete during a running delivery: never runs, not resurrected.
    o.alarms.set_alarm(START + 100).await.unwrap();
    w.clock.advance(50);
    let d3 = Arc::clone(&d);
    let tick = tokio::spawn(async move { d3.tick().await });
    gated.entered.notified().await;
    o.alarms.delete_alarm().await.unwrap();
    gated.release.notify_one();
    tick.await.unwrap().unwrap();
    assert_eq!(
        w.job(&o).await,
        None,
        "completion did not resurrect the job"
    );
    assert_eq!(row(&o), None);
    w.clock.advance(1_000_000);
    assert_eq!(
        d.tick().await.unwrap().claimed,
        0,
        "nothing left to deliver"
    );
    assert_eq!(
        o.handler.fired.lock().unwrap().len(),
        1,
        "the deleted alarm never ran"
    );
}

/// A capability that counts its runs and clears its due time.
struct Counting {
    sched: Scheduler<MemoryStorage>,
    runs: Arc<AtomicU32>,
}

impl durability_scheduler::Capability for Counting {
    fn run(&self, _now_ms: i64) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            self.runs.fetch_add(1, Ordering::SeqCst);
            self.sched
                .transaction(|tx| tx.set_due("cap", None))
                .unwrap();
        })
    }
}

/// A host that delivers to a scheduler bridge.
#[derive(Default)]
struct BridgeHost {
    bridge: Mutex<Option<SchedulerAlarm<MemoryStorage, Ix>>>,
}

impl Dispatch for BridgeHost {
    async fn dispatch(&self, d: Delivery) -> DispatchOutcome {
        let bridge = self.bridge.lock().unwrap().clone();
        match bridge {
            None => DispatchOutcome::NeverStarted {
                reason: "no owner".into(),
            },
            Some(b) => b.alarms().deliver(&d, &b).await,
        }
    }
}

fn open_bridge(
    w: &World,
    storage: &Arc<MemoryStorage>,
    runs: &Arc<AtomicU32>,
) -> (Scheduler<MemoryStorage>, SchedulerAlarm<MemoryStorage, Ix>) {
    let ctx = ObjectContext::with_clock(
        ObjectId::new("sched-object").unwrap(),
        Arc::clone(storage),
        Arc::new(w.clock.clone()),
    );
    let sched = Scheduler::new(ctx).unwrap();
    let cap = Arc::new(Counting {
        sched: sched.clone(),
        runs: Arc::clone(runs),
    });
    sched.attach("cap", None, cap).unwrap();
    let alarms = Alarms::new(&sched, Arc::clone(&w.index)).unwrap();
    (sched.clone(), SchedulerAlarm::new(&sched, alarms))
}

#[tokio::test]
async fn the_scheduler_alarm_resumes_on_the_next_owner_after_a_crash() {
    let w = world();
    let storage = Arc::new(memory_storage());
    let runs = Arc::new(AtomicU32::new(0));
    let host = Arc::new(BridgeHost::default());
    let d = Dispatcher::new(
        Arc::clone(&w.index),
        Arc::clone(&host),
        Arc::new(w.clock.clone()),
        config(),
    )
    .unwrap();
    // Host A: work becomes due in 100 ms, the bridge moves the alarm row.
    let (sched_a, bridge_a) = open_bridge(&w, &storage, &runs);
    sched_a
        .transaction(|tx| tx.set_due("cap", Some(START + 100)))
        .unwrap();
    bridge_a.sync().await.unwrap();
    assert_eq!(
        bridge_a.alarms().get_alarm().await.unwrap(),
        Some(START + 100)
    );
    // Host A dies before the alarm fires (nothing in memory survives).
    drop((sched_a, bridge_a));
    // Host B opens the object from its storage and owns it now.
    let (_sched_b, bridge_b) = open_bridge(&w, &storage, &runs);
    bridge_b.sync().await.unwrap();
    *host.bridge.lock().unwrap() = Some(bridge_b.clone());
    w.clock.advance(100);
    d.tick().await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the capability ran on host B"
    );
    assert_eq!(bridge_b.alarms().get_alarm().await.unwrap(), None);
    assert_eq!(w.index.counts().await.unwrap().total(), 0);
    assert_eq!(d.counters().snapshot().delivered, 1);
}

/// A call moves the alarm earlier while a delivery finishes: the delivery
/// read the scheduler's next alarm before the call committed, and the call
/// synced its row (as it does before it is acknowledged) before the
/// delivery kept that later alarm. The row and the index job end at the
/// call's time: its due work does not wait for the later alarm.
#[tokio::test]
async fn a_delivery_keeping_its_next_alarm_does_not_undo_a_call_that_moved_it_earlier() {
    let w = world();
    let runs = Arc::new(AtomicU32::new(0));
    let (sched, bridge) = open_bridge(&w, &Arc::new(memory_storage()), &runs);
    let later = START + 600_000;
    let sooner = START + 100;
    sched
        .transaction(|tx| tx.set_due("cap", Some(later)))
        .unwrap();
    bridge.sync().await.unwrap();
    // The delivery's run of the due work leaves `later` as the next alarm.
    let next = sched.alarm().await.unwrap();
    assert_eq!(next, Some(later));
    // A call moves the alarm earlier and syncs its row.
    sched
        .transaction(|tx| tx.set_due("cap", Some(sooner)))
        .unwrap();
    bridge.sync().await.unwrap();
    // The delivery keeps the next alarm it read.
    bridge.keep(next).await.unwrap();
    assert_eq!(bridge.alarms().get_alarm().await.unwrap(), Some(sooner));
    let job = w.index.job(bridge.alarms().object()).await.unwrap();
    assert_eq!(job.map(|j| j.due_at), Some(sooner));
}

#[test]
fn dispatch_responses_are_strict_and_capped() {
    let ok = |s: &str| decode_dispatch_response(s.as_bytes());
    assert_eq!(ok(r#"{"ok":true}"#).unwrap(), DispatchOutcome::Delivered);
    assert_eq!(
        ok(r#"{"ok":true,"ignored":false}"#).unwrap(),
        DispatchOutcome::Delivered
    );
    assert_eq!(
        ok(r#"{"ok":true,"ignored":true}"#).unwrap(),
        DispatchOutcome::Ignored
    );
    assert!(matches!(
        ok(r#"{"ok":false,"error":"do_alarm_dispatch_failed","started":false}"#).unwrap(),
        DispatchOutcome::NeverStarted { .. }
    ));
    assert!(matches!(
        ok(r#"{"ok":false,"error":"do_alarm_dispatch_failed","started":true}"#).unwrap(),
        DispatchOutcome::Failed { .. }
    ));
    assert!(matches!(
        ok(r#"{"ok":false,"error":"do_alarm_dispatch_result_unknown"}"#).unwrap(),
        DispatchOutcome::Unknown { .. }
    ));
    for bad in [
        r#"{"ok":true,"extra":1}"#,
        r#"{"ok":"true"}"#,
        r#"{"ok":false}"#,
        r#"{"ok":true,"ignored":true,"error":"x"}"#,
        "not json",
        "",
    ] {
        assert_eq!(ok(bad).unwrap_err().code(), "do_alarm_corrupt", "{bad}");
    }
    assert_eq!(
        decode_dispatch_response(&[0xff, 0xfe]).unwrap_err().code(),
        "do_alarm_corrupt"
    );
    let big = vec![b' '; MAX_RESPONSE_BYTES + 1];
    assert_eq!(
        decode_dispatch_response(&big).unwrap_err().code(),
        "do_alarm_response_too_large"
    );
}

#[test]
fn every_outcome_survives_the_wire_as_what_the_sender_acts_on() {
    let reason = || "private detail at 10.0.0.9".to_owned();
    let cases = [
        (DispatchOutcome::Delivered, DispatchOutcome::Delivered),
        (DispatchOutcome::Ignored, DispatchOutcome::Ignored),
        (
            DispatchOutcome::NotDue { at: 1_700 },
            DispatchOutcome::NotDue { at: 1_700 },
        ),
        (DispatchOutcome::Gone, DispatchOutcome::Gone),
        (
            DispatchOutcome::NeverStarted { reason: reason() },
            DispatchOutcome::NeverStarted {
                reason: DISPATCH_FAILED.to_owned(),
            },
        ),
        // The serving host is not the owner: the sender decides how long
        // to wait, so it reads as never started.
        (
            DispatchOutcome::OwnerElsewhere {
                reason: reason(),
                retry_in_ms: 5,
            },
            DispatchOutcome::NeverStarted {
                reason: DISPATCH_FAILED.to_owned(),
            },
        ),
        (
            DispatchOutcome::Failed { reason: reason() },
            DispatchOutcome::Failed {
                reason: DISPATCH_FAILED.to_owned(),
            },
        ),
        (
            DispatchOutcome::Unknown { reason: reason() },
            DispatchOutcome::Unknown {
                reason: DISPATCH_RESULT_UNKNOWN.to_owned(),
            },
        ),
    ];
    for (sent, read) in cases {
        let body = encode_dispatch_outcome(&sent);
        assert!(!body.contains("10.0.0.9"), "{body}");
        assert_eq!(
            decode_dispatch_response(body.as_bytes()).unwrap(),
            read,
            "{body}"
        );
    }
    for bad in [
        r#"{"ok":false,"error":"do_alarm_not_due"}"#,
        r#"{"ok":false,"error":"do_alarm_not_due","at":-1}"#,
        r#"{"ok":false,"error":"do_alarm_not_due","at":9007199254740992}"#,
        r#"{"ok":false,"error":"do_alarm_not_due","at":1.5}"#,
        r#"{"ok":false,"error":"do_alarm_storage_gone","started":false}"#,
        r#"{"ok":true,"at":5}"#,
    ] {
        assert_eq!(
            decode_dispatch_response(bad.as_bytes()).unwrap_err().code(),
            "do_alarm_corrupt",
            "{bad}"
        );
    }
}

#[tokio::test]
async fn response_reads_enforce_the_cap_and_the_deadline() {
    let clock = ManualClock::new(START);
    let chunks = |v: Vec<&'static str>| {
        futures::stream::iter(
            v.into_iter()
                .map(|s| Ok::<_, BoxError>(s.as_bytes().to_vec())),
        )
    };
    let out = read_dispatch_response(&clock, None, chunks(vec![r#"{"ok":"#, "true}"])).await;
    assert_eq!(out, DispatchOutcome::Delivered);
    let out =
        read_dispatch_response(&clock, Some(MAX_RESPONSE_BYTES as u64 + 1), chunks(vec![])).await;
    assert_eq!(
        out,
        DispatchOutcome::Unknown {
            reason: "do_alarm_response_too_large".into()
        },
        "an oversized declared length is refused before reading"
    );
    let many = futures::stream::iter((0..20).map(|_| Ok::<_, BoxError>(vec![b' '; 1024])));
    let out = read_dispatch_response(&clock, None, many).await;
    assert_eq!(
        out,
        DispatchOutcome::Unknown {
            reason: "do_alarm_response_too_large".into()
        },
        "a streamed body is cut at the cap"
    );
    let hung = futures::stream::pending::<Result<Vec<u8>, BoxError>>();
    // A fresh clock: the reads above left their (finished) deadline sleepers.
    let clock = ManualClock::new(START);
    let c2 = clock.clone();
    let read = tokio::spawn(async move { read_dispatch_response(&c2, None, hung).await });
    while clock.next_wake().is_none() {
        tokio::task::yield_now().await;
    }
    clock.advance(RESPONSE_DEADLINE_MS);
    assert_eq!(
        read.await.unwrap(),
        DispatchOutcome::Unknown {
            reason: "do_alarm_result_unknown".into()
        }
    );
}

/// Lets spawned tasks run until `done` holds (manual clock: no time passes).
async fn settle(mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..1_000 {
        if done().await {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("spawned work did not settle");
}

#[tokio::test]
async fn an_owner_opening_an_object_reasserts_a_pending_row_the_index_lost() {
    let w = world();
    let storage = Arc::new(memory_storage());
    let runs = Arc::new(AtomicU32::new(0));
    // Host A moved the scheduler's alarm and committed the row, but its
    // flush never reached the index and its compensation could not be
    // written (the scope had moved): a pending row without a job.
    let (sched_a, bridge_a) = open_bridge(&w, &storage, &runs);
    sched_a
        .transaction(|tx| tx.set_due("cap", Some(START + 100)))
        .unwrap();
    bridge_a.sync().await.unwrap();
    let id = bridge_a.alarms().object().clone();
    let r = storage.transaction(|tx| tx.alarm_row()).unwrap().unwrap();
    w.index.inner().delete(&id, &r.token).await.unwrap();
    drop((sched_a, bridge_a));
    // Host B opens it: a sync alone trusts the row; the watcher the host
    // spawns repairs it, once the index answers again.
    let (_sched_b, bridge_b) = open_bridge(&w, &storage, &runs);
    bridge_b.sync().await.unwrap();
    assert_eq!(w.index.job(&id).await.unwrap(), None);
    w.index.fail_next(Fault::Unavailable);
    let calls = w.index.calls();
    let watcher = tokio::spawn(bridge_b.clone().watch());
    settle(async || w.index.calls() > calls).await;
    assert_eq!(w.index.job(&id).await.unwrap(), None, "the repair failed");
    w.clock.advance(DEFAULT_SCHEDULER_IDLE_MS);
    settle(async || w.index.job(&id).await.unwrap().is_some()).await;
    let job = w.index.job(&id).await.unwrap().unwrap();
    assert_eq!((job.token, job.due_at), (r.token.clone(), START + 100));
    // Repeating it writes nothing; the alarm then fires on host B.
    let calls = w.index.calls();
    assert_eq!(bridge_b.alarms().repair().await.unwrap(), Some(r));
    assert_eq!(w.index.calls(), calls);
    let host = Arc::new(BridgeHost::default());
    *host.bridge.lock().unwrap() = Some(bridge_b.clone());
    let d = Dispatcher::new(
        Arc::clone(&w.index),
        host,
        Arc::new(w.clock.clone()),
        config(),
    )
    .unwrap();
    d.tick().await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the capability ran on host B"
    );
    watcher.abort();
}

#[tokio::test]
async fn a_repair_never_resurrects_a_deleted_alarm() {
    let (w, o) = world_with_a();
    assert_eq!(o.alarms.repair().await.unwrap(), None);
    o.alarms.set_alarm(START + 5).await.unwrap();
    o.alarms.delete_alarm().await.unwrap();
    let calls = w.index.calls();
    assert_eq!(o.alarms.repair().await.unwrap(), None);
    assert_eq!((w.index.calls(), w.job(&o).await), (calls, None));
    // A pending delete (fenced row whose backend delete was lost) neither.
    o.alarms.set_alarm(START + 6).await.unwrap();
    w.index.fail_next(Fault::UnknownAfter);
    o.alarms.delete_alarm().await.unwrap_err();
    assert_eq!(w.job(&o).await, None);
    let r = row(&o).unwrap();
    assert!(r.is_pending(), "an unknown delete lifts its fence again");
    // The row is back, so its job is repaired: the caller must delete again.
    assert_eq!(o.alarms.repair().await.unwrap(), Some(r.clone()));
    assert_eq!(w.job(&o).await.map(|j| j.token), Some(r.token));
}

/// The object `a` whose alarm at `START + 1` was replaced by one at
/// `START + 2` with an unknown outcome: the row carries the new token, the
/// index still the old one.
async fn replaced_token_unknown(w: &World) -> Arc<Obj> {
    let o = w.object("a");
    o.alarms.set_alarm(START + 1).await.unwrap();
    w.index.fail_next(Fault::UnknownBefore);
    o.alarms.set_alarm(START + 2).await.unwrap_err();
    o
}

#[tokio::test]
async fn a_delivery_of_a_replaced_token_reasserts_the_rows_job_before_settling() {
    let w = world();
    let o = replaced_token_unknown(&w).await;
    let r = row(&o).unwrap();
    assert_ne!(w.job(&o).await.unwrap().token, r.token);
    w.clock.advance(2);
    w.dispatcher.tick().await.unwrap();
    assert!(
        o.handler.fired.lock().unwrap().is_empty(),
        "old token ignored"
    );
    let job = w
        .job(&o)
        .await
        .expect("the row's job survives the settlement");
    assert_eq!((job.token, job.due_at), (r.token, START + 2));
    w.dispatcher.tick().await.unwrap();
    let fired = o.handler.fired.lock().unwrap().clone();
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0].scheduled_at, START + 2);
    assert_eq!((row(&o), w.job(&o).await), (None, None));
}

#[tokio::test]
async fn a_failed_reassertion_keeps_the_delivered_job_for_another_try() {
    let w = world();
    let o = replaced_token_unknown(&w).await;
    let old = w.job(&o).await.unwrap().token;
    w.clock.advance(2);
    w.index.fail_next(Fault::Unavailable);
    w.dispatcher.tick().await.unwrap();
    let job = w.job(&o).await.expect("kept for a retry");
    assert_eq!((job.token, job.state), (old, JobState::Due));
    assert_eq!(w.dispatcher.counters().snapshot().retry_scheduled, 1);
}

/// A pool of connections in front of an index (a semaphore handing
/// permits out in request order, as a connection pool does): every call
/// holds one for its whole round trip, which takes a few polls, as a real
/// query does.
struct Pool(tokio::sync::Semaphore);

impl IndexGate for Pool {
    async fn pass<T: Send>(&self, _: IndexCall, call: GatedCall<'_, T>) -> Result<T, AlarmError> {
        let _connection = self.0.acquire().await.unwrap();
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        call.await
    }
}

#[tokio::test]
async fn the_dispatcher_keeps_polling_deliveries_while_it_waits_for_a_connection() {
    let w = world();
    let a = w.object("a");
    let b = w.object("b");
    a.alarms.set_alarm(START).await.unwrap();
    b.alarms.set_alarm(START).await.unwrap();
    // The dispatcher's index: the jobs of `w.index` behind one connection.
    let pooled = Arc::new(GatedIndex::gated(
        MemoryAlarmIndex::new(),
        Pool(tokio::sync::Semaphore::new(1)),
    ));
    for o in [&a, &b] {
        let r = row(o).unwrap();
        pooled
            .inner
            .upsert(o.alarms.object(), &r.token, r.at)
            .await
            .unwrap();
    }
    let d = Arc::new(
        Dispatcher::new(
            Arc::clone(&pooled),
            Arc::clone(&w.host),
            Arc::new(w.clock.clone()),
            config(),
        )
        .unwrap(),
    );
    let runner = tokio::spawn({
        let d = Arc::clone(&d);
        async move { d.run().await }
    });
    // Both deliveries settle (finish) through the one connection; the first
    // to end hands it to the second while the loop goes on to claim more.
    settle(async || d.counters().snapshot().delivered == 2).await;
    assert_eq!(pooled.inner.counts().await.unwrap().total(), 0);
    assert_eq!(a.handler.fired.lock().unwrap().len(), 1);
    assert_eq!(b.handler.fired.lock().unwrap().len(), 1);
    runner.abort();
}
