//! The protocol between hosts: requests, replies, limits, headers,
//! the internal token, endpoints and the HTTP/1.1 client. Public through
//! [`crate::transport`].

mod endpoint;
pub(crate) mod http1;
mod request_id;

use std::fmt;

use futures::future::BoxFuture;
use serde_json::Value;

pub use endpoint::{Endpoint, EndpointPolicy, EndpointRefused, MAX_ENDPOINT_BYTES};
pub use http1::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_INVOKE_TIMEOUT, HttpTransport};
pub use request_id::{CONTEXT_ID_HEADER, MAX_REQUEST_ID_BYTES, REQUEST_ID_HEADER, RequestId};
pub(crate) use request_id::{edge_id, hop_id, strip_request_id};

#[cfg(test)]
pub(crate) use http1::classify_connect;

use crate::rpc::RpcArgs;

/// The invoke path.
pub const INVOKE_PATH: &str = "/internal/do/invoke";
/// The tenant fetch path.
pub const FETCH_PATH: &str = "/internal/do/fetch";
/// The WebSocket connect path.
pub const CONNECT_PATH: &str = "/internal/do/connect";
/// The alarm delivery path.
pub const ALARM_PATH: &str = "/internal/do/alarm";
/// The probe path (authenticated).
pub const PROBE_PATH: &str = "/internal/do/probe";
/// The health path (unauthenticated).
pub const HEALTH_PATH: &str = "/health";
/// The metrics path (unauthenticated).
pub const METRICS_PATH: &str = "/metrics";
/// The readiness path (unauthenticated): `200 ready` while the host runs,
/// `503` from the moment its drain starts (a load balancer takes it out of
/// rotation; `/health`, liveness, stays `200` until the process ends).
pub const READY_PATH: &str = "/ready";

/// The shared internal token.
pub const AUTH_HEADER: &str = "x-durability-internal-auth";
/// The route fence's task.
pub const ROUTE_TASK_HEADER: &str = "x-durability-route-task";
/// The route fence's generation.
pub const ROUTE_GENERATION_HEADER: &str = "x-durability-route-generation";
/// The owner's task (response).
pub const OWNER_TASK_HEADER: &str = "x-durability-owner-task";
/// The owner's generation (response).
pub const OWNER_GENERATION_HEADER: &str = "x-durability-owner-generation";
/// The owner scope's key (its host id) (response).
pub const OWNER_KEY_HEADER: &str = "x-durability-owner-key";
/// The owner's endpoint (response).
pub const OWNER_ENDPOINT_HEADER: &str = "x-durability-owner-endpoint";
/// The trusted ownership-error marker (response): the error code again.
pub const OWNERSHIP_ERROR_HEADER: &str = "x-durability-ownership-error";
/// The tenant's connect request (one line of JSON) on a connect upgrade.
pub const CONNECT_META_HEADER: &str = "x-durability-connect";
/// The private owner-hint marker of a connect handoff (response).
pub const CONNECT_HINT_HEADER: &str = "x-durability-owner-hint";
/// The one value of [`CONNECT_HINT_HEADER`].
pub const CONNECT_HINT_VALUE: &str = "connect";
/// The status of a connect handoff: the trusted control status (as for a
/// trusted ownership refusal).
pub const CONNECT_HINT_STATUS: u16 = 503;
pub use crate::fetch::CONTROL_HEADER_PREFIX;

/// The internal headers as [`http::HeaderName`]s, made at compile time: a
/// lookup or an insert by `&str` parses and checks the name every time.
pub(crate) mod names {
    use http::HeaderName;

