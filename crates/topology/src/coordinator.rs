//! The coordinator: update, delete, snapshot, publication and state channels.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};

use durability_outbox::{
    ChannelConfig, DelayFn, Entry, EventHook, MAX_ATTEMPT_TIMEOUT_MS, Outbox, OutboxEvent,
    RetryPolicy, Sink, SinkError,
};
use durability_scheduler::{
    Scheduler, SchemaTarget, Storage, Transaction, migrate, migrate_within,
};
use durability_time::timeout_at;
use durability_topology_client::{
    BoxError, MAX_MEMBERS, MAX_META_BYTES, MAX_SNAPSHOT_BYTES, Member, MemberState, Snapshot,
    check_group, check_location_hint, check_member_id, decode,
};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::encode::{
    EncodedSnapshot, encode, members_json, parse_members, same_json, same_members, to_wire,
};
use crate::error::TopologyError;
use crate::event::{TopologyEvent, TopologyEventHook, emit};
use crate::store::{GroupRow, PublishError, Publisher, SnapshotDeletion, TopologyTx};
use crate::{MAX_STATE_BYTES, SCHEMA};

mod lost;

/// The publication channel: keyed by group.
pub const PUBLICATION_CHANNEL: &str = "durability.topology";
/// How long after its timeout an abandoned publisher write is assumed able
/// to land: 5 minutes. Plain key-value stores have no conditional write, so
/// some bound is required.
pub const LANDING_WINDOW_MS: i64 = 5 * 60_000;
const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// Which members a state channel reaches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Role {
    /// Active members (the default).
    #[default]
    Write,
    /// Active and draining members.
    Read,
}

impl Role {
    fn includes(self, member: &Member) -> bool {
        self == Self::Read || member.state == MemberState::Active
    }
}

/// One state update sent to a member.
#[derive(Debug, Clone, PartialEq)]
pub struct StateUpdate {
    /// The group.
    pub group: String,
    /// The state channel.
    pub channel: String,
    /// The outbox version: increases on every update sent to this member.
    /// Apply only versions newer than the last one applied, in the same
    /// transaction as the value.
    pub version: u64,
    /// The group's membership version when the update was staged.
    pub topology_version: u64,
    /// The value.
    pub value: serde_json::Value,
}

/// Delivers one update to one member (an RPC, say). `Err` retries that
/// member alone.
///
/// # Cancellation
///
/// The returned future must be cancel-safe. A delivery still running at
/// its attempt timeout ([`StateChannel::attempt_timeout_ms`]) is dropped,
/// not left running as the seed's promise is: it stops at the await point
/// it was parked on, nothing after that point runs, its drop glue does,
/// and the update is retried later with the same version (or a newer
/// one). Whatever the member received before the drop may still be
/// applied (a request already sent lands), so the member must apply only
/// versions newer than the last it applied, and the future must leave
/// nothing half-done when dropped (hold no lock or transaction of the
/// member's across an await). Test: `tests/it/topology.rs`
/// `a_timed_out_delivery_is_dropped_at_its_await_point_and_retried_with_its_version`.
pub type DeliverFn =
    Arc<dyn Fn(Member, StateUpdate) -> BoxFuture<'static, Result<(), BoxError>> + Send + Sync>;

/// A state channel: a value every member in its role converges to.
#[derive(Clone)]
pub struct StateChannel {
    role: Role,
    deliver: DeliverFn,
    attempt_timeout_ms: Option<u64>,
    delay: Option<DelayFn>,
}

durability_time::debug_fields!(StateChannel { attempt_timeout_ms });

impl StateChannel {
    /// A `write` channel delivering through `deliver`.
    pub fn new(deliver: DeliverFn) -> Self {
        Self {
            role: Role::Write,
            deliver,
            attempt_timeout_ms: None,
            delay: None,
        }
    }
    /// Which members it reaches.
    #[must_use]
    pub fn role(mut self, role: Role) -> Self {
        self.role = role;
        self
    }
    /// Maximum duration of one delivery (default: the topology's). A
    /// delivery still running then is dropped (see [`DeliverFn`]: it must
    /// be cancel-safe) and retried.
    #[must_use]
    pub fn attempt_timeout_ms(mut self, ms: u64) -> Self {
        self.attempt_timeout_ms = Some(ms);
        self
    }
    /// Retry delay after a failed delivery (default: the topology's).
    #[must_use]
    pub fn retry_delay(mut self, delay: DelayFn) -> Self {
        self.delay = Some(delay);
        self
    }
}

/// The publisher type of a topology without one: membership is then only
/// visible inside the coordinator.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPublisher;

impl Publisher for NoPublisher {
    async fn write(&self, _: &Snapshot, _: &EncodedSnapshot) -> Result<(), PublishError> {
        Ok(())
    }
    async fn delete(&self, _: SnapshotDeletion<'_>) -> Result<(), PublishError> {
        Ok(())
    }
}

/// The coordinator's settings.
pub struct TopologyConfig<P> {
    publisher: Option<P>,
    /// Publish overrides: kept apart from the publisher so they do not
    /// depend on whether they were set before or after `publish`.
    publish_timeout_ms: Option<u64>,
    publish_delay: Option<DelayFn>,
    attempt_timeout_ms: u64,
    delay: Option<DelayFn>,
    states: BTreeMap<String, StateChannel>,
    on_event: Option<TopologyEventHook>,
}

