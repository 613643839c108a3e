//! The HTTP/1.1 transport: a hyper client ([`HttpTransport`]) and an axum
//! server ([`serve`]) for a host's internal endpoints.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::{Bytes, BytesMut};
use durability_alarms::{
    AlarmIndex, Delivery, DispatchOutcome, ObjectId, Token, encode_dispatch_outcome, validate_time,
};
use durability_ownership::{LeaseStore, LifecycleAdmin};
use durability_time::Clock;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

mod connect;
mod fetch;

#[cfg(test)]
pub(crate) use connect::classify_connect;

use super::{
    ALARM_PATH, AUTH_HEADER, AlarmRequest, CONNECT_PATH, ConnectInvoke, ConnectReply, Endpoint,
    FETCH_PATH, FetchInvoke, HEALTH_PATH, INVOKE_PATH, InternalToken, InvokeRequest,
    MAX_INVOKE_BODY_BYTES, MAX_RESPONSE_BYTES, METRICS_PATH, OWNER_ENDPOINT_HEADER,
    OWNER_GENERATION_HEADER, OWNER_KEY_HEADER, OWNER_TASK_HEADER, OWNERSHIP_ERROR_HEADER,
    OwnerHeaders, PROBE_PATH, ROUTE_GENERATION_HEADER, ROUTE_TASK_HEADER, Reply, RouteFence,
    TRUSTED_OWNERSHIP_CODES, Transport, envelope, parse_envelope, parse_success,
};
use crate::error::HostError;
use crate::host::Host;
use crate::rpc::RpcArgs;
use crate::store::ObjectStore;

const JSON: &str = "application/json";

/// The default time an invoke may take, from sending to the last byte of
/// the response (an expired invoke's outcome is unknown).
pub const DEFAULT_INVOKE_TIMEOUT: Duration = Duration::from_secs(30);

/// The hyper client transport (HTTP/1.1, pooled connections).
#[derive(Clone)]
pub struct HttpTransport {
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl Default for HttpTransport {
    fn default() -> Self {
        Self::new(DEFAULT_INVOKE_TIMEOUT)
    }
}

impl std::fmt::Debug for HttpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpTransport")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpTransport {
    /// A transport whose invokes take at most `timeout` each.
    pub fn new(timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.enforce_http(true);
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout,
        }
    }

    async fn send(
        &self,
        endpoint: &Endpoint,
        token: &InternalToken,
        request: &InvokeRequest,
    ) -> Reply {
        let http_request = match internal_post(
            endpoint,
            INVOKE_PATH,
            token,
            request.fence.as_ref(),
            JSON,
            Bytes::from(invoke_body(request)),
        ) {
            Ok(r) => r,
            Err(e) => {
                return Reply::Unmarked {
                    reason: format!("building the request failed: {e}"),
                };
            }
        };
        self.round_trip(http_request, MAX_RESPONSE_BYTES, invoke_success)
            .await
    }

    /// Sends `http_request`, reads the response body under `cap` within
    /// the timeout, and classifies the answer ([`classify_with`]): the one
    /// path every invoke and fetch takes.
    async fn round_trip<T>(
        &self,
        http_request: http::Request<Full<Bytes>>,
        cap: usize,
        success: impl FnOnce(Bytes) -> Result<T, String>,
    ) -> Reply<T> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let response = match self.request(http_request, deadline).await {
            Ok(r) => r,
            Err(SendFailure::NotSent(reason)) => return Reply::NotSent { reason },
            Err(SendFailure::AfterSending(reason)) => return Reply::Unmarked { reason },
        };
        let (parts, body) = response.into_parts();
        let read = tokio::time::timeout_at(
            deadline,
            read_capped(body, cap, content_length(&parts.headers)),
        )
        .await
        .unwrap_or_else(|_| Err("the response body timed out".to_owned()));
        classify_with(parts.status.as_u16(), &parts.headers, read, success)
    }
}

/// A request of `method` to an internal `path` of `endpoint`, with the
/// token and, when given, the route fence.
fn internal_request(
    method: http::Method,
    endpoint: &Endpoint,
    path: &str,
    token: &InternalToken,
    fence: Option<&RouteFence>,
) -> http::request::Builder {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(format!("{}{path}", endpoint.url()))
        .header(AUTH_HEADER, token.as_str());
    if let Some(fence) = fence {
        builder = builder
            .header(ROUTE_TASK_HEADER, fence.task.as_str())
            .header(ROUTE_GENERATION_HEADER, fence.generation.to_string());
    }
    builder
}

