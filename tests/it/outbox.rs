//! Outbox behaviour on the in-memory storage and on SQLite files: staging,
//! coalescing, versions, settlement, retries, timeouts, dead letters,
//! `publish_now`, events, bad input, restarts, crash injection, and a
//! property test against a model.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use durability_outbox::{
    ChannelConfig, DeadLetter, EventKind, Outbox, OutboxError, RetryPolicy, default_delay_ms,
};
use durability_scheduler::testkit::{CrashMode, CrashStorage, MemoryStorage};
use durability_scheduler::{Driver, ManualClock, SchedulerTx, Storage};
use durability_storage_sqlite::{SqliteOptions, SqliteStorage, Synchronous};
use support::{Mode, Obj, Recorder, START, memory, open};

/// Channel `c` on a fresh in-memory object, delivering to a recorder in
/// `mode` (returned too).
fn on_sink(clock: &ManualClock, mode: Mode) -> (Recorder, Obj<MemoryStorage>) {
    let sink = Recorder::with_mode(mode);
    let o = open(memory(), clock, sink.clone(), ChannelConfig::new("c"));
    (sink, o)
}

/// [`on_sink`] with a 1 s attempt timeout.
fn on_sink_with_1s_timeout(clock: &ManualClock, mode: Mode) -> (Recorder, Obj<MemoryStorage>) {
    let sink = Recorder::with_mode(mode);
    let config = ChannelConfig::new("c").attempt_timeout_ms(1_000);
    let o = open(memory(), clock, sink.clone(), config);
    (sink, o)
}

/// One `deliver_due` on `o` whose sink call is still running when the
/// 1 s attempt timeout fires: the clock moves on only once the sink was
/// entered and the timeout sleeps.
async fn deliver_past_the_timeout(o: &Obj<MemoryStorage>, clock: &ManualClock) {
    let outbox = o.outbox.clone();
    let flight = tokio::spawn(async move { outbox.deliver_due().await });
    o.sink.entered.notified().await;
    support::wait_for_sleeper(clock).await;
    clock.advance(1_000);
    flight.await.unwrap().unwrap();
}

/// Whether `o`'s channel emitted an event of a kind `kind` accepts.
fn saw<S: Storage>(o: &Obj<S>, kind: impl Fn(&EventKind) -> bool) -> bool {
    o.events.lock().unwrap().iter().any(|e| kind(&e.kind))
}

fn stage<S: Storage>(o: &Obj<S>, key: &str, value: &str) -> u64
where
    for<'t> S::Tx<'t>: durability_outbox::OutboxTx,
{
    o.sched
        .transaction(|tx| o.outbox.stage(tx, key, &value.to_owned()))
        .unwrap()
}

/// `object-1` on `storage` with a recording sink and the plain channel `c`.
fn open_plain<S: Storage>(storage: Arc<S>, clock: &ManualClock) -> Obj<S>
where
    for<'t> S::Tx<'t>: durability_outbox::OutboxTx,
{
    open(storage, clock, Recorder::default(), ChannelConfig::new("c"))
}

#[tokio::test]
async fn staged_entries_are_delivered_with_versions_that_only_increase() {
    let clock = ManualClock::new(START);
    let o = open_plain(memory(), &clock);
    let (a, b) = o
        .sched
        .transaction(|tx| {
            let a = o.outbox.stage(tx, "a", &"1".to_owned())?;
            let b = o.outbox.stage(tx, "b", &"2".to_owned())?;
            Ok::<_, OutboxError>((a, b))
        })
        .unwrap();
    assert!(b > a);
    assert_eq!(
        o.sched.alarm_at(),
        Some(START),
        "alarm moved with the stage"
    );
    o.outbox.deliver_due().await.unwrap();
    assert_eq!(
        o.sink.delivered(),
        vec![("a".into(), a, "1".into()), ("b".into(), b, "2".into())]
    );
    assert!(o.outbox.is_empty().unwrap());
    assert_eq!(o.sched.alarm_at(), None, "nothing pending: no alarm");
    let c = stage(&o, "a", "3");
    assert!(c > b, "versions survive delivery");
}