impl<P> std::fmt::Debug for TopologyConfig<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopologyConfig")
            .field("states", &self.states.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl TopologyConfig<NoPublisher> {
    /// No publisher, no state channels, 30 s attempts, default backoff.
    pub fn new() -> Self {
        Self {
            publisher: None,
            publish_timeout_ms: None,
            publish_delay: None,
            attempt_timeout_ms: DEFAULT_TIMEOUT_MS,
            delay: None,
            states: BTreeMap::new(),
            on_event: None,
        }
    }
}

impl Default for TopologyConfig<NoPublisher> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> TopologyConfig<P> {
    /// Publishes every snapshot through `publisher`. Publish settings keep
    /// their values whether they are set before or after this call.
    pub fn publish<Q: Publisher>(self, publisher: Q) -> TopologyConfig<Q> {
        TopologyConfig {
            publisher: Some(publisher),
            publish_timeout_ms: self.publish_timeout_ms,
            publish_delay: self.publish_delay,
            attempt_timeout_ms: self.attempt_timeout_ms,
            delay: self.delay,
            states: self.states,
            on_event: self.on_event,
        }
    }
    /// Maximum duration of one publisher write (`1..=2^31-1`, validated by
    /// `attach` even without a publisher), overriding the default.
    #[must_use]
    pub fn publish_timeout_ms(mut self, ms: u64) -> Self {
        self.publish_timeout_ms = Some(ms);
        self
    }
    /// Retry delay after a failed write, overriding the default.
    #[must_use]
    pub fn publish_retry_delay(mut self, delay: DelayFn) -> Self {
        self.publish_delay = Some(delay);
        self
    }
    /// Default maximum duration of one write or delivery (30 s,
    /// `1..=2^31-1`).
    #[must_use]
    pub fn attempt_timeout_ms(mut self, ms: u64) -> Self {
        self.attempt_timeout_ms = ms;
        self
    }
    /// Default retry delay (jittered exponential backoff capped at 5 minutes
    /// otherwise). Attempts never stop.
    #[must_use]
    pub fn retry_delay(mut self, delay: DelayFn) -> Self {
        self.delay = Some(delay);
        self
    }
    /// Adds a state channel.
    #[must_use]
    pub fn state(mut self, name: impl Into<String>, channel: StateChannel) -> Self {
        self.states.insert(name.into(), channel);
        self
    }
    /// Adds the state channel of a typed handle (see
    /// [`StateChannel::typed`]).
    #[must_use]
    pub fn channel<V>(self, key: &crate::ChannelKey<V>, channel: StateChannel) -> Self {
        self.state(key.name(), channel)
    }
    /// Receives the lifecycle events: the outbox events of the publication
    /// and state channels, and every publication, restage and delivery
    /// failure ([`TopologyEvent`]).
    #[must_use]
    pub fn on_event(mut self, hook: TopologyEventHook) -> Self {
        self.on_event = Some(hook);
        self
    }
}

/// A member as a draft sets it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberInput {
    /// Non-empty, unique in the draft.
    pub id: String,
    /// Active or draining.
    pub state: MemberState,
    /// Optional location hint.
    pub location_hint: Option<String>,
    /// Optional metadata (JSON).
    pub meta: Option<serde_json::Value>,
    /// Typed metadata that could not be encoded: `update` refuses the draft.
    pub(crate) refused: Option<String>,
}

impl MemberInput {
    /// An active member.
    pub fn active(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            state: MemberState::Active,
            location_hint: None,
            meta: None,
            refused: None,
        }
    }
    /// A draining member.
    pub fn draining(id: impl Into<String>) -> Self {
        Self {
            state: MemberState::Draining,
            ..Self::active(id)
        }
    }
    /// With a location hint.
    #[must_use]
    pub fn location_hint(mut self, hint: impl Into<String>) -> Self {
        self.location_hint = Some(hint.into());
        self
    }
    /// With metadata.
    #[must_use]
    pub fn meta(mut self, meta: serde_json::Value) -> Self {
        self.meta = Some(meta);
        self.refused = None;
        self
    }
}

impl From<&Member> for MemberInput {
    fn from(m: &Member) -> Self {
        Self {
            id: m.id.clone(),
            state: m.state,
            location_hint: m.location_hint.clone(),
            meta: m.meta.clone(),
            refused: None,
        }
    }
}

/// What `update`'s closure sees.
#[derive(Debug, Clone, PartialEq)]
pub struct Current {
    /// Members sorted by ID (empty for a group that does not exist).
    pub members: Vec<Member>,
    /// Current state values by channel.
    pub states: BTreeMap<String, serde_json::Value>,
}

/// What `update`'s closure returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draft {
    /// `None` keeps the current members.
    pub members: Option<Vec<MemberInput>>,
    /// Only the channels being set.
    pub states: BTreeMap<String, serde_json::Value>,
    /// A typed value that could not be encoded: `update` refuses the draft.
    refused: Option<(String, String)>,
}

impl Draft {
    /// An empty draft: changes nothing.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the members.
    #[must_use]
    pub fn members(mut self, members: impl IntoIterator<Item = MemberInput>) -> Self {
        self.members = Some(members.into_iter().collect());
        self
    }
    /// Sets a state channel's value.
    #[must_use]
    pub fn state(mut self, channel: impl Into<String>, value: serde_json::Value) -> Self {
        self.states.insert(channel.into(), value);
        self
    }

    pub(crate) fn refuse(&mut self, channel: &str, reason: String) {
        self.refused.get_or_insert((channel.to_owned(), reason));
    }
}

/// The result of `update`: the change is committed.
#[derive(Debug, Clone)]
pub struct UpdateOutcome {
    /// The group after the change.
    pub snapshot: Snapshot,
    /// Whether the snapshot is final in the store. `false`: the write failed
    /// or an older write may still land over it; the change is committed and
    /// the outbox keeps going until it is.
    pub published: bool,
    /// Why the one publish attempt after the commit could not run (a storage
    /// error claiming or settling it), if it failed that way. The change is
    /// committed all the same and its publication stays staged, so the
    /// caller must not retry a non-idempotent draft because of it.
    pub publish_error: Option<Arc<TopologyError>>,
}