/// A `POST` of `body` (of `content_type`) to an internal `path` of
/// `endpoint`, with the token and, when given, the route fence.
fn internal_post(
    endpoint: &Endpoint,
    path: &str,
    token: &InternalToken,
    fence: Option<&RouteFence>,
    content_type: &'static str,
    body: Bytes,
) -> Result<http::Request<Full<Bytes>>, http::Error> {
    internal_request(http::Method::POST, endpoint, path, token, fence)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(body))
}

/// How a request failed before its response head arrived.
enum SendFailure {
    /// The connection could not be made: the peer never saw the request.
    NotSent(String),
    /// It failed or timed out after it may have been sent.
    AfterSending(String),
}

impl HttpTransport {
    /// Sends `request`, waiting for the response head until `deadline`.
    async fn request(
        &self,
        request: http::Request<Full<Bytes>>,
        deadline: tokio::time::Instant,
    ) -> Result<http::Response<hyper::body::Incoming>, SendFailure> {
        match tokio::time::timeout_at(deadline, self.client.request(request)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) if e.is_connect() => {
                Err(SendFailure::NotSent(format!("could not connect: {e}")))
            }
            Ok(Err(e)) => Err(SendFailure::AfterSending(format!("transport failed: {e}"))),
            Err(_) => Err(SendFailure::AfterSending(
                "timed out before a response".to_owned(),
            )),
        }
    }
}

impl Transport for HttpTransport {
    fn invoke<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        token: &'a InternalToken,
        request: &'a InvokeRequest,
    ) -> BoxFuture<'a, Reply> {
        Box::pin(self.send(endpoint, token, request))
    }

    fn fetch<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        token: &'a InternalToken,
        request: &'a FetchInvoke,
    ) -> BoxFuture<'a, Reply<crate::fetch::FetchResponse>> {
        Box::pin(self.send_fetch(endpoint, token, request))
    }

    fn connect<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        token: &'a InternalToken,
        request: &'a ConnectInvoke,
        key: &'a str,
    ) -> BoxFuture<'a, ConnectReply> {
        Box::pin(self.send_connect(endpoint, token, request, key))
    }

    fn deliver_alarm<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        token: &'a InternalToken,
        request: &'a AlarmRequest,
        clock: &'a dyn Clock,
    ) -> BoxFuture<'a, DispatchOutcome> {
        Box::pin(self.send_alarm(endpoint, token, request, clock))
    }
}

