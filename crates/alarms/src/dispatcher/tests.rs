//! Dispatcher unit tests on the in-memory index with a manual clock:
//! settlement counting (superseded versus stale).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use durability_scheduler::{Clock, ManualClock, ObjectId};

use crate::*;

const START: i64 = 1_700_000_000_000;

fn obj(s: &str) -> ObjectId {
    ObjectId::new(s).unwrap()
}

fn tok(s: &str) -> Token {
    Token::new(s).unwrap()
}

fn config() -> DispatcherConfig {
    DispatcherConfig {
        seed: Some(3),
        ..DispatcherConfig::default()
    }
}

/// A handler that sets its next alarm while it runs, as the scheduler
/// bridge does: the job's row token is replaced before completion.
struct Reschedules {
    index: Arc<MemoryAlarmIndex>,
    clock: ManualClock,
}

impl Dispatch for Reschedules {
    async fn dispatch(&self, d: Delivery) -> DispatchOutcome {
        let next = self.clock.now_ms() + 1_000;
        self.index
            .upsert(&d.object, &Token::random(), next)
            .await
            .unwrap();
        DispatchOutcome::Delivered
    }
}

#[tokio::test]
async fn a_delivery_whose_row_was_replaced_counts_as_superseded_not_stale() {
    let clock = ManualClock::new(START);
    let index = Arc::new(MemoryAlarmIndex::new());
    index.upsert(&obj("a"), &tok("t0"), START).await.unwrap();
    let d = Dispatcher::new(
        Arc::clone(&index),
        Arc::new(Reschedules {
            index: Arc::clone(&index),
            clock: clock.clone(),
        }),
        Arc::new(clock.clone()),
        config(),
    )
    .unwrap();
    for _ in 0..5 {
        d.tick().await.unwrap();
        clock.advance(1_000);
    }
    let c = d.counters().snapshot();
    assert_eq!((c.superseded, c.stale), (5, 0), "{c:?}");
}

/// A delivery that outlives its claim: meanwhile the lease runs out and
/// another dispatcher claims the same job (same row token, new run token).
struct OutlivesLease {
    index: Arc<MemoryAlarmIndex>,
    clock: ManualClock,
}

impl Dispatch for OutlivesLease {
    async fn dispatch(&self, _d: Delivery) -> DispatchOutcome {
        let later = self.clock.now_ms() + DispatcherConfig::default().effective_lease_ms();
        self.index.promote(later, 10).await.unwrap();
        self.index
            .claim(later, 1_000, &tok("other-run"))
            .await
            .unwrap()
            .unwrap();
        DispatchOutcome::Delivered
    }
}

#[tokio::test]
async fn a_delivery_whose_claim_was_taken_over_counts_as_stale() {
    let clock = ManualClock::new(START);
    let index = Arc::new(MemoryAlarmIndex::new());
    index.upsert(&obj("a"), &tok("t0"), START).await.unwrap();
    let d = Dispatcher::new(
        Arc::clone(&index),
        Arc::new(OutlivesLease {
            index: Arc::clone(&index),
            clock: clock.clone(),
        }),
        Arc::new(clock.clone()),
        config(),
    )
    .unwrap();
    d.tick().await.unwrap();
    let c = d.counters().snapshot();
    assert_eq!((c.superseded, c.stale, c.delivered), (0, 1, 0), "{c:?}");
}
