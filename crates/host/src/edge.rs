//! The public edge: an [`axum::Router`] a user mounts in their own app that
//! routes tenant HTTP requests to objects by name, through the host's one
//! router (the path of `host.object_by_name(class, name).fetch(request)`:
//! forwarded once to the owner, owner hints, fences and the fetch replay
//! rules are the router's, see [`crate::ObjectRef::fetch`]).
//!
//! ```no_run
//! # async fn mount(host: durability_host::Host<
//! #     durability_storage_sqlite::ownership::SqliteLeaseStore<durability_ownership::SystemClock>,
//! #     durability_storage_sqlite::alarms::SqliteAlarmIndex>) -> Result<(), durability_host::BoxError> {
//! let app = axum::Router::new()
//!     .route("/healthz", axum::routing::get(|| async { "ok" })) // the user's own routes
//!     .merge(
//!         host.edge()
//!             .route("/orders/{name}", "Orders")
//!             .route("/orders/{name}/{*rest}", "Orders")
//!             .route_with("/by-header", |parts| {
//!                 let name = parts.headers.get("x-cart")?.to_str().ok()?;
//!                 Some(("Cart".to_owned(), name.to_owned()))
//!             })
//!             .into_router()?,
//!     );
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! What a request goes through, in order; a refusal is answered at once
//! with the host's JSON error shape (`{ "error": code, "message": … }`)
//! and nothing is dispatched:
//!
//! 1. The URL (path and query) is at most [`crate::fetch::MAX_URL_BYTES`]:
//!    else `414 request_too_large`.
//! 2. At most [`crate::fetch::MAX_HEADERS`] header entries and
//!    [`crate::fetch::MAX_HEADER_BYTES`] of names and values combined
//!    (every header the tenant sent counts): else `431 request_too_large`;
//!    a value that is not visible ASCII/UTF-8 text is `400 invalid_request`.
//! 3. The route gives the class and object name: a declarative route
//!    ([`Edge::route`]) takes the name from its `{name}` path parameter;
//!    a custom one ([`Edge::route_with`]) from a closure over the request
//!    head (`None` is `404 not_found`). An unknown class is
//!    `404 unknown_class`, an invalid name `400 invalid_object_name`.
//! 4. A `Content-Length` above [`crate::fetch::MAX_BODY_BYTES`] is refused
//!    before reading, and a streamed body is cut as it crosses that cap:
//!    `413 request_too_large`.
//! 5. Hop-by-hop headers (`connection`, `keep-alive`, `proxy-connection`,
//!    `te`, `trailer`, `transfer-encoding`, `upgrade`,
//!    `proxy-authenticate`, `proxy-authorization`, and every header the
//!    `connection` header names) and the host's control headers
//!    ([`crate::transport::CONTROL_HEADER_PREFIX`], `x-durability-`: the
//!    internal token, route fence, owner and ownership-error markers) are
//!    stripped, so a tenant cannot inject them. The rest becomes a
//!    [`crate::fetch::FetchRequest`] (method, the path and query as the
//!    URL, headers, body), checked again by
//!    [`crate::fetch::FetchRequest::validate`].
//! 6. The object's fetch handler answers, wherever the object is owned.
//!    Its response has hop-by-hop, `content-length` (recomputed) and
//!    control headers stripped, so owner task, endpoint and generation
//!    never cross the tenant boundary. A routing error is answered with
//!    the code and message it has on the wire ([`crate::HostError::wire`]:
//!    `503 owner_unavailable`, `502 do_rpc_result_unknown`, a handler's
//!    [`crate::MethodError`] as `422`, ...), never with task ids,
//!    endpoints or transport text, and never with the ownership marker.
//!
//! The edge adds no authentication, rate limits or CORS: layer those on
//! the returned router as on any axum router.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts as _, Path, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt as _;

use crate::bounds::{HostAlarms, HostLeases};
use crate::error::HostError;
use crate::fetch::{
    FetchRequest, FetchResponse, MAX_BODY_BYTES, MAX_HEADER_BYTES, MAX_HEADERS, MAX_URL_BYTES,
    is_control_header,
};
use crate::host::Host;
use crate::store::ObjectStore;
use crate::wire::{error_response, host_error_response};

/// The hop-by-hop headers (RFC 9110 §7.6.1, plus the legacy
/// `keep-alive` / `proxy-connection`): never forwarded in either
/// direction.
pub const HOP_BY_HOP_HEADERS: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
];

/// The path parameter a declarative route takes the object name from.
pub const NAME_PARAM: &str = "name";

/// A custom mapping from a request head to (class, object name).
type Resolve = Arc<dyn Fn(&Parts) -> Option<(String, String)> + Send + Sync>;