impl HttpTransport {
    async fn send_alarm(
        &self,
        endpoint: &Endpoint,
        token: &InternalToken,
        request: &AlarmRequest,
        clock: &dyn Clock,
    ) -> DispatchOutcome {
        let d = &request.delivery;
        let body = serde_json::json!({
            "object": d.object.as_str(),
            "token": d.token.as_str(),
            "scheduledAt": d.scheduled_at,
            "attempt": d.attempt,
            "finalAttempt": d.final_attempt,
        })
        .to_string();
        let http_request = match internal_post(
            endpoint,
            ALARM_PATH,
            token,
            Some(&request.fence),
            JSON,
            Bytes::from(body),
        ) {
            Ok(r) => r,
            Err(e) => {
                return DispatchOutcome::NeverStarted {
                    reason: format!("building the request failed: {e}"),
                };
            }
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        let response = match self.request(http_request, deadline).await {
            Ok(r) => r,
            Err(SendFailure::NotSent(reason)) => return DispatchOutcome::NeverStarted { reason },
            Err(SendFailure::AfterSending(reason)) => return DispatchOutcome::Unknown { reason },
        };
        let (parts, body) = response.into_parts();
        if parts.status != StatusCode::OK {
            // Not a dispatch response variant: unclassifiable, so unknown.
            return DispatchOutcome::Unknown {
                reason: format!("the owner answered status {}", parts.status.as_u16()),
            };
        }
        let chunks = body.into_data_stream().map(|chunk| {
            chunk
                .map(|b| b.to_vec())
                .map_err(|e| -> durability_alarms::BoxError { Box::new(e) })
        });
        durability_alarms::read_dispatch_response(clock, content_length(&parts.headers), chunks)
            .await
    }
}

/// `{ class, name, method, args }`, with the arguments' canonical encoding
/// spliced in (not encoded twice).
fn invoke_body(request: &InvokeRequest) -> String {
    let s = |v: &str| serde_json::to_string(v).unwrap_or_else(|_| "\"\"".to_owned());
    format!(
        "{{\"class\":{},\"name\":{},\"method\":{},\"args\":{}}}",
        s(&request.class),
        s(&request.name),
        s(&request.method),
        request.args.encoded()
    )
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Reads a body under `cap` bytes: an announced length over the cap is
/// refused before reading anything, and a stream is dropped (cancelled) as
/// soon as it crosses the cap.
pub(crate) async fn read_capped<B>(
    body: B,
    cap: usize,
    announced: Option<u64>,
) -> Result<Bytes, String>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    if let Some(n) = announced
        && n > cap as u64
    {
        return Err(format!("Content-Length {n} is over the {cap}-byte cap"));
    }
    let mut body = std::pin::pin!(body);
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the body failed: {e}"))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > cap {
                return Err(format!("the body crossed the {cap}-byte cap"));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

fn parse_json(body: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("the body is not UTF-8: {e}"))?;
    serde_json::from_str::<Value>(text).map_err(|e| format!("the body is not JSON: {e}"))
}

/// The reply a caller makes of an invoke's response (see [`Reply`]).
#[cfg(test)]
pub(crate) fn classify(status: u16, headers: &HeaderMap, body: Result<Bytes, String>) -> Reply {
    classify_with(status, headers, body, invoke_success)
}

/// Reads an invoke's success body: `{ "ok": true, "result": … }`.
fn invoke_success(body: Bytes) -> Result<Value, String> {
    parse_success(parse_json(&body)?)
        .ok_or_else(|| "the success envelope is not { ok: true, result }".to_owned())
}

/// The reply a caller makes of a response: a `200` without the ownership
/// marker is read by `success` (its failure, and any other 2xx, is
/// [`Reply::ResultUnknown`]); every other status is classified as an
/// error envelope, the same for invokes and fetches.
pub(crate) fn classify_with<T>(
    status: u16,
    headers: &HeaderMap,
    body: Result<Bytes, String>,
    success: impl FnOnce(Bytes) -> Result<T, String>,
) -> Reply<T> {
    let marker = headers
        .get(OWNERSHIP_ERROR_HEADER)
        .map(|v| v.to_str().unwrap_or("").to_owned());
    if (200..300).contains(&status) {
        if status != 200 || marker.is_some() {
            return Reply::ResultUnknown {
                reason: format!("unexpected success status {status}"),
            };
        }
        return match body.and_then(success) {
            Ok(result) => Reply::Ok {
                result,
                owner: owner_headers(headers),
            },
            Err(reason) => Reply::ResultUnknown { reason },
        };
    }
    let parsed = body.and_then(|b| parse_json(&b));
    let envelope = match parsed {
        Ok(v) => parse_envelope(&v),
        Err(reason) => {
            return Reply::Unmarked {
                reason: format!("status {status}: {reason}"),
            };
        }
    };
    let Some((code, message, details)) = envelope else {
        return Reply::Unmarked {
            reason: format!("status {status}: not an error envelope"),
        };
    };
    if let Some(marker) = marker {
        if status == 503 && marker == code && TRUSTED_OWNERSHIP_CODES.contains(&code.as_str()) {
            return Reply::Ownership { code };
        }
        return Reply::Unmarked {
            reason: format!("status {status}: an ownership marker that does not validate"),
        };
    }
    if matches!(status, 502..=504) {
        return Reply::Unmarked {
            reason: format!("status {status} without the ownership marker"),
        };
    }
    Reply::Failed {
        status,
        code,
        message,
        details,
    }
}

fn owner_headers(headers: &HeaderMap) -> Option<OwnerHeaders> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let task = get(OWNER_TASK_HEADER)?;
    let generation = parse_generation(get(OWNER_GENERATION_HEADER)?)?;
    let key = get(OWNER_KEY_HEADER)?;
    Some(OwnerHeaders {
        task: task.to_owned(),
        generation,
        key: key.to_owned(),
        endpoint: get(OWNER_ENDPOINT_HEADER).map(str::to_owned),
    })
}

/// A positive safe integer in canonical decimal (no sign, no leading zero).
pub(crate) fn parse_generation(raw: &str) -> Option<u64> {
    if raw.is_empty() || raw.len() > 16 || raw.starts_with('0') {
        return None;
    }
    if !raw.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let g: u64 = raw.parse().ok()?;
    (1..=durability_time::MAX_SAFE_UNSIGNED)
        .contains(&g)
        .then_some(g)
}

