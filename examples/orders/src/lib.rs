//! An orders service on `durability-host`, deployed as several host
//! processes over one PostgreSQL database (objects, leases and alarm jobs;
//! no directory shared between hosts).
//!
//! - [`order::Order`] (one object per order): `place`, `pay`, `get`; an
//!   expiry alarm per order expires it if unpaid; every change stages an
//!   event on the `order-events` outbox in the same transaction, delivered
//!   at least once to a webhook ([`webhook::WebhookSink`]).
//! - [`payment::Payment`] (one object per payment): `capture` pays an order
//!   wherever it is owned and records the outcome, at most once.
//! - [`limits::LimitsCoordinator`] and [`limits::LimitsMember`]: seed 000's
//!   coordinator example, a state channel delivering limits to members by
//!   name, members applying only newer versions.
//! - [`router`]: the app's HTTP routes, the host's public edge among them,
//!   so a tenant reaches any object through any host.
//!
//! Methods are the typed methods of [`api`] (`durability_host::Method`):
//! each names its class, result and error; [`api::http`] is their HTTP
//! face.
//! `src/main.rs` is one host process; `tests/three_hosts.rs` runs three
//! and kills one.

pub mod api;
pub mod limits;
pub mod order;
pub mod payment;
pub mod webhook;

use std::sync::{Arc, OnceLock};

use durability_host::fetch::{FetchRequest, FetchResponse};
use durability_host::store::postgres::{PostgresAlarmIndex, PostgresLeaseStore};
use durability_host::{BoxError, Handle, Host, HostConfig, HostError, PostgresObjectStore};

use crate::api::{
    Applied, ApplyLimits, Capture, GetOrder, GetPayment, NoArgs, PayOrder, Pending, PlaceOrder,
    SetLimits, error_response, http, refuse,
};
use crate::limits::{COORDINATOR, LimitsCoordinator, LimitsMember, MEMBER};
use crate::order::{Db, ORDER, Order};
use crate::payment::{PAYMENT, Payment};
use crate::webhook::WebhookSink;

/// A host of this service.
pub type OrdersHost = Host<PostgresLeaseStore, PostgresAlarmIndex, PostgresObjectStore>;
/// Its configuration.
pub type OrdersConfig = HostConfig<PostgresLeaseStore, PostgresAlarmIndex, PostgresObjectStore>;
/// The host, once started: what objects that call other objects use (it
/// holds a clone of the host, so the host lives as long as the process).
pub type HostSlot = Arc<OnceLock<OrdersHost>>;

type H<T> = Handle<T, PostgresAlarmIndex, Db>;

/// What the service's classes need besides the host.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Where order events are `POST`ed.
    pub webhook_url: String,
    /// How long an order stays unpaid before it expires, by default.
    pub order_ttl_ms: i64,
}

/// Adds the service's classes, their methods and fetch handlers to
/// `config`. Objects that call other objects do it through the host in
/// `slot`, set once it started.
pub fn classes(config: OrdersConfig, service: &ServiceConfig, slot: &HostSlot) -> OrdersConfig {
    let sink = WebhookSink::new(&service.webhook_url);
    let ttl = service.order_ttl_ms;
    let (pay_host, coord_host) = (Arc::clone(slot), Arc::clone(slot));
    config
        .class(ORDER, move |ctx| Order::open(ctx, sink.clone(), ttl))
        .rpc(|h: H<Order>, a: PlaceOrder| async move { h.object.place(&a) })
        .rpc(|h: H<Order>, a: PayOrder| async move { h.object.pay(&a) })
        .rpc(|h: H<Order>, _: GetOrder| async move { h.object.get() })
        .fetch(ORDER, order_http)
        .class(PAYMENT, move |ctx| {
            Payment::open(ctx, Arc::clone(&pay_host))
        })
        .rpc(|h: H<Payment>, a: Capture| async move { h.object.capture(a).await })
        .rpc(|h: H<Payment>, _: GetPayment| async move { h.object.get() })
        .fetch(PAYMENT, payment_http)
        .class(COORDINATOR, move |ctx| {
            LimitsCoordinator::open(ctx, Arc::clone(&coord_host))
        })
        .rpc(|h: H<LimitsCoordinator>, a: SetLimits| async move { h.object.set_limits(a).await })
        .rpc(|h: H<LimitsCoordinator>, _: Pending| async move { h.object.pending() })
        .fetch(COORDINATOR, coordinator_http)
        .class(MEMBER, LimitsMember::open)
        .rpc(|h: H<LimitsMember>, a: ApplyLimits| async move { h.object.apply(&a) })
        .rpc(|h: H<LimitsMember>, _: Applied| async move { h.object.applied() })
        .fetch(MEMBER, member_http)
}

