//! Tests of the operator repairs on the in-memory storage.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use durability_scheduler::testkit::MemoryStorage;
use durability_scheduler::{ManualClock, ObjectContext, ObjectId, Scheduler};

use super::*;
use crate::store::StoredEntry;

fn scheduler() -> Scheduler<MemoryStorage> {
    let storage = Arc::new(crate::conformance::memory_storage());
    let clock = Arc::new(ManualClock::new(1_000));
    Scheduler::new(ObjectContext::with_clock(
        ObjectId::new("o").unwrap(),
        storage,
        clock,
    ))
    .unwrap()
}

fn entry(claimed_until: Option<i64>) -> StoredEntry {
    StoredEntry {
        channel: "c".to_owned(),
        key: "k".to_owned(),
        value: vec![0],
        version: 7,
        attempt: 2,
        due_at: 5_000,
        claimed_until,
    }
}

/// A scheduler holding `entry(claimed_until)` (its channel due at 5 000),
/// and what `retry_now` at 1 000 answers for it.
fn retry_staged(claimed_until: Option<i64>) -> (Scheduler<MemoryStorage>, AdminOutcome) {
    let s = scheduler();
    s.transaction(|tx| {
        tx.outbox_upsert(&entry(claimed_until))?;
        tx.set_due("outbox:c", Some(5_000))
    })
    .unwrap();
    let outcome = s.transaction(|tx| retry_now(tx, "c", "k", 1_000)).unwrap();
    (s, outcome)
}

#[test]
fn retry_refuses_an_attempt_in_flight_and_writes_nothing() {
    let (s, outcome) = retry_staged(Some(5_000));
    assert_eq!(
        outcome,
        AdminOutcome::InFlight {
            claimed_until: 5_000
        }
    );
    assert_eq!(s.alarm_at(), Some(5_000), "the alarm did not move");
    let row = s.transaction(|tx| tx.outbox_get("c", "k")).unwrap();
    assert_eq!(row, Some(StoredRow::Entry(entry(Some(5_000)))));
}

#[test]
fn retry_after_a_claim_expired_makes_the_entry_due_and_lowers_the_alarm() {
    let (s, outcome) = retry_staged(Some(900));
    assert!(matches!(outcome, AdminOutcome::Done { .. }), "{outcome:?}");
    assert_eq!(s.alarm_at(), Some(1_000));
    let Some(StoredRow::Entry(e)) = s.transaction(|tx| tx.outbox_get("c", "k")).unwrap() else {
        panic!("the entry is kept");
    };
    assert_eq!(
        (e.version, e.attempt, e.due_at, e.claimed_until),
        (7, 2, 1_000, None)
    );
}

#[test]
fn bad_names_are_refused_before_anything_is_read() {
    let s = scheduler();
    let err = s.transaction(|tx| discard(tx, "c", "", 1_000)).unwrap_err();
    assert_eq!(err.code(), "OUTBOX_INVALID_KEY");
    let err = s
        .transaction(|tx| retry_now(tx, "", "k", 1_000))
        .unwrap_err();
    assert_eq!(err.code(), "OUTBOX_INVALID_CHANNEL");
    let missing = s.transaction(|tx| discard(tx, "c", "k", 1_000)).unwrap();
    assert_eq!(missing, AdminOutcome::NotFound);
}

#[test]
fn entry_states_follow_the_claim_and_the_due_time() {
    let at = |claimed, due| {
        let mut e = entry(claimed);
        e.due_at = due;
        EntryReport::from_row(&StoredRow::Entry(e), 1_000).state
    };
    assert_eq!(at(Some(1_001), 1_001), EntryState::InFlight);
    assert_eq!(at(Some(1_000), 1_000), EntryState::Due, "an expired claim");
    assert_eq!(at(None, 1_000), EntryState::Due);
    assert_eq!(at(None, 1_001), EntryState::Waiting);
}
