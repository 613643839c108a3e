//! The outbox's decisions on their own.

#![allow(clippy::unwrap_used)]

use super::*;

fn stored(attempt: u32) -> StoredEntry {
    let mut e = staged("c", "k", vec![0], 7, 1_000);
    e.attempt = attempt;
    e
}

#[test]
fn staging_resets_the_attempt_and_makes_the_entry_due_now() {
    let e = staged("orders", "o-1", vec![0, 1], 9, 5_000);
    assert_eq!(
        (e.version, e.attempt, e.due_at, e.claimed_until),
        (9, 0, 5_000, None)
    );
}

#[test]
fn issued_versions_are_checked() {
    assert_eq!(version_issued(1).unwrap(), 1);
    assert_eq!(version_issued(0).unwrap_err().code(), "OUTBOX_CORRUPT");
    assert_eq!(
        version_issued(MAX_SAFE_UNSIGNED + 1).unwrap_err().code(),
        "OUTBOX_VERSIONS_EXHAUSTED"
    );
    assert_eq!(
        version_issued(MAX_SAFE_UNSIGNED).unwrap(),
        MAX_SAFE_UNSIGNED
    );
}

#[test]
fn a_claim_counts_the_attempt_until_the_maximum() {
    let c = claim(stored(0), None);
    assert_eq!((c.attempt, c.exhausted), (1, false));
    let c = claim(stored(2), Some(3));
    assert_eq!((c.attempt, c.exhausted), (3, false));
    let c = claim(stored(3), Some(3));
    assert_eq!(
        (c.attempt, c.exhausted),
        (3, true),
        "exhausted keeps its count"
    );
    assert_eq!(claim(stored(u32::MAX), None).attempt, u32::MAX);
    assert_eq!(claim_deadline(i64::MAX - 1, 30_000), i64::MAX);
}

#[test]
fn verdicts_follow_the_sink_and_the_retry_request() {
    assert_eq!(verdict(&Ok(()), None), Outcome::Delivered);
    assert_eq!(
        verdict(&Ok(()), Some(Some(5.0))),
        Outcome::Retry {
            error: "sink asked to retry".into(),
            delay: Some(5.0)
        }
    );
    assert_eq!(
        verdict(&Err("down".into()), Some(None)),
        Outcome::Retry {
            error: "down".into(),
            delay: None
        }
    );
    assert!(verdict_gives_up(3, Some(3)));
    assert!(!verdict_gives_up(2, Some(3)));
    assert!(!verdict_gives_up(u32::MAX, None));
}

#[test]
fn settlement_removes_finished_entries_and_reschedules_the_rest() {
    assert_eq!(
        settle(Outcome::Delivered),
        Settle::Remove {
            kind: EventKind::Delivered,
            fate: None
        }
    );
    assert_eq!(
        settle(Outcome::Dropped { error: "e".into() }),
        Settle::Remove {
            kind: EventKind::Dropped { error: "e".into() },
            fate: Some(Fate::Dropped)
        }
    );
    assert_eq!(
        settle(Outcome::DeadLetterFailed { error: "e".into() }),
        Settle::Reschedule {
            error: "e".into(),
            requested: None,
            fate: Some(Fate::Kept)
        }
    );
    assert_eq!(
        settle(Outcome::Retry {
            error: "e".into(),
            delay: Some(1.0)
        }),
        Settle::Reschedule {
            error: "e".into(),
            requested: Some(1.0),
            fate: None
        }
    );
}
