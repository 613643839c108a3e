//! The topology coordinator end to end on the in-memory storage and on
//! SQLite files: update/delete/snapshot/migrate, member rules and bounds,
//! publication with write records and landing deadlines (failing, hanging,
//! late and evicted writes), state channels, and crash injection at every
//! write step.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use durability_outbox::EventKind;
use durability_scheduler::testkit::{CrashMode, CrashStorage, MemoryStorage};
use durability_scheduler::{Clock as _, ManualClock, SchedulerTx, SchemaTarget, Storage};
use durability_storage_sqlite::{SqliteOptions, SqliteStorage, Synchronous};
use durability_topology::conformance::{MemoryPublication, memory_storage};
use durability_topology::{
    Draft, LANDING_WINDOW_MS, MAX_STATE_BYTES, MemberInput, MemberState, Publisher, Topology,
    TopologyError, TopologyEvent, TopologyTx, UpdateOutcome,
};
use durability_topology_client::{MAX_MEMBERS, MAX_META_BYTES};
use serde_json::json;
use support::{
    Coord, FaultyPublisher, MemberMode, Members, PubMode, START, TIMEOUT, idle, open, with_clock,
};

fn memory() -> Arc<MemoryStorage> {
    Arc::new(memory_storage())
}

fn shards(group: &str, n: usize) -> Vec<MemberInput> {
    (0..n)
        .map(|i| MemberInput::active(format!("{group}-{i}")))
        .collect()
}

fn ids(s: &durability_topology::Snapshot) -> Vec<(&str, MemberState)> {
    s.members.iter().map(|m| (m.id.as_str(), m.state)).collect()
}

struct World {
    clock: ManualClock,
    publisher: FaultyPublisher,
    members: Members,
    c: Coord<MemoryStorage>,
    storage: Arc<MemoryStorage>,
}

fn world_with(store: MemoryPublication) -> World {
    let clock = ManualClock::new(START);
    let publisher = FaultyPublisher::new(store, &clock);
    opened(clock, publisher, Members::default(), memory())
}

/// A [`World`] whose coordinator is opened on `storage`.
fn opened(
    clock: ManualClock,
    publisher: FaultyPublisher,
    members: Members,
    storage: Arc<MemoryStorage>,
) -> World {
    let c = open(Arc::clone(&storage), &clock, &publisher, &members);
    World {
        clock,
        publisher,
        members,
        c,
        storage,
    }
}

fn world() -> World {
    world_with(MemoryPublication::plain())
}

/// Starts an update of `g` (one member) whose write hangs, then evicts
/// the object mid-write (the update and the background work aborted, the
/// in-memory object dropped) and reopens it on the same storage with a
/// publisher that works again.
async fn evicted_mid_write(w: World) -> World {
    w.publisher.set_mode(PubMode::Hang);
    let t = w.c.topology.clone();
    let pending_update = tokio::spawn(async move {
        t.update("g", |_| Draft::new().members(shards("g", 1)))
            .await
    });
    crate::support::wait_for_sleeper(&w.clock).await;
    pending_update.abort();
    w.c.sched.abort_background();
    let World {
        clock,
        publisher,
        members,
        c,
        storage,
    } = w;
    drop(c);
    publisher.set_mode(PubMode::Ok);
    opened(clock, publisher, members, storage)
}

/// Commits group `g` with `n` active members (`g-0`, …).
async fn members_of_g<S: Storage, P: Publisher>(t: &Topology<S, P>, n: usize) -> UpdateOutcome
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    t.update("g", |_| Draft::new().members(shards("g", n)))
        .await
        .unwrap()
}

/// Adds `member` to `group`'s current members.
async fn join<S: Storage>(
    t: &Topology<S, FaultyPublisher>,
    group: &str,
    member: MemberInput,
) -> UpdateOutcome
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    t.update(group, |cur| {
        let mut m: Vec<MemberInput> = cur.members.iter().map(MemberInput::from).collect();
        m.push(member);
        Draft::new().members(m)
    })
    .await
    .unwrap()
}

/// Asserts that `n` deliveries or publications are pending on `t`.
fn assert_pending<S: Storage, P: Publisher>(t: &Topology<S, P>, n: u64, why: &str)
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    assert_eq!(t.pending().unwrap(), n, "{why}");
}

/// The outbox's first `RetryScheduled` time in `events`.
fn first_retry_at(events: &std::sync::Mutex<Vec<durability_outbox::OutboxEvent>>) -> i64 {
    events
        .lock()
        .unwrap()
        .iter()
        .find_map(|e| match e.kind {
            EventKind::RetryScheduled { next_at, .. } => Some(next_at),
            _ => None,
        })
        .unwrap()
}

/// A coordinator on a SQLite file in a directory of its own (returned:
/// keep it), its publisher (on a plain publication store) and members.
fn on_sqlite() -> (
    tempfile::TempDir,
    FaultyPublisher,
    Members,
    Coord<SqliteStorage>,
) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let publisher = FaultyPublisher::new(MemoryPublication::plain(), &clock);
    let members = Members::default();
    let c = open(sqlite(&dir), &clock, &publisher, &members);
    (dir, publisher, members, c)
}

/// The version the publication store holds for `g` once the clock is at
/// `START + 5 s` and every background write settled.
async fn published_after_settling(w: &World) -> u64 {
    w.clock.set(START + 5_000);
    idle().await;
    w.c.sched.settle().await;
    w.publisher.published("g").await.unwrap().version
}

/// A [`world`] whose `g` was seeded with member `a` and `failing` (whose
/// deliveries fail), with `channel` set, after one delivery: `failing`'s
/// is left pending (asserted).
async fn world_with_a_failing(failing: MemberInput, channel: &str) -> World {
    let w = world();
    let failing_id = failing.id.clone();
    w.members.set_mode(&failing_id, MemberMode::Fail);
    w.seed(vec![MemberInput::active("a"), failing], channel, json!(1))
        .await;
    w.c.topology.deliver_due().await.unwrap();
    let why = format!("{failing_id}'s {channel} delivery is pending a retry");
    assert_pending(&w.c.topology, 1, &why);
    w
}

/// Lets `member` accept deliveries again, runs the deliveries due 10 s
/// later, and asserts that `member` never got `channel`.
async fn assert_never_delivered(w: &World, member: &str, channel: &str) {
    w.members.set_mode(member, MemberMode::Ok);
    w.clock.advance(10_000);
    w.c.topology.deliver_due().await.unwrap();
    assert_eq!(w.members.applied(member, channel), None);
}

