//! Routing calls between hosts: `host.object_by_name(class, name).call(method,
//! args)` runs the method once on the host that owns the object's scope.
//!
//! One router carries every request kind: `router` holds the one
//! owner-routing loop (used by a host's own router and by the thin
//! [`crate::RpcClient`]), `rules` the replay rules as one pure function
//! from what an attempt observed to what happens next, and each kind (an
//! RPC `call`, a `fetch`, a `connect`) is one file implementing the
//! loop's per-kind trait. Alarm deliveries are forwarded once to the owner
//! the dispatcher resolved (`forward_alarm`): their retries belong to the
//! alarm dispatcher's at-least-once contract, not to this loop.
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
//!   record it writes; after a restart (on any endpoint) it adopts only
//!   records it wrote itself, so its predecessor's records (and their
//!   endpoints) are waited out, at most one owner TTL, before it claims.

mod call;
mod connect;
mod fetch;
mod router;
mod rules;

pub(crate) use connect::{Served, Session};
pub(crate) use router::{
    Addressed, Attempt, Kind, Make, Refusal, Routes, Step, Target, route, send_fenced,
};
pub(crate) use rules::{Answer, Failure};

use std::future::Future;
use std::marker::PhantomData;

use durability_alarms::{Delivery, DispatchOutcome, RemoteOwner};
use durability_ownership::{Generation, OwnerEndpoint, OwnerHint, OwnerScope, Resolution, TaskId};

use tracing::Instrument as _;

use crate::bounds::{HostAlarms, HostLeases};
use crate::error::HostError;
use crate::host::Host;
use crate::object::Class;
use crate::protocol::{
    AlarmRequest, Endpoint, InternalToken, OwnerHeaders, Reply, RequestId, RouteFence,
};
pub use crate::route_table::RoutingStats;
use crate::route_table::bump;
use crate::store::ObjectStore;
use router::forwarded_once;

/// An object addressed by class and name, from [`Host::object_by_name`].
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

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> ObjectRef<S, I, O> {
    /// Makes a request of kind `K` from `input` ([`Make`]) and routes it
    /// to the object's owner (the one router), with its context request id
    /// (else the task's, else a new one) on everything it runs and sends.
    async fn routed<K: RunHere<S, I, O> + Make>(
        &self,
        input: K::Input,
    ) -> Result<K::Out, HostError> {
        let (request, id) = K::make(&self.class, &self.name, input)?;
        let id = id.unwrap_or_else(RequestId::current_or_new);
        let shared = self.host.shared_scope(&self.class, &self.name)?;
        let scope: &OwnerScope = &shared;
        let span = tracing::debug_span!(
            "durability.host.route",
            kind = K::NAME,
            class = %self.class,
            object = %self.name,
            method = request.method(),
            scope = %scope,
            request_id = %id
        );
        id.scope(route(&self.host, scope, &request).instrument(span))
            .await
            .map_err(|refusal| refusal.error)
    }
}

