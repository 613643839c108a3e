//! Corrupt outbox rows on SQLite (issue 15, outbox item 2): rows corrupted
//! by SQL are decoded strictly, quarantined with an event, never block
//! their channel's healthy entries, stay deletable, and never keep the
//! alarm in the past; a corrupt version counter is a typed error; the
//! pending gauge counts only what is still pending once rows are
//! quarantined.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::sync::Arc;

use durability_outbox::{ChannelConfig, EventKind, OutboxError};
use durability_scheduler::ManualClock;
use durability_storage_sqlite::SqliteStorage;
use support::{Mode, Obj, Recorder, START, fresh_sqlite, open, query_one, sql};

/// A fresh SQLite object at [`START`] with channel `channel` delivering to
/// `sink`; the directory holds the database file.
fn on_sqlite(
    sink: Recorder,
    channel: &str,
) -> (
    ManualClock,
    tempfile::TempDir,
    Arc<SqliteStorage>,
    Obj<SqliteStorage>,
) {
    let (clock, dir, storage) = fresh_sqlite();
    let o = open(storage.clone(), &clock, sink, ChannelConfig::new(channel));
    (clock, dir, storage, o)
}

/// Writes `set` (an SQL assignment) into the outbox row of `key`, behind
/// the outbox's back.
fn corrupt(storage: &SqliteStorage, key: &str, set: &str) {
    sql(
        storage,
        &format!("UPDATE durability_outbox SET {set} WHERE key = '{key}'"),
    );
}

fn stage_all(o: &Obj<SqliteStorage>, keys: &[&str]) {
    o.sched
        .transaction(|tx| {
            for k in keys {
                o.outbox.stage(tx, k, &format!("value of {k}"))?;
            }
            Ok::<_, OutboxError>(())
        })
        .unwrap();
}

