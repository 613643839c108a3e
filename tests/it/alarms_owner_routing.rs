//! The dispatcher over `OwnerRouted` on a manual clock (issue 14, alarms
//! items 7 and 8): jobs of inactive or deleted storage discard themselves
//! instead of spinning, and "owner elsewhere" refusals wait for the remote
//! owner's lease instead of retrying in a hot loop.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use durability_alarms::{
    AlarmIndex, Delivery, Dispatch, DispatchOutcome, Dispatcher, DispatcherConfig, Forward,
    MemoryAlarmIndex, ObjectId, OwnerRouted, RemoteOwner, ScopeOf, Token,
};
use durability_ownership::memory::InMemoryLeaseStore;
use durability_ownership::{
    DeleteLock, LifecycleAdmin, LifecycleId, ManualClock, Ownership, OwnershipSettings, StorageId,
    TaskId,
};

use crate::support::{Local, Log, Rooms, START, rooms};

const TTL: u64 = 10_000;

/// The transport to a dead owner: the connection is refused, so the
/// delivery provably never started there.
#[derive(Clone, Default)]
struct DeadOwner(Arc<AtomicU64>);
impl Forward for DeadOwner {
    async fn forward(&self, _owner: &RemoteOwner, _d: Delivery) -> DispatchOutcome {
        self.0.fetch_add(1, Ordering::SeqCst);
        DispatchOutcome::NeverStarted {
            reason: "connection refused".to_owned(),
        }
    }
}

type Store = Arc<InMemoryLeaseStore<ManualClock>>;
type Host = OwnerRouted<Local, DeadOwner, Store, ManualClock>;

struct World {
    clock: ManualClock,
    store: Store,
    lifecycle: LifecycleId,
    scope_of: ScopeOf,
    log: Log,
}

async fn world() -> World {
    let clock = ManualClock::new(START);
    let Rooms {
        store,
        lifecycle,
        scope_of,
    } = rooms(&clock).await;
    World {
        clock,
        store,
        lifecycle,
        scope_of,
        log: Arc::default(),
    }
}

impl World {
    fn ownership(&self, task: &str) -> Ownership<Store, ManualClock> {
        Ownership::new(
            Arc::clone(&self.store),
            self.clock.clone(),
            TaskId::new(task).unwrap(),
            OwnershipSettings {
                owner_ttl_ms: TTL,
                lease_guard_ms: 1_000,
                ..OwnershipSettings::default()
            },
        )
    }

    fn host(&self, task: &'static str, forward: DeadOwner) -> Host {
        OwnerRouted::new(
            Local(task, self.log.clone()),
            forward,
            self.ownership(task),
            self.scope_of.clone(),
        )
    }

    fn dispatcher(
        &self,
        index: &Arc<MemoryAlarmIndex>,
        host: Host,
    ) -> Dispatcher<MemoryAlarmIndex, Host> {
        Dispatcher::new(
            Arc::clone(index),
            Arc::new(host),
            Arc::new(self.clock.clone()),
            DispatcherConfig {
                seed: Some(7),
                ..DispatcherConfig::default()
            },
        )
        .unwrap()
    }
}

fn obj(s: &str) -> ObjectId {
    ObjectId::new(s).unwrap()
}

async fn job_with_alarm(index: &MemoryAlarmIndex, object: &str) {
    index
        .upsert(&obj(object), &Token::new("row1").unwrap(), START)
        .await
        .unwrap();
}

async fn tick_for(w: &World, d: &Dispatcher<MemoryAlarmIndex, Host>, ticks: u32, step: i64) {
    for _ in 0..ticks {
        d.tick().await.unwrap();
        w.clock.advance(step);
    }
}

/// A world and an index holding one due alarm of `room-1`.
async fn world_with_job() -> (World, Arc<MemoryAlarmIndex>) {
    let w = world().await;
    let index = Arc::new(MemoryAlarmIndex::new());
    job_with_alarm(&index, "room-1").await;
    (w, index)
}

/// Host A's dispatcher over `index`, ticked `ticks` times 100 ms apart.
async fn host_a_ticks(
    w: &World,
    index: &Arc<MemoryAlarmIndex>,
    ticks: u32,
) -> Dispatcher<MemoryAlarmIndex, Host> {
    let d = w.dispatcher(index, w.host("host-a", DeadOwner::default()));
    tick_for(w, &d, ticks, 100).await;
    d
}

/// [`world_with_job`] with `lock` set on the worker.
async fn world_with_job_under(lock: DeleteLock) -> (World, Arc<MemoryAlarmIndex>) {
    let (w, index) = world_with_job().await;
    w.store
        .set_delete_lock(&w.lifecycle, Some(lock))
        .await
        .unwrap();
    (w, index)
}

/// Host A's dispatcher, ticked for five seconds, discards `room-1`'s job
/// without a retry.
async fn assert_room_1_job_discards_itself(w: &World, index: &Arc<MemoryAlarmIndex>) {
    let d = host_a_ticks(w, index, 50).await;
    let c = d.counters().snapshot();
    assert_eq!((c.gone, c.retried), (1, 0), "{c:?}");
    assert_eq!(index.job(&obj("room-1")).await.unwrap(), None, "discarded");
}