/// SQLite reserves versions in blocks (one counter write per block): two
/// handles on one file, rolled-back stages and reopening the file must
/// still only ever issue increasing versions.
#[tokio::test]
async fn versions_only_increase_across_handles_on_one_file_rollbacks_and_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("obj.db");
    let clock = ManualClock::new(START);
    let file = || Arc::new(SqliteStorage::open(&path, SqliteOptions::default()).unwrap());
    let a = open_plain(file(), &clock);
    let b = open_plain(file(), &clock);
    let mut last = 0;
    for i in 0..30 {
        let o = if i % 3 == 0 { &b } else { &a };
        let v = stage(o, "k", &format!("{i}"));
        assert!(v > last, "stage {i}: version {v} after {last}");
        last = v;
        if i % 7 == 0 {
            let r: Result<u64, OutboxError> = o.sched.transaction(|tx| {
                o.outbox.stage(tx, "k", &"rolled back".to_owned())?;
                Err(OutboxError::InvalidKey { reason: "rollback" })
            });
            assert!(r.is_err());
        }
    }
    assert_eq!(a.outbox.pending("k").unwrap(), Some((last, 0)));
    drop((a, b));
    let o = open_plain(file(), &clock);
    let v = stage(&o, "k", "after reopening");
    assert!(v > last, "after reopening: {v} > {last}");
    o.outbox.deliver_due().await.unwrap();
    assert_eq!(
        o.sink.delivered(),
        vec![("k".into(), v, "after reopening".into())]
    );
}

#[tokio::test]
async fn only_the_newest_value_of_a_key_is_pending() {
    let clock = ManualClock::new(START);
    let o = open_plain(memory(), &clock);
    stage(&o, "k", "old");
    let v2 = stage(&o, "k", "new");
    assert_eq!(o.outbox.pending("k").unwrap(), Some((v2, 0)));
    o.outbox.deliver_due().await.unwrap();
    assert_eq!(o.sink.delivered(), vec![("k".into(), v2, "new".into())]);
}

#[tokio::test]
async fn a_rolled_back_stage_leaves_nothing() {
    let clock = ManualClock::new(START);
    let o = open_plain(memory(), &clock);
    let r: Result<(), OutboxError> = o.sched.transaction(|tx| {
        o.outbox.stage(tx, "k", &"v".to_owned())?;
        Err(OutboxError::InvalidKey { reason: "rollback" })
    });
    assert!(r.is_err());
    assert!(o.outbox.is_empty().unwrap());
    assert_eq!(o.sched.alarm_at(), None);
    assert!(
        o.events.lock().unwrap().is_empty(),
        "no Staged event for a rollback"
    );
}

#[tokio::test]
async fn discard_removes_a_pending_entry_and_moves_the_alarm() {
    let clock = ManualClock::new(START);
    let o = open_plain(memory(), &clock);
    stage(&o, "k", "v");
    assert!(o.sched.transaction(|tx| o.outbox.discard(tx, "k")).unwrap());
    assert!(!o.sched.transaction(|tx| o.outbox.discard(tx, "k")).unwrap());
    assert_eq!(o.sched.alarm_at(), None);
    o.outbox.deliver_due().await.unwrap();
    assert!(o.sink.delivered().is_empty());
    assert!(saw(&o, |e| *e == EventKind::Discarded));
}

#[tokio::test]
async fn a_value_staged_while_its_older_version_is_in_flight_is_delivered_next() {
    let clock = ManualClock::new(START);
    let (sink, o) = on_sink(&clock, Mode::Gate);
    let v1 = stage(&o, "k", "v1");
    let outbox = o.outbox.clone();
    let flight = tokio::spawn(async move { outbox.deliver_due().await });
    sink.entered.notified().await;
    let v2 = stage(&o, "k", "v2");
    // v1's acknowledgement must not remove v2: it stays pending and, being
    // due, is delivered by the same run right after.
    sink.set_mode(Mode::Ok);
    sink.release.notify_one();
    flight.await.unwrap().unwrap();
    let versions: Vec<u64> = sink.delivered().iter().map(|d| d.1).collect();
    assert_eq!(versions, vec![v1, v2]);
    assert!(o.outbox.is_empty().unwrap());
}

