//! The dispatcher: promotes due jobs in batches, claims ready ones in
//! batches (each under its own run token and lease), runs up to
//! `concurrency` deliveries through [`Dispatch`] at once (one per object),
//! settles each by its outcome, and on a graceful stop releases what it
//! will not finish.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::FutureExt;
use futures::future::{self, BoxFuture, Either};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;

use durability_scheduler::{Clock, ObjectId, Permit, Permits};
use durability_time::{Random, timeout_at};

use crate::error::AlarmError;
use crate::index::{AlarmIndex, Claim, RetryJob};
use crate::log_limit::LogLimit;
use crate::policy::DispatcherConfig;
use crate::token::Token;

/// One delivery of an alarm to the host that owns its object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The object.
    pub object: ObjectId,
    /// The row token the delivery is for; the object ignores it unless its
    /// alarm row still carries it.
    pub token: Token,
    /// When the alarm was scheduled.
    pub scheduled_at: i64,
    /// The try number (1 for the first).
    pub attempt: u32,
    /// Whether a failure of this try discards the alarm.
    pub final_attempt: bool,
}

/// What a dispatch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchOutcome {
    /// The alarm ran and succeeded: the job completes.
    Delivered,
    /// The object has no live row with this token (stale, deleted, or a
    /// pending delete): the job completes without running anything.
    Ignored,
    /// The object's row is not due yet (a ready hint arrived early): the row
    /// is kept and the job is rescheduled for `at` without using a try.
    NotDue {
        /// The row's scheduled time.
        at: i64,
    },
    /// Proven never started (the host could not be reached or refused before
    /// running anything): retried at once without using a try.
    NeverStarted {
        /// Why (for logs).
        reason: String,
    },
    /// Proven never started because another task holds the object's owner
    /// lease and could not take the delivery (it may be dead): retried
    /// without using a try after `retry_in_ms` (that owner's lease time
    /// left, capped by `DispatcherConfig::owner_wait_max_ms`), when the scope
    /// can be taken over, instead of at once.
    OwnerElsewhere {
        /// Why (for logs).
        reason: String,
        /// How long until the remote owner's lease runs out (ms).
        retry_in_ms: i64,
    },
    /// The alarm ran and failed: retried with backoff, discarded after the
    /// last try.
    Failed {
        /// Why (for logs).
        reason: String,
    },
    /// The alarm may have run (timeout, lost response): the claim is kept
    /// until its lease expires, then the job is due again.
    Unknown {
        /// Why (for logs).
        reason: String,
    },
    /// The object's storage is gone: the job is discarded, not delivered.
    Gone,
}

/// The host side of delivery: runs an alarm on whichever host owns the
/// object now (with the ownership crate, after its admission checks).
pub trait Dispatch: Send + Sync + 'static {
    /// Delivers one alarm and reports the outcome.
    fn dispatch(&self, delivery: Delivery) -> impl Future<Output = DispatchOutcome> + Send;
}

impl<T: Dispatch> Dispatch for Arc<T> {
    fn dispatch(&self, delivery: Delivery) -> impl Future<Output = DispatchOutcome> + Send {
        (**self).dispatch(delivery)
    }
}

/// The `do_alarm_dispatches` metric: dispatches counted by outcome.
#[derive(Debug, Default)]
pub struct DispatchCounters {
    delivered: AtomicU64,
    ignored: AtomicU64,
    not_due: AtomicU64,
    retried: AtomicU64,
    retry_scheduled: AtomicU64,
    discarded: AtomicU64,
    unknown: AtomicU64,
    gone: AtomicU64,
    stale: AtomicU64,
    superseded: AtomicU64,
    released: AtomicU64,
}