impl World {
    /// Commits group `g` with `members` and the one state channel `channel`
    /// set to `value`.
    async fn seed(&self, members: Vec<MemberInput>, channel: &str, value: serde_json::Value) {
        self.c
            .topology
            .update("g", |_| Draft::new().members(members).state(channel, value))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn update_commits_publishes_and_bumps_the_version_only_on_real_change() {
    let w = world();
    let t = &w.c.topology;
    let out = t
        .update("tenant", |cur| {
            assert!(cur.members.is_empty());
            Draft::new().members(vec![
                MemberInput::active("b"),
                MemberInput::active("a").location_hint("weur"),
            ])
        })
        .await
        .unwrap();
    assert!(out.published);
    assert_eq!(out.snapshot.version, 1);
    assert_eq!(out.snapshot.coordinator, "coordinator-1");
    assert_eq!(
        ids(&out.snapshot),
        vec![("a", MemberState::Active), ("b", MemberState::Active)],
        "sorted"
    );
    assert_eq!(w.publisher.published("tenant").await.unwrap(), out.snapshot);
    let joined = out.snapshot.members[0].joined_at;
    assert_eq!(joined, START);

    // The same members in another order: no change, no version, no write.
    w.clock.advance(10);
    let calls = w.publisher.calls();
    let same = t
        .update("tenant", |cur| {
            Draft::new().members(cur.members.iter().rev().map(MemberInput::from))
        })
        .await
        .unwrap();
    assert_eq!(
        same.snapshot.version, 1,
        "unchanged membership keeps the version"
    );
    assert!(same.published);
    assert_eq!(w.publisher.calls(), calls, "nothing new to publish");

    // A state change alone does not bump the version either.
    let s = t
        .update("tenant", |_| {
            Draft::new().state("limits", json!({"rps": 5}))
        })
        .await
        .unwrap();
    assert_eq!(s.snapshot.version, 1);

    // A real change bumps it; joinedAt of existing members is kept.
    let grown = join(t, "tenant", MemberInput::active("c")).await;
    assert_eq!(grown.snapshot.version, 2);
    assert_eq!(grown.snapshot.members[0].joined_at, joined, "joinedAt kept");
    assert_eq!(grown.snapshot.members[2].joined_at, START + 10);
    assert_eq!(w.publisher.published("tenant").await.unwrap().version, 2);
    assert_eq!(t.snapshot("tenant").unwrap().unwrap(), grown.snapshot);
    assert_eq!(t.states("tenant").unwrap()["limits"], json!({"rps": 5}));
}

#[tokio::test]
async fn invalid_drafts_are_rejected_with_typed_errors_and_nothing_is_written() {
    let w = world();
    let t = &w.c.topology;
    w.seed(shards("g", 2), "limits", json!(1)).await;
    t.deliver_due().await.unwrap();
    let before = (
        t.snapshot("g").unwrap(),
        t.states("g").unwrap(),
        w.publisher.calls(),
    );
    let long = "x".repeat(257);
    let big_meta = json!("m".repeat(MAX_META_BYTES));
    type Next = Box<dyn Fn(&durability_topology::Current) -> Draft>;
    let cases: Vec<(&str, Next)> = vec![
        (
            "TOPOLOGY_EMPTY_MEMBERS",
            Box::new(|_| Draft::new().members(vec![])),
        ),
        (
            "TOPOLOGY_DUPLICATE_MEMBER",
            Box::new(|_| {
                Draft::new().members(vec![MemberInput::active("a"), MemberInput::active("a")])
            }),
        ),
        (
            "TOPOLOGY_INVALID_MEMBER",
            Box::new(|_| Draft::new().members(vec![MemberInput::active("")])),
        ),
        (
            "TOPOLOGY_INVALID_MEMBER",
            Box::new(|_| Draft::new().members(vec![MemberInput::active("a\nb")])),
        ),
        (
            "TOPOLOGY_INVALID_MEMBER",
            Box::new(move |_| Draft::new().members(vec![MemberInput::active(long.clone())])),
        ),
        (
            "TOPOLOGY_INVALID_MEMBER",
            Box::new(|_| {
                Draft::new().members(vec![MemberInput::active("a").location_hint("h".repeat(65))])
            }),
        ),
        (
            "TOPOLOGY_METADATA_TOO_LARGE",
            Box::new(move |_| {
                Draft::new().members(vec![MemberInput::active("a").meta(big_meta.clone())])
            }),
        ),
        (
            "TOPOLOGY_TOO_MANY_MEMBERS",
            Box::new(|_| Draft::new().members(shards("g", MAX_MEMBERS + 1))),
        ),
        (
            "TOPOLOGY_UNKNOWN_CHANNEL",
            Box::new(|_| Draft::new().state("nope", json!(1))),
        ),
        (
            "TOPOLOGY_STATE_TOO_LARGE",
            Box::new(|_| Draft::new().state("limits", json!("s".repeat(MAX_STATE_BYTES)))),
        ),
        // Valid members with an invalid state: the members are not written either.
        (
            "TOPOLOGY_UNKNOWN_CHANNEL",
            Box::new(|_| Draft::new().members(shards("g", 5)).state("nope", json!(1))),
        ),
    ];
    for (code, next) in cases {
        let err = t.update("g", |c| next(c)).await.unwrap_err();
        assert_eq!(err.code(), code, "{err}");
        assert!(!err.is_retryable());
        assert_eq!(
            (
                t.snapshot("g").unwrap(),
                t.states("g").unwrap(),
                w.publisher.calls()
            ),
            before,
            "{code}: nothing written"
        );
        assert_pending(t, 0, &format!("{code}: nothing staged"));
    }
    let err = t.update("missing", |_| Draft::new()).await.unwrap_err();
    assert_eq!(err.code(), "TOPOLOGY_GROUP_NOT_FOUND");
    assert_eq!(t.snapshot("missing").unwrap(), None);
    for bad in ["", "a\u{0}b", &"g".repeat(257)] {
        let err = t.update(bad, |_| Draft::new()).await.unwrap_err();
        assert_eq!(err.code(), "TOPOLOGY_INVALID_GROUP");
        assert_eq!(
            t.delete(bad).await.unwrap_err().code(),
            "TOPOLOGY_INVALID_GROUP"
        );
    }
}

#[tokio::test]
async fn delete_drops_members_and_states_and_versions_keep_counting() {
    let w = world();
    let t = &w.c.topology;
    w.seed(shards("g", 3), "limits", json!(1)).await;
    let out = t.delete("g").await.unwrap();
    assert!(out.published);
    assert_eq!(t.snapshot("g").unwrap(), None);
    assert!(t.states("g").unwrap().is_empty());
    assert_eq!(
        w.publisher.published("g").await,
        None,
        "the snapshot is deleted"
    );
    assert_eq!(
        w.publisher.landed.lock().unwrap().last().unwrap(),
        &("g".into(), 2, true)
    );
    assert_pending(t, 0, "pending deliveries were discarded");
    // Deleting again, or a group that never existed, is a no-op.
    assert!(t.delete("g").await.unwrap().published);
    assert!(t.delete("never").await.unwrap().published);
    let err = t.update("g", |_| Draft::new()).await.unwrap_err();
    assert_eq!(err.code(), "TOPOLOGY_GROUP_NOT_FOUND");
    let again = t
        .update("g", |cur| {
            assert!(cur.members.is_empty() && cur.states.is_empty());
            Draft::new().members(shards("g", 1))
        })
        .await
        .unwrap();
    assert_eq!(
        again.snapshot.version, 3,
        "a recreated group is newer than anything cached"
    );
}

#[tokio::test]
async fn migrate_reverts_and_reapplies_only_the_topology_tables() {
    let storage = memory();
    let clock = ManualClock::new(START);
    let p = FaultyPublisher::new(MemoryPublication::plain(), &clock);
    let c = open(Arc::clone(&storage), &clock, &p, &Members::default());
    drop(c);
    assert_eq!(
        Topology::<MemoryStorage>::migrate(&storage, &SchemaTarget::Nothing).unwrap(),
        None
    );
    let versions = storage
        .transaction(|tx| {
            Ok::<_, durability_scheduler::StorageError>((
                tx.schema_version("topology")?,
                tx.schema_version("outbox")?,
            ))
        })
        .unwrap();
    // The outbox schema stays at its latest step (2: the quarantine).
    assert_eq!(versions, (None, Some(2)), "the outbox schema is untouched");
    assert_eq!(
        Topology::<MemoryStorage>::migrate(&storage, &SchemaTarget::Latest).unwrap(),
        Some(1)
    );
    let err = Topology::<MemoryStorage>::migrate(&storage, &SchemaTarget::Named("nope".into()))
        .unwrap_err();
    assert_eq!(err.code(), "SCHEDULER_UNKNOWN_SCHEMA_TARGET");
}

#[tokio::test]
async fn lifecycle_events_name_the_publication_and_state_channels() {
    let w = world();
    w.c.topology
        .update("g", |_| {
            Draft::new()
                .members(shards("g", 1))
                .state("limits", json!(1))
        })
        .await
        .unwrap();
    w.c.topology.deliver_due().await.unwrap();
    let events = w.c.events.lock().unwrap().clone();
    assert!(events.iter().any(|e| e.channel == "durability.topology"
        && e.key == "g"
        && e.kind == EventKind::Delivered));
    assert!(
        events
            .iter()
            .any(|e| e.channel == "durability.topology.limits"
                && e.key == r#"["g","g-0"]"#
                && e.kind == EventKind::Delivered)
    );
}

// ---- Publishing ----

#[tokio::test]
async fn a_failed_write_returns_published_false_and_the_outbox_keeps_going() {
    let w = world();
    w.publisher.set_mode(PubMode::Fail(1));
    let out = members_of_g(&w.c.topology, 1).await;
    assert!(!out.published, "the write failed");
    assert_eq!(
        w.c.topology.snapshot("g").unwrap().unwrap().version,
        1,
        "committed either way"
    );
    assert_eq!(w.publisher.published("g").await, None);
    w.clock.advance(1_000);
    w.c.topology.deliver_due().await.unwrap();
    assert_eq!(w.publisher.published("g").await.unwrap().version, 1);
    assert_eq!(w.c.topology.pending().unwrap(), 0);
    let outstanding = w
        .storage
        .transaction(|tx| tx.topology_outstanding_until("g", START))
        .unwrap();
    assert_eq!(outstanding, None, "a rejected write is forgotten at once");
}

#[tokio::test]
async fn only_the_newest_snapshot_of_a_group_is_pending() {
    let w = world();
    w.publisher.set_mode(PubMode::Fail(100));
    for n in 1..=3 {
        w.c.topology
            .update("g", |_| Draft::new().members(shards("g", n)))
            .await
            .unwrap();
    }
    w.publisher.set_mode(PubMode::Ok);
    w.clock.advance(1_000);
    let before = w.publisher.landed.lock().unwrap().len();
    w.c.topology.deliver_due().await.unwrap();
    let landed = w.publisher.landed.lock().unwrap()[before..].to_vec();
    assert_eq!(
        landed,
        vec![("g".to_owned(), 3, false)],
        "only v3 is written"
    );
}

#[tokio::test]
async fn a_write_hanging_past_its_timeout_holds_newer_writes_until_its_landing_deadline() {
    let w = world();
    w.publisher.set_mode(PubMode::Hang);
    let t = w.c.topology.clone();
    let out = with_clock(&w.clock, async move { members_of_g(&t, 1).await }).await;
    assert!(!out.published);
    assert_eq!(
        w.clock.now_ms(),
        START + TIMEOUT as i64,
        "the write was abandoned at its timeout"
    );
    let land_by = START + TIMEOUT as i64 + LANDING_WINDOW_MS;
    let outstanding = w
        .storage
        .transaction(|tx| tx.topology_outstanding_until("g", w.clock.now_ms()))
        .unwrap();
    assert_eq!(
        outstanding,
        Some(land_by),
        "the write record outlives the write"
    );

    // A newer write succeeds but is not acknowledged while the old one may land.
    w.publisher.set_mode(PubMode::Ok);
    let out = members_of_g(&w.c.topology, 2).await;
    assert!(!out.published, "an older write may still land over it");
    assert_eq!(w.publisher.published("g").await.unwrap().version, 2);
    let writes = w.publisher.landed.lock().unwrap().len();
    w.clock.set(land_by - 1);
    w.c.topology.deliver_due().await.unwrap();
    assert_eq!(
        w.publisher.landed.lock().unwrap().len(),
        writes,
        "nothing before the deadline"
    );
    w.clock.set(land_by);
    w.c.topology.deliver_due().await.unwrap();
    let landed = w.publisher.landed.lock().unwrap().clone();
    assert_eq!(landed.len(), writes + 1, "written again at the deadline");
    assert_eq!(landed.last().unwrap(), &("g".to_owned(), 2, false));
    assert_eq!(w.c.topology.pending().unwrap(), 0, "then acknowledged");
}

#[tokio::test]
async fn an_abandoned_write_that_lands_late_restages_the_latest_snapshot() {
    let w = world();
    w.publisher.set_mode(PubMode::Slow(5_000));
    let t = w.c.topology.clone();
    let clock = w.clock.clone();
    let handle = tokio::spawn(async move { members_of_g(&t, 1).await });
    while w.clock.next_wake().is_none() {
        tokio::task::yield_now().await;
    }
    clock.advance(TIMEOUT as i64);
    let out = handle.await.unwrap();
    assert!(!out.published, "timed out");
    w.publisher.set_mode(PubMode::Ok);
    let v2 = members_of_g(&w.c.topology, 2).await;
    assert!(!v2.published);
    assert_eq!(w.publisher.published("g").await.unwrap().version, 2);
    // The abandoned v1 lands late, over v2 (a plain store is last-write-wins) …
    assert_eq!(
        published_after_settling(&w).await,
        1,
        "the late write landed"
    );
    // … and the coordinator restaged v2 at once, so the next run repairs it.
    w.c.topology.deliver_due().await.unwrap();
    assert_eq!(
        w.publisher.published("g").await.unwrap().version,
        2,
        "repaired"
    );
    assert_eq!(
        w.c.topology.pending().unwrap(),
        0,
        "acknowledged: no record is left"
    );
}

#[tokio::test]
async fn a_version_aware_store_never_lets_a_late_old_write_overwrite_a_newer_snapshot() {
    let w = world_with(MemoryPublication::versioned());
    w.publisher.set_mode(PubMode::Slow(5_000));
    let t = w.c.topology.clone();
    let handle = tokio::spawn(async move { members_of_g(&t, 1).await });
    while w.clock.next_wake().is_none() {
        tokio::task::yield_now().await;
    }
    w.clock.advance(TIMEOUT as i64);
    handle.await.unwrap();
    w.publisher.set_mode(PubMode::Ok);
    members_of_g(&w.c.topology, 2).await;
    assert_eq!(
        published_after_settling(&w).await,
        2,
        "the late v1 was refused by the store itself"
    );
}

#[tokio::test]
async fn an_eviction_mid_write_makes_the_reopened_object_wait_for_the_landing_deadline() {
    let w = evicted_mid_write(world()).await;
    let (clock, publisher, c) = (&w.clock, &w.publisher, &w.c);
    assert_eq!(
        c.topology.snapshot("g").unwrap().unwrap().version,
        1,
        "the commit survived"
    );
    // The claimed attempt is retried after its deadline; the write record
    // left by the lost write holds the acknowledgement until it can no
    // longer land, then the snapshot is written again.
    clock.advance(2 * TIMEOUT as i64);
    c.topology.deliver_due().await.unwrap();
    assert_eq!(publisher.published("g").await.unwrap().version, 1);
    assert_eq!(
        c.topology.pending().unwrap(),
        1,
        "held by the lost write's record"
    );
    clock.set(START + TIMEOUT as i64 + LANDING_WINDOW_MS);
    c.topology.deliver_due().await.unwrap();
    assert_eq!(c.topology.pending().unwrap(), 0);
}

// ---- State channels ----

#[tokio::test]
async fn write_channels_reach_active_members_and_read_channels_draining_ones_too() {
    let w = world();
    let out =
        w.c.topology
            .update("g", |_| {
                Draft::new()
                    .members(vec![MemberInput::active("a"), MemberInput::draining("d")])
                    .state("limits", json!({"rps": 10}))
                    .state("schema", json!(7))
            })
            .await
            .unwrap();
    let t = &w.c.topology;
    assert_pending(
        t,
        3,
        "staged in the same transaction: a/limits, a/schema, d/schema",
    );
    t.deliver_due().await.unwrap();
    assert_eq!(w.members.applied("a", "limits"), Some(json!({"rps": 10})));
    assert_eq!(w.members.applied("a", "schema"), Some(json!(7)));
    assert_eq!(
        w.members.applied("d", "limits"),
        None,
        "draining members are not in the write role"
    );
    assert_eq!(w.members.applied("d", "schema"), Some(json!(7)));
    let update = &w.members.received("a")[0];
    assert_eq!(update.group, "g");
    assert_eq!(update.topology_version, out.snapshot.version);
    assert!(update.version > 0);
}

#[tokio::test]
async fn a_member_entering_a_role_gets_the_current_value_and_others_are_not_redelivered() {
    let w = world();
    let t = &w.c.topology;
    w.seed(vec![MemberInput::active("a")], "limits", json!(1))
        .await;
    t.deliver_due().await.unwrap();
    let out = join(t, "g", MemberInput::active("b")).await;
    assert_pending(t, 1, "only the new member's delivery is staged");
    t.deliver_due().await.unwrap();
    assert_eq!(w.members.applied("b", "limits"), Some(json!(1)));
    assert_eq!(
        w.members.received("b")[0].topology_version,
        out.snapshot.version
    );
    assert_eq!(
        w.members.received("a").len(),
        1,
        "unchanged values are not redelivered"
    );
    // Setting the value it already has delivers nothing.
    t.update("g", |_| Draft::new().state("limits", json!(1)))
        .await
        .unwrap();
    assert_eq!(t.pending().unwrap(), 0);
    // Changing it reaches every member in the role with a newer version.
    t.update("g", |_| Draft::new().state("limits", json!(2)))
        .await
        .unwrap();
    t.deliver_due().await.unwrap();
    let a = w.members.received("a");
    assert_eq!(a.len(), 2);
    assert!(a[1].version > a[0].version, "versions only increase");
    assert_eq!(w.members.applied("b", "limits"), Some(json!(2)));
}

#[tokio::test]
async fn a_member_leaving_a_role_loses_its_pending_delivery() {
    let w = world_with_a_failing(MemberInput::active("b"), "limits").await;
    let t = &w.c.topology;
    // b drains: it leaves the write role, and its pending delivery goes.
    t.update("g", |_| {
        Draft::new().members(vec![MemberInput::active("a"), MemberInput::draining("b")])
    })
    .await
    .unwrap();
    assert_eq!(t.pending().unwrap(), 0);
    assert_never_delivered(&w, "b", "limits").await;
    assert!(
        w.c.events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.kind == EventKind::Discarded)
    );
}

#[tokio::test]
async fn members_are_retried_independently_and_a_hanging_member_only_holds_its_batch_until_the_timeout()
 {
    let w = world();
    let t = w.c.topology.clone();
    w.members.set_mode("a", MemberMode::Fail);
    w.members.set_mode("h", MemberMode::Hang);
    w.seed(
        vec![
            MemberInput::active("a"),
            MemberInput::active("b"),
            MemberInput::active("h"),
        ],
        "limits",
        json!(1),
    )
    .await;
    let t2 = t.clone();
    with_clock(&w.clock, async move { t2.deliver_due().await.unwrap() }).await;
    assert!(
        w.clock.now_ms() <= START + TIMEOUT as i64,
        "the hang was cut at the timeout"
    );
    assert_eq!(w.members.applied("b", "limits"), Some(json!(1)));
    assert_eq!(w.members.received("b").len(), 1);
    assert_pending(&t, 2, "a and h retry on their own");
    w.members.set_mode("a", MemberMode::Ok);
    w.members.set_mode("h", MemberMode::Ok);
    w.clock.advance(2_000);
    t.deliver_due().await.unwrap();
    assert_eq!(w.members.applied("a", "limits"), Some(json!(1)));
    assert_eq!(w.members.applied("h", "limits"), Some(json!(1)));
    assert_eq!(w.members.received("b").len(), 1, "b is not redelivered");
    assert_eq!(t.pending().unwrap(), 0);
}

/// Issue 32 item 14: a delivery still running at its attempt timeout is
/// dropped, not left running (the seed's promise would keep going): the
/// member's future stops at the await point it hung on, its drop glue runs
/// and nothing after that point does; the update stays pending and the
/// retry delivers the same version. So `deliver` must be cancel-safe (the
/// `DeliverFn` docs).
#[tokio::test]
async fn a_timed_out_delivery_is_dropped_at_its_await_point_and_retried_with_its_version() {
    let w = world();
    let t = w.c.topology.clone();
    w.members.set_mode("h", MemberMode::Hang);
    w.seed(vec![MemberInput::active("h")], "limits", json!(1))
        .await;
    let t2 = t.clone();
    with_clock(&w.clock, async move { t2.deliver_due().await.unwrap() }).await;
    let started = w.members.started.lock().unwrap().clone();
    assert_eq!(started.len(), 1, "one call started: {started:?}");
    assert_eq!(
        *w.members.dropped.lock().unwrap(),
        started,
        "its future was dropped at the timeout"
    );
    assert!(
        w.members.received("h").is_empty(),
        "nothing past the await point ran"
    );
    assert_pending(&t, 1, "the update stays pending");
    w.members.set_mode("h", MemberMode::Ok);
    w.clock.advance(2_000);
    t.deliver_due().await.unwrap();
    let got = w.members.received("h");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].version, started[0].1, "retried with its version");
    assert_eq!(w.members.applied("h", "limits"), Some(json!(1)));
    assert_eq!(w.members.dropped.lock().unwrap().len(), 1);
    assert_eq!(t.pending().unwrap(), 0);
}