    pub(crate) const AUTH: HeaderName = HeaderName::from_static(super::AUTH_HEADER);
    pub(crate) const CONTEXT_ID: HeaderName = HeaderName::from_static(super::CONTEXT_ID_HEADER);
    pub(crate) const ROUTE_TASK: HeaderName = HeaderName::from_static(super::ROUTE_TASK_HEADER);
    pub(crate) const ROUTE_GENERATION: HeaderName =
        HeaderName::from_static(super::ROUTE_GENERATION_HEADER);
    pub(crate) const OWNER_TASK: HeaderName = HeaderName::from_static(super::OWNER_TASK_HEADER);
    pub(crate) const OWNER_GENERATION: HeaderName =
        HeaderName::from_static(super::OWNER_GENERATION_HEADER);
    pub(crate) const OWNER_KEY: HeaderName = HeaderName::from_static(super::OWNER_KEY_HEADER);
    pub(crate) const OWNER_ENDPOINT: HeaderName =
        HeaderName::from_static(super::OWNER_ENDPOINT_HEADER);
    pub(crate) const OWNERSHIP_ERROR: HeaderName =
        HeaderName::from_static(super::OWNERSHIP_ERROR_HEADER);
}

/// The largest invoke body a host reads: the arguments' cap plus room for
/// the class, the name and the method.
pub const MAX_INVOKE_BODY_BYTES: usize = crate::rpc::MAX_ARGS_BYTES + 8 * 1024;
/// The largest response body a caller reads.
pub const MAX_RESPONSE_BYTES: usize = crate::rpc::MAX_ARGS_BYTES;

/// The most metadata a fetch frame carries: the header and URL budgets,
/// each byte possibly escaped in JSON (`\"`, `\\`), plus room for the
/// class, the name, the method and the punctuation.
pub const MAX_FETCH_META_BYTES: usize =
    2 * (crate::fetch::MAX_HEADER_BYTES + crate::fetch::MAX_URL_BYTES) + 16 * 1024;
/// The largest fetch frame (request or response) a host reads: the body
/// cap plus the metadata cap.
pub const MAX_FETCH_WIRE_BYTES: usize = crate::fetch::MAX_BODY_BYTES + MAX_FETCH_META_BYTES;

pub use crate::error::{REDISCOVERY_CODES, TRUSTED_OWNERSHIP_CODES};

/// A route fence: the owner a forwarded or cached-direct call was sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteFence {
    /// The task the caller believes owns the scope.
    pub task: String,
    /// Its generation (a positive safe integer).
    pub generation: u64,
}

/// One invoke.
#[derive(Debug, Clone)]
pub struct InvokeRequest {
    /// The object's class.
    pub class: String,
    /// The object's name.
    pub name: String,
    /// The method.
    pub method: String,
    /// The arguments.
    pub args: RpcArgs,
    /// The route fence (forwarded and cached-direct calls).
    pub fence: Option<RouteFence>,
}

/// One tenant fetch sent to another host.
#[derive(Debug, Clone)]
pub struct FetchInvoke {
    /// The object's class.
    pub class: String,
    /// The object's name.
    pub name: String,
    /// The validated request (control headers stripped).
    pub request: crate::fetch::FetchRequest,
    /// The route fence (forwarded and cached-direct fetches).
    pub fence: Option<RouteFence>,
}

/// One WebSocket connect sent to another host.
#[derive(Debug, Clone)]
pub struct ConnectInvoke {
    /// The object's class.
    pub class: String,
    /// The object's name.
    pub name: String,
    /// The validated request (control headers stripped).
    pub request: crate::connect::ConnectRequest,
    /// The route fence (cached-direct and handed-off connects).
    pub fence: Option<RouteFence>,
}

/// How a caller classifies the answer to a connect.
#[derive(Debug)]
pub enum ConnectReply {
    /// `101`: the owner upgraded; the client end of the session.
    Upgraded {
        /// The session.
        socket: crate::connect::Socket,
        /// The owner's headers on the `101`, when complete and well-formed.
        owner: Option<OwnerHeaders>,
    },
    /// A valid trusted hint-only handoff: the right status, marker value,
    /// complete owner metadata with an endpoint, and the scope key the
    /// caller expects. Nothing was upgraded.
    Hint(OwnerHeaders),
    /// Anything else, classified as an invoke's answer is ([`Reply`]; a
    /// malformed handoff is [`Reply::Unmarked`]). Nothing was upgraded.
    Refused(Reply<std::convert::Infallible>),
}

/// One alarm delivery sent to the owner of its object.
#[derive(Debug, Clone)]
pub struct AlarmRequest {
    /// The delivery the sender's dispatcher claimed.
    pub delivery: durability_alarms::Delivery,
    /// The owner and generation the sender resolved (always carried: the
    /// receiver admits the delivery only there).
    pub fence: RouteFence,
}

