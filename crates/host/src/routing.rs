//! Routing calls between hosts: `host.object(class, name).call(method,
//! args)` runs the method once on the host that owns the object's scope.
//!
//! - An uncached call enters this host's own router: owner resolution
//!   (claiming a free scope). Owned here, it runs here. Owned by another
//!   task, it is forwarded once, with the route fence (task, generation),
//!   to the owner's endpoint, and the owner's trusted headers teach an
//!   owner hint.
//! - A hinted call goes straight to the hinted owner with the hint's fence.
//!   The owner re-checks the complete fence before dispatch (a fenced call
//!   is never forwarded again).
//! - Replay: one rediscovery through the router after a trusted
//!   pre-dispatch `stale_owner` / `owner_race` answer. An unmarked transport
//!   failure, or a 502/503/504 without the trusted marker, evicts the hint
//!   and returns `owner_unavailable`: the owner may already have run the
//!   method, so RPC is never replayed. A connection that could not be made
//!   (and a missing token or refused endpoint) is `owner_unavailable` too,
//!   as [`HostError::OwnerUnreachable`]: nothing ran, so the caller may
//!   call again. An unreadable success is
//!   `do_rpc_result_unknown`, never replayed either.
//! - Hints live in a process-local LRU of 10,000 entries keyed by storage
//!   id, class and shard (objects of one shard share a hint); the owner's
//!   admission stays authoritative.
//! - Before the internal token is attached, the owner's endpoint (the one
//!   its owner record advertises, else the [`PeerDirectory`]'s) must pass
//!   the [`EndpointPolicy`]; an invalid one fails closed as
//!   `owner_unavailable`, not started. A host with a token advertises its
//!   endpoint (checked against its own policy at start) in every owner
//!   record it writes; after a restart on another endpoint it gives its old
//!   record back and claims again, so the record never names a stale port.

mod connect;
mod fetch;

pub(crate) use connect::{Served, after_refusal};

use std::sync::Arc;

use durability_alarms::{AlarmIndex, Delivery, DispatchOutcome, RemoteOwner};
use durability_ownership::{
    Generation, LeaseStore, LifecycleAdmin, OwnerEndpoint, OwnerHint, OwnerHintCache, OwnerScope,
    Resolution, TaskId,
};
use serde_json::Value;
use tracing::Instrument as _;

use crate::error::HostError;
use crate::host::Host;
use crate::metrics::{self, Figure};
use crate::rpc::{MethodInput, Methods, RpcArgs, validate_method};
use crate::store::ObjectStore;
use crate::transport::{
    AlarmRequest, Endpoint, EndpointPolicy, InternalToken, InvokeRequest, OwnerHeaders,
    PeerDirectory, REDISCOVERY_CODES, Reply, RouteFence, Transport,
};

/// Routing outcome counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoutingStats {
    /// Calls run on this host (owned here).
    pub local: u64,
    /// Calls forwarded by this host's router to another owner.
    pub forwarded: u64,
    /// Calls sent straight to a hinted owner.
    pub direct: u64,
    /// Rediscoveries after a trusted pre-dispatch ownership answer.
    pub rediscoveries: u64,
    /// Hints evicted (stale answers, unmarked failures).
    pub hint_evictions: u64,
    /// Owner endpoints refused by the allowlist (or unknown).
    pub endpoint_refusals: u64,
    /// Internal requests refused for a missing or wrong token.
    pub auth_refusals: u64,
    /// Invokes this host served over the transport.
    pub served: u64,
    /// WebSocket connects this host's router handed off to another owner
    /// (the caller connects to the owner directly).
    pub handoffs: u64,
    /// WebSocket sessions this host admitted as the owner.
    pub upgrades: u64,
    /// Alarm deliveries this host's dispatcher sent to their owner.
    pub alarms_forwarded: u64,
    /// Alarm deliveries this host served for another host's dispatcher.
    pub alarms_served: u64,
}