/// Serves `host`'s internal endpoints on `listener` until `stop` is
/// cancelled.
///
/// # Errors
/// [`HostError::Transport`] when the server fails.
pub async fn serve<S, I, O: ObjectStore>(
    host: Host<S, I, O>,
    listener: tokio::net::TcpListener,
    stop: CancellationToken,
) -> Result<(), HostError>
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    let app = Router::new()
        .route(INVOKE_PATH, post(invoke::<S, I, O>))
        .route(ALARM_PATH, post(alarm::<S, I, O>))
        .route(FETCH_PATH, post(fetch::fetch_endpoint::<S, I, O>))
        .route(CONNECT_PATH, get(connect::connect_endpoint::<S, I, O>))
        .route(PROBE_PATH, get(probe::<S, I, O>))
        .route(HEALTH_PATH, get(|| async { "ok" }))
        .route(METRICS_PATH, get(metrics::<S, I, O>))
        .with_state(Arc::new(host));
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .map_err(|e| HostError::Transport {
            reason: format!("the server failed: {e}"),
        })
}

fn error_response(status: u16, code: &str, message: &str, marked: bool) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(envelope(code, message, None))).into_response();
    if marked && let Ok(v) = HeaderValue::from_str(code) {
        response.headers_mut().insert(OWNERSHIP_ERROR_HEADER, v);
    }
    response
}

/// `None` when authorized, else the refusal.
fn refused<S, I, O: ObjectStore>(host: &Host<S, I, O>, headers: &HeaderMap) -> Option<Response>
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
{
    let Some(token) = host.internal_token() else {
        return Some(error_response(
            401,
            "unauthorized",
            "internal endpoints are disabled (no internal token configured)",
            false,
        ));
    };
    match headers.get(AUTH_HEADER) {
        Some(v) if token.matches(v.as_bytes()) => None,
        _ => Some(error_response(
            401,
            "unauthorized",
            "missing or wrong internal token",
            false,
        )),
    }
}

/// The common front of every internal `POST` that may carry a route
/// fence (invoke, fetch, alarm delivery): the token (a refusal is
/// counted), the fence headers, then the body under `cap` (an oversized
/// Content-Length refused before reading). `Err` is the response to send.
pub(super) async fn admitted_body<S, I, O: ObjectStore>(
    host: &Host<S, I, O>,
    headers: &HeaderMap,
    body: Body,
    cap: usize,
) -> Result<(Option<RouteFence>, Bytes), Response>
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
{
    if let Some(refused) = refused(host, headers) {
        host.count_refused_auth();
        return Err(refused);
    }
    let fence =
        fence_of(headers).map_err(|reason| error_response(400, "invalid_fence", reason, false))?;
    let bytes = read_capped(body, cap, content_length(headers))
        .await
        .map_err(|reason| error_response(413, "request_too_large", &reason, false))?;
    Ok((fence, bytes))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WireInvoke {
    class: String,
    name: String,
    method: String,
    args: Value,
}

fn fence_of(headers: &HeaderMap) -> Result<Option<RouteFence>, &'static str> {
    let task = headers.get(ROUTE_TASK_HEADER);
    let generation = headers.get(ROUTE_GENERATION_HEADER);
    match (task, generation) {
        (None, None) => Ok(None),
        (Some(task), Some(generation)) => {
            let task = task
                .to_str()
                .ok()
                .filter(|t| durability_ownership::TaskId::new(t).is_ok())
                .ok_or("the route fence's task is malformed")?;
            let generation = generation
                .to_str()
                .ok()
                .and_then(parse_generation)
                .ok_or("the route fence's generation is not a positive safe integer")?;
            Ok(Some(RouteFence {
                task: task.to_owned(),
                generation,
            }))
        }
        _ => Err("a route fence carries both its task and its generation"),
    }
}

async fn invoke<S, I, O: ObjectStore>(
    State(host): State<Arc<Host<S, I, O>>>,
    headers: HeaderMap,
    body: Body,
) -> Response
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    let (fence, bytes) = match admitted_body(&host, &headers, body, MAX_INVOKE_BODY_BYTES).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let wire: WireInvoke = match serde_json::from_slice(&bytes) {
        Ok(w) => w,
        Err(e) => {
            return error_response(
                400,
                "invalid_request",
                &format!("the invoke is not {{ class, name, method, args }}: {e}"),
                false,
            );
        }
    };
    let result = match RpcArgs::new(wire.args) {
        Ok(args) => {
            host.serve_invoke(InvokeRequest {
                class: wire.class,
                name: wire.name,
                method: wire.method,
                args,
                fence,
            })
            .await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok((value, owner)) => {
            let mut response =
                axum::Json(serde_json::json!({ "ok": true, "result": value })).into_response();
            put_owner_headers(response.headers_mut(), &owner);
            response
        }
        Err(e) => {
            let wire = e.wire();
            error_response(wire.status, &wire.code, &wire.message, wire.marked)
        }
    }
}