#[tokio::test]
async fn failures_retry_with_jittered_backoff_within_bounds() {
    let clock = ManualClock::new(START);
    let (sink, o) = on_sink(&clock, Mode::Fail(2));
    stage(&o, "k", "v");
    o.outbox.deliver_due().await.unwrap();
    let next = retry_at(&o);
    assert!(
        (START + 500..=START + 1_000).contains(&next),
        "first retry in [0.5 s, 1 s]: {next}"
    );
    assert_eq!(o.sched.alarm_at(), Some(next), "alarm follows the retry");
    clock.set(next);
    o.outbox.deliver_due().await.unwrap();
    let second = retry_at(&o);
    assert!(
        (next + 1_000..=next + 2_000).contains(&second),
        "second retry in [1 s, 2 s]"
    );
    clock.set(second);
    o.outbox.deliver_due().await.unwrap();
    assert_eq!(sink.delivered().len(), 1);
    assert_eq!(sink.delivered()[0].1, o.events.lock().unwrap()[0].version);
    for attempt in 1..40 {
        for r in [0.0, 0.5, 0.999_999] {
            let d = default_delay_ms(attempt, r);
            assert!(d <= 300_000.0, "capped at 5 minutes");
            assert!(d >= 500.0);
        }
    }
    assert!(default_delay_ms(30, 0.0) >= 150_000.0);
}

fn retry_at<S: Storage>(o: &Obj<S>) -> i64 {
    let events = o.events.lock().unwrap();
    events
        .iter()
        .rev()
        .find_map(|e| match e.kind {
            EventKind::RetryScheduled { next_at, .. } => Some(next_at),
            _ => None,
        })
        .expect("a retry was scheduled")
}

/// `object-1` with the custom retry `delay` and a sink that fails once, after
/// one entry was staged and its first delivery failed.
async fn fail_once_with_delay(delay: durability_outbox::DelayFn) -> Obj<MemoryStorage> {
    let clock = ManualClock::new(START);
    let policy = RetryPolicy {
        delay: Some(delay),
        ..RetryPolicy::default()
    };
    let o = open(
        memory(),
        &clock,
        Recorder::with_mode(Mode::Fail(1)),
        ChannelConfig::new("c").retry(policy),
    );
    stage(&o, "k", "v");
    o.outbox.deliver_due().await.unwrap();
    o
}

#[tokio::test]
async fn invalid_custom_delays_are_rejected_and_the_entry_is_kept() {
    for bad in [-1.0, f64::NAN, f64::INFINITY, 9.1e15] {
        let o = fail_once_with_delay(Arc::new(move |_| bad)).await;
        let next = retry_at(&o);
        assert!(
            next > START && next <= START + 300_000,
            "{bad}: fell back to backoff, due {next}"
        );
        assert_eq!(o.outbox.len().unwrap(), 1, "{bad}: entry kept");
    }
    // A valid custom delay is used as given.
    let o = fail_once_with_delay(Arc::new(|attempt| f64::from(attempt) * 7_000.0)).await;
    assert_eq!(retry_at(&o), START + 7_000);
}

#[tokio::test]
async fn a_sink_that_hangs_past_its_timeout_is_retried() {
    let clock = ManualClock::new(START);
    let (sink, o) = on_sink_with_1s_timeout(&clock, Mode::Hang);
    stage(&o, "k", "v");
    deliver_past_the_timeout(&o, &clock).await;
    let events = o.events.lock().unwrap().clone();
    assert!(events.iter().any(|e| matches!(&e.kind, EventKind::RetryScheduled { error, .. } if error.contains("timed out"))));
    sink.set_mode(Mode::Ok);
    clock.advance(2_000);
    o.outbox.deliver_due().await.unwrap();
    assert_eq!(sink.delivered().len(), 1);
}

#[tokio::test]
async fn a_sink_that_lands_after_its_timeout_is_delivered_again_and_newest_wins() {
    let clock = ManualClock::new(START);
    let (sink, o) = on_sink_with_1s_timeout(&clock, Mode::LandLate(clock.clone()));
    let v1 = stage(&o, "k", "v1");
    deliver_past_the_timeout(&o, &clock).await;
    let v2 = stage(&o, "k", "v2");
    sink.set_mode(Mode::Ok);
    o.outbox.deliver_due().await.unwrap();
    // The abandoned attempt lands late, after v2.
    clock.advance(5_000);
    sink.settle_late().await;
    let versions: Vec<u64> = sink.delivered().iter().map(|d| d.1).collect();
    assert_eq!(versions, vec![v2, v1], "the old version landed last");
    assert_eq!(
        sink.applied("k"),
        Some((v2, "v2".to_owned())),
        "a version-aware sink keeps v2"
    );
}