/// The owner's trusted headers on a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerHeaders {
    /// The owning task.
    pub task: String,
    /// Its generation.
    pub generation: u64,
    /// The scope's key (host id).
    pub key: String,
    /// Its endpoint, when it advertises one.
    pub endpoint: Option<String>,
}

/// How a caller classifies what came back from an invoke (`T` is the
/// result: JSON for an invoke, a [`crate::fetch::FetchResponse`] for a
/// fetch).
#[derive(Debug, Clone, PartialEq)]
pub enum Reply<T = Value> {
    /// A valid success envelope.
    Ok {
        /// The method's result.
        result: T,
        /// The owner's headers, when complete and well-formed.
        owner: Option<OwnerHeaders>,
    },
    /// A trusted ownership refusal (a `503` whose marker matches the
    /// envelope's allowlisted code): proven not started.
    Ownership {
        /// The code (one of [`TRUSTED_OWNERSHIP_CODES`]).
        code: String,
    },
    /// A validated error envelope other than a trusted ownership refusal.
    Failed {
        /// The HTTP status.
        status: u16,
        /// The envelope's code.
        code: String,
        /// Its message.
        message: String,
        /// Its details.
        details: Option<Value>,
    },
    /// The request never reached the owner: the connection could not be
    /// made. Nothing ran.
    NotSent {
        /// What happened (internal diagnostics; never shown to tenants).
        reason: String,
    },
    /// No trusted answer: the connection failed or timed out after the
    /// request was sent, or a status
    /// or error envelope could not be trusted (502/503/504 without the
    /// marker, a malformed envelope). The method may have run.
    Unmarked {
        /// What happened (internal diagnostics; never shown to tenants).
        reason: String,
    },
    /// A success status whose body could not be read, decoded, parsed or
    /// validated (`do_rpc_result_unknown`): the method may have run.
    ResultUnknown {
        /// What happened.
        reason: String,
    },
}

/// The shared internal token (compared in constant time; never printed).
/// It keeps its header value, made once (every send attaches it).
#[derive(Clone)]
pub struct InternalToken {
    token: String,
    header: http::HeaderValue,
}

impl InternalToken {
    /// A token; at least 16 bytes of visible ASCII.
    ///
    /// # Errors
    /// [`crate::HostError::InvalidSetting`] otherwise.
    pub fn new(token: &str) -> Result<Self, crate::HostError> {
        let refused =
            || crate::HostError::setting("internal_token", "16..=1024 bytes of visible ASCII");
        if token.len() < 16 || token.len() > 1024 || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(refused());
        }
        let header = http::HeaderValue::from_str(token).map_err(|_| refused())?;
        Ok(Self {
            token: token.to_owned(),
            header,
        })
    }

    /// The token as the header value a request carries.
    pub(crate) fn header_value(&self) -> http::HeaderValue {
        self.header.clone()
    }

    /// Whether `presented` is the token, compared in constant time (the
    /// length is not secret).
    pub fn matches(&self, presented: &[u8]) -> bool {
        use subtle::ConstantTimeEq as _;
        presented.len() == self.token.len() && bool::from(self.token.as_bytes().ct_eq(presented))
    }
}

impl fmt::Debug for InternalToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InternalToken(..)")
    }
}

