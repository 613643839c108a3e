//! The public edge ([`durability_host::Edge`]) mounted in a user's own
//! axum app, in front of hosts that serve their internal endpoints over
//! HTTP/1.1 on loopback ports: requests reach an object owned by another
//! host, the limits refuse with typed errors before anything is
//! dispatched, and internal and hop-by-hop headers never cross the tenant
//! boundary in either direction. Requests are written as raw HTTP/1.1, as
//! curl would send them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use durability_host::fetch::{
    FetchRequest, FetchResponse, MAX_BODY_BYTES, MAX_HEADER_BYTES, MAX_HEADERS, MAX_URL_BYTES,
};
use durability_host::transport::{EndpointPolicy, serve};
use durability_host::{CancellationToken, Handle, Host, MethodError, OwnPolicy, idempotency};
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::rpc::{TOKEN, with_methods};
use crate::support::{Counter, TestConfig, TestHost, World};

type H = Handle<Counter, SqliteAlarmIndex>;

/// One host serving its internal endpoints on a loopback port.
pub(crate) struct Node {
    pub(crate) host: TestHost,
    pub(crate) endpoint: String,
    pub(crate) stop: CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

impl Node {
    /// Stops serving and waits until the listener is closed: the endpoint
    /// refuses connections from then on (a dead entry host).
    pub(crate) async fn kill_listener(self) -> TestHost {
        self.stop.cancel();
        self.server.await.unwrap();
        self.host
    }
}

/// Starts host `task` (the `Counter` class with the RPC methods of the
/// `rpc` tests and a fetch handler that echoes what it saw and counts in
/// `dispatched`), serving on a fresh loopback port.
pub(crate) async fn node(
    world: &World,
    task: &str,
    own: OwnPolicy,
    dispatched: Arc<AtomicUsize>,
) -> Node {
    node_with(world, task, own, dispatched, |c| c).await
}

/// [`node`], its configuration passed through `extra` before it starts
/// (more methods, say).
pub(crate) async fn node_with(
    world: &World,
    task: &str,
    own: OwnPolicy,
    dispatched: Arc<AtomicUsize>,
    extra: impl FnOnce(TestConfig) -> TestConfig,
) -> Node {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let owner = task.to_owned();
    let config = with_methods(world.config(task))
        .method("Counter", "incr_once", |h: H, args: Value| async move {
            let (key, _args) = idempotency::split(args)?;
            let key =
                key.ok_or_else(|| MethodError::new("missing_key", "incr_once needs a key"))?;
            let result = h.scheduler.transaction(|tx| {
                idempotency::once(tx, "incr_once", &key, |tx| {
                    Ok(json!({ "n": h.object.incr(tx)? }))
                })
            })?;
            Ok(result)
        })
        .endpoint(&endpoint)
        .internal_token(TOKEN)
        .endpoint_policy(EndpointPolicy::loopback())
        .own(own)
        .fetch("Counter", move |h: H, request: FetchRequest| {
            let owner = owner.clone();
            let dispatched = Arc::clone(&dispatched);
            async move {
                dispatched.fetch_add(1, Ordering::SeqCst);
                let n = h.scheduler.transaction(|tx| h.object.incr(tx))?;
                let body = json!({
                    "task": owner,
                    "n": n,
                    "method": request.method,
                    "url": request.url,
                    "headers": request.headers,
                    "body_len": request.body.len(),
                });
                Ok(FetchResponse::new(201, body.to_string())
                    .header("content-type", "application/json")
                    .header("x-app-out", "yes")
                    .header("x-utf8-out", "café")
                    .header("connection", "x-secret-out")
                    .header("x-secret-out", "1")
                    .header("keep-alive", "timeout=5")
                    .header("content-length", "1"))
            }
        });
    let host = Host::start(extra(config)).await.unwrap();
    let stop = CancellationToken::new();
    let server = tokio::spawn({
        let (host, stop) = (host.clone(), stop.clone());
        async move {
            serve(host, listener, stop).await.unwrap();
        }
    });
    Node {
        host,
        endpoint,
        stop,
        server,
    }
}

/// A response as a tenant reads it.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    /// The typed error body: (code, message).
    fn error(&self) -> (String, String) {
        let v = self.json();
        (
            v["error"].as_str().unwrap().to_owned(),
            v["message"].as_str().unwrap().to_owned(),
        )
    }
}