/// Where a route's requests go.
#[derive(Clone)]
enum Target {
    /// This class; the name is the `{name}` path parameter.
    Class(String),
    /// A closure's answer.
    Custom(Resolve),
}

/// A builder of the public edge of a host ([`Host::edge`]): routes from
/// tenant paths to object classes; [`Edge::into_router`] makes the
/// [`axum::Router`] to mount (module docs: the limits and stripping).
pub struct Edge<S, I, O: ObjectStore = crate::store::DefaultObjectStore> {
    host: Host<S, I, O>,
    routes: Vec<(String, Target)>,
}

impl<S, I, O: ObjectStore> std::fmt::Debug for Edge<S, I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let routes: Vec<&str> = self.routes.iter().map(|(p, _)| p.as_str()).collect();
        f.debug_struct("Edge")
            .field("routes", &routes)
            .finish_non_exhaustive()
    }
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> Host<S, I, O> {
    /// The public edge of this host, with no routes yet ([`Edge`]).
    pub fn edge(&self) -> Edge<S, I, O> {
        Edge::new(self.clone())
    }
}

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> Edge<S, I, O> {
    /// An edge of `host` with no routes.
    pub fn new(host: Host<S, I, O>) -> Self {
        Self {
            host,
            routes: Vec::new(),
        }
    }

    /// Routes requests whose path matches `path` (axum syntax, e.g.
    /// `/orders/{name}` or `/orders/{name}/{*rest}`) to the object of
    /// `class` named by the `{name}` parameter (percent-decoded). Any
    /// method is routed: the object's fetch handler sees it.
    #[must_use]
    pub fn route(mut self, path: &str, class: &str) -> Self {
        self.routes
            .push((path.to_owned(), Target::Class(class.to_owned())));
        self
    }

    /// Routes requests whose path matches `path` to the object `resolve`
    /// names from the request head: `Some((class, name))`, or `None` for
    /// `404 not_found`.
    #[must_use]
    pub fn route_with<F>(mut self, path: &str, resolve: F) -> Self
    where
        F: Fn(&Parts) -> Option<(String, String)> + Send + Sync + 'static,
    {
        self.routes
            .push((path.to_owned(), Target::Custom(Arc::new(resolve))));
        self
    }

    /// The router to mount (merge or nest it into the app's own router;
    /// it needs no state of its own).
    ///
    /// # Errors
    /// [`HostError::InvalidSetting`] (`edge_route`) for a path that does
    /// not start with `/`, a path given twice, or a declarative route
    /// whose path has no `{name}` parameter.
    pub fn into_router<St>(self) -> Result<Router<St>, HostError>
    where
        St: Clone + Send + Sync + 'static,
    {
        let mut seen = BTreeSet::new();
        let mut router = Router::new();
        let host = Arc::new(self.host);
        for (path, target) in self.routes {
            check_path(&path, &target)?;
            if !seen.insert(path.clone()) {
                return Err(HostError::setting(
                    "edge_route",
                    format!("the path {path} is routed twice"),
                ));
            }
            let host = Arc::clone(&host);
            let handler = move |request: Request| {
                let host = Arc::clone(&host);
                let target = target.clone();
                async move { serve(&host, &target, request).await }
            };
            router = router.route(&path, axum::routing::any(handler));
        }
        Ok(router)
    }
}

/// A route's path is usable.
fn check_path(path: &str, target: &Target) -> Result<(), HostError> {
    if !path.starts_with('/') {
        return Err(HostError::setting(
            "edge_route",
            format!("the path {path} does not start with /"),
        ));
    }
    let named = path
        .split('/')
        .any(|segment| segment == format!("{{{NAME_PARAM}}}"));
    if matches!(target, Target::Class(_)) && !named {
        return Err(HostError::setting(
            "edge_route",
            format!("the path {path} has no {{{NAME_PARAM}}} segment"),
        ));
    }
    Ok(())
}

/// One tenant request, through the steps of the module docs.
async fn serve<S: HostLeases, I: HostAlarms, O: ObjectStore>(
    host: &Host<S, I, O>,
    target: &Target,
    request: Request,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let head = match check_head(&parts) {
        Ok(head) => head,
        Err(refused) => return *refused,
    };
    let Some((class, name)) = address(&mut parts, target).await else {
        return refusal(404, "not_found", "no object route matches the request");
    };
    if let Err(e) = host.scope_for(&class, &name) {
        return error(&e);
    }
    let body = match read_body(&parts.headers, body).await {
        Ok(body) => body,
        Err(refused) => return *refused,
    };
    let request = FetchRequest {
        method: parts.method.as_str().to_owned(),
        url: head.url,
        headers: head.headers,
        body,
    };
    match host.object_by_name(&class, &name).fetch(request).await {
        Ok(response) => respond(response),
        Err(e) => error(&e),
    }
}

