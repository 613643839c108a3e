//! [`RpcClient`]: a thin client that is not a host. It sends a call (or a
//! tenant fetch) to an entry host's router, learns the owner hint from the
//! owner's trusted headers (the endpoint checked against the client's
//! [`EndpointPolicy`]), and calls the owner directly with the route fence
//! next time, under the
//! same replay rules as a host's own router (see [`crate::routing`]'s
//! docs on [`crate::Host::object_by_name`]).
//!
//! Its figures are plain numbers ([`RpcClient::stats`]) and counters of the
//! `metrics` facade (`durability_host_client_*`, names in ARCHITECTURE.md,
//! "Metrics"; no `task` label), bound when the client is made.

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use durability_ownership::{
    ClassName, DEFAULT_HINT_CAPACITY, ObjectName, OwnerScope, ShardCount, StorageId,
};
use serde_json::Value;

use crate::connect::{ConnectRequest, Socket};
use crate::error::HostError;
use crate::fetch::{FetchRequest, FetchResponse};
use crate::metrics::{self, Figure};
use crate::protocol::{
    ConnectInvoke, Endpoint, EndpointPolicy, FetchInvoke, HttpTransport, InternalToken,
    InvokeRequest, OwnerHeaders, RequestId, RouteFence, Transport,
};
use crate::routing::{
    Attempt, Failure, Kind, Make, Refusal, Routes, Step, Target, route, send_fenced,
};

mod failover;
pub use failover::{EntryBackoff, EntryState, FailoverClient, FailoverStats};

/// What a [`RpcClient`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Calls sent to the entry host's router.
    pub routed: u64,
    /// Calls sent straight to a hinted owner.
    pub direct: u64,
    /// Rediscoveries after a trusted pre-dispatch ownership answer.
    pub rediscoveries: u64,
    /// Hints evicted.
    pub hint_evictions: u64,
    /// Every [`RpcClient::call`] and [`RpcClient::fetch`], one outcome each.
    pub calls: ClientCalls,
}

/// The outcomes of a [`RpcClient`]'s calls
/// (`durability_host_client_calls_total{outcome}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientCalls {
    /// `completed`: the owner answered with the method's result.
    pub completed: u64,
    /// `failed`: a host answered a trusted error (the method's own, or a
    /// refusal such as an unknown method).
    pub failed: u64,
    /// `refused_ownership`: ownership refused the call before dispatch,
    /// after the one rediscovery allowed (nothing ran).
    pub refused_ownership: u64,
    /// `unreachable`: the request never reached a host (nothing ran).
    pub unreachable: u64,
    /// `unavailable`: an untrusted or unmarked answer (the method may
    /// have run).
    pub unavailable: u64,
    /// `unknown`: a success whose result could not be read (the method may
    /// have run).
    pub unknown: u64,
    /// `invalid`: refused by the client before anything was sent (method,
    /// arguments, class or name).
    pub invalid: u64,
}

/// How one call ended, for its figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Completed,
    Failed,
    RefusedOwnership,
    Unreachable,
    Unavailable,
    Unknown,
    Invalid,
}

#[derive(Debug)]
struct Figures {
    completed: Figure,
    failed: Figure,
    refused_ownership: Figure,
    unreachable: Figure,
    unavailable: Figure,
    unknown: Figure,
    invalid: Figure,
    entry: Figure,
    direct: Figure,
    rediscoveries: Figure,
    hint_evictions: Figure,
}

impl Figures {
    fn new() -> Self {
        Self {
            completed: metrics::client_call("completed"),
            failed: metrics::client_call("failed"),
            refused_ownership: metrics::client_call("refused_ownership"),
            unreachable: metrics::client_call("unreachable"),
            unavailable: metrics::client_call("unavailable"),
            unknown: metrics::client_call("unknown"),
            invalid: metrics::client_call("invalid"),
            entry: metrics::client_routed("entry"),
            direct: metrics::client_routed("direct"),
            rediscoveries: Figure::untasked("durability_host_client_rediscoveries_total", &[]),
            hint_evictions: Figure::untasked("durability_host_client_hint_evictions_total", &[]),
        }
    }

