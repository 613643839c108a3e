//! Every method's arguments and result as serde types, and the one place
//! they are turned into and out of JSON (the host's method API takes and
//! returns `serde_json::Value`; a typed method API replaces [`method`] and
//! [`http()`] without touching the classes).

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use durability_host::fetch::{FetchRequest, FetchResponse};
use durability_host::{BoxError, HostError, MethodError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// `Order.place`: places the order named by the object (idempotent: the
/// same amount again answers the stored order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaceOrder {
    /// The total, in cents (1..=[`crate::order::MAX_CENTS`]).
    pub cents: i64,
    /// Unpaid after this long, the order expires (default: the class's).
    #[serde(default)]
    pub ttl_ms: Option<i64>,
}

/// `Order.pay`: marks the order paid by `payment` (idempotent per payment).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayOrder {
    /// The payment id.
    pub payment: String,
    /// The amount paid, which must be the order's total.
    pub cents: i64,
}

/// No arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// An order's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// Placed, not paid yet.
    Placed,
    /// Paid.
    Paid,
    /// Not paid in time: its expiry alarm fired.
    Expired,
}

impl OrderStatus {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Placed => "placed",
            Self::Paid => "paid",
            Self::Expired => "expired",
        }
    }

    /// The stored spelling back; `None` for anything else (corrupt).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "placed" => Some(Self::Placed),
            "paid" => Some(Self::Paid),
            "expired" => Some(Self::Expired),
            _ => None,
        }
    }
}

/// An order as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderView {
    /// The order id (the object's name).
    pub order: String,
    /// The total.
    pub cents: i64,
    /// Its state.
    pub status: OrderStatus,
    /// When it expires if unpaid (Unix ms).
    pub expires_at_ms: i64,
    /// The payment that paid it.
    pub payment: Option<String>,
}

/// `Order.place`'s result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    /// Whether this call created it (`false`: it existed with this amount).
    pub created: bool,
    /// The order.
    pub order: OrderView,
}

/// `Payment.capture`: the payment named by the object pays `order`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capture {
    /// The order paid.
    pub order: String,
    /// The amount.
    pub cents: i64,
}

/// A payment as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentView {
    /// The payment id (the object's name).
    pub payment: String,
    /// The order it pays.
    pub order: String,
    /// The amount.
    pub cents: i64,
    /// `applied` (the order is paid by it) or `rejected`.
    pub status: String,
    /// Why it was rejected: the order's refusal code.
    pub reason: Option<String>,
}

/// The limits the coordinator delivers to its members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Requests per second a member admits.
    pub rps: u32,
    /// The largest order a member accepts, in cents.
    pub max_order_cents: i64,
}

/// `LimitsCoordinator.set_limits`: the group's members and their limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetLimits {
    /// The group (a tenant, say).
    pub group: String,
    /// The member objects (class `LimitsMember`) by name.
    pub members: Vec<String>,
    /// The value every member converges to.
    pub limits: Limits,
}

/// `LimitsCoordinator.set_limits`' result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsSet {
    /// The group's membership version.
    pub topology_version: u64,
}

/// `LimitsMember.apply_limits`: one delivery of the coordinator's channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyLimits {
    /// The group.
    pub group: String,
    /// The delivery's version: applied only when newer than the last.
    pub version: u64,
    /// The value.
    pub limits: Limits,
}

/// A member's applied limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedLimits {
    /// The group.
    pub group: String,
    /// The version applied.
    pub version: u64,
    /// The value applied.
    pub limits: Limits,
    /// Whether the call that answered this applied it (`false`: an older or
    /// repeated delivery, ignored).
    pub applied: bool,
}

/// A domain refusal: its code, as the caller sees it whether the call ran
/// here or on another host.
pub fn refuse(code: &str, message: impl Into<String>) -> BoxError {
    Box::new(MethodError::new(code, message))
}

/// The method's own refusal in a call's error, if that is what it is (the
/// same shape locally and forwarded: the wire's `422`).
pub fn method_error(e: &HostError) -> Option<MethodError> {
    let w = e.wire();
    (w.status == 422).then(|| MethodError::new(w.code, w.message))
}

/// Decodes a method's arguments strictly; `invalid_args` otherwise.
///
/// # Errors
/// A [`MethodError`] `invalid_args` naming the decode error.
pub fn decode<A: DeserializeOwned>(value: serde_json::Value) -> Result<A, BoxError> {
    serde_json::from_value(value).map_err(|e| refuse("invalid_args", e.to_string()))
}

/// Encodes a result.
///
/// # Errors
/// A result that does not encode (never for this crate's types).
pub fn encode<R: Serialize>(result: &R) -> Result<serde_json::Value, BoxError> {
    Ok(serde_json::to_value(result)?)
}

/// A boxed method future.
pub type MethodFuture = futures::future::BoxFuture<'static, Result<serde_json::Value, BoxError>>;