#[tokio::test]
async fn max_attempts_send_entries_to_the_dead_letter_sink_or_drop_them() {
    let clock = ManualClock::new(START);
    let letters: Arc<std::sync::Mutex<Vec<DeadLetter<String>>>> = Arc::default();
    let l = letters.clone();
    let fail_letters = Arc::new(std::sync::atomic::AtomicU32::new(1));
    let fl = fail_letters.clone();
    let config = ChannelConfig::new("c")
        .retry(RetryPolicy {
            max_attempts: Some(2),
            ..RetryPolicy::default()
        })
        .dead_letter(Arc::new(move |letter| {
            let l = l.clone();
            let fl = fl.clone();
            Box::pin(async move {
                if fl.fetch_sub(1, Ordering::SeqCst) > 0 {
                    return Err(durability_outbox::SinkError::new("dead-letter store down"));
                }
                l.lock().unwrap().push(letter);
                Ok(())
            })
        }));
    let o = open(
        memory(),
        &clock,
        Recorder::with_mode(Mode::Fail(u32::MAX)),
        config,
    );
    let v = stage(&o, "k", "v");
    for _ in 0..4 {
        o.outbox.deliver_due().await.unwrap();
        clock.advance(10_000);
    }
    let got = letters.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "dead-lettered once, after its sink recovered");
    assert_eq!(
        (got[0].key.as_str(), got[0].version, got[0].attempts),
        ("k", v, 2)
    );
    assert!(o.outbox.is_empty().unwrap());
    assert_eq!(
        o.sink.calls.load(Ordering::SeqCst),
        2,
        "published exactly max_attempts times"
    );
    assert!(saw(&o, |e| matches!(e, EventKind::DeadLettered { .. })));

    let clock = ManualClock::new(START);
    let config = ChannelConfig::new("c").retry(RetryPolicy {
        max_attempts: Some(1),
        ..RetryPolicy::default()
    });
    let o = open(
        memory(),
        &clock,
        Recorder::with_mode(Mode::Fail(u32::MAX)),
        config,
    );
    stage(&o, "k", "v");
    o.outbox.deliver_due().await.unwrap();
    assert!(o.outbox.is_empty().unwrap());
    assert!(saw(&o, |e| matches!(e, EventKind::Dropped { .. })));
}

#[tokio::test]
async fn publish_now_tries_a_key_at_once_and_reports_delivery() {
    let clock = ManualClock::new(START);
    let (sink, o) = on_sink(&clock, Mode::Fail(1));
    stage(&o, "k", "v");
    let failed = o.outbox.publish_now("k").await.unwrap();
    assert!(failed.pending, "failed attempt: still pending");
    assert_eq!(failed.report.retried, 1);
    assert!(!failed.is_done());
    assert_eq!(o.outbox.pending("k").unwrap().map(|p| p.1), Some(1));
    let done = o.outbox.publish_now("k").await.unwrap();
    assert!(done.is_done(), "tried at once despite backoff");
    assert_eq!(done.report.delivered, 1);
    let absent = o.outbox.publish_now("absent").await.unwrap();
    assert!(absent.is_done(), "nothing pending");
    assert_eq!(absent.report, durability_outbox::DeliveryReport::default());
    assert_eq!(sink.delivered().len(), 1);
}

#[tokio::test]
async fn batches_are_bounded_and_calls_never_overlap() {
    let clock = ManualClock::new(START);
    let sink = Recorder::default();
    let o = open(
        memory(),
        &clock,
        sink.clone(),
        ChannelConfig::new("c").batch_size(100),
    );
    o.sched
        .transaction(|tx| {
            for i in 0..250 {
                o.outbox.stage(tx, &format!("k{i:03}"), &format!("{i}"))?;
            }
            Ok::<_, OutboxError>(())
        })
        .unwrap();
    let a = o.outbox.clone();
    let b = o.outbox.clone();
    let (r1, r2, r3) = tokio::join!(
        a.deliver_due(),
        b.deliver_due(),
        o.outbox.publish_now("k249")
    );
    r1.unwrap();
    r2.unwrap();
    r3.unwrap();
    assert_eq!(sink.delivered().len(), 250);
    assert!(sink.max_batch.load(Ordering::SeqCst) <= 100);
    assert_eq!(
        sink.max_concurrent.load(Ordering::SeqCst),
        1,
        "one publish call at a time"
    );
}

