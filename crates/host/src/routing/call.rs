//! RPC calls through the router: [`ObjectRef::call`], the [`Kind`] of an
//! invoke (never replayed after an unknown outcome; an unreadable success
//! is `do_rpc_result_unknown`), and the owner's side.

use futures::future::BoxFuture;
use serde_json::Value;

use super::rules::{Answer, Rules};
use super::{Addressed, Kind, Make, ObjectRef, RunHere, Target, registered};
use crate::bounds::{HostAlarms, HostLeases};
use crate::error::HostError;
use crate::host::Host;
use crate::protocol::{InvokeRequest, OwnerHeaders, RequestId};
use crate::rpc::{RpcArgs, validate_method};
use crate::store::ObjectStore;

impl Kind for InvokeRequest {
    type Out = Value;
    const NAME: &'static str = "call";

    fn rules(&self) -> Rules {
        Rules::RPC
    }

    fn method(&self) -> Option<&str> {
        Some(&self.method)
    }

    fn send<'a>(&'a self, to: Target<'a>) -> BoxFuture<'a, Answer<Value>> {
        let reply = to.transport.invoke(to.endpoint, to.token, self);
        Box::pin(async move { Answer::Reply(reply.await) })
    }
}

impl Make for InvokeRequest {
    type Input = (String, Value);

    fn make(
        class: &str,
        name: &str,
        (method, args): (String, Value),
    ) -> Result<(Self, Option<RequestId>), HostError> {
        validate_method(&method)?;
        let args = RpcArgs::new(args)?;
        let (class, name, fence) = (class.to_owned(), name.to_owned(), None);
        Ok((
            Self {
                class,
                name,
                method,
                args,
                fence,
            },
            None,
        ))
    }
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> RunHere<S, I, O> for InvokeRequest {
    /// Runs the registered method.
    async fn run_here(&self, host: &Host<S, I, O>) -> Result<(Value, u64), HostError> {
        let methods = host.routing().methods.get(&self.class);
        let method = methods.and_then(|m| m.get(&self.method));
        let method = registered(method, &self.class, &self.method)?;
        let args = self.args.value().clone();
        host.dispatch_expect(&self.class, &self.name, self.expect(), |input| async move {
            method(input, args).await
        })
        .await
    }
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> ObjectRef<S, I, O> {
    /// Calls `method` with `args` on the object, on whichever host owns it
    /// (see the crate docs, "Calls between hosts", for routing and replay).
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
    /// a refusal, or `internal_error`). The method's own
    /// [`crate::MethodError`]: [`HostError::Method`], locally and across
    /// hosts alike. Locally: as [`Host::call`].
    pub async fn call(&self, method: &str, args: Value) -> Result<Value, HostError> {
        self.routed::<InvokeRequest>((method.to_owned(), args))
            .await
    }
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> Host<S, I, O> {
    /// Serves an invoke that arrived over the transport (see
    /// [`Host::serve_routed`]).
    pub(crate) async fn serve_invoke(
        &self,
        request: InvokeRequest,
    ) -> Result<(Value, OwnerHeaders), HostError> {
        validate_method(&request.method)?;
        self.serve_routed(request).await
    }
}