/// Sends one raw HTTP/1.1 request (head lines, then `body`) and reads the
/// whole response (the request asks the server to close).
async fn http(
    addr: &str,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} {target} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
    {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    // A refused body may be cut off by the server's answer.
    let _ = stream.write_all(body).await;
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head: {}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_owned())
        })
        .collect();
    Answer {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

/// `GET /by-header` naming the class and the object in headers (the
/// custom route).
async fn by_header(addr: &str, class: &str, name: &str) -> Answer {
    http(
        addr,
        "GET",
        "/by-header",
        &[("x-class", class), ("x-name", name)],
        b"",
    )
    .await
}

/// The user's app: its own route and the edge of `host`, served on a
/// loopback port; returns the address.
async fn app(host: &TestHost) -> String {
    let edge = host
        .edge()
        .route("/counters/{name}", "Counter")
        .route("/counters/{name}/{*rest}", "Counter")
        .route_with("/by-header", |parts| {
            let class = parts.headers.get("x-class")?.to_str().ok()?;
            let name = parts.headers.get("x-name")?.to_str().ok()?;
            Some((class.to_owned(), name.to_owned()))
        })
        .into_router()
        .unwrap();
    let app = axum::Router::new()
        .route(
            "/hello",
            axum::routing::get(|| async { "hello from the app" }),
        )
        .merge(edge);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Host `a` owns every shard; host `b` owns none and carries the edge.
async fn two_hosts(world: &World) -> (Node, Node, Arc<AtomicUsize>) {
    let dispatched = Arc::new(AtomicUsize::new(0));
    let a = node(world, "a", OwnPolicy::AllShards, Arc::clone(&dispatched)).await;
    let b = node(world, "b", OwnPolicy::OnDemand, Arc::clone(&dispatched)).await;
    (a, b, dispatched)
}

#[tokio::test]
async fn the_edge_reaches_an_object_owned_by_another_host_next_to_the_apps_own_routes() {
    let world = World::new();
    let (a, b, dispatched) = two_hosts(&world).await;
    let addr = app(&b.host).await;

    let own = http(&addr, "GET", "/hello", &[], b"").await;
    assert_eq!(
        (own.status, own.body.as_slice()),
        (200, &b"hello from the app"[..])
    );

    for n in 1..=2 {
        let r = http(
            &addr,
            "POST",
            "/counters/c1/items?x=1",
            &[("x-app", "1")],
            b"four",
        )
        .await;
        assert_eq!(r.status, 201, "{r:?}");
        let v = r.json();
        // Ran on the owner, host a, through host b's router.
        assert_eq!(v["task"], "a");
        assert_eq!(v["n"], n);
        assert_eq!(v["method"], "POST");
        assert_eq!(v["url"], "/counters/c1/items?x=1");
        assert_eq!(v["body_len"], 4);
    }
    // The declarative route without a rest, and the custom extractor.
    let r = http(&addr, "GET", "/counters/c1", &[], b"").await;
    assert_eq!((r.status, r.json()["n"].clone()), (201, json!(3)));
    let r = by_header(&addr, "Counter", "c1").await;
    assert_eq!((r.status, r.json()["n"].clone()), (201, json!(4)));
    assert_eq!(dispatched.load(Ordering::SeqCst), 4);
    // b forwarded to a and learned a's hint.
    let hint = b.host.owner_hint("Counter", "c1").unwrap().unwrap();
    assert_eq!(hint.task.as_str(), "a");
    let _ = a;
}

#[tokio::test]
async fn internal_and_hop_by_hop_headers_never_cross_the_tenant_boundary() {
    let world = World::new();
    let (_a, b, dispatched) = two_hosts(&world).await;
    let addr = app(&b.host).await;
    let r = http(
        &addr,
        "GET",
        "/counters/c1",
        &[
            ("x-durability-internal-auth", TOKEN),
            ("x-durability-route-task", "b"),
            ("x-durability-route-generation", "1"),
            ("X-Durability-Owner-Task", "forged"),
            ("connection", "x-hop-in"),
            ("x-hop-in", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic Zm9vOmJhcg=="),
            ("x-app", "kept"),
        ],
        b"",
    )
    .await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(dispatched.load(Ordering::SeqCst), 1);
    let v = r.json();
    // The forged fence did not make b run it: it ran on the owner.
    assert_eq!(v["task"], "a");
    let seen: Vec<String> = v["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h[0].as_str().unwrap().to_owned())
        .collect();
    assert!(seen.contains(&"x-app".to_owned()), "{seen:?}");
    for gone in [
        "x-durability-internal-auth",
        "x-durability-route-task",
        "x-durability-route-generation",
        "x-durability-owner-task",
        "connection",
        "x-hop-in",
        "keep-alive",
        "te",
        "proxy-authorization",
    ] {
        assert!(
            !seen.contains(&gone.to_owned()),
            "{gone} reached the handler: {seen:?}"
        );
    }
    // Out: the handler's own header stays; hop-by-hop ones and the owner's
    // trusted headers (task, generation, key, endpoint) do not reach the
    // tenant, and the length is the real one.
    assert_eq!(r.header("x-app-out"), Some("yes"));
    // A UTF-8 value (obs-text bytes on the wire) is kept, not dropped.
    assert_eq!(r.header("x-utf8-out"), Some("café"));
    assert_eq!(r.header("x-secret-out"), None, "{:?}", r.headers);
    assert_eq!(r.header("keep-alive"), None, "{:?}", r.headers);
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    assert!(
        r.headers
            .iter()
            .all(|(k, _)| !k.starts_with("x-durability-")),
        "{:?}",
        r.headers
    );
}

#[tokio::test]
async fn limits_refuse_with_typed_errors_and_nothing_is_dispatched() {
    let world = World::new();
    let (_a, b, dispatched) = two_hosts(&world).await;
    let addr = app(&b.host).await;

    // Header bytes one past the cap: 431.
    let half = "v".repeat(MAX_HEADER_BYTES / 2);
    let r = http(
        &addr,
        "GET",
        "/counters/c1",
        &[("x-big-1", &half), ("x-big-2", &half)],
        b"",
    )
    .await;
    assert_eq!(r.status, 431, "{r:?}");
    assert_eq!(r.error().0, "request_too_large");

    // More header entries than the cap: 431 (hyper's own 100-line cap
    // under `axum::serve` answers first, with the same status).
    let many: Vec<(String, String)> = (0..=MAX_HEADERS)
        .map(|i| (format!("x-h{i}"), "1".to_owned()))
        .collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = http(&addr, "GET", "/counters/c1", &many, b"").await;
    assert_eq!(r.status, 431, "{r:?}");
    eprintln!(
        "129 headers: {:?} {:?}",
        r.headers,
        String::from_utf8_lossy(&r.body)
    );

    // An announced body one past the cap: 413, refused before reading.
    let len = (MAX_BODY_BYTES + 1).to_string();
    let r = http(
        &addr,
        "POST",
        "/counters/c1",
        &[("content-length", &len)],
        b"",
    )
    .await;
    assert_eq!(r.status, 413, "{r:?}");
    assert_eq!(r.error().0, "request_too_large");

    // A URL past the cap: 414.
    let long = format!("/counters/c1/{}", "p".repeat(MAX_URL_BYTES));
    let r = http(&addr, "GET", &long, &[], b"").await;
    assert_eq!(r.status, 414, "{r:?}");
    assert_eq!(r.error().0, "request_too_large");

    // Unknown class: 404; invalid name: 400; no route: 404.
    let r = by_header(&addr, "Nope", "c1").await;
    assert_eq!((r.status, r.error().0.as_str()), (404, "unknown_class"));
    let r = by_header(&addr, "Counter", "").await;
    assert_eq!(
        (r.status, r.error().0.as_str()),
        (400, "invalid_object_name")
    );
    let r = http(&addr, "GET", "/by-header", &[], b"").await;
    assert_eq!((r.status, r.error().0.as_str()), (404, "not_found"));

    assert_eq!(
        dispatched.load(Ordering::SeqCst),
        0,
        "a refused request was dispatched"
    );

    // Exactly at the body cap is served (through the internal hop).
    let body = vec![b'x'; MAX_BODY_BYTES];
    let r = http(&addr, "PUT", "/counters/c1", &[], &body).await;
    assert_eq!(r.status, 201, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["body_len"], MAX_BODY_BYTES);
    assert_eq!(dispatched.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn bad_routes_are_refused_when_the_router_is_made() {
    let world = World::new();
    let dispatched = Arc::new(AtomicUsize::new(0));
    let a = node(&world, "a", OwnPolicy::AllShards, dispatched).await;
    for edge in [
        // No {name} segment.
        a.host.edge().route("/counters/{id}", "Counter"),
        // Not a path.
        a.host.edge().route("counters/{name}", "Counter"),
        // Routed twice.
        a.host
            .edge()
            .route("/c/{name}", "Counter")
            .route("/c/{name}", "Counter"),
    ] {
        let e = edge.into_router::<()>().unwrap_err();
        assert_eq!(e.code(), "host_invalid_setting", "{e}");
    }
}