fn quarantine_events(o: &Obj<SqliteStorage>) -> Vec<(String, String)> {
    o.events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Quarantined { reason } => Some((e.key.clone(), reason.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn corrupt_rows_are_quarantined_and_the_channels_healthy_entries_still_deliver() {
    let (_clock, _dir, storage, o) = on_sqlite(Recorder::default(), "c");
    stage_all(
        &o,
        &[
            "healthy-1",
            "neg-version",
            "neg-attempt",
            "text-version",
            "text-value",
            "text-due",
            "healthy-2",
        ],
    );
    corrupt(&storage, "neg-version", "version = -5");
    corrupt(&storage, "neg-attempt", "attempt = -1");
    corrupt(&storage, "text-version", "version = 'abc'");
    corrupt(&storage, "text-value", "value = 'not bytes'");
    corrupt(&storage, "text-due", "due_at = 'soon'");

    let report = o.outbox.deliver_due().await.unwrap();
    assert_eq!(report.delivered, 2, "both healthy entries are delivered");
    let mut delivered: Vec<String> = o.sink.delivered().into_iter().map(|d| d.0).collect();
    delivered.sort();
    assert_eq!(delivered, ["healthy-1", "healthy-2"]);
    let mut quarantined: Vec<(String, String)> = report
        .quarantined
        .iter()
        .map(|q| (q.key.clone(), q.reason.clone()))
        .collect();
    quarantined.sort();
    let keys: Vec<&str> = quarantined.iter().map(|q| q.0.as_str()).collect();
    assert_eq!(
        keys,
        [
            "neg-attempt",
            "neg-version",
            "text-due",
            "text-value",
            "text-version"
        ]
    );
    let reason = |k: &str| quarantined.iter().find(|q| q.0 == k).unwrap().1.clone();
    for (key, says) in [
        ("neg-version", "version -5"),
        ("neg-attempt", "attempt -1"),
        ("text-version", "version is text"),
        ("text-value", "value is text"),
        ("text-due", "due_at is text"),
    ] {
        assert!(reason(key).contains(says), "{}", reason(key));
    }
    let mut events = quarantine_events(&o);
    events.sort();
    assert_eq!(
        events, quarantined,
        "one Quarantined event per row, after commit"
    );

    assert!(
        o.outbox.is_empty().unwrap(),
        "nothing left blocking the channel"
    );
    assert_eq!(o.outbox.quarantined().unwrap(), 5);
    assert_eq!(o.sched.alarm_at(), None, "no alarm left in the past");
    // Quarantined rows keep what was stored, and stay deletable.
    assert_eq!(
        query_one::<i64>(
            &storage,
            "SELECT COUNT(*) FROM durability_outbox_quarantine
             WHERE key = 'text-version' AND typeof(version) = 'text'"
        ),
        1
    );
    assert_eq!(o.outbox.purge_quarantined().unwrap(), 5);
    assert_eq!(o.outbox.quarantined().unwrap(), 0);

    // The channel goes on: a new value of a quarantined key delivers.
    stage_all(&o, &["neg-version"]);
    assert_eq!(o.outbox.deliver_due().await.unwrap().delivered, 1);
}

#[tokio::test]
async fn a_corrupt_row_never_keeps_the_alarm_in_the_past() {
    let (clock, _dir, storage, o) = on_sqlite(Recorder::with_mode(Mode::Fail(1)), "c");
    stage_all(&o, &["corrupt", "healthy"]);
    // Read as u32::MAX before: never claimable, due in the past forever.
    corrupt(&storage, "corrupt", "attempt = -1");
    // The object's own alarm handler, as the driver calls it.
    let left = o.sched.alarm().await.unwrap();
    let next = left.expect("the healthy entry's retry is scheduled");
    assert!(next > START, "alarm moved forward: {next} > {START}");
    assert_eq!(o.sched.alarm_at(), Some(next));
    assert_eq!(o.outbox.pending("healthy").unwrap().map(|p| p.1), Some(1));
    assert_eq!(o.outbox.quarantined().unwrap(), 1);
    assert_eq!(quarantine_events(&o).len(), 1);
    // Running the alarm again before its time does nothing.
    let again = o.sched.alarm().await.unwrap();
    assert_eq!(again, Some(next));
    clock.set(next);
    o.sched.alarm().await.unwrap();
    assert_eq!(o.sink.delivered().len(), 1);
    assert_eq!(o.sched.alarm_at(), None);
}

#[tokio::test]
async fn a_corrupt_due_time_wakes_the_alarm_once_and_is_quarantined() {
    let (_clock, _dir, storage, o) = on_sqlite(Recorder::default(), "c");
    stage_all(&o, &["k"]);
    o.outbox.deliver_due().await.unwrap();
    stage_all(&o, &["late"]);
    // A due time that is not an integer sorts after every number.
    sql(&storage, "UPDATE durability_outbox SET due_at = 'never'");
    let report = o.outbox.deliver_due().await.unwrap();
    assert_eq!(report.quarantined.len(), 1);
    assert_eq!(report.quarantined[0].key, "late");
    assert_eq!(o.sched.alarm_at(), None);
}

#[tokio::test]
async fn publish_now_and_pending_report_a_corrupt_key() {
    let (_clock, _dir, storage, o) = on_sqlite(Recorder::default(), "c");
    stage_all(&o, &["k"]);
    sql(&storage, "UPDATE durability_outbox SET version = 0");
    let err = o.outbox.pending("k").unwrap_err();
    assert_eq!(err.code(), "OUTBOX_CORRUPT");
    assert!(!err.is_retryable());
    let outcome = o.outbox.publish_now("k").await.unwrap();
    assert!(!outcome.pending);
    assert!(!outcome.is_done());
    assert_eq!(outcome.report.quarantined.len(), 1);
    assert!(outcome.report.quarantined[0].reason.contains("version 0"));
    assert!(
        o.sink.delivered().is_empty(),
        "a corrupt row is never published"
    );
    assert_eq!(o.outbox.pending("k").unwrap(), None);

    // A corrupt row can also be discarded by its key.
    stage_all(&o, &["j"]);
    corrupt(&storage, "j", "attempt = 'x'");
    assert!(o.sched.transaction(|tx| o.outbox.discard(tx, "j")).unwrap());
    assert!(o.outbox.is_empty().unwrap());
}

#[tokio::test]
async fn a_corrupt_version_counter_is_a_typed_error_and_stages_nothing() {
    for counter in ["-1", "'abc'", "-9223372036854775808"] {
        let (_clock, _dir, storage, o) = on_sqlite(Recorder::default(), "c");
        sql(
            &storage,
            &format!("UPDATE durability_outbox_version SET last = {counter}"),
        );
        let err = o
            .sched
            .transaction(|tx| o.outbox.stage(tx, "k", &"v".to_owned()))
            .unwrap_err();
        assert_eq!(err.code(), "OUTBOX_CORRUPT", "counter {counter}: {err}");
        assert!(!err.is_retryable());
        assert!(
            o.outbox.is_empty().unwrap(),
            "counter {counter}: nothing staged"
        );
        assert_eq!(o.sched.alarm_at(), None);
    }
    // A missing counter row too.
    let (_clock, _dir, storage, o) = on_sqlite(Recorder::default(), "c");
    sql(&storage, "DELETE FROM durability_outbox_version");
    let err = o
        .sched
        .transaction(|tx| o.outbox.stage(tx, "k", &"v".to_owned()))
        .unwrap_err();
    assert_eq!(err.code(), "OUTBOX_CORRUPT");
}

/// The change of the pending gauge of `channel` since the previous
/// snapshot (the debugging recorder hands out changes), added to `total`.
fn pending_gauge(
    snapshotter: &metrics_util::debugging::Snapshotter,
    channel: &str,
    total: &mut f64,
) -> u64 {
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let here = key
            .labels()
            .any(|l| l.key() == "channel" && l.value() == channel);
        if let (true, "durability_outbox_pending", metrics_util::debugging::DebugValue::Gauge(v)) =
            (here, key.name(), value)
        {
            *total += v.into_inner();
        }
    }
    assert!(*total >= 0.0 && total.fract() == 0.0, "gauge {total}");
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = *total as u64;
    n
}

#[test]
fn the_pending_gauge_counts_what_is_left_after_corrupt_rows_are_quarantined() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        support::block_on(async {
            // The first publish fails: the healthy entries stay pending
            // after the run that quarantines the corrupt ones.
            let (clock, _dir, storage, o) = on_sqlite(Recorder::with_mode(Mode::Fail(1)), "gauge");
            let mut total = 0.0;
            let gauge = |total: &mut f64| pending_gauge(&snapshotter, "gauge", total);
            stage_all(&o, &["healthy-1", "bad-attempt", "healthy-2", "bad-due"]);
            assert_eq!(gauge(&mut total), 4);
            corrupt(&storage, "bad-attempt", "attempt = -1");
            corrupt(&storage, "bad-due", "due_at = 'soon'");

            // Quarantine, then a failed attempt: two healthy entries left.
            let report = o.outbox.deliver_due().await.unwrap();
            assert_eq!(report.quarantined.len(), 2);
            assert_eq!((report.delivered, report.retried), (0, 2));
            assert_eq!(o.outbox.quarantined().unwrap(), 2);
            assert_eq!(o.outbox.len().unwrap(), 2);
            assert_eq!(gauge(&mut total), 2);

            // The retries deliver: nothing left.
            clock.advance(60_000);
            let report = o.outbox.deliver_due().await.unwrap();
            assert_eq!(report.delivered, 2);
            assert!(report.quarantined.is_empty());
            assert_eq!(o.outbox.len().unwrap(), 0);
            assert_eq!(gauge(&mut total), 0);

            // A corrupt row met by `publish_now`, next to a healthy one.
            stage_all(&o, &["bad-version", "healthy-3"]);
            corrupt(&storage, "bad-version", "version = 'abc'");
            assert_eq!(gauge(&mut total), 2);
            let outcome = o.outbox.publish_now("bad-version").await.unwrap();
            assert!(!outcome.pending);
            assert_eq!(outcome.report.quarantined.len(), 1);
            assert_eq!(o.outbox.len().unwrap(), 1);
            assert_eq!(gauge(&mut total), 1);

            // A corrupt row discarded by the application, and a new value
            // of a quarantined key.
            stage_all(&o, &["bad-value", "bad-due"]);
            corrupt(&storage, "bad-value", "value = 'not bytes'");
            assert_eq!(gauge(&mut total), 3);
            o.sched
                .transaction(|tx| o.outbox.discard(tx, "bad-value"))
                .unwrap();
            assert_eq!(o.outbox.len().unwrap(), 2);
            assert_eq!(gauge(&mut total), 2);
            let report = o.outbox.deliver_due().await.unwrap();
            assert_eq!(report.delivered, 2);
            assert!(report.quarantined.is_empty());
            assert_eq!(o.outbox.len().unwrap(), 0);
            assert_eq!(gauge(&mut total), 0);
            assert_eq!(o.outbox.quarantined().unwrap(), 3);
        });
    });
}