/// The result of `delete`: the deletion is committed.
#[derive(Debug, Clone)]
pub struct DeleteOutcome {
    /// Whether the deletion is final in the store.
    pub published: bool,
    /// Why the one publish attempt after the commit could not run, if it
    /// failed that way (see [`UpdateOutcome::publish_error`]).
    pub publish_error: Option<Arc<TopologyError>>,
}

/// A publication staged on the outbox: the newest per group is pending.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Publication {
    Write { encoded: String },
    Delete { version: u64 },
}

/// A delivery staged on a state channel's outbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Delivery {
    group: String,
    member: String,
    topology_version: u64,
    value: String,
}

struct ChannelRt<S: Storage, P: Publisher>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    role: Role,
    deliver: DeliverFn,
    timeout_ms: i64,
    outbox: Outbox<S, Delivery, DeliverySink<S, P>>,
}

struct Core<S: Storage, P: Publisher>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    scheduler: Scheduler<S>,
    coordinator: String,
    publisher: Option<Arc<P>>,
    publish_timeout_ms: i64,
    publication: Option<Outbox<S, Publication, PublicationSink<S, P>>>,
    channels: BTreeMap<String, ChannelRt<S, P>>,
    on_event: Option<TopologyEventHook>,
}

/// The topology coordinator of one object.
///
/// Only this instance changes or publishes its groups. Cloning shares it;
/// dropping the last handle detaches its outbox channels.
pub struct Topology<S: Storage, P: Publisher = NoPublisher>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    core: Arc<Core<S, P>>,
}

impl<S: Storage, P: Publisher> std::fmt::Debug for Topology<S, P>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("coordinator", &self.core.coordinator)
            .finish_non_exhaustive()
    }
}

impl<S: Storage, P: Publisher> Clone for Topology<S, P>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    fn clone(&self) -> Self {
        Self {
            core: Arc::clone(&self.core),
        }
    }
}

