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

use std::convert::Infallible;

use durability_alarms::AlarmIndex;
use durability_ownership::{
    Generation, LeaseStore, LifecycleAdmin, OwnerEndpoint, OwnerScope, Resolution, TaskId,
};

use super::{ObjectRef, bump};
use crate::connect::{ConnectRequest, Connector, Socket};
use crate::error::HostError;
use crate::host::{Host, SessionHold};
use crate::rpc::MethodInput;
use crate::store::ObjectStore;
use crate::transport::{ConnectInvoke, ConnectReply, OwnerHeaders, REDISCOVERY_CODES, Reply};

/// The rediscovery reason of a valid trusted owner hint.
const HINTED: &str = "owner_hint";

/// How one connect attempt ended.
enum Attempt {
    Done(Result<Socket, HostError>),
    /// A valid trusted owner hint or a trusted pre-dispatch refusal:
    /// rediscover once through the router.
    Rediscover(String),
}

/// What a caller makes of a connect that was not upgraded and carried no
/// valid hint: `Ok` is a trusted pre-dispatch refusal (rediscover once
/// with that code), `Err` the final error. Broad ownership errors,
/// unmarked failures and malformed handoffs are `owner_unavailable`.
pub(crate) fn after_refusal(reply: Reply<Infallible>) -> Result<String, HostError> {
    match reply {
        Reply::Ok { result, .. } => match result {},
        Reply::Ownership { code } if REDISCOVERY_CODES.contains(&code.as_str()) => Ok(code),
        Reply::Ownership { .. } => Err(HostError::OwnerUnavailable {
            reason: "a broad ownership refusal of the connect".to_owned(),
        }),
        Reply::Failed {
            status,
            code,
            message,
            details,
        } => Err(HostError::Remote {
            status,
            code,
            message,
            details,
        }),
        Reply::NotSent { reason } => Err(HostError::OwnerUnreachable { reason }),
        Reply::Unmarked { reason } | Reply::ResultUnknown { reason } => {
            Err(HostError::OwnerUnavailable { reason })
        }
    }
}

/// An admitted session, not yet running: the owner's headers go on the
/// `101`, then [`Session::run`] runs the class's handler.
pub(crate) struct Session<I, D> {
    input: MethodInput<I, D>,
    hold: SessionHold<I, D>,
    connector: Connector<I, D>,
    request: ConnectRequest,
    /// The owner's trusted headers (this host).
    pub(crate) owner: OwnerHeaders,
}

impl<I: Send + Sync + 'static, D: Send + Sync + 'static> Session<I, D> {
    /// Runs the handler on `socket` until it returns or the session must
    /// end (scope lost, host draining): then its future is dropped, which
    /// closes the connection.
    pub(crate) async fn run(self, socket: Socket) {
        let Self {
            input,
            hold,
            connector,
            request,
            owner,
        } = self;
        let handler = connector(input, request, socket);
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

impl<S, I, O: ObjectStore> ObjectRef<S, I, O>
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
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
        let request = request.validate()?;
        let scope = self.host.scope_for(&self.class, &self.name)?;
        let invoke = ConnectInvoke {
            class: self.class.clone(),
            name: self.name.clone(),
            request,
            fence: None,
        };
        self.host.route_connect(&scope, &invoke).await
    }
}