impl<S, I, O: ObjectStore> ObjectRef<S, I, O> {
    /// The object's class.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// An object of class `T`, from [`Host::object`]: the calls of an
/// [`ObjectRef`], and `T`'s own body and transaction without naming the
/// class again.
pub struct Object<S, I, O: ObjectStore, T> {
    object: ObjectRef<S, I, O>,
    class: PhantomData<fn() -> T>,
}

impl<S, I, O: ObjectStore, T> std::fmt::Debug for Object<S, I, O, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.object.fmt(f)
    }
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore, T: Class> Object<S, I, O, T> {
    /// The untyped reference (calls by method name, fetch, connect).
    pub fn by_name(&self) -> &ObjectRef<S, I, O> {
        &self.object
    }

    /// Calls the typed method `M` of `T` with `args`, on whichever host
    /// owns the object (routed as [`ObjectRef::call`], with the same JSON on
    /// the wire): a method of another class, or a result of another type,
    /// does not compile. See [`crate::typed`].
    ///
    /// # Errors
    /// [`crate::CallError::Method`]: the method's own error, decoded (the
    /// same on this host and across hosts); [`crate::CallError::Host`]:
    /// everything [`ObjectRef::call`] reports, a result that does not
    /// decode as `M::Out` ([`HostError::RpcResultUnknown`]), or a method
    /// error whose details do not decode as `M::Error` (kept as
    /// [`HostError::Method`]).
    pub async fn call<M: crate::Method<Class = T>>(
        &self,
        args: M,
    ) -> Result<M::Out, crate::CallError<M::Error>> {
        crate::typed::call_with(&args, |args| self.object.call(M::NAME, args)).await
    }

    /// Runs `body` on the object on this host ([`Host::call`] with the
    /// class named by its type).
    ///
    /// # Errors
    /// As [`Host::call`].
    pub async fn run<R, F, Fut>(&self, body: F) -> Result<R, HostError>
    where
        F: FnOnce(crate::Handle<T, I, O::Storage>) -> Fut,
        Fut: Future<Output = Result<R, crate::BoxError>>,
    {
        self.object
            .host
            .call::<T, R, F, Fut>(T::NAME, &self.object.name, body)
            .await
    }

    /// Runs one transaction on the object on this host
    /// ([`Host::transaction`] with the class named by its type).
    ///
    /// # Errors
    /// As [`Host::transaction`].
    pub async fn transaction<R, F>(&self, body: F) -> Result<R, HostError>
    where
        F: FnOnce(
            &T,
            &mut durability_scheduler::Transaction<'_, '_, O::Storage>,
        ) -> Result<R, durability_scheduler::StorageError>,
    {
        self.object
            .host
            .transaction::<T, R, F>(T::NAME, &self.object.name, body)
            .await
    }
}

/// A request kind a host runs itself when it owns the object.
pub(crate) trait RunHere<S, I, O: ObjectStore>: Kind {
    /// Runs the request here under admission, the watchdog and the storage
    /// fence; fenced, only at the fence's generation
    /// ([`Addressed::expect`], else [`HostError::StaleFence`]). Returns the
    /// generation it ran under.
    fn run_here<'a>(
        &'a self,
        host: &'a Host<S, I, O>,
    ) -> impl Future<Output = Result<(Self::Out, u64), HostError>> + Send + 'a;
}