/// A snapshot of [`DispatchCounters`]; field names are the `outcome` label
/// values of `do_alarm_dispatches`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchCounts {
    /// Delivered and completed.
    pub delivered: u64,
    /// Stale deliveries the object ignored (completed).
    pub ignored: u64,
    /// Early hints rescheduled for the row's time.
    pub not_due: u64,
    /// Never-started dispatches retried at once.
    pub retried: u64,
    /// Definite failures scheduled for a backoff retry.
    pub retry_scheduled: u64,
    /// Discarded after the last try.
    pub discarded: u64,
    /// In-flight-unknown outcomes (claim kept until lease expiry).
    pub unknown: u64,
    /// Discarded because the object's storage is gone.
    pub gone: u64,
    /// Settlements refused because the claim went stale: the job still
    /// carries the delivery's row token but is no longer running under this
    /// claim's run token (its lease expired and it was claimed again).
    pub stale: u64,
    /// Settlements refused because the delivery was superseded: a newer
    /// alarm replaced the job's row token (or a delete removed it) while it
    /// ran. Normal for a handler that sets its next alarm (the scheduler
    /// bridge does on every delivery that leaves work).
    pub superseded: u64,
    /// Claims given back by a stopping dispatcher (so another host takes
    /// them at once).
    pub released: u64,
}

impl DispatchCounters {
    /// The current counts.
    pub fn snapshot(&self) -> DispatchCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DispatchCounts {
            delivered: g(&self.delivered),
            ignored: g(&self.ignored),
            not_due: g(&self.not_due),
            retried: g(&self.retried),
            retry_scheduled: g(&self.retry_scheduled),
            discarded: g(&self.discarded),
            unknown: g(&self.unknown),
            gone: g(&self.gone),
            stale: g(&self.stale),
            superseded: g(&self.superseded),
            released: g(&self.released),
        }
    }

    fn bump(c: &AtomicU64, outcome: &'static str, object: &ObjectId) {
        c.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("do_alarm_dispatches", "outcome" => outcome).increment(1);
        tracing::debug!(
            event = "durability.alarms.dispatch",
            metric = "do_alarm_dispatches",
            outcome,
            object = %object,
            "alarm dispatch counted"
        );
    }
}

/// What one [`Dispatcher::tick`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Jobs promoted to ready.
    pub promoted: usize,
    /// Jobs claimed and dispatched (or discarded).
    pub claimed: usize,
    /// Claims released because the dispatcher was stopped.
    pub released: usize,
}

/// A stop request, shared by the dispatcher's loops and [`Dispatcher::stop`].
#[derive(Debug, Default)]
struct Stop {
    requested: AtomicBool,
    notify: Notify,
}

impl Stop {
    fn request(&self) {
        self.requested.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    async fn wait(&self) {
        loop {
            let mut notified = pin!(self.notify.notified());
            notified.as_mut().enable();
            if self.requested() {
                return;
            }
            notified.await;
        }
    }
}

/// Deliveries in flight; each yields its object when it has settled.
type Running<'a> = FuturesUnordered<BoxFuture<'a, ObjectId>>;

/// What one dispatcher loop has in flight: at most one delivery per object,
/// at most `concurrency` claims in all.
struct Flight<'a> {
    running: Running<'a>,
    /// The claim of every object with a delivery in flight.
    claims: HashMap<ObjectId, Claim>,
    /// Claims whose object already has a delivery in flight, with the local
    /// time each was claimed: started when it settles, released on stop.
    held: Vec<(Claim, i64)>,
    /// A claim found fewer ready jobs than it asked for.
    dry: bool,
}

impl Flight<'_> {
    fn new() -> Self {
        Self {
            running: FuturesUnordered::new(),
            claims: HashMap::new(),
            held: Vec::new(),
            dry: false,
        }
    }
}

/// Why a wait ended.
enum Wake {
    /// A delivery settled.
    Done(ObjectId),
    /// A stop was requested.
    Stop,
    /// The wake time came.
    Timer,
}

/// Delivers due alarms from an [`AlarmIndex`] through a [`Dispatch`].
///
/// Up to `concurrency` deliveries run at once, at most one per object (a
/// claim for an object whose delivery is still running waits for it), so
/// a slow handler holds up only its own object. Claims are taken in
/// batches ([`AlarmIndex::claim_batch`]) and promotion in batches of
/// `promote_batch`; the dispatcher never loads the whole index. Any number
/// of dispatchers may share one index: claims are exclusive.
pub struct Dispatcher<I, D> {
    index: Arc<I>,
    dispatch: Arc<D>,
    clock: Arc<dyn Clock>,
    config: DispatcherConfig,
    random: Random,
    counters: Arc<DispatchCounters>,
    log_limit: LogLimit,
    stop: Stop,
    permits: Option<Arc<dyn Permits>>,
}

