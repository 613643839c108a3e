//! Dispatcher unit tests on the in-memory index with a manual clock:
//! settlement counting (superseded versus stale).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use durability_scheduler::{Clock, ManualClock, ObjectId};

use crate::index::JobState;
use crate::*;

const START: i64 = 1_700_000_000_000;

fn obj(s: &str) -> ObjectId {
    ObjectId::new(s).unwrap()
}

fn tok(s: &str) -> Token {
    Token::new(s).unwrap()
}

fn config() -> DispatcherConfig {
    DispatcherConfig {
        seed: Some(3),
        ..DispatcherConfig::default()
    }
}

/// A manual clock at `START` and an index where each of `objects` has a
/// job due then, with the row token `token`.
async fn due(objects: &[&str], token: &str) -> (ManualClock, Arc<MemoryAlarmIndex>) {
    let index = Arc::new(MemoryAlarmIndex::new());
    for object in objects {
        index
            .upsert(&obj(object), &tok(token), START)
            .await
            .unwrap();
    }
    (ManualClock::new(START), index)
}

/// A dispatcher on `index` delivering through `host`, on the manual clock.
fn dispatcher<D: Dispatch>(
    index: &Arc<MemoryAlarmIndex>,
    host: Arc<D>,
    clock: &ManualClock,
    config: DispatcherConfig,
) -> Dispatcher<MemoryAlarmIndex, D> {
    Dispatcher::new(Arc::clone(index), host, Arc::new(clock.clone()), config).unwrap()
}

/// A handler that sets its next alarm while it runs, as the scheduler
/// bridge does: the job's row token is replaced before completion.
struct Reschedules {
    index: Arc<MemoryAlarmIndex>,
    clock: ManualClock,
}

impl Reschedules {
    fn on(index: &Arc<MemoryAlarmIndex>, clock: &ManualClock) -> Arc<Self> {
        let (index, clock) = (Arc::clone(index), clock.clone());
        Arc::new(Self { index, clock })
    }
}

impl Dispatch for Reschedules {
    async fn dispatch(&self, d: Delivery) -> DispatchOutcome {
        let next = self.clock.now_ms() + 1_000;
        self.index
            .upsert(&d.object, &Token::random(), next)
            .await
            .unwrap();
        DispatchOutcome::Delivered
    }
}

#[tokio::test]
async fn a_delivery_whose_row_was_replaced_counts_as_superseded_not_stale() {
    let (clock, index) = due(&["a"], "t0").await;
    let d = dispatcher(&index, Reschedules::on(&index, &clock), &clock, config());
    for _ in 0..5 {
        d.tick().await.unwrap();
        clock.advance(1_000);
    }
    let c = d.counters().snapshot();
    assert_eq!((c.superseded, c.stale), (5, 0), "{c:?}");
}

/// A delivery that outlives its claim: meanwhile the lease runs out and
/// another dispatcher claims the same job (same row token, new run token).
struct OutlivesLease {
    index: Arc<MemoryAlarmIndex>,
    clock: ManualClock,
}

impl Dispatch for OutlivesLease {
    async fn dispatch(&self, _d: Delivery) -> DispatchOutcome {
        let later = self.clock.now_ms() + DispatcherConfig::default().effective_lease_ms();
        self.index.promote(later, 10).await.unwrap();
        self.index
            .claim(ClaimReady {
                now: later,
                lease_ms: 1_000,
                run: &tok("other-run"),
            })
            .await
            .unwrap()
            .unwrap();
        DispatchOutcome::Delivered
    }
}

#[tokio::test]
async fn a_delivery_whose_claim_was_taken_over_counts_as_stale() {
    let (clock, index) = due(&["a"], "t0").await;
    let d = dispatcher(
        &index,
        Arc::new(OutlivesLease {
            index: Arc::clone(&index),
            clock: clock.clone(),
        }),
        &clock,
        config(),
    );
    d.tick().await.unwrap();
    let c = d.counters().snapshot();
    assert_eq!((c.superseded, c.stale, c.delivered), (0, 1, 0), "{c:?}");
}