fn check_timeout(field: &str, ms: u64) -> Result<i64, TopologyError> {
    if ms == 0 || ms > MAX_ATTEMPT_TIMEOUT_MS {
        return Err(TopologyError::InvalidConfig {
            field: field.to_owned(),
            reason: format!("must be in 1..={MAX_ATTEMPT_TIMEOUT_MS}, got {ms}"),
        });
    }
    Ok(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// Each write or delivery has its own deadline inside a batch, so the
/// outbox's batch deadline only bounds the callback itself.
fn channel_config<T>(
    name: String,
    timeout_ms: i64,
    delay: Option<DelayFn>,
    hook: Option<&EventHook>,
) -> ChannelConfig<T> {
    let batch_timeout = u64::try_from(timeout_ms.saturating_mul(2))
        .unwrap_or(MAX_ATTEMPT_TIMEOUT_MS)
        .min(MAX_ATTEMPT_TIMEOUT_MS);
    let mut config = ChannelConfig::new(name)
        .attempt_timeout_ms(batch_timeout)
        .retry(RetryPolicy {
            delay,
            ..RetryPolicy::default()
        });
    if let Some(hook) = hook {
        config = config.on_event(Arc::clone(hook));
    }
    config
}

fn delivery_key(group: &str, member: &str) -> String {
    serde_json::to_string(&(group, member))
        .unwrap_or_else(|_| unreachable!("two strings always encode"))
}

fn corrupt(reason: impl Into<String>) -> TopologyError {
    TopologyError::Corrupt {
        reason: reason.into(),
    }
}

fn check_group_name(group: &str) -> Result<(), TopologyError> {
    check_group(group).map_err(|reason| TopologyError::InvalidGroup { reason })
}

impl<S: Storage, P: Publisher> Topology<S, P>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    /// Attaches the coordinator to the object's scheduler: applies the
    /// topology schema and attaches the publication channel (with a
    /// publisher) and one channel per state. The coordinator ID is the
    /// object's ID: every snapshot names it.
    ///
    /// # Errors
    /// [`TopologyError::InvalidConfig`] for a bad timeout or channel name, a
    /// scheduler or outbox error (a duplicate channel, a schema problem).
    pub fn attach(
        scheduler: &Scheduler<S>,
        config: TopologyConfig<P>,
    ) -> Result<Self, TopologyError> {
        let default_timeout = check_timeout("attempt_timeout_ms", config.attempt_timeout_ms)?;
        let publish_timeout = match config.publish_timeout_ms {
            Some(ms) => check_timeout("publish_timeout_ms", ms)?,
            None => default_timeout,
        };
        let mut channel_timeouts = BTreeMap::new();
        for (name, channel) in &config.states {
            if name.is_empty() || name.chars().any(char::is_control) {
                return Err(TopologyError::InvalidConfig {
                    field: "states".to_owned(),
                    reason: format!("invalid channel name {name:?}"),
                });
            }
            let t = match channel.attempt_timeout_ms {
                Some(ms) => check_timeout(&format!("states.{name}.attempt_timeout_ms"), ms)?,
                None => default_timeout,
            };
            channel_timeouts.insert(name.clone(), t);
        }
        let storage = scheduler.context().storage();
        scheduler.transaction(|tx| {
            migrate_within(storage.as_ref(), tx, SCHEMA, &SchemaTarget::Latest)
                .map(|_| ())
                .map_err(TopologyError::from)
        })?;
        let coordinator = scheduler.context().id().as_str().to_owned();
        let on_event = config.on_event.clone();
        // The outbox channels' events reach the same hook, wrapped.
        let hook: Option<EventHook> = on_event.clone().map(|h| {
            Arc::new(move |e: &OutboxEvent| emit(Some(&h), &TopologyEvent::Outbox(e.clone())))
                as EventHook
        });
        let mut failure: Option<TopologyError> = None;
        let core = Arc::new_cyclic(|weak: &Weak<Core<S, P>>| {
            let mut publisher = None;
            let mut publication = None;
            if let Some(p) = config.publisher {
                let delay = config.publish_delay.or_else(|| config.delay.clone());
                let restaging = lost::publication_hook(hook.clone(), weak.clone());
                let cfg = channel_config(
                    PUBLICATION_CHANNEL.to_owned(),
                    publish_timeout,
                    delay,
                    Some(&restaging),
                )
                .dead_letter(lost::dead_letter(weak.clone()));
                match Outbox::attach(scheduler, cfg, PublicationSink { core: weak.clone() }) {
                    Ok(o) => publication = Some(o),
                    Err(e) => failure = Some(e.into()),
                }
                publisher = Some(Arc::new(p));
            }
            let mut channels = BTreeMap::new();
            for (name, channel) in config.states {
                if failure.is_some() {
                    break;
                }
                let timeout_ms = channel_timeouts
                    .get(&name)
                    .copied()
                    .unwrap_or(default_timeout);
                let delay = channel.delay.clone().or_else(|| config.delay.clone());
                let cfg = channel_config(
                    format!("{PUBLICATION_CHANNEL}.{name}"),
                    timeout_ms,
                    delay,
                    hook.as_ref(),
                );
                let sink = DeliverySink {
                    core: weak.clone(),
                    name: name.clone(),
                };
                match Outbox::attach(scheduler, cfg, sink) {
                    Ok(outbox) => {
                        channels.insert(
                            name,
                            ChannelRt {
                                role: channel.role,
                                deliver: channel.deliver,
                                timeout_ms,
                                outbox,
                            },
                        );
                    }
                    Err(e) => failure = Some(e.into()),
                }
            }
            Core {
                scheduler: scheduler.clone(),
                coordinator,
                publisher,
                publish_timeout_ms: publish_timeout,
                publication,
                channels,
                on_event,
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(Self { core })
    }

    /// The coordinator ID every snapshot carries.
    pub fn coordinator(&self) -> &str {
        &self.core.coordinator
    }

    /// Reverts or applies only the topology tables (the outbox channels
    /// migrate with the outbox's own schema).
    ///
    /// # Errors
    /// The errors of [`durability_scheduler::migrate`].
    pub fn migrate(storage: &S, target: &SchemaTarget) -> Result<Option<u32>, TopologyError> {
        Ok(migrate(storage, SCHEMA, target)?)
    }

    /// Applies one change in a single transaction. `next` runs inside it and
    /// returns synchronously, so nothing interleaves between reading the
    /// current state and writing the draft. Membership changes (compared
    /// canonically) bump the version; an unchanged draft does not. After the
    /// commit one publish is attempted.
    ///
    /// Once the transaction has committed the call succeeds: a failure of
    /// the publish attempt after the commit is reported in the outcome
    /// (`published: false`, [`UpdateOutcome::publish_error`]) and the staged
    /// publication keeps going, never as an error a caller would retry.
    ///
    /// # Errors
    /// A validation error (nothing is written), a storage or outbox error
    /// (the transaction rolled back: nothing is committed).
    pub async fn update(
        &self,
        group: &str,
        next: impl FnOnce(&Current) -> Draft,
    ) -> Result<UpdateOutcome, TopologyError> {
        check_group_name(group)?;
        let core = &self.core;
        let snapshot = core
            .scheduler
            .transaction(|tx| core.update_within(tx, group, next))?;
        let (published, publish_error) = core.publish_after_commit(group).await;
        Ok(UpdateOutcome {
            snapshot,
            published,
            publish_error,
        })
    }

    /// Deletes the group in one transaction: members and state values are
    /// dropped and pending deliveries discarded. Versions keep counting, so
    /// a recreated group is newer than anything readers cached. One
    /// publisher delete is attempted after the commit; as with
    /// [`Topology::update`], its failure is reported in the outcome, never
    /// as an error.
    ///
    /// A group whose stored member list does not decode is deleted all the
    /// same: the deliveries of the member IDs that can still be read are
    /// discarded, and a [`TopologyEvent::CorruptGroupDeleted`] event (and
    /// the log event `durability.topology.corrupt_group_deleted`) reports
    /// it. A row the storage itself cannot decode (a corrupt version or
    /// flag) still fails with `TOPOLOGY_CORRUPT`: without its version no
    /// newer deletion can be published.
    ///
    /// # Errors
    /// [`TopologyError::InvalidGroup`]; a storage or outbox error (the
    /// transaction rolled back: nothing is committed).
    pub async fn delete(&self, group: &str) -> Result<DeleteOutcome, TopologyError> {
        check_group_name(group)?;
        let core = &self.core;
        let corrupt_members = core
            .scheduler
            .transaction(|tx| core.delete_within(tx, group))?;
        if let Some((error, discarded)) = corrupt_members {
            tracing::warn!(
                event = "durability.topology.corrupt_group_deleted",
                group, code = error.code(), %error, discarded = discarded.len(),
                "deleted a group whose stored members do not decode; deliveries of the members that could be read were discarded"
            );
            core.emit(TopologyEvent::CorruptGroupDeleted {
                group: group.to_owned(),
                discarded,
                error: Arc::new(error),
            });
        }
        let (published, publish_error) = core.publish_after_commit(group).await;
        Ok(DeleteOutcome {
            published,
            publish_error,
        })
    }

    /// The group as the coordinator holds it (`None` if absent or deleted).
    /// Not a lookup path for other readers: they use the published copy.
    ///
    /// # Errors
    /// [`TopologyError::InvalidGroup`]; a storage error or a corrupt row.
    pub fn snapshot(&self, group: &str) -> Result<Option<Snapshot>, TopologyError> {
        check_group_name(group)?;
        let core = &self.core;
        core.scheduler.transaction(|tx| {
            let Some(row) = tx.topology_group(group)?.filter(|r| !r.deleted) else {
                return Ok(None);
            };
            Ok(Some(Snapshot {
                group: group.to_owned(),
                version: row.version,
                coordinator: core.coordinator.clone(),
                members: parse_members(&row.members).map_err(corrupt)?,
            }))
        })
    }

    /// The group's current state values (coordinator-local).
    ///
    /// # Errors
    /// A storage error or a corrupt row.
    pub fn states(
        &self,
        group: &str,
    ) -> Result<BTreeMap<String, serde_json::Value>, TopologyError> {
        check_group_name(group)?;
        self.core
            .scheduler
            .transaction(|tx| read_states(tx.storage_tx(), group))
    }

    /// Runs every publication and delivery due now (what the alarm does).
    ///
    /// # Errors
    /// A storage error; entries stay pending.
    pub async fn deliver_due(&self) -> Result<(), TopologyError> {
        if let Some(p) = &self.core.publication {
            p.deliver_due().await?;
        }
        for ch in self.core.channels.values() {
            ch.outbox.deliver_due().await?;
        }
        Ok(())
    }

    /// How many publications and deliveries are pending.
    ///
    /// # Errors
    /// A storage error.
    pub fn pending(&self) -> Result<u64, TopologyError> {
        let mut n = match &self.core.publication {
            Some(p) => p.len()?,
            None => 0,
        };
        for ch in self.core.channels.values() {
            n += ch.outbox.len()?;
        }
        Ok(n)
    }
}

fn read_states<T: TopologyTx>(
    tx: &mut T,
    group: &str,
) -> Result<BTreeMap<String, serde_json::Value>, TopologyError> {
    tx.topology_states(group)?
        .into_iter()
        .map(|(channel, value)| {
            serde_json::from_str(&value)
                .map(|v| (channel.clone(), v))
                .map_err(|e| corrupt(format!("state {channel:?}: {e}")))
        })
        .collect()
}

/// The member IDs that can still be read from a stored member list that
/// does not decode: every array element that is an object with a string
/// `id`, de-duplicated.
fn readable_member_ids(text: &str) -> Vec<String> {
    let Ok(serde_json::Value::Array(items)) = serde_json::from_str(text) else {
        return Vec::new();
    };
    let ids: BTreeSet<String> = items
        .iter()
        .filter_map(|m| m.get("id")?.as_str().map(str::to_owned))
        .collect();
    ids.into_iter().collect()
}

fn normalize(
    inputs: Vec<MemberInput>,
    before: &[Member],
    now: i64,
) -> Result<Vec<Member>, TopologyError> {
    if inputs.is_empty() {
        return Err(TopologyError::EmptyMembers);
    }
    if inputs.len() > MAX_MEMBERS {
        return Err(TopologyError::TooManyMembers {
            count: inputs.len(),
            limit: MAX_MEMBERS,
        });
    }
    let joined: BTreeMap<&str, i64> = before
        .iter()
        .map(|m| (m.id.as_str(), m.joined_at))
        .collect();
    let mut seen = BTreeSet::new();
    let mut members = Vec::with_capacity(inputs.len());
    for input in inputs {
        check_member_id(&input.id).map_err(|r| TopologyError::InvalidMember {
            id: input.id.clone(),
            reason: format!("id {r}"),
        })?;
        if let Some(hint) = &input.location_hint {
            check_location_hint(hint).map_err(|r| TopologyError::InvalidMember {
                id: input.id.clone(),
                reason: format!("location hint {r}"),
            })?;
        }
        if let Some(reason) = input.refused {
            return Err(TopologyError::InvalidMetadata {
                id: input.id,
                reason,
            });
        }
        if let Some(meta) = &input.meta {
            let size = serde_json::to_string(meta)
                .map(|s| s.len())
                .unwrap_or(usize::MAX);
            if size > MAX_META_BYTES {
                return Err(TopologyError::MetadataTooLarge {
                    id: input.id,
                    size,
                    limit: MAX_META_BYTES,
                });
            }
        }
        if !seen.insert(input.id.clone()) {
            return Err(TopologyError::DuplicateMember { id: input.id });
        }
        let joined_at = joined.get(input.id.as_str()).copied().unwrap_or(now);
        members.push(Member {
            id: input.id,
            state: input.state,
            location_hint: input.location_hint,
            meta: input.meta,
            joined_at,
        });
    }
    members.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(members)
}

impl<S: Storage, P: Publisher> Core<S, P>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    fn update_within(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        group: &str,
        next: impl FnOnce(&Current) -> Draft,
    ) -> Result<Snapshot, TopologyError> {
        let row = tx.topology_group(group)?;
        let live = row.as_ref().filter(|r| !r.deleted);
        let before = match live {
            Some(r) => parse_members(&r.members).map_err(corrupt)?,
            None => Vec::new(),
        };
        let stored_states = read_states(tx.storage_tx(), group)?;
        let current = Current {
            members: before,
            states: stored_states,
        };
        let draft = next(&current);
        let Current {
            members: before,
            states: stored_states,
        } = current;

        // Validate everything before the first write.
        if let Some((channel, reason)) = draft.refused {
            return Err(TopologyError::InvalidState { channel, reason });
        }
        if live.is_none() && draft.members.is_none() {
            return Err(TopologyError::GroupNotFound {
                group: group.to_owned(),
            });
        }
        let now = self.scheduler.now_ms();
        let after = match draft.members {
            None => before.clone(),
            Some(inputs) => normalize(inputs, &before, now)?,
        };
        let mut changed_states = BTreeMap::new();
        for (channel, value) in draft.states {
            if !self.channels.contains_key(&channel) {
                return Err(TopologyError::UnknownChannel { channel });
            }
            let text = serde_json::to_string(&value).map_err(|e| corrupt(e.to_string()))?;
            if text.len() > MAX_STATE_BYTES {
                return Err(TopologyError::StateTooLarge {
                    channel,
                    size: text.len(),
                    limit: MAX_STATE_BYTES,
                });
            }
            // Canonical comparison: JSON values compare as values, numbers
            // as numbers.
            if stored_states
                .get(&channel)
                .is_some_and(|stored| same_json(stored, &value))
            {
                continue;
            }
            changed_states.insert(channel, (text, value));
        }
        let changed = live.is_none() || !same_members(&after, &before);
        let version = match (changed, live, &row) {
            (false, Some(l), _) => l.version,
            (_, _, Some(r)) => r.version.saturating_add(1),
            (_, _, None) => 1,
        };
        let snapshot = Snapshot {
            group: group.to_owned(),
            version,
            coordinator: self.coordinator.clone(),
            members: after,
        };
        let encoded = if changed {
            Some(encode(&snapshot))
        } else {
            None
        };
        if let Some(e) = &encoded
            && e.len() > MAX_SNAPSHOT_BYTES
        {
            return Err(TopologyError::SnapshotTooLarge {
                size: e.len(),
                limit: MAX_SNAPSHOT_BYTES,
            });
        }

        // Writes.
        if let Some(encoded) = encoded {
            tx.topology_put_group(
                group,
                &GroupRow {
                    version,
                    members: members_json(&snapshot.members),
                    deleted: false,
                },
                now,
            )?;
            if let Some(p) = &self.publication {
                p.stage(
                    tx,
                    group,
                    &Publication::Write {
                        encoded: encoded.as_str().to_owned(),
                    },
                )?;
            }
        }
        for (channel, (text, _)) in &changed_states {
            tx.topology_put_state(group, channel, text)?;
        }
        self.stage_deliveries(
            tx,
            group,
            version,
            &before,
            &snapshot.members,
            &changed_states,
        )?;
        Ok(snapshot)
    }

    /// Members that entered a channel's role receive its current value; a
    /// changed value goes to every member in the role. Members that left
    /// lose their pending delivery.
    fn stage_deliveries(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        group: &str,
        topology_version: u64,
        before: &[Member],
        after: &[Member],
        changed: &BTreeMap<String, (String, serde_json::Value)>,
    ) -> Result<(), TopologyError> {
        if self.channels.is_empty() {
            return Ok(());
        }
        let values: BTreeMap<String, String> = tx.topology_states(group)?.into_iter().collect();
        for (name, channel) in &self.channels {
            let previous: BTreeSet<&str> = before
                .iter()
                .filter(|m| channel.role.includes(m))
                .map(|m| m.id.as_str())
                .collect();
            let targets: Vec<&Member> = after.iter().filter(|m| channel.role.includes(m)).collect();
            let kept: BTreeSet<&str> = targets.iter().map(|m| m.id.as_str()).collect();
            for id in previous.difference(&kept) {
                channel.outbox.discard(tx, &delivery_key(group, id))?;
            }
            let Some(value) = values.get(name) else {
                continue;
            };
            for member in targets {
                if !changed.contains_key(name) && previous.contains(member.id.as_str()) {
                    continue;
                }
                let member_json =
                    serde_json::to_string(&to_wire(member)).map_err(|e| corrupt(e.to_string()))?;
                channel.outbox.stage(
                    tx,
                    &delivery_key(group, &member.id),
                    &Delivery {
                        group: group.to_owned(),
                        member: member_json,
                        topology_version,
                        value: value.clone(),
                    },
                )?;
            }
        }
        Ok(())
    }

    /// Returns the decode error and the member IDs whose deliveries were
    /// discarded when the stored members do not decode: a corrupt group
    /// stays deletable.
    fn delete_within(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        group: &str,
    ) -> Result<Option<(TopologyError, Vec<String>)>, TopologyError> {
        let Some(row) = tx.topology_group(group)?.filter(|r| !r.deleted) else {
            return Ok(None);
        };
        let (ids, corrupt_members) = match parse_members(&row.members) {
            Ok(members) => (members.into_iter().map(|m| m.id).collect(), None),
            Err(reason) => {
                let ids = readable_member_ids(&row.members);
                (ids.clone(), Some((corrupt(reason), ids)))
            }
        };
        let version = row.version.saturating_add(1);
        tx.topology_put_group(
            group,
            &GroupRow {
                version,
                members: "[]".to_owned(),
                deleted: true,
            },
            self.scheduler.now_ms(),
        )?;
        tx.topology_delete_states(group)?;
        for id in &ids {
            for channel in self.channels.values() {
                channel.outbox.discard(tx, &delivery_key(group, id))?;
            }
        }
        if let Some(p) = &self.publication {
            p.stage(tx, group, &Publication::Delete { version })?;
        }
        Ok(corrupt_members)
    }

    /// The one publish attempt after a commit. The change is committed
    /// whatever happens here, so a failure is reported, not returned: the
    /// publication stays staged and the outbox keeps going.
    async fn publish_after_commit(&self, group: &str) -> (bool, Option<Arc<TopologyError>>) {
        let Some(p) = &self.publication else {
            return (true, None);
        };
        match p.publish_now(group).await {
            Ok(outcome) => (!outcome.pending, None),
            Err(error) => {
                let error = Arc::new(TopologyError::from(error));
                tracing::warn!(
                    event = "durability.topology.publish_failed",
                    group, code = error.code(), error = %error,
                    "the publish attempt after the commit failed; the change is committed and its publication stays staged"
                );
                self.emit(TopologyEvent::PublishFailed {
                    group: group.to_owned(),
                    attempt: 0,
                    error: Arc::clone(&error),
                });
                (false, Some(error))
            }
        }
    }

    /// Stages the latest state of the group again: a fresh version fences
    /// any publication in flight, so the latest snapshot is written again.
    fn stage_latest(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        group: &str,
    ) -> Result<(), TopologyError> {
        let Some(p) = &self.publication else {
            return Ok(());
        };
        let Some(row) = tx.topology_group(group)? else {
            return Ok(());
        };
        let publication = if row.deleted {
            Publication::Delete {
                version: row.version,
            }
        } else {
            let snapshot = Snapshot {
                group: group.to_owned(),
                version: row.version,
                coordinator: self.coordinator.clone(),
                members: parse_members(&row.members).map_err(corrupt)?,
            };
            Publication::Write {
                encoded: encode(&snapshot).as_str().to_owned(),
            }
        };
        p.stage(tx, group, &publication)?;
        Ok(())
    }

    fn emit(&self, event: TopologyEvent) {
        emit(self.on_event.as_ref(), &event);
    }

    fn report_publish_failed(&self, group: &str, attempt: u32, error: TopologyError) {
        tracing::warn!(
            event = "durability.topology.publish_failed",
            group, attempt, code = error.code(), %error, "topology publication failed; it will be retried"
        );
        self.emit(TopologyEvent::PublishFailed {
            group: group.to_owned(),
            attempt,
            error: Arc::new(error),
        });
    }

    fn report_restage_failed(&self, group: &str, error: TopologyError) {
        tracing::warn!(
            event = "durability.topology.restage_failed",
            group, code = error.code(), %error, "restaging after a late write failed"
        );
        self.emit(TopologyEvent::RestageFailed {
            group: group.to_owned(),
            error: Arc::new(error),
        });
    }

    fn report_delivery_failed(
        &self,
        group: &str,
        channel: &str,
        member: &str,
        attempt: u32,
        error: TopologyError,
    ) {
        tracing::warn!(
            event = "durability.topology.delivery_failed",
            group, channel, member, attempt, code = error.code(), %error,
            "state delivery failed; it will be retried"
        );
        self.emit(TopologyEvent::DeliveryFailed {
            group: group.to_owned(),
            channel: channel.to_owned(),
            member: member.to_owned(),
            attempt,
            error: Arc::new(error),
        });
    }

    /// Every write is recorded before it starts and forgotten once it
    /// settles. A record that outlives its write (a timeout, or eviction
    /// mid-write) means an older snapshot may still land, so a newer write
    /// is not acknowledged until that record's landing deadline passes and
    /// it has been written again. Records live in storage, so this survives
    /// eviction.
    async fn publish_snapshots(
        self: Arc<Self>,
        batch: &[Entry<Publication>],
    ) -> Result<(), SinkError> {
        let Some(publisher) = self.publisher.clone() else {
            return Err(SinkError::new("no publisher"));
        };
        let now = self.scheduler.now_ms();
        let land_by = now
            .saturating_add(self.publish_timeout_ms)
            .saturating_add(LANDING_WINDOW_MS);
        let ids = self
            .scheduler
            .transaction(|tx| {
                batch
                    .iter()
                    .map(|e| tx.topology_record_write(e.key(), land_by))
                    .collect::<Result<Vec<u64>, _>>()
            })
            .map_err(|e| SinkError::new(format!("recording writes failed: {e}")))?;
        futures::future::join_all(
            batch.iter().zip(ids).map(|(entry, id)| {
                Arc::clone(&self).publish_one(Arc::clone(&publisher), entry, id)
            }),
        )
        .await;
        Ok(())
    }

    async fn publish_one(self: Arc<Self>, publisher: Arc<P>, entry: &Entry<Publication>, id: u64) {
        let group = entry.key().to_owned();
        let coordinator = self.coordinator.clone();
        let mut write: BoxFuture<'static, Result<(), PublishError>> = match entry.value().clone() {
            Publication::Write { encoded } => match decode(encoded.as_bytes()) {
                Ok(snapshot) => {
                    let encoded = EncodedSnapshot::from_trusted(encoded);
                    Box::pin(async move { publisher.write(&snapshot, &encoded).await })
                }
                // Nothing was sent: the write cannot land.
                Err(reason) => Box::pin(async move {
                    Err(PublishError::rejected(format!("stored snapshot: {reason}")))
                }),
            },
            Publication::Delete { version } => {
                let group = group.clone();
                Box::pin(async move {
                    let deletion = SnapshotDeletion {
                        group: &group,
                        version,
                        coordinator: &coordinator,
                    };
                    publisher.delete(deletion).await
                })
            }
        };
        let clock = Arc::clone(self.scheduler.context().clock());
        let deadline = clock.now_ms().saturating_add(self.publish_timeout_ms);
        let result = timeout_at(&*clock, deadline, &mut write).await.ok();
        let outcome = match &result {
            Some(Ok(())) => "written",
            Some(Err(e)) if e.is_rejected() => "rejected",
            Some(Err(_)) => "unknown",
            None => "timeout",
        };
        metrics::counter!("durability_topology_publications_total", "outcome" => outcome)
            .increment(1);
        match result {
            Some(Ok(())) => {
                let settled = self.scheduler.transaction(|tx| {
                    tx.topology_forget_write(id)?;
                    let now = self.scheduler.now_ms();
                    Ok::<_, TopologyError>((now, tx.topology_outstanding_until(&group, now)?))
                });
                match settled {
                    Ok((_, None)) => {}
                    Ok((now, Some(until))) => {
                        tracing::info!(
                            event = "durability.topology.publish_held",
                            group = %group, until,
                            "an older write may still land; written again at its landing deadline"
                        );
                        #[allow(clippy::cast_precision_loss)]
                        let wait = until
                            .saturating_sub(now)
                            .clamp(1, MAX_ATTEMPT_TIMEOUT_MS as i64)
                            as f64;
                        entry.retry_after(wait);
                    }
                    Err(e) => {
                        self.report_publish_failed(&group, entry.attempt(), e);
                        entry.retry();
                    }
                }
            }
            Some(Err(error)) if error.is_rejected() => {
                // A rejected write settled before any newer write of this
                // group started, and can never land: forget it.
                if let Err(e) = self
                    .scheduler
                    .transaction(|tx| tx.topology_forget_write(id))
                {
                    tracing::warn!(
                        event = "durability.topology.forget_failed",
                        group = %group,
                        error = %e,
                        "forgetting a settled write record failed"
                    );
                }
                let source = error.into_source();
                self.report_publish_failed(
                    &group,
                    entry.attempt(),
                    TopologyError::PublishRejected { source },
                );
                entry.retry();
            }
            Some(Err(error)) => {
                // The write may still land: its record stays until its
                // landing deadline, holding back the acknowledgement of
                // newer writes of the group.
                let source = error.into_source();
                self.report_publish_failed(
                    &group,
                    entry.attempt(),
                    TopologyError::PublishOutcomeUnknown { source },
                );
                entry.retry();
            }
            None => {
                self.report_publish_failed(
                    &group,
                    entry.attempt(),
                    TopologyError::Timeout {
                        operation: "publish",
                        after_ms: u64::try_from(self.publish_timeout_ms).unwrap_or(u64::MAX),
                    },
                );
                self.settle_late(group, id, write);
                entry.retry();
            }
        }
    }

    /// An abandoned write that settles while the object lives may have
    /// landed over a newer one: restage the latest snapshot, and forget the
    /// write if it settled for sure (it succeeded or was refused; one that
    /// failed with an unknown outcome keeps its record until its landing
    /// deadline). If the object dies first, its record makes the next
    /// publication wait instead.
    fn settle_late(
        self: Arc<Self>,
        group: String,
        id: u64,
        write: BoxFuture<'static, Result<(), PublishError>>,
    ) {
        let core = Arc::clone(&self);
        self.scheduler.wait_until(async move {
            let settled = match write.await {
                Ok(()) => true,
                Err(e) => e.is_rejected(),
            };
            let result = core.scheduler.transaction(|tx| {
                if settled {
                    tx.topology_forget_write(id)?;
                }
                core.stage_latest(tx, &group)
            });
            if let Err(error) = result {
                core.report_restage_failed(&group, error);
            }
        });
    }

    async fn deliver(
        self: Arc<Self>,
        name: &str,
        batch: &[Entry<Delivery>],
    ) -> Result<(), SinkError> {
        let Some(channel) = self.channels.get(name) else {
            return Err(SinkError::new(format!("unknown channel {name}")));
        };
        let clock = Arc::clone(self.scheduler.context().clock());
        let core: &Self = &self;
        futures::future::join_all(batch.iter().map(|entry| {
            let clock = Arc::clone(&clock);
            async move {
                let d = entry.value();
                let parsed = serde_json::from_str(&d.member)
                    .map_err(|e| e.to_string())
                    .and_then(crate::encode::from_wire)
                    .and_then(|m| {
                        serde_json::from_str::<serde_json::Value>(&d.value)
                            .map(|v| (m, v))
                            .map_err(|e| e.to_string())
                    });
                let (member, value) = match parsed {
                    Ok(p) => p,
                    Err(reason) => {
                        core.report_delivery_failed(
                            &d.group,
                            name,
                            "",
                            entry.attempt(),
                            corrupt(format!("stored delivery: {reason}")),
                        );
                        entry.retry();
                        return;
                    }
                };
                let member_id = member.id.clone();
                let update = StateUpdate {
                    group: d.group.clone(),
                    channel: name.to_owned(),
                    version: entry.version(),
                    topology_version: d.topology_version,
                    value,
                };
                let deadline = clock.now_ms().saturating_add(channel.timeout_ms);
                // Members ignore versions they have passed, so an abandoned
                // delivery landing late is harmless.
                let result =
                    match timeout_at(&*clock, deadline, (channel.deliver)(member, update)).await {
                        Ok(r) => r.map_err(|source| TopologyError::DeliveryFailed { source }),
                        Err(_) => Err(TopologyError::Timeout {
                            operation: "delivery",
                            after_ms: u64::try_from(channel.timeout_ms).unwrap_or(u64::MAX),
                        }),
                    };
                if let Err(error) = result {
                    core.report_delivery_failed(&d.group, name, &member_id, entry.attempt(), error);
                    entry.retry();
                }
            }
        }))
        .await;
        Ok(())
    }
}

struct PublicationSink<S: Storage, P: Publisher>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    core: Weak<Core<S, P>>,
}

impl<S: Storage, P: Publisher> Sink<Publication> for PublicationSink<S, P>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    async fn publish(&self, batch: &[Entry<Publication>]) -> Result<(), SinkError> {
        let Some(core) = self.core.upgrade() else {
            return Err(SinkError::new("the coordinator was dropped"));
        };
        core.publish_snapshots(batch).await
    }
}

struct DeliverySink<S: Storage, P: Publisher>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    core: Weak<Core<S, P>>,
    name: String,
}

impl<S: Storage, P: Publisher> Sink<Delivery> for DeliverySink<S, P>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    async fn publish(&self, batch: &[Entry<Delivery>]) -> Result<(), SinkError> {
        let Some(core) = self.core.upgrade() else {
            return Err(SinkError::new("the coordinator was dropped"));
        };
        core.deliver(&self.name, batch).await
    }
}
