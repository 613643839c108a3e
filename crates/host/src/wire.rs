//! The wire: the internal HTTP/1.1 endpoints a host serves to other
//! hosts and clients ([`serve`]): invoke, fetch, connect, alarm, probe,
//! health and metrics, each checking the internal token and the route
//! fence before the host admits anything.

use crate::bounds::{HostAlarms, HostLeases};
use crate::error::HostError;
use crate::host::Host;
use crate::protocol::http1::*;
use crate::protocol::{
    ALARM_PATH, AlarmRequest, CONNECT_PATH, FETCH_PATH, HEALTH_PATH, INVOKE_PATH, InvokeRequest,
    MAX_INVOKE_BODY_BYTES, METRICS_PATH, OwnerHeaders, PROBE_PATH, READY_PATH, RouteFence,
    envelope, hop_id, names, strip_request_id,
};
use crate::rpc::RpcArgs;
use crate::store::ObjectStore;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use durability_alarms::{
    AlarmIndex, Delivery, ObjectId, Token, encode_dispatch_outcome, validate_time,
};
use durability_ownership::{LeaseStore, LifecycleAdmin};
use serde_json::Value;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

mod connect;
mod fetch;

/// Serves `host`'s internal endpoints on `listener` until `stop` is
/// cancelled.
///
/// # Errors
/// [`HostError::Transport`] when the server fails.
pub async fn serve<S: HostLeases, I: HostAlarms, O: ObjectStore>(
    host: Host<S, I, O>,
    listener: tokio::net::TcpListener,
    stop: CancellationToken,
) -> Result<(), HostError> {
    let app = Router::new()
        .route(INVOKE_PATH, post(invoke::<S, I, O>))
        .route(ALARM_PATH, post(alarm::<S, I, O>))
        .route(FETCH_PATH, post(fetch::fetch_endpoint::<S, I, O>))
        .route(CONNECT_PATH, get(connect::connect_endpoint::<S, I, O>))
        .route(PROBE_PATH, get(probe::<S, I, O>))
        .route(HEALTH_PATH, get(|| async { "ok" }))
        .route(READY_PATH, get(ready::<S, I, O>))
        .route(METRICS_PATH, get(metrics::<S, I, O>))
        .with_state(Arc::new(host));
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .map_err(|e| HostError::Transport {
            reason: format!("the server failed: {e}"),
        })
}

/// `GET /ready`: `200 ready` while the host runs, `503` with its state
/// (`draining`, `stopped`) from the drain's start.
async fn ready<S: HostLeases, I: HostAlarms, O: ObjectStore>(
    State(host): State<Arc<Host<S, I, O>>>,
) -> Response {
    if host.is_ready() {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, host.probe().state).into_response()
    }
}

pub(crate) fn error_response(status: u16, code: &str, message: &str, marked: bool) -> Response {
    envelope_response(status, code, message, None, marked)
}

/// A host error as its envelope (with its details and, when `marked`
/// allows and the error carries it, the ownership marker).
pub(crate) fn host_error_response(e: &HostError, marked: bool) -> Response {
    let wire = e.wire();
    envelope_response(
        wire.status,
        &wire.code,
        &wire.message,
        wire.details,
        marked && wire.marked,
    )
}

fn envelope_response(
    status: u16,
    code: &str,
    message: &str,
    details: Option<Value>,
    marked: bool,
) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(envelope(code, message, details))).into_response();
    if marked && let Ok(v) = HeaderValue::from_str(code) {
        response.headers_mut().insert(names::OWNERSHIP_ERROR, v);
    }
    response
}

