//! Flow control of a channel: publish calls run only under a permit, and
//! entries without one stay pending with no attempt used.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use durability_scheduler::testkit::MemoryStorage;
use durability_scheduler::{ManualClock, ObjectContext, ObjectId, Permit, PermitError, Permits};
use futures::future::BoxFuture;

use super::*;

/// Grants permits of at most `entries` items while `open`; counts the
/// permits held now and every one given.
#[derive(Default)]
struct Gate {
    open: AtomicBool,
    entries: usize,
    held: Arc<AtomicUsize>,
    given: AtomicUsize,
    asked: Mutex<Vec<usize>>,
}

impl Permits for Gate {
    fn acquire(&self, want: usize) -> BoxFuture<'_, Result<Permit, PermitError>> {
        self.asked.lock().unwrap().push(want);
        let result = if self.open.load(Ordering::SeqCst) {
            self.held.fetch_add(1, Ordering::SeqCst);
            self.given.fetch_add(1, Ordering::SeqCst);
            let held = Arc::clone(&self.held);
            Ok(Permit::new(self.entries).on_release(move || {
                held.fetch_sub(1, Ordering::SeqCst);
            }))
        } else {
            Err(PermitError::new(500, "pool busy"))
        };
        Box::pin(async move { result })
    }
}

/// A published batch's keys and the permits held while it ran.
type Batch = (Vec<String>, usize);

/// Records each batch with the permits held while it was published.
#[derive(Clone)]
struct Recorder {
    held: Arc<AtomicUsize>,
    batches: Arc<Mutex<Vec<Batch>>>,
}

impl Sink<u32> for Recorder {
    async fn publish(&self, batch: &[Entry<u32>]) -> Result<(), SinkError> {
        let keys = batch.iter().map(|e| e.key().to_owned()).collect();
        let held = self.held.load(Ordering::SeqCst);
        self.batches.lock().unwrap().push((keys, held));
        Ok(())
    }
}

fn setup(
    entries: usize,
    open: bool,
) -> (
    Scheduler<MemoryStorage>,
    Outbox<MemoryStorage, u32, Recorder>,
    Arc<Gate>,
    Recorder,
) {
    let ctx = ObjectContext::with_clock(
        ObjectId::new("o").unwrap(),
        Arc::new(crate::conformance::memory_storage()),
        Arc::new(ManualClock::new(1_000)),
    );
    let scheduler = Scheduler::new(ctx).unwrap();
    let gate = Arc::new(Gate {
        open: AtomicBool::new(open),
        entries,
        ..Gate::default()
    });
    let sink = Recorder {
        held: Arc::clone(&gate.held),
        batches: Arc::default(),
    };
    let permits: Arc<dyn Permits> = gate.clone();
    let config = ChannelConfig::new("c").permits(permits);
    let outbox = Outbox::attach(&scheduler, config, sink.clone()).unwrap();
    for (i, key) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        let value = u32::try_from(i).unwrap();
        scheduler
            .transaction(|tx| outbox.stage(tx, key, &value))
            .unwrap();
    }
    (scheduler, outbox, gate, sink)
}

#[tokio::test]
async fn every_publish_call_runs_under_a_permit_and_a_batch_holds_at_most_its_entries() {
    let (_s, outbox, gate, sink) = setup(2, true);
    let report = outbox.deliver_due().await.unwrap();
    assert_eq!(report.delivered, 5);
    assert_eq!(report.waiting_for_permit, None);
    let batches = sink.batches.lock().unwrap().clone();
    let sizes: Vec<usize> = batches.iter().map(|(k, _)| k.len()).collect();
    assert_eq!(
        sizes,
        [2, 2, 1],
        "each batch as large as its permit allowed"
    );
    assert!(
        batches.iter().all(|(_, held)| *held == 1),
        "one permit held during every publish call: {batches:?}"
    );
    assert_eq!(gate.given.load(Ordering::SeqCst), 3);
    assert_eq!(
        gate.held.load(Ordering::SeqCst),
        0,
        "every permit given back"
    );
    assert_eq!(
        *gate.asked.lock().unwrap(),
        [5, 3, 1],
        "asked for what was due"
    );
    assert!(outbox.is_empty().unwrap());
}

#[tokio::test]
async fn without_a_permit_nothing_is_claimed_or_published_and_the_entries_wait_for_one() {
    let (scheduler, outbox, gate, sink) = setup(10, false);
    let before: Vec<_> = ["a", "e"]
        .iter()
        .map(|k| outbox.pending(k).unwrap())
        .collect();
    let report = outbox.deliver_due().await.unwrap();
    assert_eq!(report.delivered, 0);
    assert_eq!(
        report.waiting_for_permit.as_ref().map(PermitError::code),
        Some("SCHEDULER_PERMIT_UNAVAILABLE")
    );
    assert!(sink.batches.lock().unwrap().is_empty(), "nothing published");
    let after: Vec<_> = ["a", "e"]
        .iter()
        .map(|k| outbox.pending(k).unwrap())
        .collect();
    assert_eq!(before, after, "no attempt used, same versions");
    assert_eq!(outbox.len().unwrap(), 5, "nothing lost");
    assert_eq!(
        scheduler.alarm_at(),
        Some(1_500),
        "asks again when the source said"
    );

    let now = outbox.publish_now("a").await.unwrap();
    assert!(now.pending && now.report.waiting_for_permit.is_some());
    assert!(
        sink.batches.lock().unwrap().is_empty(),
        "publish_now waits too"
    );

    gate.open.store(true, Ordering::SeqCst);
    let report = outbox.deliver_due().await.unwrap();
    assert_eq!(
        report.delivered, 5,
        "every entry delivered once a permit came"
    );
    let batches = sink.batches.lock().unwrap().clone();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].1, 1);
    assert!(outbox.is_empty().unwrap());
}