/// Issue 32 item 12: a pending publication whose stored row is corrupt (a
/// version or attempt out of range: quarantined by the outbox; a value
/// that does not decode: dead-lettered) is replaced by the coordinator's
/// newest snapshot, so the store reaches it, across deliveries and a
/// restart (the coordinator reopened from its file). Before, the
/// corruption was reported, the store stayed at v1 while the coordinator
/// held v2, and nothing was pending.
#[tokio::test]
async fn a_corrupt_pending_publication_is_replaced_by_the_newest_snapshot() {
    for damage in [
        "UPDATE durability_outbox SET version = -5 WHERE channel = 'durability.topology'",
        "UPDATE durability_outbox SET attempt = -1 WHERE channel = 'durability.topology'",
        "UPDATE durability_outbox SET value = x'00ff17' WHERE channel = 'durability.topology'",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START);
        let publisher = FaultyPublisher::new(MemoryPublication::plain(), &clock);
        let members = Members::default();
        {
            let c = open(sqlite(&dir), &clock, &publisher, &members);
            let t = &c.topology;
            assert!(members_of_g(t, 1).await.published);
            publisher.set_mode(PubMode::Fail(1));
            let out = members_of_g(t, 2).await;
            assert!(!out.published, "v2 stays pending");
            assert_eq!(out.snapshot.version, 2);
        }
        let raw = rusqlite::Connection::open(dir.path().join("coordinator.db")).unwrap();
        assert_eq!(raw.execute(damage, []).unwrap(), 1, "{damage}");
        // Deliveries: the corrupt row is out of the way and v2 is written.
        let c = open(sqlite(&dir), &clock, &publisher, &members);
        clock.advance(2_000);
        for _ in 0..3 {
            c.topology.deliver_due().await.unwrap();
            idle().await;
        }
        assert_eq!(
            publisher.published("g").await.unwrap().version,
            2,
            "{damage}: the newest snapshot reached the store"
        );
        assert_eq!(c.topology.pending().unwrap(), 0, "{damage}");
        drop(c);
        // A restart finds nothing stuck, and publication goes on.
        let c = open(sqlite(&dir), &clock, &publisher, &members);
        c.topology.deliver_due().await.unwrap();
        assert_eq!(c.topology.pending().unwrap(), 0, "{damage}");
        assert_eq!(publisher.published("g").await.unwrap().version, 2);
        let out = c
            .topology
            .update("g", |_| Draft::new().members(shards("g", 3)))
            .await
            .unwrap();
        assert!(out.published, "{damage}");
        assert_eq!(publisher.published("g").await.unwrap().version, 3);
    }
}

