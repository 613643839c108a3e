//! Routing WebSocket connects: the owner hints, endpoint checks and
//! counters of [`super`], with the connect rules.
//!
//! - The `101` comes only from the owner's endpoint. Owned here, the
//!   session opens here (over an in-memory pipe). Owned elsewhere, this
//!   host's router does not upgrade anything itself: it hands the connect
//!   off (the owner's task, generation and endpoint, as a caller would
//!   learn them from a hint), and the caller connects straight to the
//!   owner with the route fence; the owner re-checks the complete fence
//!   (admission at that generation) before it upgrades. A cached hint
//!   connects directly the same way.
//! - A host that is sent a connect it cannot upgrade answers a hint-only
//!   handoff (when it knows another owner) or a trusted `stale_owner`;
//!   over the wire the handoff is the `503` owner-hint control response of
//!   [`crate::transport`].
//! - One router rediscovery, in all: after a valid trusted owner hint (the
//!   right status and marker value, complete metadata, the scope's own
//!   shard key), which also evicts the cached hint, or after a trusted
//!   pre-dispatch `stale_owner` / `owner_race`. A hint is never followed
//!   from the endpoint that sent it; the router resolves again.
//! - Everything else is final and never falls back to a 101 from a host
//!   that is not the owner: a malformed, wrong-status, wrong-marker or
//!   other-shard hint, an unmarked transport failure, or a broad trusted
//!   ownership error (`draining`, ...) evicts the hint and is
//!   `owner_unavailable` (a connection that could not be made is
//!   [`HostError::OwnerUnreachable`], also `owner_unavailable`), with a
//!   fixed message: no task id or endpoint reaches the tenant.

use durability_ownership::{Generation, OwnerEndpoint, OwnerScope, Resolution, TaskId};
use futures::future::BoxFuture;

use super::rules::{Answer, Rules, refused};
use super::{Addressed, Kind, ObjectRef, RunHere, Target, bump, registered};
use crate::bounds::{HostAlarms, HostLeases};
use crate::connect::{ConnectRequest, Connector, Socket};
use crate::error::HostError;
use crate::host::{Host, SessionHold};
use crate::object::MethodInput;
use crate::protocol::{ConnectInvoke, ConnectReply, OwnerHeaders, Reply, RequestId};
use crate::store::ObjectStore;

impl Kind for ConnectInvoke {
    type Out = Socket;
    const NAME: &'static str = "connect";
    const HANDOFF: bool = true;

    fn rules(&self) -> Rules {
        Rules::CONNECT
    }