/// The handler `class` registered (`method`: its name, for the error).
///
/// # Errors
/// [`HostError::UnknownMethod`] when there is none.
fn registered<H: Clone>(handler: Option<&H>, class: &str, method: &str) -> Result<H, HostError> {
    handler.cloned().ok_or_else(|| HostError::UnknownMethod {
        class: class.to_owned(),
        method: method.to_owned(),
    })
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> Host<S, I, O> {
    /// The object of class `T` named `name` (nothing is resolved until a
    /// call): `host.object::<Cart>("cart-42")`.
    pub fn object<T: Class>(&self, name: &str) -> Object<S, I, O, T> {
        Object {
            object: self.object_by_name(T::NAME, name),
            class: PhantomData,
        }
    }

    /// The object of `class` named `name`, the class by its name (nothing
    /// is resolved until a call): the untyped form the wire and the thin
    /// client use. With a [`Class`] type: [`Host::object`].
    pub fn object_by_name(&self, class: &str, name: &str) -> ObjectRef<S, I, O> {
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

    /// Sends `request` fenced at `owner` to its endpoint (the one its
    /// owner record advertises, else the peer directory's).
    async fn send_to<K: Kind>(
        &self,
        scope: &OwnerScope,
        request: &K,
        owner: OwnerHint,
    ) -> Attempt<K::Out, OwnerHint> {
        let (token, endpoint, fence) = match self.send_target(
            scope,
            &owner.task,
            owner.generation,
            owner.endpoint.as_ref(),
        ) {
            Ok(t) => t,
            Err(e) => return Attempt::Done(Err(e)),
        };
        let to = Target {
            transport: self.routing().transport.as_ref(),
            endpoint: &endpoint,
            token,
            key: scope.host_id(),
        };
        let answer = send_fenced(request, fence, to).await;
        Attempt::Answered {
            answer,
            to: Some(owner),
        }
    }

    /// Serves a request that arrived over the transport: a fenced one runs
    /// here only if the fence names this task and admission finds this
    /// task's claim at the fence's generation (else a trusted
    /// `stale_owner`); an unfenced one enters the router and is forwarded
    /// at most once (the caller applies the replay rules).
    pub(crate) async fn serve_routed<K: RunHere<S, I, O>>(
        &self,
        request: K,
    ) -> Result<(K::Out, OwnerHeaders), HostError> {
        let routing = self.routing();
        bump(&routing.counters.served);
        let (class, name) = request.object();
        let scope = self.shared_scope(class, name)?;
        if let Some(fence) = request.fence() {
            if fence.task != self.ownership().task().as_str() {
                return Err(HostError::StaleFence {
                    generation: fence.generation,
                });
            }
            let (value, generation) = request.run_here(self).await?;
            return Ok((value, self.own_headers(&scope, generation)));
        }
        match self.ownership().resolve(&scope, self.lifecycle()).await? {
            Resolution::Local(_) => {
                bump(&routing.counters.local);
                let (value, generation) = request.run_here(self).await?;
                Ok((value, self.own_headers(&scope, generation)))
            }
            Resolution::Remote {
                task,
                generation,
                endpoint,
            } => {
                self.note_forward::<K>(&scope, &task, generation);
                let owner = OwnerHeaders {
                    task: task.as_str().to_owned(),
                    generation: generation.get(),
                    key: scope.host_id().to_owned(),
                    endpoint: endpoint
                        .as_ref()
                        .map(|e| e.as_str().to_owned())
                        .or_else(|| routing.peers.endpoint(task.as_str())),
                };
                let hint = OwnerHint {
                    task,
                    generation,
                    endpoint,
                };
                let value = match self.send_to(&scope, &request, hint).await {
                    Attempt::Done(result) => result?,
                    Attempt::Answered { answer, .. } => forwarded_once(&request.rules(), answer)?,
                };
                Ok((value, owner))
            }
        }
    }

    /// Counts and reports a request sent on to another owner.
    fn note_forward<K: Kind>(&self, scope: &OwnerScope, task: &TaskId, generation: Generation) {
        let counters = &self.routing().counters;
        bump(if K::HANDOFF {
            &counters.handoffs
        } else {
            &counters.forwarded
        });
        tracing::debug!(
            event = "durability.host.route_forward",
            kind = K::NAME,
            scope = %scope,
            owner = task.as_str(),
            generation = generation.get(),
            "owned by another host; sending the request to the owner"
        );
    }

    /// This host's owner headers for `scope` at `generation`.
    pub(crate) fn own_headers(&self, scope: &OwnerScope, generation: u64) -> OwnerHeaders {
        OwnerHeaders {
            task: self.ownership().task().as_str().to_owned(),
            generation,
            key: scope.host_id().to_owned(),
            endpoint: self.endpoint().map(str::to_owned),
        }
    }

    /// Caches the owner hint a success taught: the owner it was sent to,
    /// only when the owner's trusted headers name that task, generation
    /// and scope.
    fn learn_hint(&self, scope: &OwnerScope, sent_to: OwnerHint, owner: Option<&OwnerHeaders>) {
        if let Some(owner) = owner
            && owner.task == sent_to.task.as_str()
            && owner.generation == sent_to.generation.get()
            && owner.key == scope.host_id()
        {
            self.routing().hints.insert(scope, sent_to);
        }
    }

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
            self.evict_hint(scope);
            HostError::OwnerUnreachable { reason }
        })?;
        let fence = RouteFence {
            task: task.as_str().to_owned(),
            generation: generation.get(),
        };
        Ok((token, endpoint, fence))
    }

    /// The endpoint of `task`: the one its owner record advertises, else
    /// the peer directory's; checked against the endpoint policy (before
    /// any token is attached).
    pub(crate) fn owner_endpoint(
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
        let id = RequestId::current_or_new();
        let outcome = id
            .clone()
            .scope(routing.transport.deliver_alarm(
                &endpoint,
                token,
                &request,
                self.clock().as_ref(),
            ))
            .await;
        tracing::debug!(
            event = "durability.host.alarm_forwarded",
            object = %object,
            owner = owner.as_str(),
            generation = generation.get(),
            outcome = ?outcome,
            request_id = %id,
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

    pub(crate) fn evict_hint(&self, scope: &OwnerScope) {
        let routing = self.routing();
        if routing.hints.get(scope).is_some() {
            routing.hints.remove(scope);
            bump(&routing.counters.hint_evictions);
        }
    }

    pub(crate) fn evict_quiet(&self, scope: &OwnerScope) {
        self.routing().hints.remove(scope);
    }
}

impl<K, S: HostLeases, I: HostAlarms, O> Routes<K> for Host<S, I, O>
where
    K: RunHere<S, I, O>,
    O: ObjectStore,
{
    type Owner = OwnerHint;

    fn hint(&self, scope: &OwnerScope) -> Option<OwnerHint> {
        let me = self.ownership().task();
        self.routing().hints.get(scope).filter(|h| h.task != *me)
    }

    /// Resolves the owner: owned here, the request runs here (a race with
    /// another owner is a pre-dispatch `owner_race`); owned elsewhere, it
    /// is sent to the owner once, fenced.
    async fn via_router<'a>(
        &'a self,
        scope: &'a OwnerScope,
        request: &'a K,
    ) -> Attempt<K::Out, OwnerHint> {
        let resolution = match self.ownership().resolve(scope, self.lifecycle()).await {
            Ok(r) => r,
            Err(e) => return Attempt::Done(Err(HostError::Ownership(e))),
        };
        match resolution {
            Resolution::Local(_) => {
                self.evict_quiet(scope);
                bump(&self.routing().counters.local);
                tracing::debug!(
                    event = "durability.host.route_local",
                    kind = K::NAME,
                    scope = %scope,
                    "owned here; running the request on this host"
                );
                match request.run_here(self).await {
                    Err(HostError::NotOwner { .. }) => Attempt::Answered {
                        answer: Answer::Reply(Reply::Ownership {
                            code: "owner_race".to_owned(),
                        }),
                        to: None,
                    },
                    other => Attempt::Done(other.map(|(value, _)| value)),
                }
            }
            Resolution::Remote {
                task,
                generation,
                endpoint,
            } => {
                self.note_forward::<K>(scope, &task, generation);
                let owner = OwnerHint {
                    task,
                    generation,
                    endpoint,
                };
                self.send_to(scope, request, owner).await
            }
        }
    }

    fn to_owner<'a>(
        &'a self,
        scope: &'a OwnerScope,
        request: &'a K,
        owner: OwnerHint,
    ) -> impl Future<Output = Attempt<K::Out, OwnerHint>> + Send + 'a {
        self.send_to(scope, request, owner)
    }

    fn follow(&self, owner: OwnerHeaders) -> Result<OwnerHint, HostError> {
        let unreachable = |e: durability_ownership::OwnershipError| HostError::OwnerUnreachable {
            reason: format!("the handed-off owner is malformed: {e}"),
        };
        Ok(OwnerHint {
            task: TaskId::new(&owner.task).map_err(unreachable)?,
            generation: Generation::new(owner.generation).map_err(unreachable)?,
            endpoint: owner
                .endpoint
                .as_deref()
                .map(OwnerEndpoint::new)
                .transpose()
                .map_err(unreachable)?,
        })
    }

    fn learn(&self, scope: &OwnerScope, to: Option<OwnerHint>, owner: Option<&OwnerHeaders>) {
        if let Some(to) = to {
            self.learn_hint(scope, to, owner);
        }
    }

    fn evict(&self, scope: &OwnerScope) {
        self.evict_hint(scope);
    }

    fn note(&self, scope: &OwnerScope, step: Step<'_>) {
        let counters = &self.routing().counters;
        match step {
            Step::Direct => {
                bump(&counters.direct);
                tracing::debug!(
                    event = "durability.host.route_direct",
                    kind = K::NAME,
                    scope = %scope,
                    "sending the request straight to the hinted owner"
                );
            }
            Step::Rediscover(seen) => {
                bump(&counters.rediscoveries);
                tracing::debug!(
                    event = "durability.host.route_rediscover",
                    kind = K::NAME,
                    scope = %scope,
                    seen = ?seen,
                    "refused before dispatch; rediscovering once through the router"
                );
            }
            Step::Replay(seen) => tracing::debug!(
                event = "durability.host.route_replayed",
                kind = K::NAME,
                scope = %scope,
                seen = ?seen,
                "no trusted answer to a safe request; replaying once through the router"
            ),
            Step::Untrusted(failure, error) => tracing::warn!(
                event = "durability.host.route_untrusted",
                kind = K::NAME,
                scope = %scope,
                failure = ?failure,
                code = error.code(),
                reason = %error,
                "no trusted answer from the owner; not replayed"
            ),
        }
    }
}
