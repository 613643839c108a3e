//! Routing tenant fetches: the RPC router, owner hints, endpoint checks and
//! counters of [`super`], with the fetch replay rules.
//!
//! - An uncached fetch enters this host's router: owned here, it runs
//!   here; owned elsewhere, it is forwarded once with the route fence and
//!   the owner's trusted headers teach the hint, so later fetches go
//!   direct. The owner re-checks the complete fence before dispatch.
//! - One rediscovery after a trusted pre-dispatch `stale_owner` /
//!   `owner_race`, for any method.
//! - Any other failure to get a trusted answer (an unmarked transport
//!   failure, a 502/503/504 without the marker, an unreadable success
//!   frame, a broad trusted ownership error such as `draining`) evicts the
//!   hint. A safe `GET`/`HEAD` is then replayed once through the router;
//!   any other method returns `owner_unavailable`, because the owner may
//!   have run it.

use durability_alarms::AlarmIndex;
use durability_ownership::{
    Generation, LeaseStore, LifecycleAdmin, OwnerEndpoint, OwnerScope, Resolution, TaskId,
};

use super::{ObjectRef, bump};
use crate::error::HostError;
use crate::fetch::{FetchRequest, FetchResponse};
use crate::host::Host;
use crate::rpc::MethodInput;
use crate::store::ObjectStore;
use crate::transport::{FetchInvoke, OwnerHeaders, REDISCOVERY_CODES, Reply};

/// How one fetch attempt ended.
enum Attempt {
    Done(Result<FetchResponse, HostError>),
    /// A trusted pre-dispatch refusal: rediscover once.
    Rediscover(String),
    /// No trusted answer (the hint is evicted): a safe method replays once
    /// through the router, any other returns the error.
    Untrusted(HostError),
}

impl<S, I, O: ObjectStore> ObjectRef<S, I, O>
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    /// Sends a tenant fetch to the object's fetch handler, on whichever
    /// host owns it (see [`crate::fetch`] for the limits and this module's
    /// replay rules: one rediscovery after a trusted pre-dispatch refusal;
    /// after an untrusted failure `GET`/`HEAD` replay once through the
    /// router, other methods do not).
    ///
    /// # Errors
    /// Refused before dispatch: [`HostError::InvalidRequest`],
    /// [`HostError::RequestTooLarge`], [`HostError::UnknownClass`],
    /// [`HostError::InvalidObjectName`], [`HostError::UnknownMethod`] (the
    /// class has no fetch handler; method `fetch`). Across hosts:
    /// [`HostError::OwnerUnavailable`] (it may have run),
    /// [`HostError::OwnerUnreachable`] (it did not run), [`HostError::Remote`]
    /// (the owner's refusal, a trusted ownership code, the handler's own
    /// [`crate::MethodError`] or `internal_error`). Locally: as
    /// [`Host::call`], with a response that breaks the limits reported as
    /// [`HostError::Handler`].
    pub async fn fetch(&self, request: FetchRequest) -> Result<FetchResponse, HostError> {
        let request = request.validate()?;
        let scope = self.host.scope_for(&self.class, &self.name)?;
        let invoke = FetchInvoke {
            class: self.class.clone(),
            name: self.name.clone(),
            request,
            fence: None,
        };
        self.host.route_fetch(&scope, &invoke).await
    }
}