#[tokio::test]
async fn a_panicking_hook_never_breaks_delivery() {
    let clock = ManualClock::new(START);
    let config = ChannelConfig::new("c").on_event(Arc::new(|_| panic!("hook bug")));
    let o = open(memory(), &clock, Recorder::default(), config);
    stage(&o, "k", "v");
    o.outbox.deliver_due().await.unwrap();
    assert_eq!(o.sink.delivered().len(), 1);
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_changes_nothing() {
    let clock = ManualClock::new(START);
    let store = memory();
    let o = open_plain(store.clone(), &clock);
    let v = stage(&o, "k", "v");
    let snapshot = || {
        store
            .transaction(|tx| {
                Ok::<_, durability_scheduler::StorageError>((
                    tx.alarm()?,
                    tx.capability_due("outbox:c")?,
                ))
            })
            .unwrap()
    };
    let before = (snapshot(), o.outbox.pending("k").unwrap());
    let huge = "x".repeat(durability_outbox::MAX_VALUE_BYTES);
    for (key, value, code) in [
        ("", "v", "OUTBOX_INVALID_KEY"),
        ("k\0", "v", "OUTBOX_INVALID_KEY"),
        ("k\n", "v", "OUTBOX_INVALID_KEY"),
        ("\u{7f}k", "v", "OUTBOX_INVALID_KEY"),
        ("k\u{1b}[0m", "v", "OUTBOX_INVALID_KEY"),
        (&"k".repeat(1_025)[..], "v", "OUTBOX_INVALID_KEY"),
        ("k", huge.as_str(), "OUTBOX_VALUE_TOO_LARGE"),
    ] {
        let err = o
            .sched
            .transaction(|tx| o.outbox.stage(tx, key, &value.to_owned()))
            .unwrap_err();
        assert_eq!(err.code(), code);
        assert!(!err.is_retryable());
    }
    assert_eq!(
        (snapshot(), o.outbox.pending("k").unwrap()),
        before,
        "state unchanged"
    );
    let next = stage(&o, "k2", "v");
    assert_eq!(next, v + 1, "rejected stages consumed no version");

    let bad_configs: Vec<(ChannelConfig<String>, &str)> = vec![
        (ChannelConfig::new(""), "OUTBOX_INVALID_CHANNEL"),
        (
            ChannelConfig::new("x".repeat(201)),
            "OUTBOX_INVALID_CHANNEL",
        ),
        (
            ChannelConfig::new("d").attempt_timeout_ms(0),
            "OUTBOX_INVALID_POLICY",
        ),
        (
            ChannelConfig::new("d").attempt_timeout_ms(1 << 31),
            "OUTBOX_INVALID_POLICY",
        ),
        (
            ChannelConfig::new("d").batch_size(0),
            "OUTBOX_INVALID_POLICY",
        ),
        (
            ChannelConfig::new("d").batch_size(1_001),
            "OUTBOX_INVALID_POLICY",
        ),
        (
            ChannelConfig::new("d").retry(RetryPolicy {
                max_attempts: Some(0),
                ..RetryPolicy::default()
            }),
            "OUTBOX_INVALID_POLICY",
        ),
        (ChannelConfig::new("c"), "SCHEDULER_DUPLICATE_CAPABILITY"),
    ];
    for (config, code) in bad_configs {
        let err = Outbox::attach(&o.sched, config, Recorder::default()).expect_err("rejected");
        assert_eq!(err.code(), code);
    }
    assert!(
        Outbox::attach(
            &o.sched,
            ChannelConfig::<String>::new("d").attempt_timeout_ms((1 << 31) - 1),
            Recorder::default()
        )
        .is_ok()
    );
    assert_eq!(
        o.outbox.len().unwrap(),
        2,
        "the duplicate attach did not detach the original"
    );
    o.outbox.deliver_due().await.unwrap();
    assert_eq!(o.sink.delivered().len(), 2);
    assert_eq!(
        OutboxError::CODES,
        [
            "OUTBOX_INVALID_CHANNEL",
            "OUTBOX_INVALID_KEY",
            "OUTBOX_VALUE_TOO_LARGE",
            "OUTBOX_ENCODE_FAILED",
            "OUTBOX_VALUE_NOT_ROUND_TRIP",
            "OUTBOX_INVALID_POLICY",
            "OUTBOX_VERSIONS_EXHAUSTED",
            "OUTBOX_STORAGE",
            "OUTBOX_CORRUPT",
        ],
        "the outbox's code list"
    );
    let mut codes = OutboxError::CODES.to_vec();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), OutboxError::CODES.len(), "codes are unique");
}