// ---- Crash injection ----

fn sqlite(dir: &tempfile::TempDir) -> Arc<SqliteStorage> {
    let options = SqliteOptions {
        synchronous: Synchronous::Off,
        ..SqliteOptions::default()
    };
    Arc::new(SqliteStorage::open(dir.path().join("coordinator.db"), options).unwrap())
}

/// The script: create, set a value, grow, drain, delete, recreate.
fn script() -> Vec<(Option<Vec<MemberInput>>, Option<serde_json::Value>, bool)> {
    vec![
        (Some(shards("t", 3)), Some(json!({"rps": 1})), false),
        (None, Some(json!({"rps": 2})), false),
        (
            Some(vec![
                MemberInput::active("t-0"),
                MemberInput::draining("t-1"),
                MemberInput::active("t-2"),
                MemberInput::active("t-3"),
            ]),
            None,
            false,
        ),
        (None, None, true),
        (Some(shards("t", 2)), Some(json!({"rps": 3})), false),
        (None, Some(json!({"rps": 4})), false),
    ]
}

async fn apply<S: Storage>(
    c: &Coord<S>,
    step: &(Option<Vec<MemberInput>>, Option<serde_json::Value>, bool),
) -> Result<(), TopologyError>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    let (members, value, delete) = step.clone();
    if delete {
        return c.topology.delete("t").await.map(|_| ());
    }
    c.topology
        .update("t", move |_| {
            let mut d = Draft::new();
            if let Some(m) = members {
                d = d.members(m);
            }
            if let Some(v) = value {
                d = d.state("limits", v);
            }
            d
        })
        .await
        .map(|_| ())
}

/// Drives publication and deliveries until nothing is pending.
async fn converge<S: Storage>(c: &Coord<S>, clock: &ManualClock)
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    for _ in 0..40 {
        c.topology.deliver_due().await.unwrap();
        if c.topology.pending().unwrap() == 0 {
            return;
        }
        clock.advance(30_000);
    }
    panic!("did not converge");
}

async fn run_crash(crash_at: Option<u64>, mode: CrashMode, faults: u32) -> (u64, bool) {
    let dir = tempfile::tempdir().unwrap();
    let inner = sqlite(&dir);
    let clock = ManualClock::new(START);
    let publisher = FaultyPublisher::new(MemoryPublication::plain(), &clock);
    // With faults, the first writes fail, so write records are settled on
    // the failure path as well as the success path.
    publisher.set_mode(PubMode::Fail(faults));
    let members = Members::default();
    let crashing = Arc::new(CrashStorage::new(Arc::clone(&inner), crash_at, mode));
    let steps = script();
    let mut next = 0;
    let mut crashed = false;
    if let Some(c) = support::try_open(Arc::clone(&crashing), &clock, &publisher, &members) {
        while next < steps.len() {
            if apply(&c, &steps[next]).await.is_err() || crashing.crashed() {
                break;
            }
            c.topology.deliver_due().await.ok();
            if crashing.crashed() {
                break;
            }
            next += 1;
            clock.advance(100);
        }
        c.sched.abort_background();
    }
    crashed |= crashing.crashed();
    let transactions = crashing.transactions();
    if crash_at.is_none() {
        return (transactions, false);
    }
    // Reopen on the files, as a restarted process would, and retry the call
    // that failed, then the rest of the script.
    let c = open(Arc::clone(&inner), &clock, &publisher, &members);
    for step in &steps[next.min(steps.len())..] {
        apply(&c, step).await.unwrap();
        clock.advance(100);
    }
    converge(&c, &clock).await;
    // The store converges to the latest snapshot …
    let latest = c.topology.snapshot("t").unwrap().unwrap();
    assert_eq!(
        publisher.published("t").await.unwrap(),
        latest,
        "crash at {crash_at:?} {mode:?}"
    );
    // … every member in the role converges to the latest value, and no
    // member ever applied an older version.
    for m in latest.writable() {
        assert_eq!(
            members.applied(&m.id, "limits"),
            Some(json!({"rps": 4})),
            "{} at {crash_at:?}",
            m.id
        );
    }
    assert_eq!(
        members.regressions.load(Ordering::SeqCst),
        0,
        "no member was sent an older version after a newer one (crash at {crash_at:?})"
    );
    (transactions, crashed)
}

#[tokio::test]
async fn crash_at_every_write_step_of_update_delete_and_publication_converges() {
    let mut tried = 0;
    for faults in [0, 3] {
        let (total, _) = run_crash(None, CrashMode::BeforeCommit, faults).await;
        assert!(total > 20, "the script makes {total} transactions");
        for mode in [CrashMode::BeforeCommit, CrashMode::AfterCommit] {
            for n in 1..=total {
                let (_, crashed) = run_crash(Some(n), mode, faults).await;
                assert!(crashed, "crash point {n} was reached");
                tried += 1;
            }
        }
    }
    eprintln!(
        "topology crash points tried: {tried} (every transaction of the script x 2 modes, with and without publisher faults)"
    );
}

// ---- Conformance on SQLite ----

durability_topology::topology_tx_conformance!(
    sqlite_topology_tx_passes_the_conformance_suite,
    || { SqliteStorage::open_in_memory().unwrap() }
);

#[tokio::test]
async fn sqlite_publication_stores_pass_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let plain =
        durability_storage_sqlite::topology::SqlitePublication::open(dir.path().join("kv.db"))
            .unwrap();
    durability_topology::conformance::run_publication(&plain, &plain, "", false).await;
    let versioned = durability_storage_sqlite::topology::SqlitePublication::open_versioned(
        dir.path().join("kv2.db"),
    )
    .unwrap();
    durability_topology::conformance::run_publication(&versioned, &versioned, "", true).await;
    // A reader with its own connection on the same file sees what was written.
    let reader =
        durability_storage_sqlite::topology::SqlitePublication::open(dir.path().join("kv2.db"))
            .unwrap();
    use durability_topology_client::ReadStore as _;
    assert!(reader.read("g").await.unwrap().is_some());
}

// ---- Configuration, no publisher, end to end ----

#[tokio::test]
async fn without_a_publisher_membership_is_only_visible_inside_the_coordinator() {
    let clock = ManualClock::new(START);
    let ctx = durability_scheduler::ObjectContext::with_clock(
        durability_scheduler::ObjectId::new("solo").unwrap(),
        memory(),
        Arc::new(clock.clone()),
    );
    let sched = durability_scheduler::Scheduler::new(ctx).unwrap();
    let t = Topology::attach(&sched, durability_topology::TopologyConfig::new()).unwrap();
    let out = members_of_g(&t, 2).await;
    assert!(out.published, "nothing to publish is trivially final");
    assert_eq!(t.pending().unwrap(), 0);
    assert_eq!(t.snapshot("g").unwrap().unwrap().coordinator, "solo");
}

#[tokio::test]
async fn attempt_timeouts_are_validated() {
    let clock = ManualClock::new(START);
    for ms in [0, (1 << 31) as u64] {
        let ctx = durability_scheduler::ObjectContext::with_clock(
            durability_scheduler::ObjectId::new("c").unwrap(),
            memory(),
            Arc::new(clock.clone()),
        );
        let sched = durability_scheduler::Scheduler::new(ctx).unwrap();
        let err = Topology::attach(
            &sched,
            durability_topology::TopologyConfig::new().attempt_timeout_ms(ms),
        )
        .err()
        .unwrap();
        assert_eq!(err.code(), "TOPOLOGY_INVALID_CONFIG");
    }
}

#[tokio::test]
async fn the_retry_delay_controls_the_backoff_of_writes() {
    let w = world();
    w.publisher.set_mode(PubMode::Fail(1));
    members_of_g(&w.c.topology, 1).await;
    let next_at = first_retry_at(&w.c.events);
    assert_eq!(
        next_at,
        START + 1_000,
        "the configured delay, not the default backoff"
    );
    assert_eq!(
        w.c.sched.alarm_at(),
        Some(START + 1_000),
        "the alarm follows it"
    );
}

#[tokio::test]
async fn coordinator_to_sqlite_publication_to_client_on_files() {
    use durability_storage_sqlite::topology::SqlitePublication;
    use durability_topology_client::{ClientConfig, TopologyClient};
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let storage = sqlite(&dir);
    let ctx = durability_scheduler::ObjectContext::with_clock(
        durability_scheduler::ObjectId::new("coordinator-1").unwrap(),
        storage,
        Arc::new(clock.clone()),
    );
    let sched = durability_scheduler::Scheduler::new(ctx).unwrap();
    let kv = dir.path().join("topology.db");
    let t = Topology::attach(
        &sched,
        durability_topology::TopologyConfig::new().publish(SqlitePublication::open(&kv).unwrap()),
    )
    .unwrap();
    let reader = TopologyClient::new(
        SqlitePublication::open(&kv).unwrap(),
        ClientConfig::new().clock(Arc::new(clock.clone())),
    )
    .unwrap();
    let created = t
        .update("tenant", |_| Draft::new().members(shards("tenant", 3)))
        .await
        .unwrap();
    assert!(created.published);
    assert_eq!(*reader.get("tenant").await.unwrap(), created.snapshot);
    let drained = t
        .update("tenant", |cur| {
            Draft::new().members(cur.members.iter().map(|m| {
                let mut m = MemberInput::from(m);
                if m.id == "tenant-0" {
                    m.state = MemberState::Draining;
                }
                m
            }))
        })
        .await
        .unwrap();
    clock.advance(40_000);
    let read = reader.get("tenant").await.unwrap();
    assert_eq!(read.version, drained.snapshot.version);
    assert_eq!(read.writable().count(), 2);
    t.delete("tenant").await.unwrap();
    clock.advance(40_000);
    let err = reader.get("tenant").await.unwrap_err();
    assert_eq!(err.code(), "TOPOLOGY_UNAVAILABLE");
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<TopologyError>();
    check::<Topology<MemoryStorage, FaultyPublisher>>();
    check::<Topology<SqliteStorage, durability_storage_sqlite::topology::SqlitePublication>>();
    check::<durability_topology_client::TopologyClientError>();
    check::<durability_topology_client::TopologyClient<MemoryPublication>>();
    fn future_is_send<F: Future + Send>(_: F) {}
    let w = world();
    future_is_send(w.c.topology.update("g", |_| Draft::new()));
    future_is_send(w.c.topology.delete("g"));
}