impl<S, I, O: ObjectStore> Host<S, I, O>
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    async fn route_connect(
        &self,
        scope: &OwnerScope,
        invoke: &ConnectInvoke,
    ) -> Result<Socket, HostError> {
        let routing = self.routing();
        let me = self.ownership().task().clone();
        let mut rediscoveries = 1;
        let mut first = routing
            .hints
            .get(scope)
            .filter(|h| h.task != me)
            .inspect(|_| bump(&routing.counters.direct));
        loop {
            let attempt = match first.take() {
                Some(hint) => {
                    self.send_connect(
                        scope,
                        invoke,
                        &hint.task,
                        hint.generation,
                        hint.endpoint.as_ref(),
                    )
                    .await
                }
                None => self.route_connect_once(scope, invoke).await,
            };
            match attempt {
                Attempt::Done(result) => return result,
                Attempt::Rediscover(code) if rediscoveries > 0 => {
                    rediscoveries -= 1;
                    self.evict(scope);
                    bump(&routing.counters.rediscoveries);
                    tracing::debug!(
                        event = "durability.host.connect_rediscover",
                        scope = %scope,
                        code,
                        "the connect was not upgraded before dispatch; rediscovering once"
                    );
                }
                Attempt::Rediscover(code) => {
                    self.evict(scope);
                    if code == HINTED {
                        return Err(HostError::OwnerUnavailable {
                            reason: "a second owner hint after the one rediscovery".to_owned(),
                        });
                    }
                    return Err(HostError::remote_ownership(&code));
                }
            }
        }
    }

    /// One pass through this host's router: resolve, then open the session
    /// here or hand it off to the owner (connect there directly, fenced).
    async fn route_connect_once(&self, scope: &OwnerScope, invoke: &ConnectInvoke) -> Attempt {
        let routing = self.routing();
        let resolution = match self.ownership().resolve(scope, self.lifecycle()).await {
            Ok(r) => r,
            Err(e) => return Attempt::Done(Err(HostError::Ownership(e))),
        };
        match resolution {
            Resolution::Local(_) => {
                self.evict_quiet(scope);
                bump(&routing.counters.local);
                match self.connect_local(invoke, None).await {
                    Ok(session) => Attempt::Done(Ok(self.open_here(session).await)),
                    Err(HostError::NotOwner { .. }) => Attempt::Rediscover("owner_race".to_owned()),
                    Err(e) => Attempt::Done(Err(e)),
                }
            }
            Resolution::Remote {
                task,
                generation,
                endpoint,
            } => {
                bump(&routing.counters.handoffs);
                tracing::debug!(
                    event = "durability.host.connect_handoff",
                    scope = %scope,
                    owner = task.as_str(),
                    generation = generation.get(),
                    "owned by another host; connecting to the owner directly"
                );
                self.send_connect(scope, invoke, &task, generation, endpoint.as_ref())
                    .await
            }
        }
    }

    /// Starts an admitted session here and returns the caller's end.
    async fn open_here(&self, session: Session<I, O::Storage>) -> Socket {
        let (client, server) = Socket::pair().await;
        tokio::spawn(session.run(server));
        client
    }

    /// Sends `invoke` fenced at (`task`, `generation`) to the owner's
    /// endpoint and classifies the answer.
    async fn send_connect(
        &self,
        scope: &OwnerScope,
        invoke: &ConnectInvoke,
        task: &TaskId,
        generation: Generation,
        advertised: Option<&OwnerEndpoint>,
    ) -> Attempt {
        let routing = self.routing();
        let (token, endpoint, fence) = match self.send_target(scope, task, generation, advertised) {
            Ok(t) => t,
            Err(e) => return Attempt::Done(Err(e)),
        };
        let mut fenced = invoke.clone();
        fenced.fence = Some(fence);
        let reply = routing
            .transport
            .connect(&endpoint, token, &fenced, scope.host_id())
            .await;
        let refusal = match reply {
            ConnectReply::Upgraded { socket, owner } => {
                self.learn_hint(scope, task, generation, advertised, owner.as_ref());
                return Attempt::Done(Ok(socket));
            }
            ConnectReply::Hint(_) => return Attempt::Rediscover(HINTED.to_owned()),
            ConnectReply::Refused(reply) => after_refusal(reply),
        };
        match refusal {
            Ok(code) => Attempt::Rediscover(code),
            Err(e) => {
                if !matches!(e, HostError::Remote { .. }) {
                    self.evict(scope);
                    tracing::warn!(
                        event = "durability.host.connect_untrusted",
                        scope = %scope,
                        owner = task.as_str(),
                        reason = %format!("{e:?}"),
                        "no trusted upgrade from the owner; hint evicted, no fallback"
                    );
                }
                Attempt::Done(Err(e))
            }
        }
    }

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
                match self.connect_local(&invoke, Some(fence.generation)).await {
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
                self.connect_local(&invoke, None).await.map(Served::Upgrade)
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
    /// [`Host::admit_session`]); with `expect`, only at that generation.
    async fn connect_local(
        &self,
        invoke: &ConnectInvoke,
        expect: Option<u64>,
    ) -> Result<Session<I, O::Storage>, HostError> {
        let connector = self
            .routing()
            .connectors
            .get(&invoke.class)
            .cloned()
            .ok_or_else(|| HostError::UnknownMethod {
                class: invoke.class.clone(),
                method: "connect".to_owned(),
            })?;
        let scope = self.scope_for(&invoke.class, &invoke.name)?;
        let (input, hold) = match self
            .admit_session(&invoke.class, &invoke.name, expect)
            .await
        {
            Err(HostError::NotOwner { .. }) if expect.is_some() => {
                return Err(HostError::StaleFence {
                    generation: expect.unwrap_or(0),
                });
            }
            other => other?,
        };
        bump(&self.routing().counters.upgrades);
        let generation = input.generation;
        Ok(Session {
            input,
            hold,
            connector,
            request: invoke.request.clone(),
            owner: OwnerHeaders {
                task: self.ownership().task().as_str().to_owned(),
                generation,
                key: scope.host_id().to_owned(),
                endpoint: self.endpoint().map(str::to_owned),
            },
        })
    }
}

#[cfg(test)]
mod tests;
