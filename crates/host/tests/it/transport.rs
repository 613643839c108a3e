//! The HTTP client's response cap against a raw server on loopback: an
//! announced oversize is refused before reading, a chunked stream is cut
//! as it crosses the cap, and exactly the cap is read.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::time::Duration;

use durability_host::RpcArgs;
use durability_host::transport::{
    EndpointPolicy, HttpTransport, InternalToken, InvokeRequest, MAX_RESPONSE_BYTES, Reply,
    Transport,
};
use serde_json::Value;

/// Serves one connection: reads the request head and body, then writes
/// `head` and streams `chunks` (each as one HTTP chunk), then holds the
/// connection open until the client goes away.
fn server(head: String, chunks: Vec<Vec<u8>>) -> (String, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = s.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
            if let Some(split) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let text = String::from_utf8_lossy(&got[..split]).to_ascii_lowercase();
                let len: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if got.len() >= split + 4 + len {
                    break;
                }
            }
            if n == 0 {
                return;
            }
        }
        if s.write_all(head.as_bytes()).is_err() {
            return;
        }
        for c in chunks {
            let framed = [
                format!("{:x}\r\n", c.len()).into_bytes(),
                c,
                b"\r\n".to_vec(),
            ]
            .concat();
            if s.write_all(&framed).is_err() {
                return;
            }
        }
        let _ = s.write_all(b"0\r\n\r\n");
        // Wait for the client to close.
        let _ = s.read(&mut buf);
    });
    (endpoint, handle)
}

/// Waits (off the runtime's threads) for the server thread to finish.
async fn joined(server: std::thread::JoinHandle<()>) {
    tokio::task::spawn_blocking(move || server.join().unwrap())
        .await
        .unwrap();
}

fn request() -> InvokeRequest {
    InvokeRequest {
        class: "Counter".to_owned(),
        name: "c1".to_owned(),
        method: "get".to_owned(),
        args: RpcArgs::new(Value::Null).unwrap(),
        fence: None,
    }
}

async fn send(endpoint: &str) -> Reply {
    let transport = HttpTransport::new(Duration::from_secs(60));
    let endpoint = EndpointPolicy::default().check(endpoint).unwrap();
    let token = InternalToken::new("transport-test-token-0123").unwrap();
    transport.invoke(&endpoint, &token, &request()).await
}