/// The routing figures (plain numbers and facade counters, see
/// [`crate::metrics`]).
#[derive(Debug)]
pub(crate) struct RoutingCounters {
    local: Figure,
    forwarded: Figure,
    direct: Figure,
    rediscoveries: Figure,
    hint_evictions: Figure,
    endpoint_refusals: Figure,
    auth_refusals: Figure,
    served: Figure,
    handoffs: Figure,
    upgrades: Figure,
    alarms_forwarded: Figure,
    alarms_served: Figure,
}

impl RoutingCounters {
    pub(crate) fn new(task: &str) -> Self {
        Self {
            local: metrics::routed(task, "local"),
            forwarded: metrics::routed(task, "forwarded"),
            direct: metrics::routed(task, "direct"),
            rediscoveries: Figure::new("durability_host_rediscoveries_total", task, &[]),
            hint_evictions: Figure::new("durability_host_hint_evictions_total", task, &[]),
            endpoint_refusals: metrics::refusal(task, "endpoint"),
            auth_refusals: metrics::refusal(task, "auth"),
            served: Figure::new("durability_host_invokes_served_total", task, &[]),
            handoffs: metrics::routed(task, "handoff"),
            upgrades: metrics::routed(task, "upgraded"),
            alarms_forwarded: metrics::alarm_forward(task, "sent"),
            alarms_served: metrics::alarm_forward(task, "served"),
        }
    }

    pub(crate) fn snapshot(&self) -> RoutingStats {
        RoutingStats {
            local: self.local.get(),
            forwarded: self.forwarded.get(),
            direct: self.direct.get(),
            rediscoveries: self.rediscoveries.get(),
            hint_evictions: self.hint_evictions.get(),
            endpoint_refusals: self.endpoint_refusals.get(),
            auth_refusals: self.auth_refusals.get(),
            served: self.served.get(),
            handoffs: self.handoffs.get(),
            upgrades: self.upgrades.get(),
            alarms_forwarded: self.alarms_forwarded.get(),
            alarms_served: self.alarms_served.get(),
        }
    }
}

fn bump(figure: &Figure) {
    figure.bump();
}

/// What a host routes with.
pub(crate) struct RoutingState<I, D> {
    pub(crate) methods: Methods<I, D>,
    pub(crate) fetchers: crate::fetch::Fetchers<I, D>,
    pub(crate) connectors: crate::connect::Connectors<I, D>,
    pub(crate) token: Option<InternalToken>,
    pub(crate) peers: Arc<dyn PeerDirectory>,
    pub(crate) policy: EndpointPolicy,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) hints: OwnerHintCache,
    pub(crate) counters: RoutingCounters,
}

/// An object addressed by class and name, from [`Host::object`].
pub struct ObjectRef<S, I, O: ObjectStore = crate::store::DefaultObjectStore> {
    host: Host<S, I, O>,
    class: String,
    name: String,
}

impl<S, I, O: ObjectStore> std::fmt::Debug for ObjectRef<S, I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectRef")
            .field("class", &self.class)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<S, I, O: ObjectStore> ObjectRef<S, I, O>
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    /// Calls `method` with `args` on the object, on whichever host owns it
    /// (see the module docs for routing and replay).
    ///
    /// # Errors
    /// Refused before dispatch: [`HostError::InvalidMethod`],
    /// [`HostError::InvalidArgs`], [`HostError::UnknownMethod`],
    /// [`HostError::UnknownClass`], [`HostError::InvalidObjectName`].
    /// Across hosts: [`HostError::OwnerUnavailable`] (the method may have
    /// run), [`HostError::OwnerUnreachable`] (it did not run: the owner
    /// could not be reached), [`HostError::RpcResultUnknown`] (it may have
    /// run),
    /// [`HostError::Remote`] (the owner's answer: a trusted ownership code,
    /// the method's own [`crate::MethodError`], or `internal_error`).
    /// Locally: as [`Host::call`].
    pub async fn call(&self, method: &str, args: Value) -> Result<Value, HostError> {
        validate_method(method)?;
        let args = RpcArgs::new(args)?;
        let scope = self.host.scope_for(&self.class, &self.name)?;
        let request = InvokeRequest {
            class: self.class.clone(),
            name: self.name.clone(),
            method: method.to_owned(),
            args,
            fence: None,
        };
        let span = tracing::debug_span!(
            "durability.host.route",
            class = %self.class,
            object = %self.name,
            method,
            scope = %scope
        );
        self.host.route(&scope, request).instrument(span).await
    }

    /// The object's class.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// How one attempt ended.
