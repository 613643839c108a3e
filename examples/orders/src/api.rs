//! Every method as a type: its arguments are the value, and its
//! [`durability_host::Method`] impl names its class, result and error, so a
//! call of the wrong class or expecting the wrong result does not compile.
//! The host carries them as JSON; [`http()`] is the HTTP face of the same
//! types.

use std::future::Future;

use bytes::Bytes;
use durability_host::fetch::{FetchRequest, FetchResponse};
use durability_host::{AppError, BoxError, Method};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::limits::{LimitsCoordinator, LimitsMember};
use crate::order::Order;
use crate::payment::Payment;

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

/// A method's own refusal (`invalid_order`, `order_expired`, …): the same
/// `HostError::Method` whether the call ran here or on another host, and
/// decoded back as itself by a typed call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// The stable code.
    pub code: String,
    /// What was refused and why.
    pub message: String,
}

impl AppError for Refusal {
    fn code(&self) -> &str {
        &self.code
    }
}

/// A refusal as a handler's error.
pub fn refuse(code: &str, message: impl Into<String>) -> BoxError {
    Box::new(Refusal {
        code: code.to_owned(),
        message: message.into(),
    })
}

/// `Order.get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetOrder {}

/// `Payment.get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetPayment {}

/// `LimitsCoordinator.pending`: deliveries not yet acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pending {}

/// `LimitsMember.applied`: the limits the member applied, per group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Applied {}

/// Declares `$args` a method of `$class` named `$name` returning `$out`.
macro_rules! methods {
    ($($args:ty => $class:ty, $name:literal, $out:ty;)*) => {$(
        impl Method for $args {
            type Class = $class;
            const NAME: &'static str = $name;
            type Out = $out;
            type Error = Refusal;
        }
    )*};
}

methods! {
    PlaceOrder => Order, "place", Placed;
    PayOrder => Order, "pay", OrderView;
    GetOrder => Order, "get", Option<OrderView>;
    Capture => Payment, "capture", PaymentView;
    GetPayment => Payment, "get", Option<PaymentView>;
    SetLimits => LimitsCoordinator, "set_limits", LimitsSet;
    Pending => LimitsCoordinator, "pending", u64;
    ApplyLimits => LimitsMember, "apply_limits", AppliedLimits;
    Applied => LimitsMember, "applied", Vec<AppliedLimits>;
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
        Err(e) => match e.downcast_ref::<Refusal>() {
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

    #[test]
    fn arguments_decode_strictly() {
        let ok: PlaceOrder = serde_json::from_value(serde_json::json!({ "cents": 5 })).unwrap();
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
            assert!(
                serde_json::from_value::<PlaceOrder>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_refusal_carries_its_code_and_message_through_its_encoding() {
        let e = refuse("order_expired", "the order expired");
        let r = e.downcast_ref::<Refusal>().unwrap();
        assert_eq!(AppError::code(r), "order_expired");
        assert_eq!(r.to_string(), "the order expired");
        let back: Refusal = serde_json::from_value(serde_json::to_value(r).unwrap()).unwrap();
        assert_eq!(&back, r);
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