/// `None` when authorized, else the refusal.
pub(crate) fn refused<S, I, O: ObjectStore>(
    host: &Host<S, I, O>,
    headers: &HeaderMap,
) -> Option<Response>
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
    match headers.get(names::AUTH) {
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
pub(crate) async fn admitted_body<S, I, O: ObjectStore>(
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
pub(crate) struct WireInvoke {
    class: String,
    name: String,
    method: String,
    args: Value,
}

pub(crate) fn fence_of(headers: &HeaderMap) -> Result<Option<RouteFence>, &'static str> {
    let task = headers.get(names::ROUTE_TASK);
    let generation = headers.get(names::ROUTE_GENERATION);
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

pub(crate) async fn invoke<S: HostLeases, I: HostAlarms, O: ObjectStore>(
    State(host): State<Arc<Host<S, I, O>>>,
    request: axum::extract::Request,
) -> Response {
    // The request's own header map (the `HeaderMap` extractor copies it).
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
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
    let args = match RpcArgs::new(wire.args) {
        Ok(args) => args,
        Err(e) => return host_error_response(&e, true),
    };
    let served = hop_id(&headers)
        .scope(host.serve_invoke(InvokeRequest {
            class: wire.class,
            name: wire.name,
            method: wire.method,
            args,
            fence,
        }))
        .await;
    match served {
        Ok((value, owner)) => {
            let mut response = success_response(&value);
            put_owner_headers(response.headers_mut(), &owner);
            response
        }
        Err(e) => host_error_response(&e, true),
    }
}

/// `200 { "ok": true, "result": … }`, the result encoded once straight
/// into the body.
fn success_response(value: &Value) -> Response {
    let mut body = Vec::with_capacity(128);
    body.extend_from_slice(b"{\"ok\":true,\"result\":");
    if serde_json::to_writer(&mut body, value).is_err() {
        return error_response(500, "internal_error", "the result is not JSON", false);
    }
    body.push(b'}');
    let mut response = Response::new(Body::from(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Sets the owner's trusted headers on a success response (the names made
/// once, [`names`]; the generation written without a `String`).
pub(crate) fn put_owner_headers(h: &mut HeaderMap, owner: &OwnerHeaders) {
    let mut put = |name: HeaderName, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    };
    put(names::OWNER_TASK, &owner.task);
    put(names::OWNER_KEY, &owner.key);
    if let Some(e) = &owner.endpoint {
        put(names::OWNER_ENDPOINT, e);
    }
    h.insert(names::OWNER_GENERATION, HeaderValue::from(owner.generation));
}

/// The largest alarm delivery body a host reads.
pub(crate) const MAX_ALARM_BODY_BYTES: usize = 4 * 1024;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct WireAlarm {
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

pub(crate) async fn alarm<S: HostLeases, I: HostAlarms, O: ObjectStore>(
    State(host): State<Arc<Host<S, I, O>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
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
    let outcome = hop_id(&headers)
        .scope(host.serve_alarm(AlarmRequest { delivery, fence }))
        .await;
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        encode_dispatch_outcome(&outcome),
    )
        .into_response()
}

pub(crate) async fn probe<S: HostLeases, I: HostAlarms, O: ObjectStore>(
    State(host): State<Arc<Host<S, I, O>>>,
    headers: HeaderMap,
) -> Response {
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
        "ownerTtlMs": p.owner_ttl_ms,
        "renewIntervalMs": p.renew_interval_ms,
        "failoverBudgetMs": p.failover_budget_ms,
        "balance": p.balance,
    }))
    .into_response()
}

/// `GET /metrics`: the probe's figures in the Prometheus text format,
/// under the names and labels of the metrics facade (ARCHITECTURE.md's
/// metrics table; the tidy test `the_hosts_metrics_endpoint_uses_the_tables_names`
/// keeps them there), so a scrape of this endpoint and of the facade's
/// exporter read the same numbers under the same names.
pub(crate) async fn metrics<S: HostLeases, I: HostAlarms, O: ObjectStore>(
    State(host): State<Arc<Host<S, I, O>>>,
) -> Response {
    let p = host.probe();
    let task = p.task.clone();
    let mut text = String::new();
    for (name, kind, label, values) in metric_families(p) {
        text.push_str(&format!("# TYPE {name} {kind}\n"));
        for (value_label, value) in values {
            if label.is_empty() {
                text.push_str(&format!("{name}{{task=\"{task}\"}} {value}\n"));
            } else {
                text.push_str(&format!(
                    "{name}{{task=\"{task}\",{label}=\"{value_label}\"}} {value}\n"
                ));
            }
        }
    }
    text.into_response()
}

/// One metric family of `/metrics`: name, kind, its label beside `task`
/// (empty: none) and the values by label value.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    Vec<(&'static str, u64)>,
);

/// The probe's figures as the facade's metric families (names, kinds and
/// labels of ARCHITECTURE.md's metrics table).
fn metric_families(p: crate::host::HostProbe) -> [Family; 10] {
    let (r, d) = (p.routing, p.dispatch);
    // A family of one value, without a label of its own.
    let one = |name, kind, value| (name, kind, "", vec![("", value)]);
    [
        one("durability_ownership_in_flight", "gauge", p.in_flight),
        (
            "durability_host_dispatches_total",
            "counter",
            "outcome",
            vec![
                ("completed", d.completed - d.handler_failed),
                ("handler_failed", d.handler_failed),
                ("refused_draining", d.refused_draining),
                ("refused_not_owner", d.refused_not_owner),
                ("refused_ownership", d.refused_ownership),
                ("fenced", d.fenced),
                ("ownership_lost", d.ownership_lost),
            ],
        ),
        one("durability_host_cold_opens_total", "counter", d.cold),
        one("durability_host_evictions_total", "counter", d.evicted),
        (
            "durability_host_routed_total",
            "counter",
            "route",
            vec![
                ("local", r.local),
                ("forwarded", r.forwarded),
                ("direct", r.direct),
                ("handoff", r.handoffs),
                ("upgraded", r.upgrades),
            ],
        ),
        one(
            "durability_host_rediscoveries_total",
            "counter",
            r.rediscoveries,
        ),
        one(
            "durability_host_hint_evictions_total",
            "counter",
            r.hint_evictions,
        ),
        one("durability_host_invokes_served_total", "counter", r.served),
        (
            "durability_host_refusals_total",
            "counter",
            "reason",
            vec![("endpoint", r.endpoint_refusals), ("auth", r.auth_refusals)],
        ),
        (
            "durability_host_alarm_forwards_total",
            "counter",
            "side",
            vec![("sent", r.alarms_forwarded), ("served", r.alarms_served)],
        ),
    ]
}