#[tokio::test]
async fn pending_entries_resume_after_reopening_the_file_with_a_driver() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("obj.db");
    let clock = ManualClock::new(START);
    let v;
    {
        let s = Arc::new(SqliteStorage::open(&path, SqliteOptions::default()).unwrap());
        let o = open(
            s,
            &clock,
            Recorder::with_mode(Mode::Fail(1)),
            ChannelConfig::new("c"),
        );
        v = stage(&o, "k", "v");
        o.outbox.deliver_due().await.unwrap();
        // Evicted: memory gone, the failed entry is waiting for its retry.
    }
    let s = Arc::new(SqliteStorage::open(&path, SqliteOptions::default()).unwrap());
    let sink = Recorder::default();
    let o = open(s, &clock, sink.clone(), ChannelConfig::new("c"));
    let due = o.sched.alarm_at().expect("alarm re-read from storage");
    let _driver = Driver::start(o.sched.clone());
    support::wait_for_sleeper(&clock).await;
    clock.set(due);
    sink.wait_delivered(1).await;
    assert_eq!(sink.delivered()[0].1, v);
}

/// Crash at every transaction of a scenario (before and after its commit),
/// reopen from the file, and check: each key's newest acknowledged version
/// is delivered, versions per key never go backwards, and what a
/// version-aware sink keeps is the newest committed value.
#[tokio::test]
async fn crash_at_every_write_then_reopen_delivers_the_newest_of_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let total = {
        let clock = ManualClock::new(START);
        let counter = Arc::new(CrashStorage::new(
            Arc::new(sqlite(&dir, "count")),
            None,
            CrashMode::BeforeCommit,
        ));
        let _ = scenario(counter.clone(), &clock, &Recorder::default()).await;
        counter.transactions()
    };
    let mut tried = 0;
    for mode in [CrashMode::BeforeCommit, CrashMode::AfterCommit] {
        for at in 1..=total {
            let name = format!("{mode:?}-{at}");
            let clock = ManualClock::new(START);
            let file = Arc::new(sqlite(&dir, &name));
            let crashy = Arc::new(CrashStorage::new(file, Some(at), mode));
            let sink = Recorder::with_mode(Mode::FailEvery(3));
            let acked = scenario(crashy.clone(), &clock, &sink).await;
            assert!(crashy.crashed(), "{name}: the crash point was reached");
            tried += 1;
            // Reopen from the file: a new process.
            let reopened = Arc::new(sqlite(&dir, &name));
            let o = open(reopened, &clock, sink.clone(), ChannelConfig::new("c"));
            for _ in 0..20 {
                clock.advance(400_000);
                o.outbox.deliver_due().await.unwrap();
                if o.outbox.is_empty().unwrap() {
                    break;
                }
            }
            assert!(
                o.outbox.is_empty().unwrap(),
                "{name}: everything delivered after reopening"
            );
            for (key, version) in &acked {
                let applied = sink.applied(key).map(|a| a.0);
                assert!(
                    applied >= Some(*version),
                    "{name}: {key} v{version} delivered (applied {applied:?})"
                );
            }
            let mut last: BTreeMap<String, u64> = BTreeMap::new();
            for (key, version, _) in sink.delivered_first_times() {
                let prev = last.insert(key.clone(), version).unwrap_or(0);
                assert!(
                    version > prev,
                    "{name}: {key} went from v{prev} to v{version}"
                );
            }
        }
    }
    eprintln!(
        "outbox crash injection: {tried} crash points tried ({total} transactions x 2 modes)"
    );
    assert!(
        tried >= 20,
        "the scenario has enough write steps to be meaningful"
    );
}