/// The service's HTTP routes: `GET /healthz` and the public edge
/// (`/orders/{id}`, `/orders/{id}/pay`, `/payments/{id}`, `/limits/{name}`,
/// `/members/{name}`), each request reaching its object through this
/// host's router wherever the object is owned.
///
/// # Errors
/// A route the edge refuses (never for these).
pub fn router(host: &OrdersHost) -> Result<axum::Router, HostError> {
    let edge = host
        .edge()
        .route("/orders/{name}", ORDER)
        .route("/orders/{name}/{*rest}", ORDER)
        .route("/payments/{name}", PAYMENT)
        .route("/limits/{name}", COORDINATOR)
        .route("/members/{name}", MEMBER)
        .into_router()?;
    Ok(axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .merge(edge))
}

fn not_allowed(request: &FetchRequest) -> Result<FetchResponse, BoxError> {
    Ok(error_response(
        405,
        "method_not_allowed",
        &format!("{} {} is not a route", request.method, api::path(request)),
    ))
}

/// `GET /orders/{id}`, `PUT|POST /orders/{id}` (place), `POST
/// /orders/{id}/pay`.
async fn order_http(h: H<Order>, request: FetchRequest) -> Result<FetchResponse, BoxError> {
    // `/orders/{id}` or `/orders/{id}/pay` (the id is one path segment).
    let rest = api::path(&request).splitn(4, '/').nth(3).map(str::to_owned);
    let o = &h.object;
    match (request.method.as_str(), rest.as_deref()) {
        ("GET", None) => {
            http(&request, |_: NoArgs| async {
                o.get()?
                    .ok_or_else(|| refuse("order_not_found", "no such order"))
            })
            .await
        }
        ("PUT" | "POST", None) => http(&request, |a: PlaceOrder| async move { o.place(&a) }).await,
        ("POST", Some("pay")) => http(&request, |a: PayOrder| async move { o.pay(&a) }).await,
        _ => not_allowed(&request),
    }
}

/// `POST /payments/{id}` (capture), `GET /payments/{id}`.
async fn payment_http(h: H<Payment>, request: FetchRequest) -> Result<FetchResponse, BoxError> {
    let p = &h.object;
    match request.method.as_str() {
        "POST" => http(&request, |a: Capture| p.capture(a)).await,
        "GET" => {
            http(&request, |_: NoArgs| async {
                p.get()?
                    .ok_or_else(|| refuse("not_found", "no such payment"))
            })
            .await
        }
        _ => not_allowed(&request),
    }
}

/// `PUT /limits/{name}` (set a group's members and limits), `GET
/// /limits/{name}` (deliveries pending).
async fn coordinator_http(
    h: H<LimitsCoordinator>,
    request: FetchRequest,
) -> Result<FetchResponse, BoxError> {
    let c = &h.object;
    match request.method.as_str() {
        "PUT" => http(&request, |a: SetLimits| c.set_limits(a)).await,
        "GET" => http(&request, |_: NoArgs| async { c.pending() }).await,
        _ => not_allowed(&request),
    }
}

/// `GET /members/{name}`: the limits the member applied.
async fn member_http(h: H<LimitsMember>, request: FetchRequest) -> Result<FetchResponse, BoxError> {
    match request.method.as_str() {
        "GET" => http(&request, |_: NoArgs| async { h.object.applied() }).await,
        _ => not_allowed(&request),
    }
}