#[tokio::test]
async fn the_default_claim_batch_and_release_pass_the_conformance_suite() {
    // `FaultIndex` forwards the required methods only, so it runs the
    // trait's default `claim_batch` and `release`.
    conformance::run_index(|| async { conformance::FaultIndex::new(MemoryAlarmIndex::new()) })
        .await;
}

/// A host whose handler for object `a` never finishes (until the gate
/// opens, if one is set); every other object is delivered at once. It
/// records starts and the most deliveries of one object seen at once.
#[derive(Default)]
struct Slow {
    started: std::sync::Mutex<Vec<String>>,
    running_a: std::sync::atomic::AtomicU32,
    max_a: std::sync::atomic::AtomicU32,
    /// While `a` runs, set its next alarm due at once (a handler that
    /// reschedules itself), so its new job is promoted and claimed while
    /// the first delivery still runs.
    reschedule: Option<(Arc<MemoryAlarmIndex>, ManualClock)>,
    gate: tokio::sync::Notify,
    open: std::sync::atomic::AtomicBool,
}

impl Dispatch for Slow {
    async fn dispatch(&self, d: Delivery) -> DispatchOutcome {
        use std::sync::atomic::Ordering::SeqCst;
        self.started.lock().unwrap().push(d.object.to_string());
        if d.object.as_str() != "a" {
            return DispatchOutcome::Delivered;
        }
        let n = self.running_a.fetch_add(1, SeqCst) + 1;
        self.max_a.fetch_max(n, SeqCst);
        if let Some((index, clock)) = &self.reschedule
            && n == 1
            && self
                .started
                .lock()
                .unwrap()
                .iter()
                .filter(|o| *o == "a")
                .count()
                == 1
        {
            index
                .upsert(&d.object, &Token::random(), clock.now_ms())
                .await
                .unwrap();
        }
        loop {
            let notified = self.gate.notified();
            if self.open.load(SeqCst) {
                break;
            }
            notified.await;
        }
        self.running_a.fetch_sub(1, SeqCst);
        DispatchOutcome::Delivered
    }
}

impl Slow {
    /// A host that reschedules `a` on `index` while it runs (see
    /// [`Slow::reschedule`]).
    fn rescheduling(index: &Arc<MemoryAlarmIndex>, clock: &ManualClock) -> Arc<Self> {
        Arc::new(Self {
            reschedule: Some((Arc::clone(index), clock.clone())),
            ..Self::default()
        })
    }

    fn starts(&self, object: &str) -> usize {
        self.started
            .lock()
            .unwrap()
            .iter()
            .filter(|o| *o == object)
            .count()
    }
    fn open(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
        self.gate.notify_waiters();
    }
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("timed out waiting for {what}");
}

/// A dispatcher shared between the test and its run task.
type SlowDispatcher = Arc<Dispatcher<MemoryAlarmIndex, Slow>>;

/// A dispatcher on `index`, delivering through `host`, on the manual clock.
fn slow_dispatcher(
    index: &Arc<MemoryAlarmIndex>,
    host: &Arc<Slow>,
    clock: &ManualClock,
    config: DispatcherConfig,
) -> SlowDispatcher {
    Arc::new(dispatcher(index, Arc::clone(host), clock, config))
}

/// Runs `d` in its own task until it stops.
fn spawn_run(d: &SlowDispatcher) -> tokio::task::JoinHandle<()> {
    let d = Arc::clone(d);
    tokio::spawn(async move { d.run().await })
}

/// Waits until the job of `a` is claimed again (it runs).
async fn until_a_is_claimed_again(index: &MemoryAlarmIndex) {
    until("the second claim of a", || {
        futures::FutureExt::now_or_never(index.job(&obj("a")))
            .and_then(Result::ok)
            .flatten()
            .is_some_and(|j| j.state == JobState::Running)
    })
    .await;
}