impl<I, D> std::fmt::Debug for Dispatcher<I, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher").finish_non_exhaustive()
    }
}

impl<I: AlarmIndex, D: Dispatch> Dispatcher<I, D> {
    /// A dispatcher on `index`, delivering through `dispatch`, on `clock`.
    ///
    /// # Errors
    /// [`AlarmError::InvalidConfig`] for a bad configuration.
    pub fn new(
        index: Arc<I>,
        dispatch: Arc<D>,
        clock: Arc<dyn Clock>,
        config: DispatcherConfig,
    ) -> Result<Self, AlarmError> {
        config.validate()?;
        let random = config.seed.map_or_else(Random::os, Random::seeded);
        Ok(Self {
            index,
            dispatch,
            clock,
            config,
            random,
            counters: Arc::default(),
            log_limit: LogLimit::new(config.log_interval_ms),
            stop: Stop::default(),
            permits: None,
        })
    }

    /// Flow control: every delivery holds a [`Permit`] of `permits` (one
    /// item) while it runs, taken before it starts and within its dispatch
    /// deadline. Without one the delivery does not start: its job is due
    /// again after [`PermitError::retry_in_ms`](durability_scheduler::PermitError)
    /// (capped by `owner_wait_max_ms`) with no try used, counted `retried`.
    #[must_use]
    pub fn with_permits(mut self, permits: Arc<dyn Permits>) -> Self {
        self.permits = Some(permits);
        self
    }

    /// The `do_alarm_dispatches` counters.
    pub fn counters(&self) -> &Arc<DispatchCounters> {
        &self.counters
    }

    /// The configuration in use.
    pub fn config(&self) -> &DispatcherConfig {
        &self.config
    }

    /// Asks the dispatcher to stop gracefully (a drain): it claims nothing
    /// more; claims it holds but has not started are released at once
    /// ([`AlarmIndex::release`]: ready again, no try used); in-flight
    /// deliveries get `stop_grace_ms` to finish, then are cancelled and
    /// their claims made due again at once (their try counted: they may
    /// have run). A running [`Dispatcher::run`] or [`Dispatcher::tick`]
    /// then returns. A delivery cancelled here that was forwarded to another
    /// host may still be running there, so its alarm body may overlap its
    /// redelivery (alarm bodies are at-least-once).
    pub fn stop(&self) {
        self.stop.request();
    }

