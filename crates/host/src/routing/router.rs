//! The one owner-routing loop, for every request kind (a [`Kind`]: call,
//! fetch, connect) and every router (a [`Routes`]: a host's own, and the
//! thin [`crate::RpcClient`]'s through an entry host).
//!
//! The loop sends to the cached owner hint when there is one, else
//! through the router; each answer goes through [`decide`] (the replay
//! rules), and the loop does what it says: return, rediscover once,
//! replay once, follow a handoff, or fail. A new request kind is one
//! [`Kind`] implementation (how it is sent, its rules) and one [`Make`]
//! (how a caller makes it: the host's [`crate::ObjectRef`] and the thin
//! clients alike).

use std::future::Future;

use durability_ownership::OwnerScope;
use futures::future::BoxFuture;

use super::rules::{
    Answer, Budget, Decision, Failure, Payload, Rules, Seen, Source, Verdict, decide, error_of,
};
use crate::error::HostError;
use crate::protocol::{
    Endpoint, InternalToken, OwnerHeaders, RequestId, RouteFence, Transport, edge_id,
};

/// A request addressed to one object, with an optional route fence.
pub(crate) trait Addressed {
    /// The object's class and name.
    fn object(&self) -> (&str, &str);

    /// The route fence the request carries.
    fn fence(&self) -> Option<&RouteFence>;

    /// Sets (or clears) the route fence.
    fn set_fence(&mut self, fence: Option<RouteFence>);

    /// The generation the request may run at here: its route fence's
    /// (`None`, unfenced: whatever this host owns).
    fn expect(&self) -> Option<u64> {
        self.fence().map(|f| f.generation)
    }
}

/// [`Addressed`] for request types with `class`, `name` and `fence`
/// fields.
macro_rules! addressed {
    ($($request:ty),*) => {$(
        impl $crate::routing::router::Addressed for $request {
            fn object(&self) -> (&str, &str) {
                (&self.class, &self.name)
            }

            fn fence(&self) -> Option<&RouteFence> {
                self.fence.as_ref()
            }

            fn set_fence(&mut self, fence: Option<RouteFence>) {
                self.fence = fence;
            }
        }
    )*};
}

addressed!(
    crate::protocol::InvokeRequest,
    crate::protocol::FetchInvoke,
    crate::protocol::ConnectInvoke
);

/// [`Make`] for the edge kinds (a fetch, a connect): the request checked
/// by its own `validate`, with the context id its headers carry
/// ([`edge_id`]).
macro_rules! edge_make {
    ($($invoke:ty: $input:ty),*) => {$(
        impl Make for $invoke {
            type Input = $input;

            fn make(
                class: &str,
                name: &str,
                request: $input,
            ) -> Result<(Self, Option<RequestId>), HostError> {
                let mut request = request.validate()?;
                let id = edge_id(&mut request.headers);
                let (class, name, fence) = (class.to_owned(), name.to_owned(), None);
                let invoke = Self {
                    class,
                    name,
                    request,
                    fence,
                };
                Ok((invoke, Some(id)))
            }
        }
    )*};
}

edge_make!(
    crate::protocol::FetchInvoke: crate::fetch::FetchRequest,
    crate::protocol::ConnectInvoke: crate::connect::ConnectRequest
);

/// One kind of request the router carries.
pub(crate) trait Kind: Addressed + Clone + Send + Sync + 'static {
    /// What a success carries.
    type Out: Send + 'static;

    /// The kind's name in events (`call`, `fetch`, `connect`).
    const NAME: &'static str;

    /// Whether a router hands this kind off to its owner (the caller
    /// connects there) instead of forwarding it.
    const HANDOFF: bool = false;

    /// The replay rules of this request.
    fn rules(&self) -> Rules;

    /// The RPC method called, for the route's span.
    fn method(&self) -> Option<&str> {
        None
    }

    /// Sends the request to `to`.
    fn send<'a>(&'a self, to: Target<'a>) -> BoxFuture<'a, Answer<Self::Out>>;
}