#[tokio::test]
async fn members_leave_the_read_set_only_when_a_draft_omits_them() {
    let w = world_with_a_failing(MemberInput::draining("d"), "schema").await;
    let t = &w.c.topology;
    // Still draining: d stays in the read set and keeps its delivery.
    t.update("g", |cur| {
        Draft::new().members(cur.members.iter().map(MemberInput::from))
    })
    .await
    .unwrap();
    assert_eq!(t.pending().unwrap(), 1);
    // Omitted: d leaves the read set and its pending delivery is discarded.
    t.update("g", |_| {
        Draft::new().members(vec![MemberInput::active("a")])
    })
    .await
    .unwrap();
    assert_eq!(t.pending().unwrap(), 0);
    assert_never_delivered(&w, "d", "schema").await;
    assert_eq!(w.members.applied("a", "schema"), Some(json!(1)));
}

#[tokio::test]
async fn publish_settings_do_not_depend_on_builder_order_and_are_validated() {
    let clock = ManualClock::new(START);
    let attach = |config: durability_topology::TopologyConfig<FaultyPublisher>| {
        let ctx = durability_scheduler::ObjectContext::with_clock(
            durability_scheduler::ObjectId::new("c").unwrap(),
            memory(),
            Arc::new(clock.clone()),
        );
        let sched = durability_scheduler::Scheduler::new(ctx).unwrap();
        Topology::attach(&sched, config).map(|t| (sched, t))
    };
    let publisher = FaultyPublisher::new(MemoryPublication::plain(), &clock);
    // An invalid publish timeout is refused whether it is set before or
    // after `.publish()`.
    for before in [true, false] {
        let config = if before {
            durability_topology::TopologyConfig::new()
                .publish_timeout_ms(0)
                .publish(publisher.clone())
        } else {
            durability_topology::TopologyConfig::new()
                .publish(publisher.clone())
                .publish_timeout_ms(0)
        };
        let err = attach(config).err().unwrap();
        assert_eq!(err.code(), "TOPOLOGY_INVALID_CONFIG", "before: {before}");
    }
    // A publish retry delay set before `.publish()` is the one used.
    let config = durability_topology::TopologyConfig::new()
        .publish_retry_delay(Arc::new(|_| 7_000.0))
        .publish(publisher.clone());
    let (events, _, hook) = support::topology_event_log();
    let (_sched, t) = attach(config.on_event(hook)).unwrap();
    publisher.set_mode(PubMode::Fail(1));
    members_of_g(&t, 1).await;
    let next_at = first_retry_at(&events);
    assert_eq!(next_at, START + 7_000, "the delay set before .publish()");
}

#[tokio::test]
async fn numbers_in_metadata_and_states_compare_as_numbers() {
    let w = world();
    let t = &w.c.topology;
    // `g` with member `a` of metadata `meta`, and `limits` set.
    let write = async |meta: serde_json::Value, limits: serde_json::Value| {
        t.update("g", |_| {
            Draft::new()
                .members(vec![MemberInput::active("a").meta(meta)])
                .state("limits", limits)
        })
        .await
        .unwrap()
    };
    let first = write(json!({"w": 1, "r": [2.5, 3]}), json!({"max": 10})).await;
    assert_eq!(first.snapshot.version, 1);
    let calls = w.publisher.calls();
    let events = w.c.events.lock().unwrap().len();
    // The same numbers written another way: no new version, no republish,
    // no new delivery.
    let same = write(json!({"w": 1.0, "r": [2.5, 3.0]}), json!({"max": 10.0})).await;
    assert_eq!(same.snapshot.version, 1, "1 and 1.0 are one number");
    assert_eq!(w.publisher.calls(), calls, "nothing republished");
    assert_eq!(
        w.c.events.lock().unwrap().len(),
        events,
        "nothing staged: the state value did not change either"
    );
    // A real change still bumps the version.
    let changed = t
        .update("g", |_| {
            Draft::new().members(vec![
                MemberInput::active("a").meta(json!({"w": 2, "r": [2.5, 3]})),
            ])
        })
        .await
        .unwrap();
    assert_eq!(changed.snapshot.version, 2);
}

// ---- After the commit ----

/// The seed's `retireShard`: drains `shard` and adds a new one. Not
/// idempotent: running it twice adds two shards.
fn retire_shard(cur: &durability_topology::Current, shard: &str) -> Draft {
    let n = cur.members.len();
    let mut members: Vec<MemberInput> = cur
        .members
        .iter()
        .map(|m| {
            let mut m = MemberInput::from(m);
            if m.id == shard {
                m.state = MemberState::Draining;
            }
            m
        })
        .collect();
    members.push(MemberInput::active(format!("t-{n}")));
    Draft::new().members(members)
}

#[tokio::test]
async fn a_publish_step_failing_after_the_commit_reports_the_committed_change_and_a_retrying_caller_adds_one_shard()
 {
    // Fail each transaction after update's own commit in turn: the claim of
    // the publication, the write records, the settlement, the final check.
    for after_commit in 1..=4u64 {
        let clock = ManualClock::new(START);
        let publisher = FaultyPublisher::new(MemoryPublication::plain(), &clock);
        let members = Members::default();
        let storage = Arc::new(support::FlakyStorage::new(memory()));
        let c = open(Arc::clone(&storage), &clock, &publisher, &members);
        let t = &c.topology;
        t.update("t", |_| Draft::new().members(shards("t", 3)))
            .await
            .unwrap();
        // The caller a user writes: retry what the library says is retryable.
        let mut calls = 0;
        storage.fail_after(after_commit);
        let outcome = loop {
            calls += 1;
            match t.update("t", |cur| retire_shard(cur, "t-0")).await {
                Ok(out) => break out,
                Err(e) if e.is_retryable() && calls < 5 => {}
                Err(e) => panic!("after_commit {after_commit}: {e}"),
            }
        };
        assert_eq!(
            storage.failed(),
            1,
            "after_commit {after_commit}: the fault was injected"
        );
        assert_eq!(
            calls, 1,
            "after_commit {after_commit}: a committed change is never reported as retryable"
        );
        assert_eq!(outcome.snapshot.version, 2);
        let stored = t.snapshot("t").unwrap().unwrap();
        assert_eq!(
            stored.members.len(),
            4,
            "after_commit {after_commit}: exactly one shard was added"
        );
        assert_eq!(
            stored, outcome.snapshot,
            "the outcome is the committed group"
        );
        if after_commit == 1 {
            // The claim of the publication itself failed: nothing was written.
            let error = outcome
                .publish_error
                .as_ref()
                .expect("the failure is reported");
            assert_eq!(error.code(), "OUTBOX_STORAGE");
            assert!(!outcome.published);
            assert_eq!(publisher.published("t").await.unwrap().version, 1);
        }
        if outcome.publish_error.is_some() {
            assert!(!outcome.published, "a failed attempt is never final");
        }
        // The outbox keeps going: the store converges to the committed group.
        for _ in 0..10 {
            clock.advance(30_000);
            t.deliver_due().await.unwrap();
        }
        assert_eq!(publisher.published("t").await.unwrap(), stored);
        // delete: the same rule.
        storage.fail_after(after_commit);
        let deleted = t.delete("t").await.unwrap();
        assert_eq!(t.snapshot("t").unwrap(), None, "the deletion is committed");
        if deleted.publish_error.is_some() {
            assert!(!deleted.published);
        }
    }
}

#[tokio::test]
async fn a_write_failing_with_an_unknown_outcome_keeps_its_record_and_only_a_rejection_forgets_it()
{
    let w = world();
    w.publisher.set_mode(PubMode::Unknown(1));
    let out = members_of_g(&w.c.topology, 1).await;
    assert!(!out.published);
    let land_by = START + TIMEOUT as i64 + LANDING_WINDOW_MS;
    let outstanding = w
        .storage
        .transaction(|tx| tx.topology_outstanding_until("g", START))
        .unwrap();
    assert_eq!(
        outstanding,
        Some(land_by),
        "a write whose outcome is unknown may still land: its record stays"
    );
    // The retry writes and lands, but is held until the record's deadline.
    w.clock.advance(1_000);
    w.c.topology.deliver_due().await.unwrap();
    assert_eq!(w.publisher.published("g").await.unwrap().version, 1);
    assert_eq!(
        w.c.topology.pending().unwrap(),
        1,
        "held by the unknown write"
    );
    w.clock.set(land_by);
    w.c.topology.deliver_due().await.unwrap();
    assert_eq!(
        w.c.topology.pending().unwrap(),
        0,
        "written again, then acknowledged"
    );
}

// ---- Failure reports as lifecycle events ----

fn failures<S: Storage>(c: &Coord<S>) -> Vec<TopologyEvent>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    std::mem::take(&mut *c.failures.lock().unwrap())
}

