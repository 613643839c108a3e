//! Tests of the error vocabulary.

use super::*;
use std::collections::BTreeSet;

fn all() -> Vec<OwnershipError> {
    let io = || -> BoxError { Box::new(std::io::Error::other("x")) };
    vec![
        OwnershipError::invalid("shard", "x"),
        OwnershipError::InvalidOwnerRecord {
            scope: "s".into(),
            reason: "r".into(),
        },
        OwnershipError::InvalidLifecycleState {
            lifecycle: "l".into(),
            reason: "r".into(),
        },
        OwnershipError::StaleOwner { scope: "s".into() },
        OwnershipError::OwnerRace { scope: "s".into() },
        OwnershipError::LeaseExpired { scope: "s".into() },
        OwnershipError::StorageInactive {
            storage_id: "s".into(),
        },
        OwnershipError::DeleteLocked {
            lifecycle: "l".into(),
        },
        OwnershipError::Draining,
        OwnershipError::StoreUnavailable { source: io() },
        OwnershipError::OwnerUnavailable { source: io() },
        OwnershipError::OwnershipLost { scope: "s".into() },
        OwnershipError::StaleGeneration {
            scope: "s".into(),
            attempted: 1,
            stored: 2,
        },
        OwnershipError::FenceNotRecorded {
            scope: "s".into(),
            attempted: 1,
        },
        OwnershipError::ShardCountMismatch {
            storage_id: "s".into(),
            recorded: 16,
            requested: 8,
        },
        OwnershipError::ObjectScopeMismatch {
            recorded: "s".into(),
            attempted: "t".into(),
        },
        OwnershipError::DuplicateTaskId {
            task_id: "t".into(),
            scope: "s".into(),
        },
    ]
}

#[test]
fn codes_are_unique_and_listed() {
    let codes: Vec<&str> = all().iter().map(OwnershipError::code).collect();
    let unique: BTreeSet<&str> = codes.iter().copied().collect();
    assert_eq!(unique.len(), codes.len(), "duplicate codes in {codes:?}");
    assert_eq!(codes, OwnershipError::CODES);
}

#[test]
fn classification_matches_the_seed() {
    let stale = OwnershipError::StaleOwner { scope: "s".into() };
    assert_eq!(stale.outcome(), DispatchOutcome::NotStarted);
    assert!(
        stale.may_retry(false),
        "stale owner retries once for any method"
    );
    let race = OwnershipError::OwnerRace { scope: "s".into() };
    assert!(race.may_retry(false));
    let unavailable = OwnershipError::OwnerUnavailable {
        source: Box::new(std::io::Error::other("x")),
    };
    assert_eq!(unavailable.outcome(), DispatchOutcome::Unknown);
    assert!(unavailable.may_retry(true), "GET/HEAD may rediscover");
    assert!(
        !unavailable.may_retry(false),
        "non-idempotent methods terminate"
    );
    let locked = OwnershipError::DeleteLocked {
        lifecycle: "l".into(),
    };
    assert!(!locked.is_retryable());
    assert!(!OwnershipError::invalid("shard", "x").may_retry(true));
}

#[test]
fn errors_are_send_sync_static() {
    fn check<T: Send + Sync + 'static>() {}
    check::<OwnershipError>();
}

#[test]
fn configuration_refusals_name_both_sides_and_are_final() {
    let e = OwnershipError::ShardCountMismatch {
        storage_id: "st1".into(),
        recorded: 16,
        requested: 8,
    };
    let text = e.to_string();
    assert!(
        text.contains("16") && text.contains(" 8") && text.contains("st1"),
        "{text}"
    );
    assert!(!e.is_retryable());
    assert_eq!(e.outcome(), DispatchOutcome::NotStarted);
    let d = OwnershipError::DuplicateTaskId {
        task_id: "task-7".into(),
        scope: "st1:C:shard0".into(),
    };
    assert!(d.to_string().contains("task-7"));
    assert!(!d.is_retryable());
    assert!(
        !OwnershipError::ObjectScopeMismatch {
            recorded: "a".into(),
            attempted: "b".into()
        }
        .is_retryable()
    );
}