/// Where one send goes.
#[derive(Clone, Copy)]
pub(crate) struct Target<'a> {
    /// The transport it goes over.
    pub(crate) transport: &'a dyn Transport,
    /// The endpoint (an entry or router host, or an owner).
    pub(crate) endpoint: &'a Endpoint,
    /// The internal token attached.
    pub(crate) token: &'a InternalToken,
    /// The scope key (host id) an answer must name.
    pub(crate) key: &'a str,
}

/// Sends a copy of `request` fenced at `fence` to `to` (an owner).
pub(crate) async fn send_fenced<K: Kind>(
    request: &K,
    fence: RouteFence,
    to: Target<'_>,
) -> Answer<K::Out> {
    let mut fenced = request.clone();
    fenced.set_fence(Some(fence));
    fenced.send(to).await
}

/// A request kind as a caller makes it: checked before anything is sent.
pub(crate) trait Make: Kind {
    /// What the caller gives (a method and its arguments, a fetch, a
    /// connect).
    type Input;

    /// The unfenced request to the object `class` / `name`, checked, and
    /// the context request id it carries (`None`: the task's, else a new
    /// one).
    ///
    /// # Errors
    /// The input's own refusal ([`HostError::InvalidMethod`],
    /// [`HostError::InvalidArgs`], [`HostError::InvalidRequest`],
    /// [`HostError::RequestTooLarge`]).
    fn make(
        class: &str,
        name: &str,
        input: Self::Input,
    ) -> Result<(Self, Option<RequestId>), HostError>;
}

/// How one attempt ended.
pub(crate) enum Attempt<T, W> {
    /// Settled where it was run (this host): returned as it is.
    Done(Result<T, HostError>),
    /// An answer, and the owner the request was sent to (`None`: the
    /// router answered).
    Answered {
        /// The classified answer.
        answer: Answer<T>,
        /// Where it was sent, fenced.
        to: Option<W>,
    },
}

/// A step of the loop worth an event or a figure.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step<'a> {
    /// The first attempt goes straight to the hinted owner.
    Direct,
    /// Back through the router once, after this answer.
    Rediscover(Seen),
    /// The same request through the router once more, after this answer.
    Replay(Seen),
    /// A final failure other than the owner's own error envelope.
    Untrusted(Failure, &'a HostError),
}

/// A router: where the loop's attempts go, and what it remembers.
pub(crate) trait Routes<K: Kind>: Sync {
    /// An owner to send to (from a hint or a handoff).
    type Owner: Send + Sync;

    /// The cached owner of the scope, when it is another host.
    fn hint(&self, scope: &OwnerScope) -> Option<Self::Owner>;

    /// One attempt through the router.
    fn via_router<'a>(
        &'a self,
        scope: &'a OwnerScope,
        request: &'a K,
    ) -> impl Future<Output = Attempt<K::Out, Self::Owner>> + Send + 'a;

    /// One attempt straight to `owner`, with the route fence.
    fn to_owner<'a>(
        &'a self,
        scope: &'a OwnerScope,
        request: &'a K,
        owner: Self::Owner,
    ) -> impl Future<Output = Attempt<K::Out, Self::Owner>> + Send + 'a;

    /// The owner a router's handoff names.
    ///
    /// # Errors
    /// [`HostError::OwnerUnreachable`] when its endpoint is refused.
    fn follow(&self, owner: OwnerHeaders) -> Result<Self::Owner, HostError>;

    /// A success's owner headers, from the owner it was sent to.
    fn learn(&self, scope: &OwnerScope, to: Option<Self::Owner>, owner: Option<&OwnerHeaders>);

    /// Drops the scope's cached owner.
    fn evict(&self, scope: &OwnerScope);

    /// Counts and reports a step.
    fn note(&self, scope: &OwnerScope, step: Step<'_>);
}