    fn call(&self, outcome: Outcome) -> &Figure {
        match outcome {
            Outcome::Completed => &self.completed,
            Outcome::Failed => &self.failed,
            Outcome::RefusedOwnership => &self.refused_ownership,
            Outcome::Unreachable => &self.unreachable,
            Outcome::Unavailable => &self.unavailable,
            Outcome::Unknown => &self.unknown,
            Outcome::Invalid => &self.invalid,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Hint {
    task: String,
    generation: u64,
    endpoint: Endpoint,
}

/// A client of a deployment's hosts (for tools, benchmarks and services
/// that do not host objects themselves).
pub struct RpcClient {
    entry: Endpoint,
    token: InternalToken,
    storage: StorageId,
    count: ShardCount,
    policy: EndpointPolicy,
    transport: Arc<dyn Transport>,
    hints: Mutex<lru::LruCache<OwnerScope, Hint>>,
    figures: Figures,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("entry", &self.entry)
            .field("storage", &self.storage)
            .finish_non_exhaustive()
    }
}

impl RpcClient {
    /// A client entering through `entry` (any host), with the deployment's
    /// internal token, storage id and shard count, over HTTP/1.1 and the
    /// default endpoint policy.
    ///
    /// # Errors
    /// [`HostError::InvalidSetting`] when the entry endpoint fails the
    /// policy, the token is malformed or the storage id is invalid.
    pub fn new(
        entry: &str,
        token: &str,
        storage_id: &str,
        shard_count: ShardCount,
    ) -> Result<Self, HostError> {
        Self::with(
            entry,
            token,
            storage_id,
            shard_count,
            EndpointPolicy::default(),
            Arc::new(HttpTransport::default()),
        )
    }

    /// [`RpcClient::new`] with a policy and a transport.
    ///
    /// # Errors
    /// As [`RpcClient::new`].
    pub fn with(
        entry: &str,
        token: &str,
        storage_id: &str,
        shard_count: ShardCount,
        policy: EndpointPolicy,
        transport: Arc<dyn Transport>,
    ) -> Result<Self, HostError> {
        let entry = policy
            .check(entry)
            .map_err(|e| HostError::setting("entry", e.to_string()))?;
        let storage = StorageId::new(storage_id)
            .map_err(|e| HostError::setting("storage_id", e.to_string()))?;
        Ok(Self {
            entry,
            token: InternalToken::new(token)?,
            storage,
            count: shard_count,
            policy,
            transport,
            hints: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(DEFAULT_HINT_CAPACITY).unwrap_or(NonZeroUsize::MIN),
            )),
            figures: Figures::new(),
        })
    }

    fn hints(&self) -> MutexGuard<'_, lru::LruCache<OwnerScope, Hint>> {
        self.hints.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn evict_hint(&self, scope: &OwnerScope) {
        if self.hints().pop(scope).is_some() {
            self.figures.hint_evictions.bump();
        }
    }

    /// What the client did so far.
    pub fn stats(&self) -> ClientStats {
        let f = &self.figures;
        ClientStats {
            routed: f.entry.get(),
            direct: f.direct.get(),
            rediscoveries: f.rediscoveries.get(),
            hint_evictions: f.hint_evictions.get(),
            calls: ClientCalls {
                completed: f.completed.get(),
                failed: f.failed.get(),
                refused_ownership: f.refused_ownership.get(),
                unreachable: f.unreachable.get(),
                unavailable: f.unavailable.get(),
                unknown: f.unknown.get(),
                invalid: f.invalid.get(),
            },
        }
    }

    /// The hinted owner of an object's scope: (task, generation, endpoint).
    ///
    /// # Errors
    /// [`HostError::UnknownClass`] / [`HostError::InvalidObjectName`] for a
    /// class or name that cannot form a scope.
    pub fn hint(
        &self,
        class: &str,
        name: &str,
    ) -> Result<Option<(String, u64, String)>, HostError> {
        let scope = self.scope(class, name)?;
        Ok(self
            .hints()
            .peek(&scope)
            .map(|h| (h.task.clone(), h.generation, h.endpoint.url())))
    }

