//! RPC calls through the router: [`ObjectRef::call`], the [`Kind`] of an
//! invoke (never replayed after an unknown outcome; an unreadable success
//! is `do_rpc_result_unknown`), and the owner's side.

use std::future::Future;

use durability_alarms::AlarmIndex;
use durability_ownership::{LeaseStore, LifecycleAdmin};
use futures::future::BoxFuture;
use serde_json::Value;

use super::rules::{Answer, Rules};
use super::{Kind, ObjectRef, RunHere};
use crate::error::HostError;
use crate::host::Host;
use crate::object::MethodInput;
use crate::protocol::{Endpoint, InternalToken, InvokeRequest, OwnerHeaders, RequestId, Transport};
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

    fn send<'a>(
        &'a self,
        transport: &'a dyn Transport,
        endpoint: &'a Endpoint,
        token: &'a InternalToken,
        _key: &'a str,
    ) -> BoxFuture<'a, Answer<Value>> {
        Box::pin(async move { Answer::Reply(transport.invoke(endpoint, token, self).await) })
    }
}

impl<S, I, O: ObjectStore> RunHere<S, I, O> for InvokeRequest
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    fn run_here<'a>(
        &'a self,
        host: &'a Host<S, I, O>,
        expect: Option<u64>,
    ) -> impl Future<Output = Result<(Value, OwnerHeaders), HostError>> + Send + 'a {
        host.invoke_local(self, expect)
    }
}

impl<S, I, O: ObjectStore> ObjectRef<S, I, O>
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
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
        validate_method(method)?;
        let args = RpcArgs::new(args)?;
        self.routed(
            InvokeRequest {
                class: self.class.clone(),
                name: self.name.clone(),
                method: method.to_owned(),
                args,
                fence: None,
            },
            RequestId::current_or_new(),
        )
        .await
    }
}

impl<S, I, O: ObjectStore> Host<S, I, O>
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    /// Serves an invoke that arrived over the transport (see
    /// [`Host::serve_routed`]).
    pub(crate) async fn serve_invoke(
        &self,
        request: InvokeRequest,
    ) -> Result<(Value, OwnerHeaders), HostError> {
        validate_method(&request.method)?;
        self.serve_routed(request).await
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
        let (value, generation) = self
            .dispatch_expect(
                &request.class,
                &request.name,
                expect,
                |input: MethodInput<I, O::Storage>| async move { method(input, args).await },
            )
            .await?;
        Ok((value, self.own_headers(&scope, generation)))
    }
}
