//! Tenant fetches through the router: [`ObjectRef::fetch`], the [`Kind`]
//! of a fetch, and the owner's side.
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

use futures::future::BoxFuture;

use super::rules::{Answer, Rules};
use super::{Addressed, Kind, ObjectRef, RunHere, Target, registered};
use crate::bounds::{HostAlarms, HostLeases};
use crate::error::HostError;
use crate::fetch::{FetchRequest, FetchResponse};
use crate::host::Host;
use crate::protocol::{FetchInvoke, OwnerHeaders};
use crate::store::ObjectStore;

impl Kind for FetchInvoke {
    type Out = FetchResponse;
    const NAME: &'static str = "fetch";

    fn rules(&self) -> Rules {
        Rules::fetch(self.request.is_safe())
    }

    fn send<'a>(&'a self, to: Target<'a>) -> BoxFuture<'a, Answer<FetchResponse>> {
        let reply = to.transport.fetch(to.endpoint, to.token, self);
        Box::pin(async move { Answer::Reply(reply.await) })
    }
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> RunHere<S, I, O> for FetchInvoke {
    /// Runs the class's fetch handler; its response is checked against
    /// the limits.
    async fn run_here(&self, host: &Host<S, I, O>) -> Result<(FetchResponse, u64), HostError> {
        let fetcher = host.routing().fetchers.get(&self.class);
        let fetcher = registered(fetcher, &self.class, "fetch")?;
        let request = self.request.clone();
        host.dispatch_expect(&self.class, &self.name, self.expect(), |input| async move {
            let response = fetcher(input, request).await.map_err(HostError::Handler)?;
            response.validate().map_err(|e| {
                HostError::Handler(format!("the fetch handler's response: {e}").into())
            })
        })
        .await
    }
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> ObjectRef<S, I, O> {
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
        self.routed::<FetchInvoke>(request).await
    }
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> Host<S, I, O> {
    /// Serves a fetch that arrived over the transport (see
    /// [`Host::serve_routed`]).
    pub(crate) async fn serve_fetch(
        &self,
        invoke: FetchInvoke,
    ) -> Result<(FetchResponse, OwnerHeaders), HostError> {
        self.serve_routed(invoke).await
    }
}
