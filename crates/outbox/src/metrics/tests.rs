//! The outbox's metrics, read back through a debugging recorder: staged
//! counts only committed stages, retries, deliveries with their lateness,
//! discards; with and without a lifecycle hook.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use durability_scheduler::testkit::MemoryStorage;
use durability_scheduler::{ManualClock, ObjectContext, ObjectId, Scheduler};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use crate::{ChannelConfig, Entry, Outbox, OutboxError, SCHEMA, SCHEMA_STEPS, Sink, SinkError};

const START: i64 = 1_700_000_000_000;

/// Fails its first call, then acknowledges.
#[derive(Default)]
struct FailOnce(AtomicU32);

impl Sink<String> for FailOnce {
    async fn publish(&self, _batch: &[Entry<String>]) -> Result<(), SinkError> {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(SinkError::new("down"));
        }
        Ok(())
    }
}

/// Runs the scenario on channel `name` and returns `(metric, channel) →
/// value` for every counter, and the lateness samples.
fn scenario(name: &str, hook: bool) -> (Vec<(String, String, u64)>, Vec<f64>) {
    let snapshotter = recorded(async |_| {
        let clock = ManualClock::new(START);
        let sched = object("o", &clock);
        let mut config = ChannelConfig::new(name);
        if hook {
            config = config.on_event(Arc::new(|_| {}));
        }
        let outbox = Outbox::attach(&sched, config, FailOnce::default()).unwrap();
        sched
            .transaction(|tx| {
                outbox.stage(tx, "a", &"1".to_owned())?;
                outbox.stage(tx, "b", &"2".to_owned())?;
                outbox.stage(tx, "c", &"3".to_owned())
            })
            .unwrap();
        // A rolled-back stage is not counted.
        let rolled_back: Result<(), OutboxError> = sched.transaction(|tx| {
            outbox.stage(tx, "d", &"4".to_owned())?;
            Err(OutboxError::InvalidKey {
                reason: "rolled back on purpose",
            })
        });
        assert!(rolled_back.is_err());
        sched.transaction(|tx| outbox.discard(tx, "c")).unwrap();
        outbox.deliver_due().await.unwrap(); // the sink fails: 2 retries
        clock.advance(60_000);
        let report = outbox.deliver_due().await.unwrap();
        assert_eq!(report.delivered, 2);
    });
    let mut counters = Vec::new();
    let mut lateness = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let channel = key
            .labels()
            .find(|l| l.key() == "channel")
            .map(|l| l.value().to_owned())
            .unwrap_or_default();
        match value {
            DebugValue::Counter(n) => counters.push((key.name().to_owned(), channel, n)),
            DebugValue::Histogram(samples) => {
                assert_eq!(key.name(), "durability_outbox_delivery_lateness_ms");
                lateness.extend(samples.into_iter().map(|s| s.into_inner()));
            }
            DebugValue::Gauge(_) => {}
        }
    }
    counters.sort();
    (counters, lateness)
}

#[test]
fn every_lifecycle_event_is_counted_per_channel_with_or_without_a_hook() {
    for hook in [false, true] {
        let (counters, lateness) = scenario("orders", hook);
        let expect = |name: &str| -> u64 {
            counters
                .iter()
                .find(|(n, c, _)| n == name && c == "orders")
                .map_or(0, |(_, _, v)| *v)
        };
        assert_eq!(expect("durability_outbox_staged_total"), 3, "hook={hook}");
        assert_eq!(
            expect("durability_outbox_discarded_total"),
            1,
            "hook={hook}"
        );
        assert_eq!(expect("durability_outbox_retried_total"), 2, "hook={hook}");
        assert_eq!(
            expect("durability_outbox_delivered_total"),
            2,
            "hook={hook}"
        );
        assert_eq!(expect("durability_outbox_dead_lettered_total"), 0);
        assert_eq!(expect("durability_outbox_dropped_total"), 0);
        assert_eq!(expect("durability_outbox_quarantined_total"), 0);
        // Both entries were due at START and delivered at least 60 s later
        // (their retry's backoff is shorter than that).
        assert_eq!(lateness.len(), 2, "hook={hook}: {lateness:?}");
        assert!(
            lateness.iter().all(|ms| *ms >= 1.0 && *ms <= 60_000.0),
            "{lateness:?}"
        );
    }
}

/// Fails every call.
struct Down;

impl Sink<String> for Down {
    async fn publish(&self, _batch: &[Entry<String>]) -> Result<(), SinkError> {
        Err(SinkError::new("down"))
    }
}