/// Sends invokes to other hosts. Object safe: a host holds one chosen at
/// run time ([`HttpTransport`] by default).
pub trait Transport: Send + Sync + 'static {
    /// Sends `request` to `endpoint` with `token` and classifies the answer.
    /// Never fails: every failure is a [`Reply`].
    fn invoke<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        token: &'a InternalToken,
        request: &'a InvokeRequest,
    ) -> BoxFuture<'a, Reply>;

    /// Sends a tenant fetch to `endpoint` with `token` and classifies the
    /// answer, like [`Transport::invoke`]. The default carries none: the
    /// fetch is [`Reply::NotSent`] (nothing ran).
    fn fetch<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        token: &'a InternalToken,
        request: &'a FetchInvoke,
    ) -> BoxFuture<'a, Reply<crate::fetch::FetchResponse>> {
        let _ = (endpoint, token, request);
        Box::pin(async {
            Reply::NotSent {
                reason: "this transport does not carry fetches".to_owned(),
            }
        })
    }

    /// Sends a WebSocket connect to `endpoint` with `token`; `key` is the
    /// scope key (host id) a handoff must name. The default carries none:
    /// [`Reply::NotSent`] (nothing ran).
    fn connect<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        token: &'a InternalToken,
        request: &'a ConnectInvoke,
        key: &'a str,
    ) -> BoxFuture<'a, ConnectReply> {
        let _ = (endpoint, token, request, key);
        Box::pin(async {
            ConnectReply::Refused(Reply::NotSent {
                reason: "this transport does not carry connects".to_owned(),
            })
        })
    }

    /// Sends an alarm delivery to `endpoint` and reports the outcome the
    /// owner answered. Never fails: a request that provably never reached
    /// the owner (the connection could not be made) is
    /// [`durability_alarms::DispatchOutcome::NeverStarted`]; any other
    /// transport failure, and a response that cannot be read and
    /// classified within its cap and `clock`'s 5 s body deadline, is
    /// [`durability_alarms::DispatchOutcome::Unknown`].
    ///
    /// The default carries none: nothing is sent, and the delivery never
    /// started (the dispatcher waits for the owner's lease, as without a
    /// transport).
    fn deliver_alarm<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        token: &'a InternalToken,
        request: &'a AlarmRequest,
        clock: &'a dyn durability_time::Clock,
    ) -> BoxFuture<'a, durability_alarms::DispatchOutcome> {
        let _ = (endpoint, token, request, clock);
        Box::pin(async {
            durability_alarms::DispatchOutcome::NeverStarted {
                reason: "this transport does not carry alarm deliveries".to_owned(),
            }
        })
    }
}

/// Where a task can be reached when its owner record advertises no
/// endpoint. Every endpoint, from a record or from here, is checked against
/// the host's [`EndpointPolicy`] before the token is attached.
pub trait PeerDirectory: Send + Sync + 'static {
    /// The raw endpoint of `task`, if known.
    fn endpoint(&self, task: &str) -> Option<String>;
}

/// A fixed task → endpoint map.
#[derive(Debug, Clone, Default)]
pub struct StaticPeers(pub std::collections::BTreeMap<String, String>);

impl PeerDirectory for StaticPeers {
    fn endpoint(&self, task: &str) -> Option<String> {
        self.0.get(task).cloned()
    }
}

/// The error envelope's body: `{ error, message, details? }`.
pub(crate) fn envelope(code: &str, message: &str, details: Option<Value>) -> Value {
    let mut map = serde_json::Map::new();
    map.insert("error".to_owned(), Value::String(code.to_owned()));
    map.insert("message".to_owned(), Value::String(message.to_owned()));
    if let Some(d) = details {
        map.insert("details".to_owned(), d);
    }
    Value::Object(map)
}

/// Reads an error envelope strictly: exactly `error` and `message`
/// strings and optionally `details`; the code is `[a-z0-9_]{1,64}`.
pub(crate) fn parse_envelope(value: &Value) -> Option<(String, String, Option<Value>)> {
    let map = value.as_object()?;
    if map
        .keys()
        .any(|k| !matches!(k.as_str(), "error" | "message" | "details"))
    {
        return None;
    }
    let code = map.get("error")?.as_str()?;
    let message = map.get("message")?.as_str()?;
    if !crate::rpc::MethodError::code_is_valid(code) {
        return None;
    }
    Some((
        code.to_owned(),
        message.to_owned(),
        map.get("details").cloned(),
    ))
}

/// Reads a success envelope strictly: exactly `{ "ok": true, "result": … }`.
pub(crate) fn parse_success(value: Value) -> Option<Value> {
    let Value::Object(mut map) = value else {
        return None;
    };
    if map.len() != 2 || map.get("ok") != Some(&Value::Bool(true)) {
        return None;
    }
    map.remove("result")
}

#[cfg(test)]
mod tests;