#[tokio::test]
async fn a_handler_that_never_finishes_does_not_delay_other_objects() {
    let clock = ManualClock::new(START);
    let index = Arc::new(MemoryAlarmIndex::new());
    // `a` is due first, so a one-at-a-time dispatcher would claim it first
    // and hold everything else up to the 60 s dispatch timeout.
    index
        .upsert(&obj("a"), &tok("ta"), START - 10)
        .await
        .unwrap();
    for i in 0..5 {
        index
            .upsert(&obj(&format!("b{i}")), &tok("tb"), START)
            .await
            .unwrap();
    }
    let host = Arc::new(Slow::default());
    let d = slow_dispatcher(&index, &host, &clock, config());
    let tick = tokio::spawn({
        let d = Arc::clone(&d);
        async move { d.tick().await.unwrap() }
    });
    until("the other objects' deliveries", || {
        d.counters().snapshot().delivered == 5
    })
    .await;
    assert_eq!(host.starts("a"), 1, "a is running");
    assert!(!tick.is_finished(), "a still hangs");
    // a's dispatch times out: outcome unknown, the claim is kept.
    clock.advance(DEFAULT_DISPATCH_TIMEOUT_MS);
    let report = tick.await.unwrap();
    assert_eq!(report.claimed, 6);
    let c = d.counters().snapshot();
    assert_eq!((c.delivered, c.unknown), (5, 1), "{c:?}");
}

#[tokio::test]
async fn two_jobs_of_one_object_never_run_at_once_and_stop_releases_claims() {
    let (clock, index) = due(&["a"], "ta").await;
    let host = Slow::rescheduling(&index, &clock);
    let d = slow_dispatcher(&index, &host, &clock, config());
    let run = spawn_run(&d);
    until("a's first delivery", || host.starts("a") == 1).await;
    // The handler set a's next alarm, due now; at its next poll the
    // dispatcher promotes and claims it while the first delivery runs.
    let job = index.job(&obj("a")).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Due);
    clock.advance(DispatcherConfig::default().poll_ms);
    until_a_is_claimed_again(&index).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        host.starts("a"),
        1,
        "the second job of a waits for the first"
    );
    assert_eq!(host.max_a.load(std::sync::atomic::Ordering::SeqCst), 1);

    // A graceful stop: the held claim goes back at once (no try used); the
    // hung delivery gets the grace period, then is cancelled and released.
    d.stop();
    until("the held claim's release", || {
        d.counters().snapshot().released == 1
    })
    .await;
    let job = index.job(&obj("a")).await.unwrap().unwrap();
    assert_eq!(
        (job.state, job.tries),
        (JobState::Ready, 0),
        "released unused"
    );
    assert!(!run.is_finished(), "the in-flight delivery has its grace");
    clock.advance(DEFAULT_STOP_GRACE_MS);
    run.await.unwrap();
    let c = d.counters().snapshot();
    assert_eq!(c.released, 1, "{c:?}");
    // Another dispatcher takes the job at once, without the 5-minute lease.
    let other = dispatcher(
        &index,
        Reschedules::on(&Arc::new(MemoryAlarmIndex::new()), &clock),
        &clock,
        config(),
    );
    assert_eq!(other.tick().await.unwrap().claimed, 1);
}

/// A dispatcher told to stop while its slow delivery of `a` runs; with
/// the clock, the index, the handler and the run task.
async fn stopped_while_delivering() -> (
    ManualClock,
    Arc<MemoryAlarmIndex>,
    Arc<Slow>,
    SlowDispatcher,
    tokio::task::JoinHandle<()>,
) {
    let (clock, index) = due(&["a"], "ta").await;
    let host = Arc::new(Slow::default());
    let d = slow_dispatcher(&index, &host, &clock, config());
    let run = spawn_run(&d);
    until("a's delivery", || host.starts("a") == 1).await;
    d.stop();
    (clock, index, host, d, run)
}