/// Wraps a typed method body as the host's JSON method: arguments decoded
/// (strictly) before the body runs, the result encoded after.
pub fn method<H, A, R, F, Fut>(
    body: F,
) -> impl Fn(H, serde_json::Value) -> MethodFuture + Send + Sync + 'static
where
    H: Send + 'static,
    A: DeserializeOwned + Send + 'static,
    R: Serialize + 'static,
    F: Fn(H, A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, BoxError>> + Send + 'static,
{
    let body = Arc::new(body);
    move |handle, args| {
        let body = Arc::clone(&body);
        Box::pin(async move {
            let args: A = decode(args)?;
            encode(&body(handle, args).await?)
        })
    }
}

/// Calls a typed method through any [`durability_host::ObjectRef`]-like
/// JSON call and decodes its result.
///
/// # Errors
/// The call's error; a result that does not decode is
/// [`HostError::Handler`].
pub async fn call<A: Serialize, R: DeserializeOwned, Fut>(
    send: impl FnOnce(serde_json::Value) -> Fut,
    args: &A,
) -> Result<R, HostError>
where
    Fut: Future<Output = Result<serde_json::Value, HostError>>,
{
    let args = serde_json::to_value(args).map_err(|e| HostError::Handler(Box::new(e)))?;
    let value = send(args).await?;
    serde_json::from_value(value).map_err(|e| HostError::Handler(Box::new(e)))
}

/// An HTTP answer with a JSON body.
pub fn json_response<R: Serialize>(status: u16, body: &R) -> FetchResponse {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"null".to_vec());
    let mut response = FetchResponse::new(status, Bytes::from(bytes));
    response
        .headers
        .push(("content-type".to_owned(), "application/json".to_owned()));
    response
}

/// The HTTP face of a method: its JSON body decoded as `A` (an empty body
/// is `{}`), the result `200` with JSON, a domain refusal `409`/`404`/`400`
/// with `{ "error": code, "message": … }`. Other errors are the host's.
///
/// # Errors
/// Whatever is not a domain refusal.
pub async fn http<A, R, Fut>(
    request: &FetchRequest,
    body: impl FnOnce(A) -> Fut,
) -> Result<FetchResponse, BoxError>
where
    A: DeserializeOwned,
    R: Serialize,
    Fut: Future<Output = Result<R, BoxError>>,
{
    let raw: &[u8] = if request.body.is_empty() {
        b"{}"
    } else {
        &request.body
    };
    let args: A = match serde_json::from_slice(raw) {
        Ok(a) => a,
        Err(e) => return Ok(error_response(400, "invalid_args", &e.to_string())),
    };
    match body(args).await {
        Ok(result) => Ok(json_response(200, &result)),
        Err(e) => match e.downcast_ref::<MethodError>() {
            Some(m) => {
                let status = match m.code.as_str() {
                    "order_not_found" | "not_found" => 404,
                    "invalid_args" | "invalid_order" | "invalid_limits" => 400,
                    _ => 409,
                };
                Ok(error_response(status, &m.code, &m.message))
            }
            None => Err(e),
        },
    }
}

/// `{ "error": code, "message": … }` with `status`.
pub fn error_response(status: u16, code: &str, message: &str) -> FetchResponse {
    json_response(
        status,
        &serde_json::json!({ "error": code, "message": message }),
    )
}

/// The request's path without its query.
pub fn path(request: &FetchRequest) -> &str {
    let url = request.url.as_str();
    let path = url.find("://").map_or(url, |i| {
        let rest = &url[i + 3..];
        rest.find('/').map_or("/", |j| &rest[j..])
    });
    path.split('?').next().unwrap_or(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn code(e: &BoxError) -> Option<&str> {
        e.downcast_ref::<MethodError>().map(|m| m.code.as_str())
    }

    #[test]
    fn arguments_decode_strictly_as_a_typed_refusal() {
        let ok: PlaceOrder = decode(serde_json::json!({ "cents": 5 })).unwrap();
        assert_eq!(
            ok,
            PlaceOrder {
                cents: 5,
                ttl_ms: None
            }
        );
        for bad in [
            serde_json::json!({ "cents": 5, "extra": 1 }),
            serde_json::json!({ "cents": "5" }),
            serde_json::json!({}),
        ] {
            let e = decode::<PlaceOrder>(bad.clone()).unwrap_err();
            assert_eq!(code(&e), Some("invalid_args"), "{bad}");
        }
    }

    #[test]
    fn a_methods_refusal_has_one_shape_local_or_forwarded() {
        let local = HostError::Handler(refuse("order_expired", "the order expired"));
        let forwarded = HostError::Remote {
            status: 422,
            code: "order_expired".to_owned(),
            message: "the order expired".to_owned(),
            details: None,
        };
        for e in [&local, &forwarded] {
            let m = method_error(e).unwrap();
            assert_eq!(
                (m.code.as_str(), m.message.as_str()),
                ("order_expired", "the order expired")
            );
        }
        let unknown = HostError::RpcResultUnknown {
            reason: "lost".to_owned(),
        };
        assert!(
            method_error(&unknown).is_none(),
            "an unknown outcome is not a refusal"
        );
    }

    #[tokio::test]
    async fn the_http_face_maps_refusals_and_bad_bodies_to_statuses() {
        let mut request = FetchRequest::new("PUT", "/orders/o1?x=1");
        assert_eq!(path(&request), "/orders/o1");
        request.body = Bytes::from_static(b"{\"cents\":");
        let r = http(&request, |_: PlaceOrder| async { Ok(1) })
            .await
            .unwrap();
        assert_eq!(r.status, 400);
        request.body = Bytes::from_static(b"{\"cents\":1}");
        let r = http(&request, |_: PlaceOrder| async {
            Err::<u8, _>(refuse("order_not_found", "none"))
        })
        .await
        .unwrap();
        assert_eq!(r.status, 404);
        let r = http(&request, |_: PlaceOrder| async {
            Err::<u8, _>(refuse("order_expired", "late"))
        })
        .await
        .unwrap();
        assert_eq!(r.status, 409);
        assert!(String::from_utf8_lossy(&r.body).contains("order_expired"));
        let r = http(&request, |a: PlaceOrder| async move { Ok(a.cents) })
            .await
            .unwrap();
        assert_eq!((r.status, r.body.as_ref()), (200, b"1".as_ref()));
        let failed = http(&request, |_: PlaceOrder| async {
            Err::<u8, BoxError>("storage down".into())
        })
        .await;
        assert!(failed.is_err(), "not a refusal: the host's error");
    }
}
