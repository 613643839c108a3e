//! Alarm dispatch through the owner router and fence: a delivery goes to the
//! task that owns the object's scope, is admitted there before it runs, and
//! follows ownership when it moves.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use durability_alarms::{
    Delivery, Dispatch, DispatchOutcome, Forward, ObjectId, OwnerRouted, RemoteOwner, ScopeOf,
    Token,
};
use durability_ownership::memory::InMemoryLeaseStore;
use durability_ownership::{ManualClock, Ownership, OwnershipSettings, TaskId};

use crate::support::{Local, Log, Rooms, rooms};

/// The host's transport to the owner: records where it sent the delivery.
struct Send(&'static str, Log);
impl Forward for Send {
    async fn forward(&self, owner: &RemoteOwner, d: Delivery) -> DispatchOutcome {
        self.1.lock().unwrap().push(format!(
            "{} forwarded {} to {}",
            self.0,
            d.object,
            owner.task.as_str()
        ));
        DispatchOutcome::Delivered
    }
}

type Host = OwnerRouted<Local, Send, Arc<InMemoryLeaseStore<ManualClock>>, ManualClock>;

fn delivery(object: &str) -> Delivery {
    Delivery {
        object: ObjectId::new(object).unwrap(),
        token: Token::new("0123456789abcdef0123456789abcdef").unwrap(),
        scheduled_at: 1_000,
        attempt: 1,
        final_attempt: false,
    }
}

fn settings() -> OwnershipSettings {
    OwnershipSettings {
        owner_ttl_ms: 10_000,
        lease_guard_ms: 1_000,
        ..OwnershipSettings::default()
    }
}

async fn world() -> (
    ManualClock,
    Host,
    Host,
    Ownership<Arc<InMemoryLeaseStore<ManualClock>>, ManualClock>,
    Log,
) {
    let clock = ManualClock::new(1_000_000);
    let Rooms {
        store, scope_of, ..
    } = rooms(&clock).await;
    let log: Log = Arc::default();
    let owner = |name: &str| {
        Ownership::new(
            Arc::clone(&store),
            clock.clone(),
            TaskId::new(name).unwrap(),
            settings(),
        )
    };
    let b_ownership = owner("host-b");
    let a = OwnerRouted::new(
        Local("host-a", log.clone()),
        Send("host-a", log.clone()),
        owner("host-a"),
        scope_of.clone(),
    );
    let b = OwnerRouted::new(
        Local("host-b", log.clone()),
        Send("host-b", log.clone()),
        b_ownership.clone(),
        scope_of,
    );
    (clock, a, b, b_ownership, log)
}

#[tokio::test]
async fn deliveries_follow_the_owner_and_pass_admission() {
    let (clock, a, b, b_ownership, log) = world().await;
    // Each step: the host asked, whether A's lease runs out first, and what
    // happens; every delivery reports `Delivered`.
    for (host, lease_runs_out, what) in [
        (
            &a,
            false,
            "host A is asked first: it claims the scope and runs the alarm itself",
        ),
        (
            &b,
            false,
            "host B's dispatcher finds A owning the scope and forwards to it",
        ),
        (
            &b,
            true,
            "A stops renewing; once its lease runs out, B takes over and runs it",
        ),
        (
            &a,
            false,
            "A, waking up, no longer owns the scope: it forwards to B instead of running",
        ),
    ] {
        if lease_runs_out {
            clock.advance(10_001);
        }
        assert_eq!(
            host.dispatch(delivery("room-1")).await,
            DispatchOutcome::Delivered,
            "{what}"
        );
    }
    assert_eq!(
        *log.lock().unwrap(),
        vec![
            "host-a ran room-1".to_owned(),
            "host-b forwarded room-1 to host-a".to_owned(),
            "host-b ran room-1".to_owned(),
            "host-a forwarded room-1 to host-b".to_owned(),
        ]
    );
    // A draining host admits nothing: the alarm provably never started there,
    // so the dispatcher retries it at once (and routing finds the next owner).
    let _ = b_ownership.drain().await;
    match b.dispatch(delivery("room-1")).await {
        DispatchOutcome::NeverStarted { reason } => {
            assert!(reason.contains("draining"), "{reason}")
        }
        other => panic!("expected never started, got {other:?}"),
    }
    assert_eq!(
        log.lock().unwrap().len(),
        4,
        "nothing ran on the draining host"
    );
}

#[tokio::test]
async fn an_object_without_a_scope_is_a_definite_failure() {
    let (_clock, _a, _b, ownership, log) = world().await;
    // A mapping that cannot name the object's scope is reported as a
    // definite failure (retried with backoff, then discarded), and nothing runs.
    let bad: ScopeOf = Arc::new(|_| Err("no scope for this object".to_owned()));
    let host = OwnerRouted::new(
        Local("host-x", log.clone()),
        Send("host-x", log.clone()),
        ownership,
        bad,
    );
    match host.dispatch(delivery("room-9")).await {
        DispatchOutcome::Failed { reason } => assert!(reason.contains("no scope")),
        other => panic!("expected a failure, got {other:?}"),
    }
    assert!(log.lock().unwrap().is_empty());
}