/// `{"ok":true,"result":"…"}` of exactly `len` bytes, in `parts` chunks.
fn envelope_chunks(len: usize, parts: usize) -> Vec<Vec<u8>> {
    let body = format!("{{\"ok\":true,\"result\":\"{}\"}}", "r".repeat(len - 23)).into_bytes();
    let size = body.len().div_ceil(parts);
    body.chunks(size).map(<[u8]>::to_vec).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_oversize_is_refused_before_reading() {
    // The server announces one byte past the cap and sends nothing: a
    // client that tried to buffer would wait for the body.
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        MAX_RESPONSE_BYTES + 1
    );
    let listener_head = head.clone();
    let (endpoint, server) = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 8192];
            let _ = s.read(&mut buf);
            s.write_all(listener_head.as_bytes()).unwrap();
            let _ = s.read(&mut buf);
        });
        (endpoint, handle)
    };
    let reply = send(&endpoint).await;
    match reply {
        Reply::ResultUnknown { reason } => assert!(reason.contains("Content-Length"), "{reason}"),
        other => panic!("{other:?}"),
    }
    joined(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_cut_as_it_crosses_the_cap_and_exactly_the_cap_is_read() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    let (endpoint, server_at) = server(head.to_owned(), envelope_chunks(MAX_RESPONSE_BYTES, 16));
    match send(&endpoint).await {
        Reply::Ok { result, .. } => {
            assert_eq!(result.as_str().map(str::len), Some(MAX_RESPONSE_BYTES - 23));
        }
        other => panic!("{other:?}"),
    }
    joined(server_at).await;
    let (endpoint, server_past) =
        server(head.to_owned(), envelope_chunks(MAX_RESPONSE_BYTES + 1, 16));
    match send(&endpoint).await {
        Reply::ResultUnknown { reason } => assert!(reason.contains("crossed"), "{reason}"),
        other => panic!("{other:?}"),
    }
    joined(server_past).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_not_sent() {
    // Bind and drop: nothing listens on the port, so the request never
    // left this process (unlike a failure after sending, which is unmarked).
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    match send(&format!("http://127.0.0.1:{port}")).await {
        Reply::NotSent { .. } => {}
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_that_hangs_is_not_sent_after_the_connect_timeout() {
    // A listener that never accepts, its backlog of one filled: the kernel
    // drops further SYNs, so a connection attempt hangs. Before the connect
    // timeout existed, this waited out the whole invoke timeout and came
    // back as an unknown outcome, though nothing had been sent.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut held = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            held.push(s);
        }
    }
    let transport =
        HttpTransport::with_connect_timeout(Duration::from_secs(120), Duration::from_millis(300));
    let endpoint = EndpointPolicy::default()
        .check(&format!("http://{addr}"))
        .unwrap();
    let token = InternalToken::new("transport-test-token-0123").unwrap();
    match transport.invoke(&endpoint, &token, &request()).await {
        Reply::NotSent { .. } => {}
        other => panic!("{other:?}"),
    }
    drop((held, listener));
}

// ------------------------------------------------------------ request ids

mod request_ids {
    //! Request ids across two hosts serving each other over HTTP/1.1 on
    //! loopback: a tenant's id is accepted only at the edge and only when
    //! it sanitizes; nested calls carry the context id, never the tenant's
    //! header; the host's spans carry `request_id`.

    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex, OnceLock};

    use durability_host::fetch::{FetchRequest, FetchResponse};
    use durability_host::transport::{
        EndpointPolicy, MAX_REQUEST_ID_BYTES, RequestId, StaticPeers, serve,
    };
    use durability_host::{BoxError, Handle};
    use durability_storage_sqlite::alarms::SqliteAlarmIndex;
    use serde_json::{Value, json};
    use tokio_util::sync::CancellationToken;
    use tracing::span::{Attributes, Id};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

    use crate::rpc::TOKEN;
    use crate::support::{Counter, TestHost, World};

    type H = Handle<Counter, SqliteAlarmIndex>;
    type Me = Arc<OnceLock<TestHost>>;

    /// What a fetch handler answers: `id=<context id> header=<x-request-id
    /// it saw, or ->`; `GET /nest` first fetches `/who` on object `inner`
    /// with a forged `x-request-id` and answers what that saw.
    async fn handler(me: Me, req: FetchRequest) -> Result<FetchResponse, BoxError> {
        if req.url == "/nest" {
            let host = me.get().ok_or("no host yet")?;
            let inner = host
                .object_by_name("Counter", "inner")
                .fetch(FetchRequest::new("GET", "/who").header("x-request-id", "tenant-forged"))
                .await?;
            return Ok(FetchResponse::new(200, inner.body));
        }
        let id = RequestId::current().map_or_else(|| "-".to_owned(), |id| id.to_string());
        let header = req.header_value("x-request-id").unwrap_or("-");
        Ok(FetchResponse::new(200, format!("id={id} header={header}")))
    }

    async fn start(
        w: &World,
        task: &str,
        listener: tokio::net::TcpListener,
        peers: &StaticPeers,
        ports: [u16; 2],
        stop: &CancellationToken,
    ) -> TestHost {
        let me: Me = Arc::default();
        let (fetch_me, call_me) = (Arc::clone(&me), Arc::clone(&me));
        let config = w
            .config(task)
            .endpoint(&format!("http://{}", listener.local_addr().unwrap()))
            .internal_token(TOKEN)
            .endpoint_policy(EndpointPolicy::ports(ports))
            .peers(peers.clone())
            .fetch("Counter", move |_h: H, req: FetchRequest| {
                handler(Arc::clone(&fetch_me), req)
            })
            .method("Counter", "who", |_h: H, _args: Value| async move {
                Ok(json!(RequestId::current().map(|id| id.to_string())))
            })
            .method("Counter", "nest", move |_h: H, _args: Value| {
                let me = Arc::clone(&call_me);
                async move {
                    let outer = RequestId::current().map(|id| id.to_string());
                    let host = me.get().ok_or("no host yet")?;
                    let inner = host.object_by_name("Counter", "inner");
                    let inner = inner.call("who", json!(null)).await?;
                    Ok(json!({ "outer": outer, "inner": inner }))
                }
            });
        let host = TestHost::start(config).await.unwrap();
        me.set(host.clone()).ok();
        tokio::spawn(serve(host.clone(), listener, stop.clone()));
        host
    }

    /// A span's name and its `request_id` field.
    type Seen = (String, Option<String>);

    /// Spans the host opened, by name, with their `request_id` field.
    #[derive(Clone, Default)]
    struct Spans(Arc<Mutex<Vec<Seen>>>);

    struct IdVisitor(Option<String>);

    impl tracing::field::Visit for IdVisitor {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            if field.name() == "request_id" {
                self.0 = Some(format!("{value:?}"));
            }
        }

        fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
            if field.name() == "request_id" {
                self.0 = Some(value.to_owned());
            }
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for Spans {
        fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
            let mut visitor = IdVisitor(None);
            attrs.record(&mut visitor);
            self.0
                .lock()
                .unwrap()
                .push((attrs.metadata().name().to_owned(), visitor.0));
        }
    }

    impl Spans {
        /// The request ids of the spans named `name`.
        fn ids(&self, name: &str) -> Vec<Option<String>> {
            let spans = self.0.lock().unwrap();
            spans
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, id)| id.clone())
                .collect()
        }

        fn clear(&self) {
            self.0.lock().unwrap().clear();
        }
    }

    fn fetch_of(header: Option<&str>, url: &str) -> FetchRequest {
        let r = FetchRequest::new("GET", url);
        match header {
            Some(h) => r.header("X-Request-Id", h),
            None => r,
        }
    }

    fn body(r: &FetchResponse) -> String {
        String::from_utf8(r.body.to_vec()).unwrap()
    }

    /// `id=<id> header=-` → the id (the handler never sees the header).
    fn id_of(answer: &str) -> String {
        let rest = answer.strip_prefix("id=").unwrap();
        let (id, header) = rest.split_once(' ').unwrap();
        assert_eq!(header, "header=-", "the handler saw an x-request-id header");
        assert!(RequestId::sanitize(id).is_some(), "unsanitized id {id:?}");
        id.to_owned()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn ids_are_sanitized_at_the_edge_and_nested_calls_carry_the_context_id() {
        let spans = Spans::default();
        let _guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
        let w = World::new();
        let stop = CancellationToken::new();
        let la = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let lb = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ports = [
            la.local_addr().unwrap().port(),
            lb.local_addr().unwrap().port(),
        ];
        let peers = StaticPeers(BTreeMap::from([
            (
                "a".to_owned(),
                format!("http://{}", la.local_addr().unwrap()),
            ),
            (
                "b".to_owned(),
                format!("http://{}", lb.local_addr().unwrap()),
            ),
        ]));
        let a = start(&w, "a", la, &peers, ports, &stop).await;
        let b = start(&w, "b", lb, &peers, ports, &stop).await;
        // a owns `inner`, b owns `outer`.
        a.object_by_name("Counter", "inner")
            .fetch(fetch_of(None, "/who"))
            .await
            .unwrap();
        b.object_by_name("Counter", "outer")
            .fetch(fetch_of(None, "/who"))
            .await
            .unwrap();
        let outer = a.object_by_name("Counter", "outer");

        // A well-formed tenant id at the edge crosses the hop as the
        // context id; the handler sees no tenant header.
        spans.clear();
        let answer = body(&outer.fetch(fetch_of(Some("edge-1"), "/who")).await.unwrap());
        assert_eq!(id_of(&answer), "edge-1");
        assert_eq!(b.probe().routing.served, 1, "the fetch crossed a → b");
        for name in ["durability.host.route", "durability.host.dispatch"] {
            assert_eq!(spans.ids(name), vec![Some("edge-1".to_owned())], "{name}");
        }

        // Forged, oversized and malformed ids are replaced by fresh ones.
        let oversized = "a".repeat(MAX_REQUEST_ID_BYTES + 1);
        let mut fresh = Vec::new();
        for forged in [oversized.as_str(), "has space", "caf\u{e9}", "a\"b"] {
            let answer = body(&outer.fetch(fetch_of(Some(forged), "/who")).await.unwrap());
            let id = id_of(&answer);
            assert_ne!(id, forged);
            fresh.push(id);
        }
        // A tenant's own copy of the internal header is a control header:
        // stripped, never taken for the context id.
        let answer = outer
            .fetch(fetch_of(None, "/who").header("x-durability-request-id", "forged-ctx"))
            .await
            .unwrap();
        fresh.push(id_of(&body(&answer)));
        assert!(!fresh.contains(&"forged-ctx".to_owned()));
        fresh.sort();
        fresh.dedup();
        assert_eq!(fresh.len(), 5, "each request got its own id: {fresh:?}");
        // A control character is refused before dispatch, as any header
        // value holding one.
        let refused = outer
            .fetch(fetch_of(Some("a\u{1}b"), "/who"))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), "host_invalid_request");

        // Nested: a → b (`outer`) → a (`inner`); outer's handler sends a
        // forged tenant id, inner sees the edge's id.
        spans.clear();
        let answer = body(
            &outer
                .fetch(fetch_of(Some("edge-2"), "/nest"))
                .await
                .unwrap(),
        );
        assert_eq!(id_of(&answer), "edge-2");
        let routes = spans.ids("durability.host.route");
        assert_eq!(
            routes,
            vec![Some("edge-2".to_owned()); 2],
            "the edge's and the nested route"
        );
        let dispatches = spans.ids("durability.host.dispatch");
        assert_eq!(
            dispatches,
            vec![Some("edge-2".to_owned()); 2],
            "outer's and inner's dispatch"
        );

        // RPC: no tenant id; the edge generates one and the nested call on
        // another host carries it.
        let ids = outer.call("nest", json!(null)).await.unwrap();
        let (o, i) = (
            ids["outer"].as_str().unwrap(),
            ids["inner"].as_str().unwrap(),
        );
        assert!(RequestId::sanitize(o).is_some());
        assert_eq!(o, i, "the nested call carried the context id");
        let again = outer.call("nest", json!(null)).await.unwrap();
        assert_ne!(again["outer"], ids["outer"], "a new edge call, a new id");
        stop.cancel();
        a.shutdown().await;
        b.shutdown().await;
    }
}