    fn send<'a>(&'a self, to: Target<'a>) -> BoxFuture<'a, Answer<Socket>> {
        let reply = to.transport.connect(to.endpoint, to.token, self, to.key);
        Box::pin(async move {
            match reply.await {
                ConnectReply::Upgraded { socket, owner } => Answer::Reply(Reply::Ok {
                    result: socket,
                    owner,
                }),
                ConnectReply::Hint(owner) => Answer::Handoff(owner),
                ConnectReply::Refused(reply) => Answer::Reply(refused(reply)),
            }
        })
    }
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> RunHere<S, I, O> for ConnectInvoke {
    /// Admits the session here and opens it over an in-memory pipe.
    async fn run_here(&self, host: &Host<S, I, O>) -> Result<(Socket, u64), HostError> {
        let session = host.connect_local(self).await?;
        let generation = session.owner.generation;
        let (client, server) = Socket::pair().await;
        tokio::spawn(session.run(server));
        Ok((client, generation))
    }
}

/// An admitted session, not yet running: the owner's headers go on the
/// `101`, then [`Session::run`] runs the class's handler.
pub(crate) struct Session<I, D> {
    input: MethodInput<I, D>,
    hold: SessionHold<I, D>,
    connector: Connector<I, D>,
    request: ConnectRequest,
    /// The context request id the session was admitted under.
    id: RequestId,
    /// The owner's trusted headers (this host).
    pub(crate) owner: OwnerHeaders,
}

impl<I: Send + Sync + 'static, D: Send + Sync + 'static> Session<I, D> {
    /// Runs the handler on `socket` until it returns or the session must
    /// end (scope lost, host draining): then its future is dropped, which
    /// closes the connection. The handler runs with the admitting
    /// request's context id (its nested calls carry it).
    pub(crate) async fn run(self, socket: Socket) {
        let Self {
            input,
            hold,
            connector,
            request,
            id,
            owner,
        } = self;
        let handler = id.scope(connector(input, request, socket));
        tokio::select! {
            result = handler => if let Err(e) = result {
                tracing::warn!(
                    event = "durability.host.connect_handler_failed",
                    scope = owner.key,
                    error = %e,
                    "the connect handler failed; the session is closed"
                );
            },
            () = hold.ended() => tracing::info!(
                event = "durability.host.connect_ended",
                scope = owner.key,
                "the session's scope was lost or the host is draining; the session is closed"
            ),
        }
        drop(hold);
    }
}

/// What a host answers a connect it was sent.
pub(crate) enum Served<I, D> {
    /// Upgrade: this host owns the scope at the fence (or, unfenced,
    /// resolved it here).
    Upgrade(Session<I, D>),
    /// Hand off: another task owns the scope.
    Hint(OwnerHeaders),
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> ObjectRef<S, I, O> {
    /// Opens a WebSocket session with the object's connect handler, on
    /// whichever host owns it, and returns the caller's end (see
    /// [`crate::connect`] for the session and this module's docs for the
    /// routing: the `101` only from the owner, one rediscovery, no
    /// fallback).
    ///
    /// # Errors
    /// Refused before dispatch: [`HostError::InvalidRequest`],
    /// [`HostError::RequestTooLarge`] (the fetch limits on the URL and
    /// headers), [`HostError::UnknownClass`],
    /// [`HostError::InvalidObjectName`], [`HostError::UnknownMethod`] (the
    /// class has no connect handler; method `connect`). Across hosts:
    /// [`HostError::OwnerUnavailable`] (no trusted upgrade from the owner,
    /// a malformed handoff, a broad ownership error, a second hint),
    /// [`HostError::OwnerUnreachable`] (the owner could not be reached),
    /// [`HostError::Remote`] (a refusal such as `unauthorized`, or a trusted
    /// `stale_owner` / `owner_race` after the one rediscovery). Locally: as
    /// [`Host::call`].
    pub async fn connect(&self, request: ConnectRequest) -> Result<Socket, HostError> {
        self.routed::<ConnectInvoke>(request).await
    }
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> Host<S, I, O> {
    /// Serves a connect that arrived over the transport. Fenced: it
    /// upgrades only if the fence names this task and admission finds this
    /// task's claim at the fence's generation; otherwise a handoff to the
    /// owner this host resolves, or a trusted `stale_owner`. Unfenced (this
    /// host as the router): resolved here it upgrades, owned elsewhere it
    /// hands off; it never upgrades for another owner.
    pub(crate) async fn serve_connect(
        &self,
        invoke: ConnectInvoke,
    ) -> Result<Served<I, O::Storage>, HostError> {
        let routing = self.routing();
        bump(&routing.counters.served);
        let scope = self.scope_for(&invoke.class, &invoke.name)?;
        if let Some(fence) = invoke.fence.clone() {
            if fence.task == self.ownership().task().as_str() {
                match self.connect_local(&invoke).await {
                    Ok(session) => return Ok(Served::Upgrade(session)),
                    Err(HostError::StaleFence { .. } | HostError::NotOwner { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            return match self.ownership().resolve(&scope, self.lifecycle()).await {
                Ok(Resolution::Remote {
                    task,
                    generation,
                    endpoint,
                }) if task != *self.ownership().task() => self
                    .handoff(&scope, &task, generation, endpoint.as_ref())
                    .map(Served::Hint)
                    .map_err(|_| HostError::StaleFence {
                        generation: fence.generation,
                    }),
                _ => Err(HostError::StaleFence {
                    generation: fence.generation,
                }),
            };
        }
        match self.ownership().resolve(&scope, self.lifecycle()).await? {
            Resolution::Local(_) => {
                bump(&routing.counters.local);
                self.connect_local(&invoke).await.map(Served::Upgrade)
            }
            Resolution::Remote {
                task,
                generation,
                endpoint,
            } => {
                bump(&routing.counters.handoffs);
                self.handoff(&scope, &task, generation, endpoint.as_ref())
                    .map(Served::Hint)
            }
        }
    }

    /// The owner headers of a handoff to `task` at `generation`: its
    /// endpoint (advertised, else the peer directory's) must pass this
    /// host's endpoint policy, else nothing is handed off
    /// ([`HostError::OwnerUnreachable`]).
    fn handoff(
        &self,
        scope: &OwnerScope,
        task: &TaskId,
        generation: Generation,
        advertised: Option<&OwnerEndpoint>,
    ) -> Result<OwnerHeaders, HostError> {
        let endpoint = self
            .owner_endpoint(task, advertised)
            .map_err(|reason| HostError::OwnerUnreachable { reason })?;
        Ok(OwnerHeaders {
            task: task.as_str().to_owned(),
            generation: generation.get(),
            key: scope.host_id().to_owned(),
            endpoint: Some(endpoint.url()),
        })
    }

    /// Admits a session with the class's connect handler here (see
    /// [`Host::admit_session`]); fenced, only at the fence's generation.
    pub(super) async fn connect_local(
        &self,
        invoke: &ConnectInvoke,
    ) -> Result<Session<I, O::Storage>, HostError> {
        let connector = self.routing().connectors.get(&invoke.class);
        let connector = registered(connector, &invoke.class, "connect")?;
        let scope = self.scope_for(&invoke.class, &invoke.name)?;
        let (input, hold) = self
            .admit_session(&invoke.class, &invoke.name, invoke.expect())
            .await?;
        bump(&self.routing().counters.upgrades);
        let generation = input.generation;
        Ok(Session {
            input,
            hold,
            connector,
            request: invoke.request.clone(),
            id: RequestId::current_or_new(),
            owner: self.own_headers(&scope, generation),
        })
    }
}

#[cfg(test)]
mod tests;