enum Attempt {
    Done(Result<Value, HostError>),
    Rediscover(String),
}

impl<S, I, O: ObjectStore> Host<S, I, O>
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    /// The object of `class` named `name` (nothing is resolved until a
    /// call).
    pub fn object(&self, class: &str, name: &str) -> ObjectRef<S, I, O> {
        ObjectRef {
            host: self.clone(),
            class: class.to_owned(),
            name: name.to_owned(),
        }
    }

    /// The cached owner hint of an object's scope (diagnostics and tests).
    ///
    /// # Errors
    /// [`HostError::UnknownClass`] or [`HostError::InvalidObjectName`].
    pub fn owner_hint(&self, class: &str, name: &str) -> Result<Option<OwnerHint>, HostError> {
        let scope = self.scope_for(class, name)?;
        Ok(self.routing().hints.get(&scope))
    }

    /// Drops the cached owner hint of an object's scope (and so of every
    /// object of its shard): the next call goes through this host's router
    /// again. For diagnostics, tests and benchmarks; hints are advisory.
    /// Whether there was one.
    ///
    /// # Errors
    /// [`HostError::UnknownClass`] or [`HostError::InvalidObjectName`].
    pub fn forget_owner_hint(&self, class: &str, name: &str) -> Result<bool, HostError> {
        let scope = self.scope_for(class, name)?;
        let hints = &self.routing().hints;
        let had = hints.get(&scope).is_some();
        hints.remove(&scope);
        Ok(had)
    }

    pub(crate) fn count_refused_auth(&self) {
        bump(&self.routing().counters.auth_refusals);
    }

    async fn route(&self, scope: &OwnerScope, request: InvokeRequest) -> Result<Value, HostError> {
        let routing = self.routing();
        let me = self.ownership().task().clone();
        let mut rediscoveries = 1;
        if let Some(hint) = routing.hints.get(scope).filter(|h| h.task != me) {
            bump(&routing.counters.direct);
            tracing::debug!(
                event = "durability.host.route_direct",
                scope = %scope,
                owner = hint.task.as_str(),
                generation = hint.generation.get(),
                "sending the call straight to the hinted owner"
            );
            match self
                .send(
                    scope,
                    &request,
                    &hint.task,
                    hint.generation,
                    hint.endpoint.as_ref(),
                )
                .await
            {
                Attempt::Done(result) => return result,
                Attempt::Rediscover(code) => {
                    self.evict(scope);
                    bump(&routing.counters.rediscoveries);
                    rediscoveries = 0;
                    tracing::debug!(
                        event = "durability.host.route_rediscover",
                        scope = %scope,
                        code,
                        "hinted owner refused before dispatch; rediscovering"
                    );
                }
            }
        }
        loop {
            match self.route_once(scope, &request).await {
                Attempt::Done(result) => return result,
                Attempt::Rediscover(code) if rediscoveries > 0 => {
                    rediscoveries -= 1;
                    self.evict(scope);
                    bump(&routing.counters.rediscoveries);
                    tracing::debug!(
                        event = "durability.host.route_rediscover",
                        scope = %scope,
                        code,
                        "owner refused before dispatch; rediscovering once"
                    );
                }
                Attempt::Rediscover(code) => {
                    self.evict(scope);
                    return Err(HostError::remote_ownership(&code));
                }
            }
        }
    }

    /// One pass through this host's router: resolve, then run here or
    /// forward once.
    async fn route_once(&self, scope: &OwnerScope, request: &InvokeRequest) -> Attempt {
        let routing = self.routing();
        let resolution = match self.ownership().resolve(scope, self.lifecycle()).await {
            Ok(r) => r,
            Err(e) => return Attempt::Done(Err(HostError::Ownership(e))),
        };
        match resolution {
            Resolution::Local(_) => {
                self.evict_quiet(scope);
                bump(&routing.counters.local);
                tracing::debug!(
                    event = "durability.host.route_local",
                    scope = %scope,
                    "owned here; running the call on this host"
                );
                match self.invoke_local(request, None).await {
                    // Resolved here, then found owned elsewhere: a race.
                    Err(HostError::NotOwner { .. }) => Attempt::Rediscover("owner_race".to_owned()),
                    other => Attempt::Done(other.map(|(v, _)| v)),
                }
            }
            Resolution::Remote {
                task,
                generation,
                endpoint,
            } => {
                bump(&routing.counters.forwarded);
                tracing::debug!(
                    event = "durability.host.route_forward",
                    scope = %scope,
                    owner = task.as_str(),
                    generation = generation.get(),
                    "owned by another host; forwarding the call"
                );
                self.send(scope, request, &task, generation, endpoint.as_ref())
                    .await
            }
        }
    }

    /// Sends `request` fenced at (`task`, `generation`) to `task`'s
    /// endpoint (the one its owner record advertises, else the peer
    /// directory's) and classifies the answer.
    async fn send(
        &self,
        scope: &OwnerScope,
        request: &InvokeRequest,
        task: &TaskId,
        generation: Generation,
        advertised: Option<&OwnerEndpoint>,
    ) -> Attempt {
        let routing = self.routing();
        let (token, endpoint, fence) = match self.send_target(scope, task, generation, advertised) {
            Ok(t) => t,
            Err(e) => return Attempt::Done(Err(e)),
        };
        let mut fenced = request.clone();
        fenced.fence = Some(fence);
        let reply = routing.transport.invoke(&endpoint, token, &fenced).await;
        match reply {
            Reply::Ok { result, owner } => {
                self.learn_hint(scope, task, generation, advertised, owner.as_ref());
                Attempt::Done(Ok(result))
            }
            Reply::Ownership { code } if REDISCOVERY_CODES.contains(&code.as_str()) => {
                Attempt::Rediscover(code)
            }
            Reply::Ownership { code } => {
                self.evict(scope);
                Attempt::Done(Err(HostError::remote_ownership(&code)))
            }
            Reply::Failed {
                status,
                code,
                message,
                details,
            } => Attempt::Done(Err(HostError::Remote {
                status,
                code,
                message,
                details,
            })),
            Reply::NotSent { reason } => {
                self.evict(scope);
                tracing::warn!(
                    event = "durability.host.owner_unreachable",
                    scope = %scope,
                    owner = task.as_str(),
                    reason,
                    "the owner could not be reached; hint evicted, nothing ran"
                );
                Attempt::Done(Err(HostError::OwnerUnreachable { reason }))
            }
            Reply::Unmarked { reason } => {
                self.evict(scope);
                tracing::warn!(
                    event = "durability.host.owner_unavailable",
                    scope = %scope,
                    owner = task.as_str(),
                    reason,
                    "no trusted answer from the owner; hint evicted, not replayed"
                );
                Attempt::Done(Err(HostError::OwnerUnavailable { reason }))
            }
            Reply::ResultUnknown { reason } => {
                tracing::warn!(
                    event = "durability.host.rpc_result_unknown",
                    scope = %scope,
                    owner = task.as_str(),
                    reason,
                    "the owner's success could not be read; not replayed"
                );
                Attempt::Done(Err(HostError::RpcResultUnknown { reason }))
            }
        }
    }

    /// Caches the owner hint a success taught: only when the owner's
    /// trusted headers name the task, generation and scope it was sent to.
    fn learn_hint(
        &self,
        scope: &OwnerScope,
        task: &TaskId,
        generation: Generation,
        advertised: Option<&OwnerEndpoint>,
        owner: Option<&OwnerHeaders>,
    ) {
        if let Some(owner) = owner
            && owner.task == task.as_str()
            && owner.generation == generation.get()
            && owner.key == scope.host_id()
            && let Ok(g) = Generation::new(owner.generation)
        {
            self.routing().hints.insert(
                scope,
                OwnerHint {
                    task: task.clone(),
                    generation: g,
                    endpoint: advertised.cloned(),
                },
            );
        }
    }

    /// The endpoint of `task`: the one its owner record advertises, else
    /// the peer directory's; checked against the endpoint policy (before
    /// any token is attached).
    /// The token, the owner's endpoint and the route fence of a send to
    /// `task` at `generation` (calls and fetches alike). No token, or an
    /// endpoint this host's policy refuses (the hint is evicted), is
    /// [`HostError::OwnerUnreachable`]: nothing was sent.
    pub(crate) fn send_target(
        &self,
        scope: &OwnerScope,
        task: &TaskId,
        generation: Generation,
        advertised: Option<&OwnerEndpoint>,
    ) -> Result<(&InternalToken, Endpoint, RouteFence), HostError> {
        let Some(token) = self.routing().token.as_ref() else {
            return Err(HostError::OwnerUnreachable {
                reason: "no internal token configured: calls between hosts are off".to_owned(),
            });
        };
        let endpoint = self.owner_endpoint(task, advertised).map_err(|reason| {
            self.evict(scope);
            HostError::OwnerUnreachable { reason }
        })?;
        let fence = RouteFence {
            task: task.as_str().to_owned(),
            generation: generation.get(),
        };
        Ok((token, endpoint, fence))
    }

    fn owner_endpoint(
        &self,
        task: &TaskId,
        advertised: Option<&OwnerEndpoint>,
    ) -> Result<Endpoint, String> {
        let routing = self.routing();
        let raw = advertised
            .map(|e| e.as_str().to_owned())
            .or_else(|| routing.peers.endpoint(task.as_str()));
        let endpoint = match raw {
            None => Err("the owner's endpoint is unknown".to_owned()),
            Some(raw) => routing.policy.check(&raw).map_err(|e| e.to_string()),
        };
        if let Err(reason) = &endpoint {
            bump(&routing.counters.endpoint_refusals);
            tracing::warn!(
                event = "durability.host.owner_endpoint_refused",
                owner = task.as_str(),
                reason,
                "owner endpoint refused before the token was attached"
            );
        }
        endpoint
    }

    /// Sends an alarm delivery this host's dispatcher claimed to `owner`,
    /// fenced at `generation`, over the transport. Nothing sent (no token,
    /// an unknown or refused endpoint) is never started.
    pub(crate) async fn forward_alarm(
        &self,
        remote: &RemoteOwner,
        delivery: Delivery,
    ) -> DispatchOutcome {
        let (owner, generation) = (&remote.task, remote.generation);
        let routing = self.routing();
        let Some(token) = routing.token.as_ref() else {
            return DispatchOutcome::NeverStarted {
                reason: "no internal token configured: calls between hosts are off".to_owned(),
            };
        };
        let endpoint = match self.owner_endpoint(owner, remote.endpoint.as_ref()) {
            Ok(e) => e,
            Err(reason) => return DispatchOutcome::NeverStarted { reason },
        };
        bump(&routing.counters.alarms_forwarded);
        let object = delivery.object.clone();
        let request = AlarmRequest {
            delivery,
            fence: RouteFence {
                task: owner.as_str().to_owned(),
                generation: generation.get(),
            },
        };
        let outcome = routing
            .transport
            .deliver_alarm(&endpoint, token, &request, self.clock().as_ref())
            .await;
        tracing::debug!(
            event = "durability.host.alarm_forwarded",
            object = %object,
            owner = owner.as_str(),
            generation = generation.get(),
            outcome = ?outcome,
            "alarm delivery forwarded to its owner"
        );
        outcome
    }

    /// Serves an alarm delivery another host's dispatcher forwarded: it
    /// runs here only if the fence names this task and admission finds this
    /// task's owner record at the fence's generation; otherwise it never
    /// started (the sender re-resolves the owner).
    pub(crate) async fn serve_alarm(&self, request: AlarmRequest) -> DispatchOutcome {
        bump(&self.routing().counters.alarms_served);
        let AlarmRequest { delivery, fence } = request;
        if fence.task != self.ownership().task().as_str() {
            return DispatchOutcome::NeverStarted {
                reason: format!("the route fence names task {:?}, not this host", fence.task),
            };
        }
        let (Ok(generation), Some(routed)) = (Generation::new(fence.generation), self.routed())
        else {
            return DispatchOutcome::NeverStarted {
                reason: "the host is not serving alarm deliveries".to_owned(),
            };
        };
        routed.dispatch_at(delivery, generation).await
    }

    fn evict(&self, scope: &OwnerScope) {
        let routing = self.routing();
        if routing.hints.get(scope).is_some() {
            routing.hints.remove(scope);
            bump(&routing.counters.hint_evictions);
        }
    }

    fn evict_quiet(&self, scope: &OwnerScope) {
        self.routing().hints.remove(scope);
    }

    /// Serves an invoke that arrived over the transport: a fenced one runs
    /// here only if this host owns the scope at the fence's generation
    /// (else a trusted `stale_owner`); an unfenced one enters the router
    /// and is forwarded at most once.
    pub(crate) async fn serve_invoke(
        &self,
        request: InvokeRequest,
    ) -> Result<(Value, OwnerHeaders), HostError> {
        bump(&self.routing().counters.served);
        validate_method(&request.method)?;
        let scope = self.scope_for(&request.class, &request.name)?;
        if let Some(fence) = request.fence.clone() {
            if fence.task != self.ownership().task().as_str() {
                return Err(HostError::StaleFence {
                    generation: fence.generation,
                });
            }
            return self.invoke_local(&request, Some(fence.generation)).await;
        }
        let routing = self.routing();
        match self.ownership().resolve(&scope, self.lifecycle()).await? {
            Resolution::Local(_) => {
                bump(&routing.counters.local);
                self.invoke_local(&request, None).await
            }
            Resolution::Remote {
                task,
                generation,
                endpoint,
            } => {
                bump(&routing.counters.forwarded);
                tracing::debug!(
                    event = "durability.host.route_forward",
                    scope = %scope,
                    owner = task.as_str(),
                    generation = generation.get(),
                    "owned by another host; forwarding the call"
                );
                match self
                    .send(&scope, &request, &task, generation, endpoint.as_ref())
                    .await
                {
                    Attempt::Done(Ok(value)) => Ok((
                        value,
                        OwnerHeaders {
                            task: task.as_str().to_owned(),
                            generation: generation.get(),
                            key: scope.host_id().to_owned(),
                            endpoint: endpoint
                                .map(|e| e.as_str().to_owned())
                                .or_else(|| routing.peers.endpoint(task.as_str())),
                        },
                    )),
                    Attempt::Done(Err(e)) => Err(e),
                    Attempt::Rediscover(code) => Err(HostError::remote_ownership(&code)),
                }
            }
        }
    }

    /// Runs a registered method here under admission, the watchdog and the
    /// storage fence; with `expect`, only at that generation.
    pub(crate) async fn invoke_local(
        &self,
        request: &InvokeRequest,
        expect: Option<u64>,
    ) -> Result<(Value, OwnerHeaders), HostError> {
        let method = self
            .routing()
            .methods
            .get(&request.class)
            .and_then(|m| m.get(&request.method))
            .cloned()
            .ok_or_else(|| HostError::UnknownMethod {
                class: request.class.clone(),
                method: request.method.clone(),
            })?;
        let args = request.args.value().clone();
        let scope = self.scope_for(&request.class, &request.name)?;
        let value = self
            .dispatch_expect(
                &request.class,
                &request.name,
                expect,
                |input: MethodInput<I, O::Storage>| async move {
                    method(input, args).await.map_err(HostError::Handler)
                },
            )
            .await;
        let (value, generation) = match value {
            Err(HostError::NotOwner { .. }) if expect.is_some() => {
                return Err(HostError::StaleFence {
                    generation: expect.unwrap_or(0),
                });
            }
            other => other?,
        };
        Ok((
            value,
            OwnerHeaders {
                task: self.ownership().task().as_str().to_owned(),
                generation,
                key: scope.host_id().to_owned(),
                endpoint: self.endpoint().map(str::to_owned),
            },
        ))
    }
}
