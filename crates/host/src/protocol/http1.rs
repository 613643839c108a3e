//! The HTTP/1.1 transport: a hyper client ([`HttpTransport`]) and an axum
//! server ([`serve`]) for a host's internal endpoints.

use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use bytes::{Bytes, BytesMut};
use durability_alarms::DispatchOutcome;
use durability_time::Clock;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub(crate) mod connect;
pub(crate) mod fetch;

#[cfg(test)]
pub(crate) use connect::classify_connect;

use super::{
    ALARM_PATH, AlarmRequest, ConnectInvoke, ConnectReply, Endpoint, FetchInvoke, INVOKE_PATH,
    InternalToken, InvokeRequest, MAX_RESPONSE_BYTES, OwnerHeaders, Reply, RouteFence,
    TRUSTED_OWNERSHIP_CODES, Transport, names, parse_envelope, parse_success,
};

pub(crate) const JSON: &str = "application/json";

/// The default time an invoke may take, from sending to the last byte of
/// the response (an expired invoke's outcome is unknown).
pub const DEFAULT_INVOKE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a connection attempt may take by default before the request
/// counts as never sent (a peer host that does not answer its SYN).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The hyper client transport (HTTP/1.1, pooled connections).
///
/// A connection attempt that does not complete within the connect timeout
/// ([`DEFAULT_CONNECT_TIMEOUT`], at most the invoke timeout) is
/// [`Reply::NotSent`]: nothing was written, so routers and the failover
/// client may try elsewhere at once. Only after the connection exists does
/// the invoke timeout make an outcome unknown.
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
    /// A transport whose invokes take at most `timeout` each, connecting
    /// within [`DEFAULT_CONNECT_TIMEOUT`] (or `timeout`, when shorter).
    pub fn new(timeout: Duration) -> Self {
        Self::with_connect_timeout(timeout, DEFAULT_CONNECT_TIMEOUT)
    }

    /// A transport whose invokes take at most `timeout` each and whose
    /// connection attempts give up after `connect` (capped at `timeout`)
    /// as not sent.
    pub fn with_connect_timeout(timeout: Duration, connect: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.enforce_http(true);
        connector.set_connect_timeout(Some(connect.min(timeout)));
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
        let built = invoke_body(request)
            .map_err(|e| e.to_string())
            .and_then(|body| {
                internal_post(
                    endpoint,
                    INVOKE_PATH,
                    token,
                    request.fence.as_ref(),
                    JSON,
                    Bytes::from(body),
                )
                .map_err(|e| e.to_string())
            });
        let http_request = match built {
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
            Err(failure) => return failure.into(),
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
/// token, the task's context request id and, when given, the route fence.
pub(crate) fn internal_request(
    method: http::Method,
    endpoint: &Endpoint,
    path: &str,
    token: &InternalToken,
    fence: Option<&RouteFence>,
) -> http::request::Builder {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(format!(
            "http://{}:{}{path}",
            endpoint.host(),
            endpoint.port()
        ))
        .header(names::AUTH, token.header_value());
    // The sanitized context id, never a tenant's header (see
    // [`super::RequestId`]).
    if let Some(id) = super::RequestId::current() {
        builder = builder.header(names::CONTEXT_ID, id.as_str());
    }
    if let Some(fence) = fence {
        builder = builder
            .header(names::ROUTE_TASK, fence.task.as_str())
            .header(names::ROUTE_GENERATION, fence.generation);
    }
    builder
}

/// A `POST` of `body` (of `content_type`) to an internal `path` of
/// `endpoint`, with the token and, when given, the route fence.
pub(crate) fn internal_post(
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
pub(crate) enum SendFailure {
    /// The connection could not be made: the peer never saw the request.
    NotSent(String),
    /// It failed or timed out after it may have been sent.
    AfterSending(String),
}

/// A send that failed before its response: nothing ran, or it may have.
impl<T> From<SendFailure> for Reply<T> {
    fn from(failure: SendFailure) -> Self {
        match failure {
            SendFailure::NotSent(reason) => Reply::NotSent { reason },
            SendFailure::AfterSending(reason) => Reply::Unmarked { reason },
        }
    }
}

/// An alarm delivery that failed before its response: never started, or
/// its outcome is unknown.
impl From<SendFailure> for DispatchOutcome {
    fn from(failure: SendFailure) -> Self {
        match failure {
            SendFailure::NotSent(reason) => DispatchOutcome::NeverStarted { reason },
            SendFailure::AfterSending(reason) => DispatchOutcome::Unknown { reason },
        }
    }
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
            Err(failure) => return failure.into(),
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

/// `{ class, name, method, args }`, the arguments encoded straight into
/// the body (once per send; nothing else keeps an encoding).
pub(crate) fn invoke_body(request: &InvokeRequest) -> serde_json::Result<Vec<u8>> {
    #[derive(serde::Serialize)]
    struct Body<'a> {
        class: &'a str,
        name: &'a str,
        method: &'a str,
        args: &'a Value,
    }
    serde_json::to_vec(&Body {
        class: &request.class,
        name: &request.name,
        method: &request.method,
        args: request.args.value(),
    })
}

pub(crate) fn content_length(headers: &HeaderMap) -> Option<u64> {
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
    // A body of one data frame (the usual small envelope) is kept as it
    // came, without a copy; a second frame starts the buffer.
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the body failed: {e}"))?;
        if let Ok(data) = frame.into_data() {
            if len + data.len() > cap {
                return Err(format!("the body crossed the {cap}-byte cap"));
            }
            len += data.len();
            match first.take() {
                None if buf.is_empty() => first = Some(data),
                None => buf.extend_from_slice(&data),
                Some(head) => {
                    buf.extend_from_slice(&head);
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
    Ok(first.unwrap_or_else(|| buf.freeze()))
}

pub(crate) fn parse_json(body: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("the body is not UTF-8: {e}"))?;
    serde_json::from_str::<Value>(text).map_err(|e| format!("the body is not JSON: {e}"))
}

/// The reply a caller makes of an invoke's response (see [`Reply`]).
#[cfg(test)]
pub(crate) fn classify(status: u16, headers: &HeaderMap, body: Result<Bytes, String>) -> Reply {
    classify_with(status, headers, body, invoke_success)
}

/// Reads an invoke's success body: `{ "ok": true, "result": … }`.
pub(crate) fn invoke_success(body: Bytes) -> Result<Value, String> {
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
        .get(names::OWNERSHIP_ERROR)
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

pub(crate) fn owner_headers(headers: &HeaderMap) -> Option<OwnerHeaders> {
    let get = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let task = get(names::OWNER_TASK)?;
    let generation = parse_generation(get(names::OWNER_GENERATION)?)?;
    let key = get(names::OWNER_KEY)?;
    Some(OwnerHeaders {
        task: task.to_owned(),
        generation,
        key: key.to_owned(),
        endpoint: get(names::OWNER_ENDPOINT).map(str::to_owned),
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