#[tokio::test]
async fn a_job_whose_storage_pointer_is_gone_discards_itself() {
    let (w, index) = world_with_job().await;
    // Whole-worker delete removed the storage pointer; a residual job stays.
    w.store
        .set_active_storage(&w.lifecycle, None)
        .await
        .unwrap();
    assert_room_1_job_discards_itself(&w, &index).await;
    assert!(w.log.lock().unwrap().is_empty(), "nothing ran");
}

#[tokio::test]
async fn a_job_whose_storage_moved_discards_itself() {
    let (w, index) = world_with_job().await;
    // Redeploy after delete: the pointer names a new storage id.
    w.store
        .set_active_storage(&w.lifecycle, Some(&StorageId::new("st2").unwrap()))
        .await
        .unwrap();
    assert_room_1_job_discards_itself(&w, &index).await;
}

#[tokio::test]
async fn a_job_under_a_whole_delete_lock_discards_itself() {
    let (w, index) = world_with_job_under(DeleteLock::Whole).await;
    assert_room_1_job_discards_itself(&w, &index).await;
}

#[tokio::test]
async fn a_version_delete_lock_does_not_discard_the_active_storage_jobs() {
    let (w, index) = world_with_job_under(DeleteLock::Version).await;
    let d = host_a_ticks(&w, &index, 2).await;
    let c = d.counters().snapshot();
    assert_eq!((c.delivered, c.gone), (1, 0), "{c:?}");
    assert_eq!(*w.log.lock().unwrap(), vec!["host-a ran room-1".to_owned()]);
}

#[tokio::test]
async fn owner_elsewhere_waits_for_the_remote_lease_instead_of_a_hot_loop() {
    let w = world().await;
    let index = Arc::new(MemoryAlarmIndex::new());
    // Host A owns room-1's scope (it ran an alarm there), then dies: its lease
    // stays live for TTL, and forwarding to it is refused.
    let a = w.host("host-a", DeadOwner::default());
    let warm = Delivery {
        object: obj("room-1"),
        token: Token::new("warm").unwrap(),
        scheduled_at: START,
        attempt: 1,
        final_attempt: false,
    };
    assert_eq!(a.dispatch(warm).await, DispatchOutcome::Delivered);
    drop(a);
    job_with_alarm(&index, "room-1").await;
    let forwards = DeadOwner::default();
    let d = w.dispatcher(&index, w.host("host-b", forwards.clone()));
    // Three seconds of ticks every 100 ms during the failover.
    tick_for(&w, &d, 30, 100).await;
    assert_eq!(
        forwards.0.load(Ordering::SeqCst),
        1,
        "one forward, then the job waits for the dead owner's lease"
    );
    let job = index.job(&obj("room-1")).await.unwrap().unwrap();
    assert_eq!(job.tries, 0, "never started: no try used");
    let next = index.next_due().await.unwrap().unwrap();
    assert!(
        (START + TTL as i64..=START + TTL as i64 + 1).contains(&next),
        "retried at the lease deadline: {}",
        next - START
    );
    // Once A's lease is over, B takes the scope and runs the alarm itself.
    w.clock.set(next);
    d.tick().await.unwrap();
    assert_eq!(d.counters().snapshot().delivered, 1);
    assert_eq!(
        *w.log.lock().unwrap(),
        vec![
            "host-a ran room-1".to_owned(),
            "host-b ran room-1".to_owned()
        ]
    );
    assert_eq!(forwards.0.load(Ordering::SeqCst), 1);
}

/// A lease store whose owner snapshot read loses its reply (outcome unknown
/// for the read); everything else passes through.
fn snapshot_lost(store: Store) -> durability_ownership::conformance::HookedStore<Store> {
    use durability_ownership::conformance::{Action, HookedStore, Hooks, Method};
    let hooks = Hooks::new();
    hooks.set(|method, _| match method {
        Method::Snapshot => Action::Fail(durability_ownership::OwnershipError::OwnerUnavailable {
            source: "the reply was lost".into(),
        }),
        _ => Action::Pass,
    });
    HookedStore::new(store, hooks)
}

#[tokio::test]
async fn an_admission_whose_snapshot_read_is_lost_never_started_the_handler() {
    // Admission reads the owner snapshot before the handler runs, so a lost
    // reply there proves the alarm did not run: never started (retried
    // through the owner path), not an unknown outcome that would hold the
    // claim for its whole lease.
    let w = world().await;
    let host = OwnerRouted::new(
        Local("host-a", w.log.clone()),
        DeadOwner::default(),
        Ownership::new(
            snapshot_lost(Arc::clone(&w.store)),
            w.clock.clone(),
            TaskId::new("host-a").unwrap(),
            OwnershipSettings {
                owner_ttl_ms: TTL,
                lease_guard_ms: 1_000,
                ..OwnershipSettings::default()
            },
        ),
        w.scope_of.clone(),
    );
    let outcome = host
        .dispatch(Delivery {
            object: obj("room-1"),
            token: Token::new("row1").unwrap(),
            scheduled_at: START,
            attempt: 1,
            final_attempt: false,
        })
        .await;
    assert!(
        matches!(outcome, DispatchOutcome::NeverStarted { .. }),
        "{outcome:?}"
    );
    assert!(w.log.lock().unwrap().is_empty(), "the handler did not run");
}