#[tokio::test]
async fn stop_cancels_a_delivery_past_the_grace_and_releases_its_claim() {
    let (clock, index, _host, d, run) = stopped_while_delivering().await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(!run.is_finished(), "the delivery has its grace period");
    clock.advance(DEFAULT_STOP_GRACE_MS);
    run.await.unwrap();
    assert_eq!(d.counters().snapshot().released, 1);
    let job = index.job(&obj("a")).await.unwrap().unwrap();
    assert_eq!(
        (job.state, job.tries),
        (JobState::Due, 1),
        "due again at once, its try counted (it may have run)"
    );
    assert_eq!(index.next_due().await.unwrap(), Some(clock.now_ms()));
}

#[tokio::test]
async fn stop_lets_a_delivery_that_finishes_in_its_grace_settle() {
    let (_clock, index, host, d, run) = stopped_while_delivering().await;
    host.open();
    run.await.unwrap();
    let c = d.counters().snapshot();
    assert_eq!((c.delivered, c.released), (1, 0), "{c:?}");
    assert_eq!(index.job(&obj("a")).await.unwrap(), None);
}

#[test]
fn the_failover_budget_and_the_fast_profile() {
    let default = DispatcherConfig::default();
    assert_eq!(default.claim_lease_ms, 300_000, "the seed's five minutes");
    assert_eq!(default.retry.max_tries, 6);
    assert_eq!(
        default.failover_budget_ms(SEED_OWNER_TTL_MS),
        120_000 + 300_000 + 1_000
    );
    let fast = DispatcherConfig::fast();
    fast.validate().unwrap();
    assert_eq!(fast.failover_budget_ms(15_000), 15_000 + 30_000 + 200);
    assert!(fast.effective_lease_ms() > fast.dispatch_timeout_ms);
}

#[tokio::test]
async fn a_held_claim_is_never_delivered_past_its_own_lease() {
    let (clock, index) = due(&["a"], "ta").await;
    let host = Slow::rescheduling(&index, &clock);
    let d = slow_dispatcher(
        &index,
        &host,
        &clock,
        DispatcherConfig {
            dispatch_timeout_ms: 1_000,
            claim_lease_ms: 1_500,
            poll_ms: 100,
            idle_ms: 10,
            ..config()
        },
    );
    let run = spawn_run(&d);
    until("a's first delivery", || host.starts("a") == 1).await;
    // At the next poll a's rescheduled job is claimed (lease until +1600)
    // and held behind the first delivery.
    clock.advance(100);
    until_a_is_claimed_again(&index).await;
    // The first delivery times out at +1000; the held one starts then, and
    // is cut at its lease end (+1599), not at +2000.
    clock.advance(900);
    until("the held delivery's start", || host.starts("a") == 2).await;
    assert_eq!(d.counters().snapshot().unknown, 1);
    clock.advance(599);
    until("the held delivery's cut", || {
        d.counters().snapshot().unknown == 2
    })
    .await;
    d.stop();
    run.await.unwrap();
}

/// Delivers every alarm.
struct Delivers;

impl Dispatch for Delivers {
    async fn dispatch(&self, _d: Delivery) -> DispatchOutcome {
        DispatchOutcome::Delivered
    }
}