/// Why [`route`] failed: the error, and the failure the rules found
/// (`None` for an error where the request ran).
#[derive(Debug)]
pub(crate) struct Refusal {
    /// The rule that ended the request, if an answer did.
    pub(crate) failure: Option<Failure>,
    /// The error.
    pub(crate) error: HostError,
}

impl Refusal {
    fn new(failure: Failure, error: HostError) -> Self {
        Self {
            failure: Some(failure),
            error,
        }
    }
}

/// Routes `request` for the object of `scope` to its owner through
/// `router`, under the replay rules ([`decide`]).
///
/// # Errors
/// The [`Refusal`] the rules end with, or the error of a local run.
pub(crate) async fn route<K: Kind, R: Routes<K>>(
    router: &R,
    scope: &OwnerScope,
    request: &K,
) -> Result<K::Out, Refusal> {
    let rules = request.rules();
    let mut budget = Budget::new(&rules);
    let mut next = router.hint(scope);
    if next.is_some() {
        router.note(scope, Step::Direct);
    }
    loop {
        let attempt = match next.take() {
            Some(owner) => router.to_owner(scope, request, owner).await,
            None => router.via_router(scope, request).await,
        };
        let (answer, to) = match attempt {
            Attempt::Done(result) => {
                return result.map_err(|error| Refusal {
                    failure: None,
                    error,
                });
            }
            Attempt::Answered { answer, to } => (answer, to),
        };
        let source = if to.is_some() {
            Source::Owner
        } else {
            Source::Router
        };
        let (seen, payload) = answer.split();
        let Decision { verdict, evict } = decide(&rules, source, budget, seen);
        if evict {
            router.evict(scope);
        }
        match (verdict, payload) {
            (Verdict::Success, Payload::Success(value, owner)) => {
                router.learn(scope, to, owner.as_ref());
                return Ok(value);
            }
            (Verdict::Follow, Payload::Handoff(owner)) => match router.follow(owner) {
                Ok(owner) => next = Some(owner),
                Err(error) => return Err(Refusal::new(Failure::Unreachable, error)),
            },
            (Verdict::Rediscover, _) => {
                budget.rediscoveries = budget.rediscoveries.saturating_sub(1);
                router.note(scope, Step::Rediscover(seen));
            }
            (Verdict::Replay, _) => {
                budget.replays = budget.replays.saturating_sub(1);
                router.note(scope, Step::Replay(seen));
            }
            (verdict, payload) => {
                let (failure, error) = failure_of(verdict, payload);
                if failure != Failure::Remote {
                    router.note(scope, Step::Untrusted(failure, &error));
                }
                return Err(Refusal::new(failure, error));
            }
        }
    }
}

/// What a router that forwards once (for a caller that applies the rules
/// itself) answers: the owner's success, or the error the rules give with
/// nothing left to spend.
pub(crate) fn forwarded_once<T>(rules: &Rules, answer: Answer<T>) -> Result<T, HostError> {
    let (seen, payload) = answer.split();
    match (
        decide(rules, Source::Owner, Budget::NONE, seen).verdict,
        payload,
    ) {
        (Verdict::Success, Payload::Success(value, _)) => Ok(value),
        (verdict, payload) => Err(failure_of(verdict, payload).1),
    }
}

/// The failure a verdict other than a success or a followed handoff is,
/// and its error. (`decide` succeeds or follows only on a success or a
/// handoff, so any other verdict here is a failure.)
fn failure_of<T>(verdict: Verdict, payload: Payload<T>) -> (Failure, HostError) {
    let failure = match verdict {
        Verdict::Fail(failure) => failure,
        _ => Failure::Unavailable,
    };
    let reply = match payload {
        Payload::Other(reply) => Some(reply),
        Payload::Success(..) | Payload::Handoff(_) => None,
    };
    (failure, error_of(failure, reply))
}