/// Reads the pending gauge of `channel` from `snapshotter` and adds it to
/// `total`: the debugging recorder hands out each gauge's change since its
/// previous snapshot.
fn pending(snapshotter: &Snapshotter, channel: &str, total: &mut f64) -> f64 {
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let here = key
            .labels()
            .any(|l| l.key() == "channel" && l.value() == channel);
        if let (true, "durability_outbox_pending", DebugValue::Gauge(v)) = (here, key.name(), value)
        {
            *total += v.into_inner();
        }
    }
    *total
}

/// Runs `test` on a current-thread runtime with a fresh debugging recorder
/// installed for this thread, handing it the recorder's snapshotter, which
/// it returns.
fn recorded(test: impl AsyncFnOnce(&Snapshotter)) -> Snapshotter {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(test(&snapshotter));
    });
    snapshotter
}

fn object(name: &str, clock: &ManualClock) -> Scheduler<MemoryStorage> {
    let storage = Arc::new(MemoryStorage::new().with_schema(SCHEMA, SCHEMA_STEPS));
    let ctx = ObjectContext::with_clock(
        ObjectId::new(name).unwrap(),
        storage,
        Arc::new(clock.clone()),
    );
    Scheduler::new(ctx).unwrap()
}

#[test]
fn the_pending_gauge_follows_stage_discard_delivery_give_up_and_reattach() {
    let mut total = 0.0;
    recorded(async |snapshotter| {
        let clock = ManualClock::new(START);
        let sched = object("o", &clock);
        let outbox =
            Outbox::attach(&sched, ChannelConfig::new("pend"), FailOnce::default()).unwrap();
        sched
            .transaction(|tx| {
                outbox.stage(tx, "a", &"1".to_owned())?;
                outbox.stage(tx, "b", &"2".to_owned())?;
                outbox.stage(tx, "c", &"3".to_owned())?;
                // A new value of a pending key is not a new entry.
                outbox.stage(tx, "a", &"1b".to_owned())
            })
            .unwrap();
        assert_eq!(pending(snapshotter, "pend", &mut total), 3.0);
        // A rolled-back stage changes nothing.
        let rolled_back: Result<(), OutboxError> = sched.transaction(|tx| {
            outbox.stage(tx, "d", &"4".to_owned())?;
            Err(OutboxError::InvalidKey {
                reason: "on purpose",
            })
        });
        assert!(rolled_back.is_err());
        assert_eq!(pending(snapshotter, "pend", &mut total), 3.0);
        assert!(sched.transaction(|tx| outbox.discard(tx, "c")).unwrap());
        assert!(!sched.transaction(|tx| outbox.discard(tx, "zz")).unwrap());
        assert_eq!(pending(snapshotter, "pend", &mut total), 2.0);
        // A failed batch keeps both pending; the next delivers them.
        assert_eq!(outbox.deliver_due().await.unwrap().retried, 2);
        assert_eq!(pending(snapshotter, "pend", &mut total), 2.0);
        clock.advance(60_000);
        assert_eq!(outbox.deliver_due().await.unwrap().delivered, 2);
        assert_eq!(pending(snapshotter, "pend", &mut total), 0.0);
        assert_eq!(outbox.len().unwrap(), 0);

        // Given up after one attempt with no dead-letter sink: dropped.
        let config = ChannelConfig::new("pend2").retry(crate::RetryPolicy {
            max_attempts: Some(1),
            ..Default::default()
        });
        let gives_up = Outbox::attach(&sched, config, Down).unwrap();
        sched
            .transaction(|tx| gives_up.stage(tx, "x", &"1".to_owned()))
            .unwrap();
        assert_eq!(pending(snapshotter, "pend2", &mut 0.0), 1.0);
        let report = gives_up.deliver_due().await.unwrap();
        assert_eq!(report.gave_up.len(), 1);
        assert_eq!(pending(snapshotter, "pend2", &mut 0.0), -1.0);

        // Two objects with a channel of one name add up; dropping a
        // channel takes its entries out, attaching it again counts the
        // stored ones.
        let other = object("p", &clock);
        let down = Outbox::attach(&other, ChannelConfig::new("pend"), Down).unwrap();
        other
            .transaction(|tx| {
                down.stage(tx, "k1", &"1".to_owned())?;
                down.stage(tx, "k2", &"2".to_owned())
            })
            .unwrap();
        sched
            .transaction(|tx| outbox.stage(tx, "e", &"5".to_owned()))
            .unwrap();
        assert_eq!(pending(snapshotter, "pend", &mut total), 3.0);
        drop(down);
        assert_eq!(pending(snapshotter, "pend", &mut total), 1.0);
        let down = Outbox::attach(&other, ChannelConfig::new("pend"), Down).unwrap();
        assert_eq!(down.len().unwrap(), 2);
        assert_eq!(pending(snapshotter, "pend", &mut total), 3.0);
    });
}