impl<S, I, O: ObjectStore> Host<S, I, O>
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    async fn route_fetch(
        &self,
        scope: &OwnerScope,
        invoke: &FetchInvoke,
    ) -> Result<FetchResponse, HostError> {
        let routing = self.routing();
        let me = self.ownership().task().clone();
        let mut rediscoveries = 1;
        let mut replays = u8::from(invoke.request.is_safe());
        let mut first = routing
            .hints
            .get(scope)
            .filter(|h| h.task != me)
            .inspect(|_| bump(&routing.counters.direct));
        loop {
            let attempt = match first.take() {
                Some(hint) => {
                    self.send_fetch(
                        scope,
                        invoke,
                        &hint.task,
                        hint.generation,
                        hint.endpoint.as_ref(),
                    )
                    .await
                }
                None => self.route_fetch_once(scope, invoke).await,
            };
            match attempt {
                Attempt::Done(result) => return result,
                Attempt::Rediscover(code) if rediscoveries > 0 => {
                    rediscoveries -= 1;
                    self.evict(scope);
                    bump(&routing.counters.rediscoveries);
                    tracing::debug!(
                        event = "durability.host.fetch_rediscover",
                        scope = %scope,
                        code,
                        "owner refused the fetch before dispatch; rediscovering once"
                    );
                }
                Attempt::Rediscover(code) => {
                    self.evict(scope);
                    return Err(HostError::remote_ownership(&code));
                }
                Attempt::Untrusted(e) if replays > 0 => {
                    replays -= 1;
                    tracing::debug!(
                        event = "durability.host.fetch_replayed",
                        scope = %scope,
                        method = invoke.request.method,
                        code = e.code(),
                        "no trusted answer to a safe fetch; replaying once through the router"
                    );
                }
                Attempt::Untrusted(e) => return Err(e),
            }
        }
    }

    /// One pass through this host's router: resolve, then run here or
    /// forward once.
    async fn route_fetch_once(&self, scope: &OwnerScope, invoke: &FetchInvoke) -> Attempt {
        let routing = self.routing();
        let resolution = match self.ownership().resolve(scope, self.lifecycle()).await {
            Ok(r) => r,
            Err(e) => return Attempt::Done(Err(HostError::Ownership(e))),
        };
        match resolution {
            Resolution::Local(_) => {
                self.evict_quiet(scope);
                bump(&routing.counters.local);
                match self.fetch_local(invoke, None).await {
                    Err(HostError::NotOwner { .. }) => Attempt::Rediscover("owner_race".to_owned()),
                    other => Attempt::Done(other.map(|(r, _)| r)),
                }
            }
            Resolution::Remote {
                task,
                generation,
                endpoint,
            } => {
                bump(&routing.counters.forwarded);
                self.send_fetch(scope, invoke, &task, generation, endpoint.as_ref())
                    .await
            }
        }
    }

    /// Sends `invoke` fenced at (`task`, `generation`) and classifies the
    /// answer (the transport's one classifier; the hint learned as for
    /// invokes).
    async fn send_fetch(
        &self,
        scope: &OwnerScope,
        invoke: &FetchInvoke,
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
        let untrusted = |e: HostError, what: &str| {
            self.evict(scope);
            tracing::warn!(
                event = "durability.host.fetch_untrusted",
                scope = %scope,
                owner = task.as_str(),
                what,
                reason = %format!("{e:?}"),
                "no trusted answer to a fetch; hint evicted"
            );
            Attempt::Untrusted(e)
        };
        match routing.transport.fetch(&endpoint, token, &fenced).await {
            Reply::Ok { result, owner } => {
                self.learn_hint(scope, task, generation, advertised, owner.as_ref());
                Attempt::Done(Ok(result))
            }
            Reply::Ownership { code } if REDISCOVERY_CODES.contains(&code.as_str()) => {
                Attempt::Rediscover(code)
            }
            Reply::Ownership { code } => {
                untrusted(HostError::remote_ownership(&code), "broad ownership error")
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
                untrusted(HostError::OwnerUnreachable { reason }, "not sent")
            }
            Reply::Unmarked { reason } => {
                untrusted(HostError::OwnerUnavailable { reason }, "unmarked failure")
            }
            Reply::ResultUnknown { reason } => {
                untrusted(HostError::OwnerUnavailable { reason }, "unreadable success")
            }
        }
    }

    /// Serves a fetch that arrived over the transport: a fenced one runs
    /// here only if the fence names this task and admission finds this
    /// task's claim at the fence's generation (else a trusted
    /// `stale_owner`); an unfenced one enters the router and is forwarded
    /// at most once.
    pub(crate) async fn serve_fetch(
        &self,
        invoke: FetchInvoke,
    ) -> Result<(FetchResponse, OwnerHeaders), HostError> {
        let routing = self.routing();
        bump(&routing.counters.served);
        let scope = self.scope_for(&invoke.class, &invoke.name)?;
        if let Some(fence) = invoke.fence.clone() {
            if fence.task != self.ownership().task().as_str() {
                return Err(HostError::StaleFence {
                    generation: fence.generation,
                });
            }
            return self.fetch_local(&invoke, Some(fence.generation)).await;
        }
        match self.ownership().resolve(&scope, self.lifecycle()).await? {
            Resolution::Local(_) => {
                bump(&routing.counters.local);
                self.fetch_local(&invoke, None).await
            }
            Resolution::Remote {
                task,
                generation,
                endpoint,
            } => {
                bump(&routing.counters.forwarded);
                match self
                    .send_fetch(&scope, &invoke, &task, generation, endpoint.as_ref())
                    .await
                {
                    Attempt::Done(Ok(response)) => Ok((
                        response,
                        OwnerHeaders {
                            task: task.as_str().to_owned(),
                            generation: generation.get(),
                            key: scope.host_id().to_owned(),
                            endpoint: endpoint
                                .map(|e| e.as_str().to_owned())
                                .or_else(|| routing.peers.endpoint(task.as_str())),
                        },
                    )),
                    Attempt::Done(Err(e)) | Attempt::Untrusted(e) => Err(e),
                    Attempt::Rediscover(code) => Err(HostError::remote_ownership(&code)),
                }
            }
        }
    }

    /// Runs the class's fetch handler here under admission, the watchdog
    /// and the storage fence; with `expect`, only at that generation. The
    /// handler's response is checked against the limits.
    async fn fetch_local(
        &self,
        invoke: &FetchInvoke,
        expect: Option<u64>,
    ) -> Result<(FetchResponse, OwnerHeaders), HostError> {
        let fetcher = self
            .routing()
            .fetchers
            .get(&invoke.class)
            .cloned()
            .ok_or_else(|| HostError::UnknownMethod {
                class: invoke.class.clone(),
                method: "fetch".to_owned(),
            })?;
        let scope = self.scope_for(&invoke.class, &invoke.name)?;
        let request = invoke.request.clone();
        let result = self
            .dispatch_expect(
                &invoke.class,
                &invoke.name,
                expect,
                |input: MethodInput<I, O::Storage>| async move {
                    let response = fetcher(input, request).await.map_err(HostError::Handler)?;
                    response.validate().map_err(|e| {
                        HostError::Handler(format!("the fetch handler's response: {e}").into())
                    })
                },
            )
            .await;
        let (response, generation) = match result {
            Err(HostError::NotOwner { .. }) if expect.is_some() => {
                return Err(HostError::StaleFence {
                    generation: expect.unwrap_or(0),
                });
            }
            other => other?,
        };
        Ok((
            response,
            OwnerHeaders {
                task: self.ownership().task().as_str().to_owned(),
                generation,
                key: scope.host_id().to_owned(),
                endpoint: self.endpoint().map(str::to_owned),
            },
        ))
    }
}