fn sqlite(dir: &tempfile::TempDir, name: &str) -> SqliteStorage {
    let options = SqliteOptions {
        synchronous: Synchronous::Off,
        ..SqliteOptions::default()
    };
    SqliteStorage::open(dir.path().join(format!("{name}.db")), options).unwrap()
}

/// Stages, restages, discards and delivers through a flaky sink until the
/// storage crashes or the scenario ends; returns the acknowledged newest
/// version of each key.
async fn scenario<S: Storage>(
    storage: Arc<S>,
    clock: &ManualClock,
    sink: &Recorder,
) -> BTreeMap<String, u64>
where
    for<'t> S::Tx<'t>: durability_outbox::OutboxTx,
{
    let mut acked = BTreeMap::new();
    let Some(o) = support::try_open(
        storage,
        clock,
        sink.clone(),
        ChannelConfig::new("c").batch_size(2),
    ) else {
        return acked;
    };
    for round in 0..4 {
        for key in ["a", "b", "c"] {
            match o
                .sched
                .transaction(|tx| o.outbox.stage(tx, key, &format!("{key}{round}")))
            {
                Ok(v) => {
                    acked.insert(key.to_owned(), v);
                }
                Err(_) => return acked,
            }
        }
        if round == 2 {
            // Removed from the expectations whatever the outcome: a discard
            // that crashed after its commit did happen.
            acked.remove("c");
            if o.sched.transaction(|tx| o.outbox.discard(tx, "c")).is_err() {
                return acked;
            }
        }
        if o.outbox.deliver_due().await.is_err() {
            return acked;
        }
        clock.advance(400_000);
    }
    for _ in 0..6 {
        if o.outbox.deliver_due().await.is_err() {
            return acked;
        }
        clock.advance(400_000);
    }
    acked
}

mod model {
    //! A property test against a model: the pending set is exactly the
    //! newest staged, not yet acknowledged or discarded version of each key.
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Stage(u8),
        Discard(u8),
        Deliver { fail: bool },
        Crash,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..4).prop_map(Op::Stage),
            1 => (0u8..4).prop_map(Op::Discard),
            3 => any::<bool>().prop_map(|fail| Op::Deliver { fail }),
            1 => Just(Op::Crash),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn outbox_matches_its_model(ops in proptest::collection::vec(op(), 1..40)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let clock = ManualClock::new(START);
                let store = memory();
                let sink = Recorder::default();
                let mut o = open(store.clone(), &clock, sink.clone(), ChannelConfig::new("c"));
                let mut model: BTreeMap<String, u64> = BTreeMap::new();
                let mut last_version = 0;
                for op in ops {
                    match op {
                        Op::Stage(k) => {
                            let v = stage(&o, &format!("k{k}"), "v");
                            assert!(v > last_version, "versions only increase");
                            last_version = v;
                            model.insert(format!("k{k}"), v);
                        }
                        Op::Discard(k) => {
                            let had = o.sched.transaction(|tx| o.outbox.discard(tx, &format!("k{k}"))).unwrap();
                            assert_eq!(had, model.remove(&format!("k{k}")).is_some());
                        }
                        Op::Deliver { fail } => {
                            sink.set_mode(if fail { Mode::Fail(u32::MAX) } else { Mode::Ok });
                            clock.advance(400_000);
                            o.outbox.deliver_due().await.unwrap();
                            if !fail {
                                model.clear();
                            }
                        }
                        Op::Crash => {
                            drop(o);
                            o = open(store.clone(), &clock, sink.clone(), ChannelConfig::new("c"));
                        }
                    }
                    let stored: BTreeMap<String, u64> = (0..4)
                        .filter_map(|k| {
                            let key = format!("k{k}");
                            o.outbox.pending(&key).unwrap().map(|(v, _)| (key, v))
                        })
                        .collect();
                    assert_eq!(stored, model);
                }
            });
        }
    }
}