/// What the head of a request carries on: its URL and forwarded headers.
struct Head {
    url: String,
    headers: Vec<(String, String)>,
}

/// Steps 1, 2 and 5: the URL and header limits, then the stripping.
fn check_head(parts: &Parts) -> Result<Head, Box<Response>> {
    let too_large = |status, reason| Box::new(too_large(status, reason));
    let error = |e: &HostError| Box::new(error(e));
    let url = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
    if url.len() > MAX_URL_BYTES {
        return Err(too_large(
            414,
            format!("the URL is {} bytes, more than {MAX_URL_BYTES}", url.len()),
        ));
    }
    let count = parts.headers.len();
    if count > MAX_HEADERS {
        return Err(too_large(
            431,
            format!("{count} header entries, more than {MAX_HEADERS}"),
        ));
    }
    let bytes: usize = parts
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if bytes > MAX_HEADER_BYTES {
        return Err(too_large(
            431,
            format!("header names and values are {bytes} bytes, more than {MAX_HEADER_BYTES}"),
        ));
    }
    let hop = hop_by_hop(&parts.headers);
    let mut headers = Vec::with_capacity(count);
    for (name, value) in &parts.headers {
        if hop.contains(name.as_str()) || is_control_header(name.as_str()) {
            continue;
        }
        let Ok(value) = std::str::from_utf8(value.as_bytes()) else {
            return Err(error(&HostError::InvalidRequest {
                reason: format!("the value of header {name} is not UTF-8"),
            }));
        };
        headers.push((name.as_str().to_owned(), value.to_owned()));
    }
    Ok(Head { url, headers })
}

/// The hop-by-hop headers of a message: the fixed list and every name its
/// `connection` headers list.
fn hop_by_hop(headers: &HeaderMap) -> BTreeSet<String> {
    let mut hop: BTreeSet<String> = HOP_BY_HOP_HEADERS.iter().map(|h| (*h).to_owned()).collect();
    for value in headers.get_all(http::header::CONNECTION) {
        if let Ok(value) = value.to_str() {
            hop.extend(
                value
                    .split(',')
                    .map(|name| name.trim().to_ascii_lowercase())
                    .filter(|name| !name.is_empty()),
            );
        }
    }
    hop
}

/// Step 3: the class and object name of a request.
async fn address(parts: &mut Parts, target: &Target) -> Option<(String, String)> {
    match target {
        Target::Custom(resolve) => resolve(parts),
        Target::Class(class) => {
            let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, &())
                .await
                .ok()?;
            let name = params.get(NAME_PARAM)?.clone();
            Some((class.clone(), name))
        }
    }
}

/// Step 4: the body, under the cap.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<bytes::Bytes, Box<Response>> {
    let too_large = |status, reason| Box::new(too_large(status, reason));
    let error = |e: &HostError| Box::new(error(e));
    let announced = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = announced
        && len > MAX_BODY_BYTES as u64
    {
        return Err(too_large(
            413,
            format!("the body is {len} bytes, more than {MAX_BODY_BYTES}"),
        ));
    }
    match http_body_util::Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(
            413,
            format!("the body is more than {MAX_BODY_BYTES} bytes"),
        )),
        Err(e) => Err(error(&HostError::InvalidRequest {
            reason: format!("the body could not be read: {e}"),
        })),
    }
}

/// Step 6: the handler's response, stripped, as an HTTP response.
fn respond(response: FetchResponse) -> Response {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut out = Response::new(Body::from(response.body));
    *out.status_mut() = status;
    let mut announced = HeaderMap::new();
    for (name, value) in &response.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            announced.append(name, value);
        }
    }
    let hop = hop_by_hop(&announced);
    for (name, value) in &announced {
        let name_str = name.as_str();
        if hop.contains(name_str) || is_control_header(name_str) || name_str == "content-length" {
            continue;
        }
        out.headers_mut().append(name.clone(), value.clone());
    }
    out
}

/// An error as the tenant sees it: the wire's code, message and details,
/// never the ownership marker.
fn error(e: &HostError) -> Response {
    host_error_response(e, false)
}

/// A size refusal with its own status (413, 414 or 431).
fn too_large(status: u16, reason: String) -> Response {
    let wire = HostError::RequestTooLarge { reason }.wire();
    error_response(status, &wire.code, &wire.message, false)
}

/// A refusal that is no host error.
fn refusal(status: u16, code: &str, message: &str) -> Response {
    error_response(status, code, message, false)
}
