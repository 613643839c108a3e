//! Crash injection at every write step of an outbox scenario on PostgreSQL
//! object storage (before and after each commit), then a reopen from the
//! database: each key's newest acknowledged version is delivered and no
//! key's versions go backwards.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use durability_outbox::{ChannelConfig, Entry, Outbox, OutboxTx, Sink, SinkError};
use durability_scheduler::testkit::{CrashMode, CrashStorage};
use durability_scheduler::{ObjectContext, ObjectId, Scheduler, Storage};
use durability_time::ManualClock;

use crate::object_support::TestDeployment;

const START: i64 = 1_700_000_000_000;

/// A sink that fails every third call and records what it was given.
#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<u64>>,
    /// Every delivered (key, version), in order.
    delivered: Arc<Mutex<Vec<(String, u64)>>>,
}

impl Recorder {
    /// The newest version delivered per key (what a version-aware sink
    /// keeps).
    fn applied(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (k, v) in self.delivered.lock().unwrap().iter() {
            let e = out.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
        out
    }
}

impl Sink<String> for Recorder {
    async fn publish(&self, batch: &[Entry<String>]) -> Result<(), SinkError> {
        let n = {
            let mut c = self.calls.lock().unwrap();
            *c += 1;
            *c
        };
        if n % 3 == 0 {
            return Err(SinkError::new("flaky sink"));
        }
        let mut d = self.delivered.lock().unwrap();
        d.extend(batch.iter().map(|e| (e.key().to_owned(), e.version())));
        Ok(())
    }
}

type Obj<S> = (Scheduler<S>, Outbox<S, String, Recorder>);

fn open<S: Storage>(storage: Arc<S>, clock: &ManualClock, sink: &Recorder) -> Option<Obj<S>>
where
    for<'t> S::Tx<'t>: OutboxTx,
{
    let ctx = ObjectContext::with_clock(
        ObjectId::new("object-1").unwrap(),
        storage,
        Arc::new(clock.clone()),
    );
    let sched = Scheduler::new(ctx).ok()?;
    let outbox =
        Outbox::attach(&sched, ChannelConfig::new("c").batch_size(2), sink.clone()).ok()?;
    Some((sched, outbox))
}

/// Stages, restages, discards and delivers until the storage crashes or
/// the scenario ends; returns the acknowledged newest version of each key.
async fn scenario<S: Storage>(
    storage: Arc<S>,
    clock: &ManualClock,
    sink: &Recorder,
) -> BTreeMap<String, u64>
where
    for<'t> S::Tx<'t>: OutboxTx,
{
    let mut acked = BTreeMap::new();
    let Some((sched, outbox)) = open(storage, clock, sink) else {
        return acked;
    };
    for round in 0..3 {
        for key in ["a", "b", "c"] {
            match sched.transaction(|tx| outbox.stage(tx, key, &format!("{key}{round}"))) {
                Ok(v) => {
                    acked.insert(key.to_owned(), v);
                }
                Err(_) => return acked,
            }
        }
        if round == 1 {
            // Whatever the outcome: a discard that crashed after its
            // commit did happen.
            acked.remove("c");
            if sched.transaction(|tx| outbox.discard(tx, "c")).is_err() {
                return acked;
            }
        }
        if outbox.deliver_due().await.is_err() {
            return acked;
        }
        clock.advance(400_000);
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_at_every_write_then_reopen_delivers_the_newest_of_every_key() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let total = {
        let counter = Arc::new(CrashStorage::new(
            Arc::new(d.fresh()),
            None,
            CrashMode::BeforeCommit,
        ));
        let _ = scenario(
            counter.clone(),
            &ManualClock::new(START),
            &Recorder::default(),
        )
        .await;
        counter.transactions()
    };
    let mut tried = 0;
    for mode in [CrashMode::BeforeCommit, CrashMode::AfterCommit] {
        for at in 1..=total {
            let name = format!("{mode:?}-{at}");
            let clock = ManualClock::new(START);
            let id = format!("crash-{name}");
            let crashy = Arc::new(CrashStorage::new(
                Arc::new(d.objects.open(&id).unwrap()),
                Some(at),
                mode,
            ));
            let sink = Recorder::default();
            let acked = scenario(crashy.clone(), &clock, &sink).await;
            assert!(crashy.crashed(), "{name}: the crash point was reached");
            tried += 1;
            // A new process: a new handle on the same object.
            let reopened = Arc::new(d.objects.open(&id).unwrap());
            let (_sched, outbox) = open(reopened, &clock, &sink).expect("reopens");
            for _ in 0..20 {
                clock.advance(400_000);
                outbox.deliver_due().await.unwrap();
                if outbox.is_empty().unwrap() {
                    break;
                }
            }
            assert!(outbox.is_empty().unwrap(), "{name}: everything delivered");
            let applied = sink.applied();
            for (key, version) in &acked {
                assert!(
                    applied.get(key) >= Some(version),
                    "{name}: {key} v{version} delivered (applied {:?})",
                    applied.get(key)
                );
            }
            let mut last: BTreeMap<String, u64> = BTreeMap::new();
            for (key, version) in sink.delivered.lock().unwrap().iter() {
                let prev = last.insert(key.clone(), *version).unwrap_or(0);
                assert!(
                    *version >= prev,
                    "{name}: {key} went from v{prev} to v{version}"
                );
            }
        }
    }
    eprintln!(
        "postgres object crash injection: {tried} crash points tried ({total} transactions x 2 modes)"
    );
    assert!(
        tried >= 20,
        "the scenario has enough write steps to be meaningful"
    );
}
