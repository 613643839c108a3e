//! Tests of the lease report's strict decoding.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::{ClassName, Generation, LifecycleId, StorageId, TaskId};

fn record() -> OwnerRecord {
    let scope = OwnerScope::new(
        StorageId::new("st").unwrap(),
        ClassName::new("Shop").unwrap(),
        1,
        ShardCount::default(),
    )
    .unwrap();
    OwnerRecord::new(
        scope,
        LifecycleId::new("life").unwrap(),
        TaskId::new("task-1").unwrap(),
        Generation::new(4).unwrap(),
    )
}

#[test]
fn a_valid_record_is_reported_with_owner_generation_and_lease() {
    let r = record();
    let scope = r.scope().host_id().to_owned();
    let report =
        LeaseReport::from_stored(&scope, r.encoded().as_bytes(), 900, ShardCount::default());
    assert_eq!(report.owner.as_deref(), Some("task-1"));
    assert_eq!(report.lifecycle.as_deref(), Some("life"));
    assert_eq!(report.generation, Some(4));
    assert_eq!(report.lease_left_ms, 900);
    assert_eq!(report.problem, None);
}

#[test]
fn invalid_records_are_reported_with_their_problem() {
    let r = record();
    let count = ShardCount::default();
    let garbage = LeaseReport::from_stored("st:Shop:shard1", b"not json", 5, count);
    assert!(garbage.problem.unwrap().contains("not an owner record"));
    assert_eq!(garbage.generation, None);
    let moved = LeaseReport::from_stored("st:Shop:shard2", r.encoded().as_bytes(), 5, count);
    assert!(moved.problem.unwrap().contains("reconstruct"));
    // Not canonical: same fields, extra whitespace.
    let spaced = r.encoded().replacen(',', ", ", 1);
    let spaced = LeaseReport::from_stored("st:Shop:shard1", spaced.as_bytes(), 5, count);
    assert!(spaced.problem.is_some());
    assert_eq!(spaced.owner, None);
}

#[test]
fn an_advertised_endpoint_is_reported() {
    let r = record();
    let with = OwnerRecord::with_endpoint(
        r.scope().clone(),
        r.lifecycle().clone(),
        r.task().clone(),
        Some(crate::OwnerEndpoint::new("http://10.0.0.2:7000").unwrap()),
        r.generation(),
    );
    let scope = r.scope().host_id().to_owned();
    let report = LeaseReport::from_stored(
        &scope,
        with.encoded().as_bytes(),
        900,
        ShardCount::default(),
    );
    assert_eq!(report.endpoint.as_deref(), Some("http://10.0.0.2:7000"));
    assert_eq!(report.problem, None);
    let bare = LeaseReport::from_stored(&scope, r.encoded().as_bytes(), 900, ShardCount::default());
    assert_eq!(bare.endpoint, None);
    assert!(
        !serde_json::to_string(&bare).unwrap().contains("endpoint"),
        "omitted when none"
    );
}