#[tokio::test]
async fn publish_failures_are_lifecycle_events_with_typed_errors() {
    let w = world();
    // A refused write.
    w.publisher.set_mode(PubMode::Fail(1));
    members_of_g(&w.c.topology, 1).await;
    let got = failures(&w.c);
    assert_eq!(got.len(), 1, "{got:?}");
    match &got[0] {
        TopologyEvent::PublishFailed {
            group,
            attempt,
            error,
        } => {
            assert_eq!((group.as_str(), *attempt), ("g", 1));
            assert_eq!(error.code(), "TOPOLOGY_PUBLISH_REJECTED");
        }
        other => panic!("{other:?}"),
    }
    // An unknown outcome.
    w.publisher.set_mode(PubMode::Unknown(1));
    w.clock.advance(1_000);
    w.c.topology.deliver_due().await.unwrap();
    let got = failures(&w.c);
    assert!(
        matches!(&got[..], [TopologyEvent::PublishFailed { attempt: 2, error, .. }]
            if error.code() == "TOPOLOGY_PUBLISH_OUTCOME_UNKNOWN"),
        "{got:?}"
    );
    // A write hanging past its timeout: a typed timeout, not a string.
    w.publisher.set_mode(PubMode::Hang);
    let t = w.c.topology.clone();
    with_clock(&w.clock, async move { members_of_g(&t, 2).await }).await;
    let got = failures(&w.c);
    assert!(
        matches!(
            &got[..],
            [TopologyEvent::PublishFailed { error, .. }]
                if matches!(**error, TopologyError::Timeout { operation: "publish", after_ms: TIMEOUT })
        ),
        "{got:?}"
    );
    assert!(got_retryable(&got));
}

fn got_retryable(events: &[TopologyEvent]) -> bool {
    events.iter().all(|e| match e {
        TopologyEvent::PublishFailed { error, .. }
        | TopologyEvent::RestageFailed { error, .. }
        | TopologyEvent::DeliveryFailed { error, .. } => error.is_retryable(),
        _ => false,
    })
}

