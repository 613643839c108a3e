//! Migration moves through the `metrics` facade, on SQLite shards: every
//! `reassign_*` call counts once by outcome (committed, aborted, conflict,
//! unavailable, refused) with its duration on the router's injected clock,
//! read back with the debugging recorder; and the move's span names the
//! scope, key and target.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use durability_migration::conformance::FaultMode;
use durability_migration::conformance::harness::{HookedShard, user};
use durability_migration::{BackendError, Router, Statement, Value};
use durability_time::ManualClock;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tracing_subscriber::layer::SubscriberExt as _;

use crate::shards::{Env, Hook, Kind, OnWrite, Write, env, hooked, router_with_user};

/// Nothing happens before the source's writes.
const QUIET: u8 = 0;
/// The clock moves 250 ms before the cutover batch.
const SLOW: u8 = 1;
/// The key's source row is deleted before the cutover batch (once).
const VANISH: u8 = 2;

/// On the move's source (which also holds the journal): what happens
/// before the cutover batch.
struct Cutover {
    clock: ManualClock,
    mode: AtomicU8,
}

impl Hook for Cutover {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        let cutover = w.is_cutover();
        if !cutover {
            return Ok(());
        }
        match self.mode.load(Ordering::SeqCst) {
            SLOW => self.clock.advance(250),
            VANISH => {
                self.mode.store(QUIET, Ordering::SeqCst);
                w.inner
                    .execute(&Statement::with_params(
                        "DELETE FROM users WHERE id = ?1",
                        vec![Value::from("gone")],
                    ))
                    .await?;
            }
            _ => {}
        }
        Ok(())
    }
}

async fn mover(e: &Env) -> (Router, Arc<HookedShard<OnWrite<Cutover>>>) {
    let hooked = hooked(
        e,
        "s0",
        Cutover {
            clock: e.clock.clone(),
            mode: AtomicU8::new(QUIET),
        },
    );
    let r = Router::new(e.config(false, 30_000).shard("s0", hooked.clone())).unwrap();
    r.init().await.unwrap();
    (r, hooked)
}

/// (name, outcome) → counter value, and outcome → duration samples.
type Figures = (BTreeMap<(String, String), u64>, BTreeMap<String, Vec<f64>>);

fn figures(snapshotter: &metrics_util::debugging::Snapshotter) -> Figures {
    let (mut counts, mut durations) = (BTreeMap::new(), BTreeMap::<String, Vec<f64>>::new());
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let outcome = key
            .labels()
            .find(|l| l.key() == "outcome")
            .map(|l| l.value().to_owned())
            .unwrap_or_default();
        match (key.name(), value) {
            ("durability_migration_moves_total", DebugValue::Counter(n)) => {
                counts.insert((key.name().to_owned(), outcome), n);
            }
            ("durability_migration_move_duration_ms", DebugValue::Histogram(samples)) => {
                durations
                    .entry(outcome)
                    .or_default()
                    .extend(samples.into_iter().map(|s| s.into_inner()));
            }
            _ => {}
        }
    }
    (counts, durations)
}

#[test]
fn every_move_counts_once_by_outcome_with_its_duration_on_the_router_clock() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        crate::support::block_on(async {
            let e = env(&[Kind::Sqlite, Kind::Sqlite]).await.unwrap();
            let setup = e.router().await;
            for key in ["k", "gone", "busy"] {
                e.mapping.put(key, "s0").await.unwrap();
                setup.insert(key, "users", user(key, 1)).await.unwrap();
            }
            let (r, hooked) = mover(&e).await;

            // Committed, 250 ms on the router's clock.
            hooked.hook.mode.store(SLOW, Ordering::SeqCst);
            r.reassign_shard("k", "s1", "users").await.unwrap();
            hooked.hook.mode.store(QUIET, Ordering::SeqCst);
            // Refused before any write: already there, and no mapping.
            let same = r.reassign_shard("k", "s1", "users").await.unwrap_err();
            assert_eq!(same.code(), "MIGRATION_SAME_SHARD");
            let none = r.reassign_shard("nobody", "s1", "users").await.unwrap_err();
            assert_eq!(none.code(), "MAPPING_NOT_FOUND");
            // Aborted: the source row went away before the cutover.
            hooked.hook.mode.store(VANISH, Ordering::SeqCst);
            let aborted = r.reassign_shard("gone", "s1", "users").await.unwrap_err();
            assert_eq!(aborted.code(), "MIGRATION_ABORTED", "{aborted}");
            // A crashed move (outcome unknown: unavailable) leaves its
            // claim; another router's move of the key conflicts.
            e.interrupt_move("busy", "s1", "users", 2, FaultMode::Before)
                .await;
            let busy = r.reassign_shard("busy", "s1", "users").await.unwrap_err();
            assert_eq!(busy.code(), "MIGRATION_ALREADY_ACTIVE");
        });
    });
    let (counts, durations) = figures(&snapshotter);
    let n = |outcome: &str| {
        counts
            .get(&(
                "durability_migration_moves_total".to_owned(),
                outcome.to_owned(),
            ))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(n("committed"), 1, "{counts:?}");
    assert_eq!(n("refused"), 2, "{counts:?}");
    assert_eq!(n("aborted"), 1, "{counts:?}");
    assert_eq!(n("unavailable"), 1, "{counts:?}");
    assert_eq!(n("conflict"), 1, "{counts:?}");
    assert_eq!(n("taken_over"), 0, "{counts:?}");
    assert_eq!(durations["committed"], [250.0]);
    assert_eq!(durations["refused"], [0.0, 0.0]);
    assert_eq!(durations["aborted"].len(), 1);
}

/// The spans opened, as `name{field=value,…}` (fields sorted).
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<String>>>);

struct Fields(BTreeMap<String, String>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields(BTreeMap::new());
        attrs.record(&mut fields);
        let fields: Vec<String> = fields.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.0.lock().unwrap().push(format!(
            "{}{{{}}}",
            attrs.metadata().name(),
            fields.join(",")
        ));
    }
}

#[test]
fn a_move_runs_in_a_span_naming_its_scope_key_and_target() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    tracing::subscriber::with_default(subscriber, || {
        crate::support::block_on(async {
            let e = env(&[Kind::Sqlite, Kind::Sqlite]).await.unwrap();
            let r = router_with_user(&e, "k", "s0", user("k", 1)).await;
            r.reassign_shard("k", "s1", "users").await.unwrap();
        });
    });
    let spans = spans.0.lock().unwrap().clone();
    assert!(
        spans
            .iter()
            .any(|s| s == "durability.migration.move{key=k,scope=default,target=s1}"),
        "{spans:#?}"
    );
}