#[test]
fn do_alarm_dispatches_is_recorded_through_the_metrics_facade_by_outcome() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let counts = metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let (clock, index) = due(&["a", "b", "c"], "t0").await;
            let delivers = dispatcher(&index, Arc::new(Delivers), &clock, config());
            delivers.tick().await.unwrap();
            index
                .upsert(&obj("d"), &tok("t0"), START + 1_000)
                .await
                .unwrap();
            clock.advance(1_000);
            let reschedules = dispatcher(&index, Reschedules::on(&index, &clock), &clock, config());
            reschedules.tick().await.unwrap();
            (
                delivers.counters().snapshot(),
                reschedules.counters().snapshot(),
            )
        })
    });
    let mut recorded: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "do_alarm_dispatches")
        .map(|(k, _, _, v)| {
            let outcome = k
                .key()
                .labels()
                .find(|l| l.key() == "outcome")
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            let DebugValue::Counter(n) = v else {
                panic!("do_alarm_dispatches is a counter")
            };
            (outcome, n)
        })
        .collect();
    recorded.sort();
    assert_eq!(counts.0.delivered, 3);
    assert_eq!(counts.1.superseded, 1);
    assert_eq!(
        recorded,
        [("delivered".to_owned(), 3), ("superseded".to_owned(), 1)],
        "the facade sees what the dispatchers counted"
    );
}

/// A permit source that grants while open, counting permits held now.
#[derive(Default)]
struct Gate {
    open: std::sync::atomic::AtomicBool,
    held: Arc<std::sync::atomic::AtomicUsize>,
}

impl durability_scheduler::Permits for Gate {
    fn acquire(
        &self,
        _want: usize,
    ) -> futures::future::BoxFuture<
        '_,
        Result<durability_scheduler::Permit, durability_scheduler::PermitError>,
    > {
        use std::sync::atomic::Ordering::SeqCst;
        let result = if self.open.load(SeqCst) {
            self.held.fetch_add(1, SeqCst);
            let held = Arc::clone(&self.held);
            Ok(durability_scheduler::Permit::new(1).on_release(move || {
                held.fetch_sub(1, SeqCst);
            }))
        } else {
            Err(durability_scheduler::PermitError::new(2_000, "pool busy"))
        };
        Box::pin(async move { result })
    }
}

/// Records, per delivery, the permits held while it ran.
struct SeesPermits(
    Arc<std::sync::atomic::AtomicUsize>,
    std::sync::Mutex<Vec<usize>>,
);

impl Dispatch for SeesPermits {
    async fn dispatch(&self, _d: Delivery) -> DispatchOutcome {
        let held = self.0.load(std::sync::atomic::Ordering::SeqCst);
        self.1.lock().unwrap().push(held);
        DispatchOutcome::Delivered
    }
}

#[tokio::test]
async fn a_delivery_runs_only_under_a_permit_and_without_one_its_job_waits_with_no_try_used() {
    use std::sync::atomic::Ordering::SeqCst;
    let (clock, index) = due(&["a"], "t0").await;
    let gate = Arc::new(Gate::default());
    let host = Arc::new(SeesPermits(
        Arc::clone(&gate.held),
        std::sync::Mutex::default(),
    ));
    let permits: Arc<dyn durability_scheduler::Permits> = gate.clone();
    let d = dispatcher(&index, Arc::clone(&host), &clock, config()).with_permits(permits);

    d.tick().await.unwrap();
    assert!(
        host.1.lock().unwrap().is_empty(),
        "nothing ran without a permit"
    );
    let job = index.job(&obj("a")).await.unwrap().unwrap();
    assert_eq!(
        (job.state, job.tries, job.token.clone()),
        (JobState::Due, 0, tok("t0")),
        "kept, due again, no try used"
    );
    assert_eq!(d.counters().snapshot().retried, 1);

    clock.advance(1_999);
    d.tick().await.unwrap();
    assert!(
        host.1.lock().unwrap().is_empty(),
        "not due before the source's delay"
    );

    gate.open.store(true, SeqCst);
    clock.advance(1);
    d.tick().await.unwrap();
    assert_eq!(
        *host.1.lock().unwrap(),
        [1],
        "delivered once, holding one permit"
    );
    assert_eq!(gate.held.load(SeqCst), 0, "the permit was given back");
    assert!(index.job(&obj("a")).await.unwrap().is_none(), "completed");
    assert_eq!(d.counters().snapshot().delivered, 1);
}