#[tokio::test]
async fn delivery_failures_are_lifecycle_events_with_typed_errors() {
    let w = world();
    w.members.set_mode("a", MemberMode::Fail);
    w.members.set_mode("h", MemberMode::Hang);
    w.seed(
        vec![MemberInput::active("a"), MemberInput::active("h")],
        "limits",
        json!(1),
    )
    .await;
    failures(&w.c);
    let t = w.c.topology.clone();
    with_clock(&w.clock, async move { t.deliver_due().await.unwrap() }).await;
    let mut got: Vec<(String, String, String)> = failures(&w.c)
        .into_iter()
        .map(|e| match e {
            TopologyEvent::DeliveryFailed {
                group,
                channel,
                member,
                attempt,
                error,
            } => {
                assert_eq!(
                    (group.as_str(), channel.as_str(), attempt),
                    ("g", "limits", 1)
                );
                if member == "h" {
                    assert!(matches!(
                        *error,
                        TopologyError::Timeout {
                            operation: "delivery",
                            after_ms: TIMEOUT
                        }
                    ));
                }
                (member, error.code().to_owned(), error.to_string())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    got.sort();
    assert_eq!(got[0].0, "a");
    assert_eq!(got[0].1, "TOPOLOGY_DELIVERY_FAILED");
    assert!(got[0].2.contains("member down"), "{}", got[0].2);
    assert_eq!(got[1].0, "h");
    assert_eq!(got[1].1, "TOPOLOGY_TIMEOUT");
    assert_eq!(got.len(), 2);
}

#[tokio::test]
async fn a_failed_restage_after_a_late_write_is_a_lifecycle_event() {
    let clock = ManualClock::new(START);
    let publisher = FaultyPublisher::new(MemoryPublication::plain(), &clock);
    let members = Members::default();
    let storage = Arc::new(support::FlakyStorage::new(memory()));
    let c = open(Arc::clone(&storage), &clock, &publisher, &members);
    publisher.set_mode(PubMode::Slow(5_000));
    let t = c.topology.clone();
    let handle = tokio::spawn(async move { members_of_g(&t, 1).await });
    while clock.next_wake().is_none() {
        tokio::task::yield_now().await;
    }
    clock.advance(TIMEOUT as i64);
    assert!(!handle.await.unwrap().published);
    publisher.set_mode(PubMode::Ok);
    failures(&c);
    // The abandoned write settles late, and the restage transaction fails.
    storage.fail_after(0);
    clock.set(START + 5_000);
    idle().await;
    c.sched.settle().await;
    assert_eq!(storage.failed(), 1);
    let got = failures(&c);
    assert!(
        matches!(&got[..], [TopologyEvent::RestageFailed { group, error }]
            if group == "g" && error.code() == "TOPOLOGY_STORAGE"),
        "{got:?}"
    );
    // The record stays, so the snapshot is written again at its deadline.
    clock.set(START + TIMEOUT as i64 + LANDING_WINDOW_MS);
    c.topology.deliver_due().await.unwrap();
    assert_eq!(c.topology.pending().unwrap(), 0);
    assert_eq!(publisher.published("g").await.unwrap().version, 1);
}

// ---- Corrupt stored rows ----

#[tokio::test]
async fn corrupt_stored_topology_rows_are_typed_errors_isolated_to_their_group() {
    let cases = [
        (
            "text version",
            "UPDATE durability_topology_groups SET version = 'x' WHERE group_id = 'bad'",
        ),
        (
            "negative version",
            "UPDATE durability_topology_groups SET version = -1 WHERE group_id = 'bad'",
        ),
        (
            "members not JSON",
            "UPDATE durability_topology_groups SET members = 'not json' WHERE group_id = 'bad'",
        ),
        (
            "members not text",
            "UPDATE durability_topology_groups SET members = x'00ff' WHERE group_id = 'bad'",
        ),
        (
            "state value not JSON",
            "UPDATE durability_topology_states SET value = '{' WHERE group_id = 'bad'",
        ),
        (
            "state value not text",
            "UPDATE durability_topology_states SET value = x'31' WHERE group_id = 'bad'",
        ),
    ];
    for (what, corruption) in cases {
        let (dir, publisher, members, c) = on_sqlite();
        let t = &c.topology;
        for g in ["bad", "good"] {
            t.update(g, |_| {
                Draft::new()
                    .members(vec![MemberInput::active(format!("{g}-0"))])
                    .state("limits", json!(1))
            })
            .await
            .unwrap();
        }
        t.deliver_due().await.unwrap();
        let raw = rusqlite::Connection::open(dir.path().join("coordinator.db")).unwrap();
        assert_eq!(raw.execute(corruption, []).unwrap(), 1, "{what}");
        let dump = |raw: &rusqlite::Connection| -> String {
            raw.query_row(
                "SELECT quote(version) || quote(members) || quote(deleted) ||
                   (SELECT group_concat(quote(value)) FROM durability_topology_states
                    WHERE group_id = 'bad')
                 FROM durability_topology_groups WHERE group_id = 'bad'",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        let before = dump(&raw);

        // Every read of the corrupt group is a typed, non-retryable error …
        let err = t
            .update("bad", |_| Draft::new().state("limits", json!(2)))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "TOPOLOGY_CORRUPT", "{what}: {err}");
        assert!(!err.is_retryable(), "{what}: a corrupt row stays corrupt");
        if what.starts_with("state") {
            assert_eq!(
                t.states("bad").unwrap_err().code(),
                "TOPOLOGY_CORRUPT",
                "{what}"
            );
        } else {
            assert_eq!(
                t.snapshot("bad").unwrap_err().code(),
                "TOPOLOGY_CORRUPT",
                "{what}"
            );
        }
        // … that writes nothing …
        assert_eq!(dump(&raw), before, "{what}: the stored row is untouched");
        // … and never blocks the healthy group.
        let grown = t
            .update("good", |cur| {
                let mut m: Vec<MemberInput> = cur.members.iter().map(MemberInput::from).collect();
                m.push(MemberInput::active("good-1"));
                Draft::new().members(m).state("limits", json!(2))
            })
            .await
            .unwrap();
        assert!(grown.published, "{what}");
        t.deliver_due().await.unwrap();
        assert_eq!(publisher.published("good").await.unwrap(), grown.snapshot);
        assert_eq!(
            members.applied("good-1", "limits"),
            Some(json!(2)),
            "{what}"
        );
        assert_eq!(
            members.applied("good-0", "limits"),
            Some(json!(2)),
            "{what}"
        );
    }
}

// ---- Settings, defaults and the alarm ----

fn bare_scheduler(clock: &ManualClock) -> durability_scheduler::Scheduler<MemoryStorage> {
    let ctx = durability_scheduler::ObjectContext::with_clock(
        durability_scheduler::ObjectId::new("coordinator-1").unwrap(),
        memory(),
        Arc::new(clock.clone()),
    );
    durability_scheduler::Scheduler::new(ctx).unwrap()
}

fn retry_next_at(events: &[durability_outbox::OutboxEvent], channel: &str) -> Option<i64> {
    events.iter().find_map(|e| match e.kind {
        EventKind::RetryScheduled { next_at, .. } if e.channel == channel => Some(next_at),
        _ => None,
    })
}

#[tokio::test]
async fn the_default_attempt_timeout_is_thirty_seconds() {
    let clock = ManualClock::new(START);
    let sched = bare_scheduler(&clock);
    let publisher = FaultyPublisher::new(MemoryPublication::plain(), &clock);
    publisher.set_mode(PubMode::Hang);
    let (_, failures, hook) = support::topology_event_log();
    let t = Topology::attach(
        &sched,
        durability_topology::TopologyConfig::new()
            .publish(publisher.clone())
            .on_event(hook),
    )
    .unwrap();
    let t2 = t.clone();
    let out = with_clock(&clock, async move {
        t2.update("g", |_| Draft::new().members(shards("g", 1)))
            .await
            .unwrap()
    })
    .await;
    assert!(!out.published);
    assert_eq!(
        clock.now_ms(),
        START + 30_000,
        "abandoned at the 30 s default"
    );
    let got = failures.lock().unwrap().clone();
    assert!(
        matches!(&got[..], [TopologyEvent::PublishFailed { error, .. }]
            if matches!(**error, TopologyError::Timeout { operation: "publish", after_ms: 30_000 })),
        "{got:?}"
    );
    // The write record's landing deadline counts from the 30 s timeout.
    let outstanding = sched
        .context()
        .storage()
        .transaction(|tx| tx.topology_outstanding_until("g", START))
        .unwrap();
    assert_eq!(outstanding, Some(START + 30_000 + LANDING_WINDOW_MS));
}

#[tokio::test]
async fn per_publisher_and_per_channel_timeouts_and_delays_override_the_defaults() {
    let clock = ManualClock::new(START);
    let sched = bare_scheduler(&clock);
    let publisher = FaultyPublisher::new(MemoryPublication::plain(), &clock);
    let members = Members::default();
    let (events, failures, hook) = support::topology_event_log();
    let t = Topology::attach(
        &sched,
        durability_topology::TopologyConfig::new()
            .attempt_timeout_ms(1_000)
            .retry_delay(Arc::new(|_| 1_000.0))
            .publish(publisher.clone())
            .publish_timeout_ms(3_000)
            .publish_retry_delay(Arc::new(|_| 4_000.0))
            .state(
                "slow",
                members
                    .channel(durability_topology::Role::Write)
                    .attempt_timeout_ms(2_500)
                    .retry_delay(Arc::new(|_| 6_000.0)),
            )
            .state("plain", members.channel(durability_topology::Role::Write))
            .on_event(hook),
    )
    .unwrap();
    // The publisher's timeout: 3 s, not the 1 s default; its delay: 4 s.
    publisher.set_mode(PubMode::Hang);
    let t2 = t.clone();
    with_clock(&clock, async move {
        t2.update("g", |_| {
            Draft::new()
                .members(vec![MemberInput::active("m")])
                .state("slow", json!(1))
                .state("plain", json!(1))
        })
        .await
        .unwrap()
    })
    .await;
    assert_eq!(clock.now_ms(), START + 3_000, "the publisher's own timeout");
    assert_eq!(
        retry_next_at(&events.lock().unwrap(), "durability.topology"),
        Some(START + 3_000 + 4_000),
        "the publisher's own retry delay"
    );
    // Each channel: its own timeout and delay, or the defaults.
    publisher.set_mode(PubMode::Ok);
    members.set_mode("m", MemberMode::Hang);
    failures.lock().unwrap().clear();
    let at = clock.now_ms();
    let t3 = t.clone();
    with_clock(&clock, async move { t3.deliver_due().await.unwrap() }).await;
    let mut timeouts: Vec<(String, u64)> = failures
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            TopologyEvent::DeliveryFailed { channel, error, .. } => match **error {
                TopologyError::Timeout { after_ms, .. } => Some((channel.clone(), after_ms)),
                _ => None,
            },
            _ => None,
        })
        .collect();
    timeouts.sort();
    assert_eq!(
        timeouts,
        vec![("plain".to_owned(), 1_000), ("slow".to_owned(), 2_500)]
    );
    let events = events.lock().unwrap().clone();
    // `deliver_due` runs the channels one after another ("plain" first):
    // "slow" starts when "plain" timed out, and its delay counts from the
    // end of its own batch.
    assert_eq!(
        retry_next_at(&events, "durability.topology.slow"),
        Some(at + 1_000 + 2_500 + 6_000),
        "the channel's own timeout and delay"
    );
    let plain = retry_next_at(&events, "durability.topology.plain").unwrap();
    assert_eq!(plain - at, 1_000 + 1_000, "the defaults");
}

#[tokio::test]
async fn a_claimed_batch_is_retried_after_twice_the_attempt_timeout() {
    // The outbox's batch deadline is twice the attempt timeout, so one
    // write or delivery that hangs until its own timeout never outlives
    // the claim. An attempt lost to an eviction is retried at that deadline.
    let w = evicted_mid_write(world()).await;
    let (clock, publisher, c) = (&w.clock, &w.publisher, &w.c);
    let calls = publisher.calls();
    clock.set(START + 2 * TIMEOUT as i64 - 1);
    c.topology.deliver_due().await.unwrap();
    assert_eq!(
        publisher.calls(),
        calls,
        "still claimed before the batch deadline"
    );
    clock.set(START + 2 * TIMEOUT as i64);
    c.topology.deliver_due().await.unwrap();
    assert_eq!(
        publisher.calls(),
        calls + 1,
        "retried at twice the attempt timeout"
    );
}

#[tokio::test]
async fn a_channel_defaults_to_the_write_role() {
    let clock = ManualClock::new(START);
    let sched = bare_scheduler(&clock);
    let members = Members::default();
    let recorder = members.clone();
    // StateChannel::new without .role().
    let channel = durability_topology::StateChannel::new(Arc::new(move |m, u| {
        let r = recorder.clone();
        Box::pin(async move {
            r.received.lock().unwrap().entry(m.id).or_default().push(u);
            Ok(())
        })
    }));
    let t = Topology::attach(
        &sched,
        durability_topology::TopologyConfig::new().state("limits", channel),
    )
    .unwrap();
    t.update("g", |_| {
        Draft::new()
            .members(vec![MemberInput::active("a"), MemberInput::draining("d")])
            .state("limits", json!(1))
    })
    .await
    .unwrap();
    t.deliver_due().await.unwrap();
    assert_eq!(members.received("a").len(), 1, "active members are reached");
    assert!(members.received("d").is_empty(), "draining members are not");
}

#[tokio::test]
async fn channel_names_are_validated() {
    let clock = ManualClock::new(START);
    let members = Members::default();
    for bad in ["", "a\nb", "tab\there", &"x".repeat(300)] {
        let sched = bare_scheduler(&clock);
        let err = Topology::attach(
            &sched,
            durability_topology::TopologyConfig::new()
                .state(bad, members.channel(durability_topology::Role::Write)),
        )
        .err()
        .unwrap_or_else(|| panic!("{bad:?} accepted"));
        assert!(
            ["TOPOLOGY_INVALID_CONFIG", "OUTBOX_INVALID_CHANNEL"].contains(&err.code()),
            "{bad:?}: {}",
            err.code()
        );
        assert!(!err.is_retryable());
    }
    // A valid name with dots and dashes is fine.
    let sched = bare_scheduler(&clock);
    Topology::attach(
        &sched,
        durability_topology::TopologyConfig::new().state(
            "limits.v2-eu",
            members.channel(durability_topology::Role::Write),
        ),
    )
    .unwrap();
}

#[tokio::test]
async fn a_channel_that_was_never_set_stages_nothing() {
    let w = world();
    let t = &w.c.topology;
    // Members only: neither channel has a value.
    members_of_g(t, 3).await;
    assert_pending(t, 0, "no delivery staged for unset channels");
    // One channel set: only it is delivered; the other still stages nothing,
    // also for a member that joins later.
    t.update("g", |_| Draft::new().state("limits", json!(1)))
        .await
        .unwrap();
    assert_eq!(t.pending().unwrap(), 3);
    t.deliver_due().await.unwrap();
    join(t, "g", MemberInput::active("late")).await;
    assert_pending(t, 1, "the newcomer gets limits, not schema");
    t.deliver_due().await.unwrap();
    assert_eq!(w.members.applied("late", "limits"), Some(json!(1)));
    for m in ["g-0", "g-1", "g-2", "late"] {
        assert_eq!(w.members.applied(m, "schema"), None, "{m}");
    }
}

#[tokio::test]
async fn publication_and_deliveries_run_from_the_alarm_through_the_driver_after_an_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let storage = sqlite(&dir);
    let clock = ManualClock::new(START);
    let publisher = FaultyPublisher::new(MemoryPublication::plain(), &clock);
    let members = Members::default();
    let c = open(Arc::clone(&storage), &clock, &publisher, &members);
    publisher.set_mode(PubMode::Fail(1));
    members.set_mode("t-1", MemberMode::Fail);
    let out = c
        .topology
        .update("t", |_| {
            Draft::new()
                .members(shards("t", 2))
                .state("limits", json!({"rps": 9}))
        })
        .await
        .unwrap();
    assert!(!out.published);
    c.topology.deliver_due().await.unwrap();
    assert_eq!(members.applied("t-0", "limits"), Some(json!({"rps": 9})));
    assert_eq!(members.applied("t-1", "limits"), None);
    let alarm = c
        .sched
        .alarm_at()
        .expect("the alarm is set for the retries");
    // Evict, reopen on the file, and let the driver wake the object.
    c.sched.abort_background();
    drop(c);
    members.set_mode("t-1", MemberMode::Ok);
    let c = open(Arc::clone(&storage), &clock, &publisher, &members);
    assert_eq!(
        c.sched.alarm_at(),
        Some(alarm),
        "the alarm survived the eviction"
    );
    let driver = durability_scheduler::Driver::start(c.sched.clone());
    clock.set(alarm.max(START + 1_000));
    let mut spins = 0;
    while publisher.published("t").await.is_none()
        || members.applied("t-1", "limits").is_none()
        || c.topology.pending().unwrap() > 0
    {
        spins += 1;
        assert!(spins < 100_000, "the driver did not deliver");
        if let Some(at) = clock.next_wake()
            && at <= clock.now_ms() + 60_000
            && spins % 100 == 0
        {
            clock.set(at);
        }
        tokio::task::yield_now().await;
    }
    driver.stop();
    assert_eq!(publisher.published("t").await.unwrap(), out.snapshot);
    assert_eq!(members.applied("t-1", "limits"), Some(json!({"rps": 9})));
    assert_eq!(c.sched.alarm_at(), None, "nothing left to wake for");
}

// ---- Typed channel handles ----

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Limits {
    rps: u32,
    burst: Option<u32>,
}

const LIMITS: durability_topology::ChannelKey<Limits> =
    durability_topology::ChannelKey::new("limits");

#[tokio::test]
async fn typed_channel_handles_set_read_and_deliver_values_over_the_json_storage() {
    let clock = ManualClock::new(START);
    let sched = bare_scheduler(&clock);
    type Seen = Vec<(String, durability_topology::TypedUpdate<Limits>)>;
    let got: Arc<std::sync::Mutex<Seen>> = Arc::default();
    let seen = Arc::clone(&got);
    let channel = durability_topology::StateChannel::typed(&LIMITS, move |member, update| {
        let seen = Arc::clone(&seen);
        async move {
            seen.lock().unwrap().push((member.id, update));
            Ok(())
        }
    });
    let (_, failures, hook) = support::topology_event_log();
    let t = Topology::attach(
        &sched,
        durability_topology::TopologyConfig::new()
            .channel(&LIMITS, channel)
            .on_event(hook),
    )
    .unwrap();
    let v1 = Limits {
        rps: 10,
        burst: None,
    };
    t.update("g", |cur| {
        assert_eq!(cur.get(&LIMITS).unwrap(), None);
        Draft::new().members(shards("g", 2)).set(&LIMITS, &v1)
    })
    .await
    .unwrap();
    // Stored as JSON, exactly as an untyped draft would store it.
    assert_eq!(
        t.states("g").unwrap()["limits"],
        json!({"rps": 10, "burst": null})
    );
    t.deliver_due().await.unwrap();
    let delivered = got.lock().unwrap().clone();
    assert_eq!(delivered.len(), 2);
    assert!(
        delivered
            .iter()
            .all(|(_, u)| u.value == v1 && u.channel == "limits")
    );
    // The current value reads back typed.
    t.update("g", |cur| {
        assert_eq!(cur.get(&LIMITS).unwrap(), Some(v1.clone()));
        Draft::new()
    })
    .await
    .unwrap();
    // A stored value that is not a `Limits` (set untyped): reading it typed
    // is a corrupt error, and delivering it fails with a typed event.
    t.update("g", |_| {
        Draft::new().state("limits", json!({"rps": "many"}))
    })
    .await
    .unwrap();
    let err = t
        .update("g", |cur| {
            assert_eq!(cur.get(&LIMITS).unwrap_err().code(), "TOPOLOGY_CORRUPT");
            Draft::new()
        })
        .await;
    assert!(err.is_ok());
    t.deliver_due().await.unwrap();
    let failed = failures.lock().unwrap().clone();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(failed.iter().all(|e| matches!(e,
        TopologyEvent::DeliveryFailed { error, .. } if error.code() == "TOPOLOGY_DELIVERY_FAILED"
            && error.to_string().contains("does not decode"))));
    // A value that cannot be encoded as JSON is refused before any write.
    const BY_ID: durability_topology::ChannelKey<std::collections::BTreeMap<(u8, u8), u8>> =
        durability_topology::ChannelKey::new("limits");
    let before = t.states("g").unwrap();
    let err = t
        .update("g", |_| {
            Draft::new().set(&BY_ID, &[((1, 2), 3)].into_iter().collect())
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "TOPOLOGY_INVALID_STATE");
    assert_eq!(t.states("g").unwrap(), before, "nothing written");
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct ShardMeta {
    weight: u32,
    zone: String,
}

const SHARD_META: durability_topology::MetaKey<ShardMeta> = durability_topology::MetaKey::new();

#[tokio::test]
async fn typed_member_metadata_round_trips_over_the_json_storage_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let publisher = FaultyPublisher::new(MemoryPublication::plain(), &clock);
    let members = Members::default();
    let heavy = ShardMeta {
        weight: 3,
        zone: "weur".to_owned(),
    };
    {
        let c = open(sqlite(&dir), &clock, &publisher, &members);
        let out = c
            .topology
            .update("g", |_| {
                Draft::new().members(vec![
                    MemberInput::active("a").with_meta(&SHARD_META, &heavy),
                    MemberInput::active("b"),
                ])
            })
            .await
            .unwrap();
        assert!(out.published);
        // Stored and published as plain JSON metadata …
        assert_eq!(
            out.snapshot.members[0].meta,
            Some(json!({"weight": 3, "zone": "weur"}))
        );
        let published = publisher.published("g").await.unwrap();
        assert_eq!(
            SHARD_META.get(&published.members[0]).unwrap(),
            Some(heavy.clone())
        );
        assert_eq!(SHARD_META.get(&published.members[1]).unwrap(), None);
    }
    // … and read back typed from the file by a new coordinator.
    let c = open(sqlite(&dir), &clock, &publisher, &members);
    let t = &c.topology;
    let stored = t.snapshot("g").unwrap().unwrap();
    assert_eq!(
        SHARD_META.get(&stored.members[0]).unwrap(),
        Some(heavy.clone())
    );
    t.update("g", |cur| {
        assert_eq!(
            SHARD_META.get(&cur.members[0]).unwrap(),
            Some(heavy.clone())
        );
        Draft::new()
    })
    .await
    .unwrap();

    // Metadata set untyped that is not a `ShardMeta` reads as a typed
    // corrupt error, not a panic.
    let out = t
        .update("g", |_| {
            Draft::new().members(vec![
                MemberInput::active("a").meta(json!({"weight": "heavy"})),
                MemberInput::active("b"),
            ])
        })
        .await
        .unwrap();
    let err = SHARD_META.get(&out.snapshot.members[0]).unwrap_err();
    assert_eq!(err.code(), "TOPOLOGY_CORRUPT");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("\"a\""), "{err}");

    // Metadata that cannot be encoded as JSON is refused before any write.
    const BY_PAIR: durability_topology::MetaKey<std::collections::BTreeMap<(u8, u8), u8>> =
        durability_topology::MetaKey::new();
    let raw = rusqlite::Connection::open(dir.path().join("coordinator.db")).unwrap();
    let dump = |raw: &rusqlite::Connection| -> String {
        raw.query_row(
            "SELECT quote(version) || quote(members) FROM durability_topology_groups
             WHERE group_id = 'g'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    let before = dump(&raw);
    let calls = publisher.calls();
    let err = t
        .update("g", |_| {
            Draft::new().members(vec![
                MemberInput::active("a").with_meta(&BY_PAIR, &[((1, 2), 3)].into_iter().collect()),
            ])
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "TOPOLOGY_INVALID_METADATA", "{err}");
    assert!(!err.is_retryable());
    assert_eq!(dump(&raw), before, "nothing written");
    assert_eq!(publisher.calls(), calls, "nothing published");
    assert_eq!(t.snapshot("g").unwrap().unwrap(), out.snapshot);
    // A later untyped or typed value replaces the refused one.
    let fixed = t
        .update("g", |_| {
            Draft::new().members(vec![
                MemberInput::active("a")
                    .with_meta(&BY_PAIR, &[((1, 2), 3)].into_iter().collect())
                    .with_meta(&SHARD_META, &heavy),
            ])
        })
        .await
        .unwrap();
    assert_eq!(
        SHARD_META.get(&fixed.snapshot.members[0]).unwrap(),
        Some(heavy)
    );
}

#[tokio::test]
async fn a_group_whose_stored_members_do_not_decode_stays_deletable_on_sqlite() {
    let cases = [
        // An element with a readable ID but no valid state / joinedAt: its
        // pending delivery is discarded.
        (
            "members not wire members",
            r#"[{"id":"bad-0","state":"bogus"}]"#,
            vec!["bad-0".to_owned()],
        ),
        ("members not JSON", "not json", vec![]),
    ];
    for (what, members_text, discarded_ids) in cases {
        let (dir, publisher, members, c) = on_sqlite();
        let t = &c.topology;
        let mut versions = std::collections::BTreeMap::new();
        for g in ["bad", "good"] {
            let out = t
                .update(g, |_| {
                    Draft::new()
                        .members(vec![MemberInput::active(format!("{g}-0"))])
                        .state("limits", json!(1))
                })
                .await
                .unwrap();
            versions.insert(g, out.snapshot.version);
        }
        // Both deliveries are still pending.
        assert_pending(t, 2, what);
        let raw = rusqlite::Connection::open(dir.path().join("coordinator.db")).unwrap();
        assert_eq!(
            raw.execute(
                "UPDATE durability_topology_groups SET members = ?1 WHERE group_id = 'bad'",
                [members_text],
            )
            .unwrap(),
            1,
            "{what}"
        );
        assert_eq!(
            t.snapshot("bad").unwrap_err().code(),
            "TOPOLOGY_CORRUPT",
            "{what}"
        );
        let good_before = t.snapshot("good").unwrap().unwrap();

        let out = t.delete("bad").await.unwrap();
        assert!(out.published, "{what}");
        assert!(out.publish_error.is_none(), "{what}");
        assert_eq!(t.snapshot("bad").unwrap(), None, "{what}");
        assert_eq!(t.states("bad").unwrap(), Default::default(), "{what}");
        assert_eq!(publisher.published("bad").await, None, "{what}");
        let (deleted, members_after): (i64, String) = raw
            .query_row(
                "SELECT deleted, members FROM durability_topology_groups WHERE group_id = 'bad'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((deleted, members_after.as_str()), (1, "[]"), "{what}");
        let reported = failures(&c);
        assert!(
            matches!(&reported[..], [TopologyEvent::CorruptGroupDeleted { group, discarded, error }]
                if group == "bad" && *discarded == discarded_ids
                    && error.code() == "TOPOLOGY_CORRUPT"),
            "{what}: {reported:?}"
        );
        // The readable member's delivery is gone; the other group is
        // untouched and still delivers.
        assert_eq!(
            t.pending().unwrap(),
            2 - discarded_ids.len() as u64,
            "{what}"
        );
        if !discarded_ids.is_empty() {
            t.deliver_due().await.unwrap();
            assert_eq!(members.applied("bad-0", "limits"), None, "{what}");
            assert_pending(t, 0, what);
        }
        t.deliver_due().await.unwrap();
        assert_eq!(
            members.applied("good-0", "limits"),
            Some(json!(1)),
            "{what}"
        );
        assert_eq!(t.snapshot("good").unwrap().unwrap(), good_before, "{what}");
        assert_eq!(
            publisher.published("good").await.unwrap(),
            good_before,
            "{what}"
        );
        // The group can be created again, newer than anything published.
        let again = t
            .update("bad", |_| {
                Draft::new().members(vec![MemberInput::active("bad-1")])
            })
            .await
            .unwrap();
        assert!(again.snapshot.version > versions["bad"] + 1, "{what}");
        assert_eq!(publisher.published("bad").await.unwrap(), again.snapshot);
    }
}