    /// Whether [`Dispatcher::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.stop.requested()
    }

    /// Promotes every job due now, then claims ready jobs in batches and
    /// delivers up to `concurrency` at once (one per object) until none is
    /// ready and every delivery has settled. Jobs retried at once go back
    /// to due and wait for the next tick, so a tick always ends (a hung
    /// delivery ends at its dispatch timeout).
    ///
    /// # Errors
    /// A failure to promote or claim (deliveries already started still
    /// settle first); settlement failures are logged (the claim lease
    /// brings such a job back).
    pub async fn tick(&self) -> Result<TickReport, AlarmError> {
        let mut report = TickReport {
            promoted: self.promote_due().await?,
            ..TickReport::default()
        };
        let mut flight = Flight::new();
        let mut failure = None;
        loop {
            if self.stop.requested() {
                self.drain(flight, &mut report).await;
                break;
            }
            if failure.is_none()
                && let Err(error) = self.fill(&mut flight, &mut report).await
            {
                flight.dry = true;
                failure = Some(error);
            }
            if flight.running.is_empty() {
                break;
            }
            if let Wake::Done(object) = self.wait(&mut flight.running, true, None).await {
                self.settled(&mut flight, &object);
            }
        }
        failure.map_or(Ok(report), Err)
    }

    /// Delivers until [`Dispatcher::stop`]: promotes due jobs (at most once
    /// per `idle_ms`, so an immediate retry cannot spin), keeps up to
    /// `concurrency` deliveries in flight, and between completions waits
    /// until the next job is due (at most `poll_ms`: other hosts may add
    /// jobs). Returns after the stop has released or finished what was in
    /// flight.
    pub async fn run(&self) {
        let mut flight = Flight::new();
        let mut report = TickReport::default();
        let mut promoted_at: Option<i64> = None;
        loop {
            if self.stop.requested() {
                self.drain(flight, &mut report).await;
                return;
            }
            let now = self.clock.now_ms();
            if promoted_at.is_none_or(|at| now >= at.saturating_add(self.config.idle_ms)) {
                promoted_at = Some(now);
                let promoted = self.alongside(&mut flight, self.promote_due()).await;
                if let Err(error) = promoted {
                    Self::warn_loop(&error);
                }
            }
            flight.dry = false;
            if let Err(error) = self.fill(&mut flight, &mut report).await {
                Self::warn_loop(&error);
            }
            let next = if self.room(&flight) > 0 {
                match self.alongside(&mut flight, self.index.next_due()).await {
                    Ok(next) => next,
                    Err(error) => {
                        Self::warn_loop(&error);
                        None
                    }
                }
            } else {
                None
            };
            let now = self.clock.now_ms();
            let lo = promoted_at
                .unwrap_or(now)
                .saturating_add(self.config.idle_ms);
            let hi = now.saturating_add(self.config.poll_ms);
            let wake = next.unwrap_or(hi).clamp(lo, hi.max(lo));
            if let Wake::Done(object) = self.wait(&mut flight.running, true, Some(wake)).await {
                self.settled(&mut flight, &object);
                // Collect whatever else settled meanwhile before claiming.
                while let Some(Some(object)) = flight.running.next().now_or_never() {
                    self.settled(&mut flight, &object);
                }
            }
        }
    }

    fn warn_loop(error: &AlarmError) {
        tracing::warn!(
            event = "durability.alarms.tick_failed",
            code = error.code(),
            %error,
            "dispatcher tick failed"
        );
    }

    async fn promote_due(&self) -> Result<usize, AlarmError> {
        let now = self.clock.now_ms();
        let mut promoted = 0;
        loop {
            let n = self.index.promote(now, self.config.promote_batch).await?;
            promoted += n;
            if n < self.config.promote_batch {
                return Ok(promoted);
            }
        }
    }

    /// Awaits `call`, one of the dispatcher's own index calls, while still
    /// polling the deliveries in flight (settling those that end). A
    /// delivery holds a pooled index connection while it settles (or while
    /// its handler writes an alarm); left unpolled, it could never give it
    /// back, and `call` would wait for a connection in vain: with every
    /// connection held that way, each dispatcher call failed
    /// `do_alarm_backend_unavailable` at its deadline, for good.
    async fn alongside<'a, T>(
        &'a self,
        flight: &mut Flight<'a>,
        call: impl Future<Output = T>,
    ) -> T {
        let mut call = pin!(call);
        let mut ended = Vec::new();
        let value = loop {
            if flight.running.is_empty() {
                break call.await;
            }
            match future::select(call.as_mut(), flight.running.next()).await {
                Either::Left((value, _)) => break value,
                Either::Right((Some(object), _)) => ended.push(object),
                Either::Right((None, _)) => {}
            }
        };
        for object in &ended {
            self.settled(flight, object);
        }
        value
    }

    /// Claims that may still be taken before `concurrency` is reached.
    fn room(&self, flight: &Flight<'_>) -> usize {
        self.config
            .concurrency
            .saturating_sub(flight.claims.len() + flight.held.len())
    }

    /// Claims ready jobs up to the free capacity, one batch per round trip.
    async fn fill<'a>(
        &'a self,
        flight: &mut Flight<'a>,
        report: &mut TickReport,
    ) -> Result<(), AlarmError> {
        while !flight.dry && !self.stop.requested() {
            let want = self.room(flight);
            if want == 0 {
                break;
            }
            let runs: Vec<Token> = (0..want).map(|_| Token::random()).collect();
            let now = self.clock.now_ms();
            let lease_ms = self.config.effective_lease_ms();
            let claims = self
                .alongside(flight, self.index.claim_batch(now, lease_ms, &runs))
                .await?;
            if claims.len() < want {
                flight.dry = true;
            }
            report.claimed += claims.len();
            let claimed_at = self.clock.now_ms();
            for claim in claims {
                self.start(flight, claim, claimed_at);
            }
        }
        Ok(())
    }

    /// Starts the delivery of `claim` (claimed at local time `claimed_at`),
    /// or holds it while its object has one in flight.
    fn start<'a>(&'a self, flight: &mut Flight<'a>, claim: Claim, claimed_at: i64) {
        if flight.claims.contains_key(&claim.object) {
            flight.held.push((claim, claimed_at));
            return;
        }
        let object = claim.object.clone();
        flight.claims.insert(object.clone(), claim.clone());
        flight.running.push(
            async move {
                self.handle(claim, claimed_at).await;
                object
            }
            .boxed(),
        );
    }

    /// A delivery of `object` settled: start the claim held for it, if any.
    fn settled<'a>(&'a self, flight: &mut Flight<'a>, object: &ObjectId) {
        flight.claims.remove(object);
        if let Some(i) = flight.held.iter().position(|(c, _)| &c.object == object) {
            let (claim, claimed_at) = flight.held.remove(i);
            self.start(flight, claim, claimed_at);
        }
    }

    /// Waits for the next delivery to settle, for a stop request (when
    /// `watch_stop`), or until `until`.
    async fn wait(&self, running: &mut Running<'_>, watch_stop: bool, until: Option<i64>) -> Wake {
        let done = async {
            match running.next().await {
                Some(object) => object,
                None => std::future::pending().await,
            }
        };
        let stop = async {
            if watch_stop {
                self.stop.wait().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let either = async {
            match future::select(pin!(done), pin!(stop)).await {
                Either::Left((object, _)) => Wake::Done(object),
                Either::Right(((), _)) => Wake::Stop,
            }
        };
        match until {
            Some(at) => timeout_at(&*self.clock, at, either)
                .await
                .unwrap_or(Wake::Timer),
            None => either.await,
        }
    }

    /// The graceful stop: releases held claims at once, lets in-flight
    /// deliveries settle for up to `stop_grace_ms`, then cancels the rest
    /// and makes their jobs due again at once.
    async fn drain<'a>(&'a self, mut flight: Flight<'a>, report: &mut TickReport) {
        for (claim, _) in std::mem::take(&mut flight.held) {
            self.release(&claim, false, report).await;
        }
        let deadline = self
            .clock
            .now_ms()
            .saturating_add(self.config.stop_grace_ms);
        while !flight.running.is_empty() {
            match self.wait(&mut flight.running, false, Some(deadline)).await {
                Wake::Done(object) => {
                    flight.claims.remove(&object);
                }
                Wake::Stop | Wake::Timer => break,
            }
        }
        let Flight {
            running, claims, ..
        } = flight;
        drop(running);
        for claim in claims.into_values() {
            tracing::warn!(
                event = "durability.alarms.delivery_cancelled",
                object = %claim.object,
                grace_ms = self.config.stop_grace_ms,
                "dispatcher stopped: an in-flight delivery outlived the grace period; its claim is released"
            );
            self.release(&claim, true, report).await;
        }
    }

    /// Gives a claim back on stop: unused (`started == false`: ready again,
    /// no try used) or after a cancelled delivery (due at once, its try
    /// counted).
    async fn release(&self, claim: &Claim, started: bool, report: &mut TickReport) {
        let now = self.clock.now_ms();
        let result = if started {
            self.index
                .retry(RetryJob {
                    object: &claim.object,
                    run: &claim.run,
                    now,
                    delay_ms: 0,
                    tries: claim.tries,
                })
                .await
        } else {
            self.index.release(&claim.object, &claim.run, now).await
        };
        let released = &self.counters.released;
        if self
            .count_settlement(result, claim, released, "released")
            .await
        {
            report.released += 1;
        }
    }

    async fn handle(&self, claim: Claim, claimed_at: i64) {
        let max = self.config.retry.max_tries;
        let c = &self.counters;
        if claim.tries > max {
            // Tries used up by unknown outcomes: discard without running again.
            self.settle_finish(&claim, &c.discarded, "discarded").await;
            tracing::warn!(event = "durability.alarms.discarded", object = %claim.object, tries = claim.tries, "alarm discarded after its last try");
            return;
        }
        let delivery = Delivery {
            object: claim.object.clone(),
            token: claim.token.clone(),
            scheduled_at: claim.due_at,
            attempt: claim.tries,
            final_attempt: claim.tries >= max,
        };
        // The dispatch timeout, but never past the claim's own lease (a held
        // claim waited for its object's previous delivery): a delivery still
        // running when its lease ran out could overlap a redelivery.
        let lease_end = claimed_at
            .saturating_add(self.config.effective_lease_ms())
            .saturating_sub(1);
        let deadline = self
            .clock
            .now_ms()
            .saturating_add(self.config.dispatch_timeout_ms)
            .min(lease_end);
        let Some(_permit) = self.permit(&claim, deadline).await else {
            return;
        };
        let span = tracing::debug_span!(
            "durability.alarms.dispatch",
            object = %claim.object,
            attempt = claim.tries
        );
        let outcome = timeout_at(
            &*self.clock,
            deadline,
            tracing::Instrument::instrument(self.dispatch.dispatch(delivery), span),
        )
        .await
        .unwrap_or_else(|_| DispatchOutcome::Unknown {
            reason: "dispatch timed out".to_owned(),
        });
        match outcome {
            DispatchOutcome::Delivered => {
                self.settle_finish(&claim, &c.delivered, "delivered").await;
            }
            DispatchOutcome::Ignored => self.settle_finish(&claim, &c.ignored, "ignored").await,
            DispatchOutcome::Gone => self.settle_finish(&claim, &c.gone, "gone").await,
            DispatchOutcome::NotDue { at } => {
                let delay = at.saturating_sub(self.clock.now_ms()).max(0);
                let tries = claim.tries.saturating_sub(1);
                self.settle_retry(&claim, delay, tries, &c.not_due, "not_due")
                    .await;
            }
            DispatchOutcome::NeverStarted { reason } => {
                let now = self.clock.now_ms();
                if let Some(suppressed) = self.log_limit.admit(&claim.object, "not_started", now) {
                    tracing::info!(
                        event = "durability.alarms.dispatch_not_started",
                        object = %claim.object,
                        %reason,
                        suppressed,
                        "alarm delivery never started; retrying at once"
                    );
                }
                let tries = claim.tries.saturating_sub(1);
                self.settle_retry(&claim, 0, tries, &c.retried, "retried")
                    .await;
            }
            DispatchOutcome::OwnerElsewhere {
                reason,
                retry_in_ms,
            } => {
                let delay = retry_in_ms.clamp(0, self.config.owner_wait_max_ms);
                let now = self.clock.now_ms();
                if let Some(suppressed) =
                    self.log_limit.admit(&claim.object, "owner_elsewhere", now)
                {
                    tracing::info!(
                        event = "durability.alarms.dispatch_owner_elsewhere",
                        object = %claim.object,
                        %reason,
                        delay_ms = delay,
                        suppressed,
                        "alarm delivery never started: another task holds the owner lease; retrying when it can be taken over"
                    );
                }
                let tries = claim.tries.saturating_sub(1);
                self.settle_retry(&claim, delay, tries, &c.retried, "retried")
                    .await;
            }
            DispatchOutcome::Failed { reason } => {
                if claim.tries >= max {
                    tracing::warn!(event = "durability.alarms.discarded", object = %claim.object, tries = claim.tries, %reason, "alarm discarded after its last try");
                    self.settle_finish(&claim, &c.discarded, "discarded").await;
                } else {
                    let delay = self.config.retry.delay_ms(claim.tries, &self.random);
                    tracing::info!(
                        event = "durability.alarms.retry_scheduled",
                        object = %claim.object,
                        tries = claim.tries,
                        delay_ms = delay,
                        %reason,
                        "alarm delivery failed; retry scheduled"
                    );
                    self.settle_retry(
                        &claim,
                        delay,
                        claim.tries,
                        &c.retry_scheduled,
                        "retry_scheduled",
                    )
                    .await;
                }
            }
            DispatchOutcome::Unknown { reason } => {
                tracing::warn!(
                    event = "durability.alarms.dispatch_result_unknown",
                    object = %claim.object,
                    lease_until = claim.lease_until,
                    %reason,
                    "alarm delivery result unknown; the claim stays until its lease expires"
                );
                DispatchCounters::bump(&c.unknown, "unknown", &claim.object);
            }
        }
    }

    /// The permit a delivery of `claim` runs under (`Some(None)` without a
    /// permit source), asked for until `deadline`. Without one the job is
    /// due again when the source said, with no try used, and `None` is
    /// returned: the delivery does not start.
    async fn permit(&self, claim: &Claim, deadline: i64) -> Option<Option<Permit>> {
        let Some(permits) = self.permits.clone() else {
            return Some(None);
        };
        let refused = match timeout_at(&*self.clock, deadline, permits.acquire(1)).await {
            Ok(Ok(permit)) => return Some(Some(permit)),
            Ok(Err(refused)) => refused,
            Err(_) => {
                durability_scheduler::PermitError::new(0, "no permit before the dispatch deadline")
            }
        };
        let delay = refused.retry_in_ms.clamp(0, self.config.owner_wait_max_ms);
        tracing::debug!(
            event = "durability.alarms.no_permit",
            object = %claim.object,
            delay_ms = delay,
            reason = %refused.reason,
            "no permit for an alarm delivery; it never started and is due again"
        );
        let tries = claim.tries.saturating_sub(1);
        self.settle_retry(claim, delay, tries, &self.counters.retried, "retried")
            .await;
        None
    }

    /// Counts a settlement the index refused: superseded when the job no
    /// longer carries the claim's row token (a newer alarm replaced it, or a
    /// delete removed it), stale otherwise (same row token, another run).
    async fn refused(&self, claim: &Claim) {
        let superseded = match self.index.job(&claim.object).await {
            Ok(job) => job.is_none_or(|j| j.token != claim.token),
            // Unknown: count it stale, the conservative label.
            Err(_) => false,
        };
        if superseded {
            DispatchCounters::bump(&self.counters.superseded, "superseded", &claim.object);
        } else {
            DispatchCounters::bump(&self.counters.stale, "stale", &claim.object);
        }
    }

    async fn settle_finish(&self, claim: &Claim, counter: &AtomicU64, outcome: &'static str) {
        let result = self.index.finish(&claim.object, &claim.run).await;
        self.count_settlement(result, claim, counter, outcome).await;
    }

    async fn settle_retry(
        &self,
        claim: &Claim,
        delay: i64,
        tries: u32,
        counter: &AtomicU64,
        outcome: &'static str,
    ) {
        let now = self.clock.now_ms();
        let result = self
            .index
            .retry(RetryJob {
                object: &claim.object,
                run: &claim.run,
                now,
                delay_ms: delay,
                tries,
            })
            .await;
        self.count_settlement(result, claim, counter, outcome).await;
    }

    /// Counts a settlement the index applied under `outcome` and returns
    /// whether it applied; a refusal (the claim is no longer ours) is
    /// classified, a failure logged (the claim's lease brings the job back).
    async fn count_settlement(
        &self,
        result: Result<bool, AlarmError>,
        claim: &Claim,
        counter: &AtomicU64,
        outcome: &'static str,
    ) -> bool {
        match result {
            Ok(true) => {
                DispatchCounters::bump(counter, outcome, &claim.object);
                return true;
            }
            Ok(false) => self.refused(claim).await,
            Err(error) => {
                tracing::warn!(
                    event = "durability.alarms.settle_failed",
                    object = %claim.object,
                    code = error.code(),
                    %error,
                    "settling an alarm claim failed; its lease brings it back"
                );
            }
        }
        false
    }
}

#[cfg(test)]
mod tests;