    fn scope(&self, class: &str, name: &str) -> Result<OwnerScope, HostError> {
        let class_name = ClassName::new(class).map_err(|_| HostError::UnknownClass {
            class: class.to_owned(),
        })?;
        if name.is_empty() {
            return Err(HostError::InvalidObjectName {
                reason: "the name is empty".to_owned(),
            });
        }
        OwnerScope::for_object(
            self.storage.clone(),
            class_name,
            &ObjectName::new(name),
            self.count,
        )
        .map_err(|e| HostError::InvalidObjectName {
            reason: e.to_string(),
        })
    }

    /// Calls `method` on the object of `class` named `name`, wherever it is
    /// owned.
    ///
    /// # Errors
    /// As [`crate::ObjectRef::call`].
    pub async fn call(
        &self,
        class: &str,
        name: &str,
        method: &str,
        args: Value,
    ) -> Result<Value, HostError> {
        let request = InvokeRequest::make(class, name, (method.to_owned(), args));
        self.send(self, class, name, request).await
    }

    /// Calls the typed method `M` on object `name` of its class (see
    /// [`crate::typed`]), by the routing and replay rules of
    /// [`RpcClient::call`], with the same JSON on the wire.
    ///
    /// # Errors
    /// [`crate::CallError::Method`]: the method's own error, decoded;
    /// [`crate::CallError::Host`]: as [`RpcClient::call`].
    pub async fn call_typed<M: crate::Method>(
        &self,
        name: &str,
        args: M,
    ) -> Result<M::Out, crate::CallError<M::Error>> {
        let class = <M::Class as crate::Class>::NAME;
        crate::typed::call_with(&args, |args| self.call(class, name, M::NAME, args)).await
    }

    /// Sends a tenant fetch to the fetch handler of the object of `class`
    /// named `name`, wherever it is owned: through the entry host's router
    /// (forwarded once to the owner), then straight to the learned owner
    /// with the route fence. One rediscovery after a trusted pre-dispatch
    /// ownership answer; after an untrusted failure a `GET` or `HEAD`
    /// replays once through the entry host, any other method returns the
    /// error (it may have run). Counted with the calls in
    /// [`RpcClient::stats`] and the client's figures.
    ///
    /// # Errors
    /// As [`crate::ObjectRef::fetch`]: the request limits
    /// ([`HostError::InvalidRequest`], [`HostError::RequestTooLarge`]) before
    /// anything is sent, then the routing errors of [`RpcClient::call`].
    pub async fn fetch(
        &self,
        class: &str,
        name: &str,
        request: FetchRequest,
    ) -> Result<FetchResponse, HostError> {
        let invoke = FetchInvoke::make(class, name, request);
        self.send(self, class, name, invoke).await
    }

    /// Opens a WebSocket session with the connect handler of the object of
    /// `class` named `name`, wherever it is owned, and returns the
    /// caller's end. Uncached, the connect enters the entry host's router,
    /// which upgrades only when it owns the object and otherwise answers
    /// the hint-only handoff: the client then connects straight to the
    /// handed-off owner (its endpoint checked against the client's policy)
    /// with the route fence; a cached hint connects directly. The hint is
    /// learned from the owner's trusted headers on the `101`. One
    /// rediscovery through the entry host in all, after a valid trusted
    /// owner hint from an owner's endpoint (the cached hint is evicted) or
    /// a trusted pre-dispatch `stale_owner` / `owner_race`; anything else
    /// is final and never falls back to an upgrade by another host.
    /// Counted with the calls in [`RpcClient::stats`].
    ///
    /// # Errors
    /// As [`crate::ObjectRef::connect`].
    pub async fn connect(
        &self,
        class: &str,
        name: &str,
        request: ConnectRequest,
    ) -> Result<Socket, HostError> {
        let invoke = ConnectInvoke::make(class, name, request);
        self.send(self, class, name, invoke).await
    }