/// Sets the owner's trusted headers on a success response.
fn put_owner_headers(h: &mut HeaderMap, owner: &OwnerHeaders) {
    let mut put = |name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    };
    put(OWNER_TASK_HEADER, &owner.task);
    put(OWNER_GENERATION_HEADER, &owner.generation.to_string());
    put(OWNER_KEY_HEADER, &owner.key);
    if let Some(e) = &owner.endpoint {
        put(OWNER_ENDPOINT_HEADER, e);
    }
}

/// The largest alarm delivery body a host reads.
const MAX_ALARM_BODY_BYTES: usize = 4 * 1024;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WireAlarm {
    object: String,
    token: String,
    scheduled_at: i64,
    attempt: u32,
    final_attempt: bool,
}

impl WireAlarm {
    fn delivery(self) -> Result<Delivery, String> {
        let object = ObjectId::new(&self.object).map_err(|e| format!("object: {e}"))?;
        let token = Token::new(self.token).map_err(|e| format!("token: {e}"))?;
        let scheduled_at =
            validate_time(self.scheduled_at).map_err(|e| format!("scheduledAt: {e}"))?;
        if self.attempt == 0 {
            return Err("attempt: tries count from 1".to_owned());
        }
        Ok(Delivery {
            object,
            token,
            scheduled_at,
            attempt: self.attempt,
            final_attempt: self.final_attempt,
        })
    }
}

async fn alarm<S, I, O: ObjectStore>(
    State(host): State<Arc<Host<S, I, O>>>,
    headers: HeaderMap,
    body: Body,
) -> Response
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    let (fence, bytes) = match admitted_body(&host, &headers, body, MAX_ALARM_BODY_BYTES).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let Some(fence) = fence else {
        return error_response(
            400,
            "invalid_fence",
            "an alarm delivery carries its route fence",
            false,
        );
    };
    let delivery = serde_json::from_slice::<WireAlarm>(&bytes)
        .map_err(|e| e.to_string())
        .and_then(WireAlarm::delivery);
    let delivery = match delivery {
        Ok(d) => d,
        Err(reason) => {
            return error_response(
                400,
                "invalid_request",
                &format!(
                    "the alarm is not {{ object, token, scheduledAt, attempt, finalAttempt }}: {reason}"
                ),
                false,
            );
        }
    };
    let outcome = host.serve_alarm(AlarmRequest { delivery, fence }).await;
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        encode_dispatch_outcome(&outcome),
    )
        .into_response()
}

async fn probe<S, I, O: ObjectStore>(
    State(host): State<Arc<Host<S, I, O>>>,
    headers: HeaderMap,
) -> Response
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    if let Some(refused) = refused(&host, &headers) {
        host.count_refused_auth();
        return refused;
    }
    let p = host.probe();
    let scopes: Vec<Value> = p
        .scopes
        .iter()
        .map(|s| serde_json::json!({ "scope": s.scope, "generation": s.generation }))
        .collect();
    axum::Json(serde_json::json!({
        "task": p.task,
        "endpoint": p.endpoint,
        "storageId": p.storage_id,
        "state": p.state,
        "inFlight": p.in_flight,
        "openObjects": p.open_objects,
        "scopes": scopes,
    }))
    .into_response()
}

async fn metrics<S, I, O: ObjectStore>(State(host): State<Arc<Host<S, I, O>>>) -> Response
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
{
    let p = host.probe();
    let r = p.routing;
    let d = p.dispatch;
    let text = format!(
        "do_in_flight {}\n\
         do_dispatches{{outcome=\"completed\"}} {}\n\
         do_dispatches{{outcome=\"handler_failed\"}} {}\n\
         do_dispatches{{outcome=\"refused_not_owner\"}} {}\n\
         do_routed_calls{{path=\"local\"}} {}\n\
         do_routed_calls{{path=\"forwarded\"}} {}\n\
         do_routed_calls{{path=\"direct\"}} {}\n\
         do_route_rediscoveries {}\n\
         do_route_hint_evictions {}\n\
         do_route_endpoint_refusals {}\n\
         do_internal_auth_refusals {}\n\
         do_invokes_served {}\n\
         do_connect_handoffs {}\n\
         do_connect_upgrades {}\n\
         do_alarm_deliveries_forwarded {}\n\
         do_alarm_deliveries_served {}\n",
        p.in_flight,
        d.completed,
        d.handler_failed,
        d.refused_not_owner,
        r.local,
        r.forwarded,
        r.direct,
        r.rediscoveries,
        r.hint_evictions,
        r.endpoint_refusals,
        r.auth_refusals,
        r.served,
        r.handoffs,
        r.upgrades,
        r.alarms_forwarded,
        r.alarms_served,
    );
    text.into_response()
}
