//! Ownership's metrics read back through a debugging recorder: claims by
//! outcome, admissions, the in-flight gauge, renews renewed and lost.

use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use super::*;

#[test]
fn claims_renews_admissions_and_in_flight_are_recorded_per_task() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let gauge_while_admitted = ::metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let f = fixture().await;
            let a = f.task("a");
            let b = f.task("b");
            let g = f.claim(&a).await; // claimed
            f.claim(&a).await; // a live local lease: no store claim
            assert!(matches!(
                b.resolve(&f.scope, &f.lifecycle).await.expect("resolve"),
                Resolution::Remote { .. }
            )); // held elsewhere
            let permit = a.admit(&f.scope, g).await.expect("admitted");
            // A snapshot drains the debugging recorder's counters: keep them.
            let (gauge, early) = snapshot_gauge(&snapshotter, "a");
            drop(permit);
            assert!(
                a.admit(&f.scope, Generation::new(g.get() + 1).expect("gen"))
                    .await
                    .is_err()
            );
            a.renew_all().await; // renewed
            f.clock.advance(20_000);
            a.renew_all().await; // lost: the lease ran out on the store
            (gauge, early)
        })
    });
    let (gauge_while_admitted, early) = gauge_while_admitted;
    assert_eq!(gauge_while_admitted, 1.0, "one admission in flight");
    let mut counters: Vec<(String, String, String, u64)> = Vec::new();
    let mut gauges: Vec<(String, f64)> = Vec::new();
    for (key, _, _, value) in early.into_iter().chain(snapshotter.snapshot().into_vec()) {
        let key = key.key();
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        match value {
            DebugValue::Counter(n) if n > 0 => {
                counters.push((key.name().to_owned(), label("task"), label("outcome"), n))
            }
            DebugValue::Gauge(v) => gauges.push((label("task"), v.into_inner())),
            _ => {}
        }
    }
    counters.sort();
    let c = |name: &str, task: &str, outcome: &str, n: u64| {
        (name.to_owned(), task.to_owned(), outcome.to_owned(), n)
    };
    assert_eq!(
        counters,
        [
            c("durability_ownership_admissions_total", "a", "admitted", 1),
            c("durability_ownership_admissions_total", "a", "refused", 1),
            c("durability_ownership_claims_total", "a", "claimed", 1),
            c(
                "durability_ownership_claims_total",
                "b",
                "held_elsewhere",
                1
            ),
            c("durability_ownership_renews_total", "a", "lost", 1),
            c("durability_ownership_renews_total", "a", "renewed", 1),
        ]
    );
    // The debugging recorder reports changes since its last snapshot.
    let net = |task: &str| -> f64 {
        gauges
            .iter()
            .filter(|(t, _)| t == task)
            .map(|(_, v)| v)
            .sum()
    };
    assert_eq!(net("a"), 0.0, "nothing in flight at the end: {gauges:?}");
    assert_eq!(net("b"), 0.0, "{gauges:?}");
}

type Snapshot = Vec<(
    metrics_util::CompositeKey,
    Option<::metrics::Unit>,
    Option<::metrics::SharedString>,
    DebugValue,
)>;

/// The in-flight gauge of `task` now, and the whole snapshot taken.
fn snapshot_gauge(
    snapshotter: &metrics_util::debugging::Snapshotter,
    task: &str,
) -> (f64, Snapshot) {
    let all = snapshotter.snapshot().into_vec();
    let gauge = all
        .iter()
        .find_map(|(key, _, _, value)| {
            let key = key.key();
            let is_task = key.labels().any(|l| l.key() == "task" && l.value() == task);
            match value {
                DebugValue::Gauge(v)
                    if key.name() == "durability_ownership_in_flight" && is_task =>
                {
                    Some(v.into_inner())
                }
                _ => None,
            }
        })
        .unwrap_or(0.0);
    (gauge, all)
}