    /// Routes a made request (the one router, [`route`], through
    /// `router`: this client, or a [`FailoverClient`] over it) with its
    /// request id (else the task's context id, else a new one), and
    /// counts its outcome; a request or object refused before anything was
    /// sent is `invalid`.
    async fn send<K: Kind, R: Routes<K>>(
        &self,
        router: &R,
        class: &str,
        name: &str,
        request: Result<(K, Option<RequestId>), HostError>,
    ) -> Result<K::Out, HostError> {
        let routed = match request.and_then(|r| Ok((self.scope(class, name)?, r))) {
            Err(e) => Err((Outcome::Invalid, e)),
            Ok((scope, (request, id))) => id
                .unwrap_or_else(RequestId::current_or_new)
                .scope(route(router, &scope, &request))
                .await
                .map_err(|refusal| (outcome(&refusal), refusal.error)),
        };
        let (outcome, result) = match routed {
            Ok(value) => (Outcome::Completed, Ok(value)),
            Err((outcome, e)) => (outcome, Err(e)),
        };
        self.figures.call(outcome).bump();
        result
    }

    /// A send of this client to `endpoint`, for `scope`.
    fn target<'a>(&'a self, endpoint: &'a Endpoint, scope: &'a OwnerScope) -> Target<'a> {
        Target {
            transport: self.transport.as_ref(),
            endpoint,
            token: &self.token,
            key: scope.host_id(),
        }
    }

    /// The owner a trusted owner header names, when its endpoint passes
    /// the client's policy.
    fn owner_of(&self, owner: &OwnerHeaders) -> Option<Hint> {
        let endpoint = owner
            .endpoint
            .as_deref()
            .and_then(|e| self.policy.check(e).ok())?;
        Some(Hint {
            task: owner.task.clone(),
            generation: owner.generation,
            endpoint,
        })
    }
}

/// The figure of a refused call.
fn outcome(refusal: &Refusal) -> Outcome {
    match refusal.failure {
        None | Some(Failure::Remote) => Outcome::Failed,
        // An untrusted code is an unavailable owner, not a refusal.
        Some(Failure::Ownership) if matches!(refusal.error, HostError::OwnerUnavailable { .. }) => {
            Outcome::Unavailable
        }
        Some(Failure::Ownership) => Outcome::RefusedOwnership,
        Some(Failure::Unreachable) => Outcome::Unreachable,
        Some(Failure::Unavailable | Failure::SecondHint) => Outcome::Unavailable,
        Some(Failure::Unknown) => Outcome::Unknown,
    }
}

/// The client's router is its entry host; its hints come from the
/// owners' trusted headers.
impl<K: Kind> Routes<K> for RpcClient {
    type Owner = Hint;

    fn hint(&self, scope: &OwnerScope) -> Option<Hint> {
        self.hints().get(scope).cloned()
    }

    fn via_router<'a>(
        &'a self,
        scope: &'a OwnerScope,
        request: &'a K,
    ) -> impl Future<Output = Attempt<K::Out, Hint>> + Send + 'a {
        self.figures.entry.bump();
        async move {
            let answer = request.send(self.target(&self.entry, scope)).await;
            Attempt::Answered { answer, to: None }
        }
    }

    async fn to_owner<'a>(
        &'a self,
        scope: &'a OwnerScope,
        request: &'a K,
        owner: Hint,
    ) -> Attempt<K::Out, Hint> {
        let fence = RouteFence {
            task: owner.task.clone(),
            generation: owner.generation,
        };
        let answer = send_fenced(request, fence, self.target(&owner.endpoint, scope)).await;
        Attempt::Answered {
            answer,
            to: Some(owner),
        }
    }

    fn follow(&self, owner: OwnerHeaders) -> Result<Hint, HostError> {
        self.owner_of(&owner)
            .ok_or_else(|| HostError::OwnerUnreachable {
                reason: "the handed-off owner endpoint is refused".to_owned(),
            })
    }

    fn learn(&self, scope: &OwnerScope, _to: Option<Hint>, owner: Option<&OwnerHeaders>) {
        if let Some(owner) = owner
            && owner.key == scope.host_id()
            && let Some(hint) = self.owner_of(owner)
        {
            self.hints().put(scope.clone(), hint);
        }
    }

    fn evict(&self, scope: &OwnerScope) {
        self.evict_hint(scope);
    }

    fn note(&self, _scope: &OwnerScope, step: Step<'_>) {
        match step {
            Step::Direct => self.figures.direct.bump(),
            Step::Rediscover(_) => self.figures.rediscoveries.bump(),
            Step::Replay(_) | Step::Untrusted(..) => {}
        }
    }
}
