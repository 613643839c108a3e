//! Unit tests: the published format (insta), error codes, the in-memory
//! backends against their conformance suites.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use durability_topology_client::{Member, MemberState, Snapshot, decode};

use crate::conformance::{MemoryPublication, memory_storage, run_publication, run_tx};
use crate::encode::encode;
use crate::error::TopologyError;

fn sample() -> Snapshot {
    Snapshot {
        group: "tenant-a".into(),
        version: 3,
        coordinator: "coordinator-1".into(),
        members: vec![
            Member {
                id: "tenant-a-0".into(),
                state: MemberState::Active,
                location_hint: Some("weur".into()),
                meta: Some(serde_json::json!({"weight": 2, "az": "b"})),
                joined_at: 1_700_000_000_000,
            },
            Member {
                id: "tenant-a-1".into(),
                state: MemberState::Draining,
                location_hint: None,
                meta: None,
                joined_at: 1_700_000_000_500,
            },
        ],
    }
}

#[test]
fn the_encoded_format_is_pinned() {
    let encoded = encode(&sample());
    insta::assert_snapshot!(encoded.as_str());
}

#[test]
fn encoding_round_trips_through_the_client_decoder() {
    let s = sample();
    let encoded = encode(&s);
    assert_eq!(decode(encoded.as_bytes()).unwrap(), s);
}

#[test]
fn error_codes_are_unique() {
    let mut seen = BTreeSet::new();
    for code in TopologyError::CODES
        .iter()
        .chain(durability_topology_client::TopologyClientError::CODES)
        .chain(durability_outbox::OutboxError::CODES)
        .chain(durability_scheduler::SchedulerError::CODES)
    {
        assert!(seen.insert(*code), "duplicate code {code}");
    }
    insta::assert_debug_snapshot!(TopologyError::CODES);
}

#[test]
fn memory_topology_tx_passes_the_conformance_suite() {
    run_tx(memory_storage);
}

#[tokio::test]
async fn memory_publication_stores_pass_the_conformance_suite() {
    let plain = MemoryPublication::plain();
    run_publication(&plain, &plain, "", false).await;
    let versioned = MemoryPublication::versioned();
    run_publication(&versioned, &versioned, "", true).await;
}

#[tokio::test]
async fn suites_get_encoded_snapshots_from_a_real_coordinator() {
    let written = crate::conformance::coordinator_snapshots(
        "coordinator-9",
        "g",
        &[Some(2), Some(2), Some(3), None, Some(1)],
    )
    .await;
    let versions: Vec<u64> = written.iter().map(|(s, _)| s.version).collect();
    assert_eq!(
        versions,
        vec![1, 2, 4],
        "an unchanged membership publishes nothing; the delete takes version 3"
    );
    for (snapshot, encoded) in &written {
        assert_eq!(snapshot.coordinator, "coordinator-9");
        assert_eq!(
            &decode(encoded.as_bytes()).unwrap(),
            snapshot,
            "the encoding is the coordinator's"
        );
    }
    assert_eq!(written[1].0.members.len(), 3);
}

#[test]
fn publications_are_counted_by_outcome_through_the_metrics_facade() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let written = metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(crate::conformance::coordinator_snapshots(
            "coordinator-9",
            "g",
            &[Some(2), Some(3), None],
        ))
    });
    assert_eq!(written.len(), 2);
    let counted: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "durability_topology_publications_total")
        .map(|(k, _, _, v)| {
            let outcome = k
                .key()
                .labels()
                .find(|l| l.key() == "outcome")
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            let DebugValue::Counter(n) = v else {
                panic!("a counter")
            };
            (outcome, n)
        })
        .collect();
    assert_eq!(
        counted,
        [("written".to_owned(), 3)],
        "two snapshots and one delete were written"
    );
}
