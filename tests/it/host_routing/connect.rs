//! Process tests of WebSocket connect between hosts: `routing-host`
//! processes whose `Counter` class has a connect handler that greets with
//! the serving host's task (see the binary's docs). They check that the
//! `101` comes from the owner (a non-owner router hands off, then the hint
//! goes direct), one rediscovery after a takeover, forged and malformed
//! owner hints from an impostor reduced to `owner_unavailable` without a
//! fallback, a wrong or missing token, forged fences, and the request
//! limits at their boundary and one past. Each test prints what it tried.

use super::*;

type Pairs = Vec<(String, String)>;

impl Proc {
    /// `connect <name> <url> <headers> <message>` → its answer: the
    /// session's greeting and the answer to the one message sent.
    fn connect(
        &mut self,
        name: &str,
        url: &str,
        headers: &[(String, String)],
        message: &str,
    ) -> Answered<(String, String)> {
        let headers = serde_json::to_string(headers).unwrap();
        let command = format!("connect {name} {url} {headers} {message}");
        self.answer(&command, &format!("connect {name}"), |line| {
            let (greeting, reply) = two_fields(line, "greeting", "reply");
            (greeting.to_owned(), reply.to_owned())
        })
    }
}

/// A raw WebSocket upgrade request to `/internal/do/connect` carrying
/// `meta` (the connect header) and `extra` headers: (status, headers
/// lowercased, body). A `101` is read up to its head only.
fn raw_upgrade(
    endpoint: &str,
    meta: &str,
    extra: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let addr = endpoint.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!(
        "GET /internal/do/connect HTTP/1.1\r\nhost: {addr}\r\nconnection: upgrade\r\n\
         upgrade: websocket\r\nsec-websocket-version: 13\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nx-durability-connect: {meta}\r\n"
    );
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let split = loop {
        if let Some(split) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break split;
        }
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before a response head");
        got.extend_from_slice(&buf[..n]);
    };
    let (status, headers) = parse_head(&got[..split]);
    let mut body = got[split + 4..].to_vec();
    if status != 101 {
        let len: usize = header(&headers, "content-length")
            .map(|v| v.parse().unwrap())
            .unwrap_or(0);
        while body.len() < len {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&buf[..n]);
        }
    }
    (status, headers, body)
}

fn meta(name: &str, url: &str, headers: &[(String, String)]) -> String {
    serde_json::json!({ "class": "Counter", "name": name, "url": url, "headers": headers })
        .to_string()
}

#[test]
fn a_connect_through_a_non_owner_is_upgraded_by_the_owner_then_goes_direct() {
    let forged = pairs(&[
        ("X-Tenant", "t1"),
        ("x-durability-route-task", "evil"),
        ("x-durability-internal-auth", "guess"),
    ]);
    let (_dir, mut a, mut b) = a_owns_c1();
    let (greeting, reply) = b.connect("c1", "/ws?room=1", &forged, "incr").ok();
    assert_eq!(
        greeting, "hello task=a url=/ws?room=1 seen=[\"x-tenant\"]",
        "the session runs on the owner, which saw no control header"
    );
    assert_eq!(reply, "echo task=a msg=n=2", "and writes there");
    let rb = b.routing();
    assert_eq!(
        (
            rb["handoffs"],
            rb["direct"],
            rb["forwarded"],
            rb["upgrades"]
        ),
        (1, 0, 0, 0),
        "b's router handed off and upgraded nothing"
    );
    assert_eq!(a.routing()["upgrades"], 1, "the 101 came from a");
    let (task, generation) = b.hint("c1");
    assert_eq!(task, "a", "the handoff taught b the owner");

    let (greeting, _) = b.connect("c1", "/ws", &[], "again").ok();
    assert!(greeting.starts_with("hello task=a "), "{greeting}");
    let rb = b.routing();
    assert_eq!(
        (rb["handoffs"], rb["direct"]),
        (1, 1),
        "then direct on the hint"
    );
    assert_eq!(a.routing()["upgrades"], 2);
    // The owner opens its own sessions locally.
    let (greeting, reply) = a.connect("c1", "/ws", &[], "incr").ok();
    assert!(greeting.starts_with("hello task=a "), "{greeting}");
    assert_eq!(reply, "echo task=a msg=n=3");

    // On the wire: b (not the owner) never upgrades, it answers the
    // hint-only handoff; a (the owner) upgrades.
    let auth = ("x-durability-internal-auth", TOKEN);
    let m = meta("c1", "/ws", &[]);
    let (status, headers, _) = raw_upgrade(&b.endpoint, &m, &[auth]);
    let key = counter_scope("c1").host_id().to_owned();
    let g = generation.to_string();
    assert_eq!(status, 503, "{headers:?}");
    for (name, value) in [
        ("x-durability-owner-hint", "connect"),
        ("x-durability-owner-task", "a"),
        ("x-durability-owner-generation", g.as_str()),
        ("x-durability-owner-key", key.as_str()),
        ("x-durability-owner-endpoint", a.endpoint.as_str()),
    ] {
        assert_eq!(header(&headers, name), Some(value), "{name}: {headers:?}");
    }
    let (status, headers, _) = raw_upgrade(&a.endpoint, &m, &[auth]);
    assert_eq!(status, 101);
    assert_eq!(header(&headers, "x-durability-owner-task"), Some("a"));
    assert_eq!(
        header(&headers, "sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    eprintln!(
        "tried: b connected to c1 (owned by a@{generation}) uncached → b handed off, the 101 \
         came from a (greeting task=a, the increment ran on a); the second connect went direct \
         on the hint; raw: b answered the 503 owner hint naming a, a answered 101"
    );
}

#[test]
fn a_stale_connect_hint_after_a_takeover_costs_one_rediscovery() {
    let (_dir, mut a, mut b, mut c) = a_owns_c1_of_three();
    b.connect("c1", "/ws", &[], "hi").ok();
    let (_, g1) = b.hint("c1");
    a.ask("drain", "drained ");
    let v = c.call_ok("c1", "incr", "{\"by\":1}");
    assert_eq!(v["task"], "c");
    let upgrades_a = a.routing()["upgrades"];

    // b's hint says a@g1: a no longer owns it and answers a trusted
    // handoff (or stale_owner); b evicts, rediscovers once and the 101
    // comes from c.
    let (greeting, reply) = b.connect("c1", "/ws", &[], "incr").ok();
    assert!(greeting.starts_with("hello task=c "), "{greeting}");
    assert_eq!(reply, "echo task=c msg=n=3", "ran once, on the new owner");
    let rb = b.routing();
    assert_eq!(
        (rb["direct"], rb["rediscoveries"], rb["handoffs"]),
        (1, 1, 2),
        "{rb:?}"
    );
    assert_eq!(a.routing()["upgrades"], upgrades_a, "a upgraded nothing");
    let (task, g2) = b.hint("c1");
    assert_eq!(task, "c");
    assert!(g2 > g1, "new generation {g2} > {g1}");
    eprintln!(
        "tried: b's connect hint a@{g1}, a drained, c took over at {g2}; b's direct connect to \
         a was refused before any upgrade, b rediscovered once and c upgraded (n=3)"
    );
}

/// Answers `n` connections, one after another, with `response`.
fn impostor_n(
    listener: TcpListener,
    response: String,
    n: usize,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        (0..n)
            .map(|_| {
                impostor(listener.try_clone().unwrap(), response.clone())
                    .join()
                    .unwrap()
            })
            .collect()
    })
}

fn hint_response(status: u16, marker: &str, task: &str, generation: &str, key: &str) -> String {
    let body = "{\"error\":\"owner_hint\",\"message\":\"Connect to the owner\"}";
    format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\nx-durability-owner-hint: {marker}\r\n\
         x-durability-owner-task: {task}\r\nx-durability-owner-generation: {generation}\r\n\
         x-durability-owner-key: {key}\r\nx-durability-owner-endpoint: http://127.0.0.1:9\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_hints_and_tokens_are_refused_without_a_fallback() {
    let (dir, mut a, mut b) = a_owns_c1();
    let (_, g) = {
        b.call_ok("c1", "get", "null");
        b.hint("c1")
    };

    // The owner's endpoint: a missing, wrong, truncated or empty token
    // never upgrades.
    let m = meta("c1", "/ws", &[]);
    let tokens = assert_bad_tokens_refused(|extra| {
        let (status, _, body) = raw_upgrade(&a.endpoint, &m, extra);
        (status, body)
    });
    // Forged fences: a generation a does not hold, another task.
    let stale = (g + 1000).to_string();
    for fence in [("a", stale.as_str()), ("zz", "1")] {
        let upgrade = |headers: &[(&str, &str)]| raw_upgrade(&a.endpoint, &m, headers);
        assert_stale_fence(upgrade, fence.0, fence.1, &format!("{fence:?}"));
    }
    let ra = a.routing();
    assert_eq!((ra["upgrades"], ra["auth"]), (0, tokens), "{ra:?}");

    // An impostor owner of another shard (its record advertises its
    // listener) answers b's fenced connect with forged hints.
    let (store, victim, key) = victim(dir.path(), &["c1"]);
    let other_key = counter_scope("c1").host_id().to_owned();
    let mut record = None;
    let forged = [
        ("marker on a 502", 502, "connect", "imp", "1", &key),
        ("wrong marker value", 503, "owner", "imp", "1", &key),
        (
            "another shard's key",
            503,
            "connect",
            "imp",
            "1",
            &other_key,
        ),
        ("generation 0", 503, "connect", "imp", "0", &key),
        ("malformed task", 503, "connect", "i m p", "1", &key),
    ]
    .map(|(what, status, marker, task, generation, key)| {
        (what, hint_response(status, marker, task, generation, key))
    });
    for (what, answer) in &forged {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        record = Some(plant_owner(&store, &victim, "imp", &endpoint, record.take()).await);
        let seen = impostor_n(listener, answer.clone(), 1);
        let before = b.routing();
        let (code, outcome) = b.connect(&victim, "/ws", &[], "incr").err();
        let requests = seen.join().unwrap();
        assert!(
            requests[0].contains("x-durability-route-task: imp")
                && requests[0].contains("upgrade: websocket"),
            "{what}: a fenced upgrade to the record's endpoint: {requests:?}"
        );
        assert_eq!(
            (code.as_str(), outcome.as_str()),
            ("owner_unavailable", "unknown"),
            "{what}"
        );
        assert_moved(
            &before,
            &b.routing(),
            &[("rediscoveries", 0), ("handoffs", 1), ("upgrades", 0)],
            &format!("{what}: no rediscovery, no fallback"),
        );
        assert_eq!(b.hint(&victim).0, "none", "{what}");
    }
    // A valid trusted hint from the endpoint b sent to: one rediscovery
    // through b's router (which finds the impostor again), then a second
    // valid hint is final.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let planted = plant_owner(&store, &victim, "imp", &endpoint, record.take()).await;
    let generation = planted.generation().get().to_string();
    let seen = impostor_n(
        listener,
        hint_response(503, "connect", "imp2", &generation, &key),
        2,
    );
    let before = b.routing();
    let (code, _) = b.connect(&victim, "/ws", &[], "incr").err();
    assert_eq!(seen.join().unwrap().len(), 2, "asked twice");
    assert_eq!(code, "owner_unavailable");
    assert_moved(
        &before,
        &b.routing(),
        &[("rediscoveries", 1), ("handoffs", 2)],
        "exactly one rediscovery",
    );
    assert!(store.release(&planted).await.unwrap());
    let (greeting, reply) = b.connect(&victim, "/ws", &[], "incr").ok();
    assert!(greeting.starts_with("hello task=b "), "{greeting}");
    assert_eq!(
        reply, "echo task=b msg=n=1",
        "nothing b sent the impostor ran anywhere"
    );
    eprintln!(
        "tried: no/wrong token on a's connect (401), 2 forged fences (503 stale_owner); {} \
         forged hints from an impostor owner of {victim} (marker on a 502, wrong marker value, \
         another shard's key, generation 0, a malformed task) each owner_unavailable with no \
         rediscovery; a valid hint rediscovered once, the second was final",
        forged.len()
    );
}

#[test]
fn connect_limits_hold_at_the_boundary_and_one_past() {
    let (_dir, mut a, mut b) = a_owns_c1();
    // Everything at its limit at once, b → a: a 16 KiB URL, 128 headers of
    // 128 KiB in all (one name of 128 bytes).
    let url = format!("/ws?{}", "q".repeat(16 * 1024 - 4));
    let mut max_headers: Vec<(String, String)> = (0..127)
        .map(|i| (format!("h{i:03}"), "v".repeat(1020)))
        .collect();
    max_headers.push(("n".repeat(128), "v".repeat(1024 - 128)));
    let total: usize = max_headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert_eq!(
        (max_headers.len(), total, url.len()),
        (128, 128 * 1024, 16 * 1024)
    );
    let (greeting, _) = b.connect("c1", &url, &max_headers, "hi").ok();
    assert!(greeting.starts_with("hello task=a "), "upgraded by a");
    assert!(greeting.contains(&url), "the whole URL arrived");
    let served = a.routing()["served"];

    // One past each limit: refused on the caller before anything is sent.
    let mut one_more = max_headers.clone();
    one_more.push(("h999".to_owned(), String::new()));
    let mut one_byte_more = max_headers.clone();
    one_byte_more[0].1.push('v');
    let cases: Vec<(&str, String, Pairs, &str)> = vec![
        (
            "URL 16 KiB + 1",
            format!("{url}q"),
            vec![],
            "request_too_large",
        ),
        (
            "129 headers",
            "/ws".into(),
            one_more.clone(),
            "request_too_large",
        ),
        (
            "128 KiB + 1 of headers",
            "/ws".into(),
            one_byte_more,
            "request_too_large",
        ),
        (
            "header name of 129 bytes",
            "/ws".into(),
            pairs(&[(&"n".repeat(129), "v")]),
            "invalid_request",
        ),
    ];
    for (what, url, headers, code) in &cases {
        b.connect("c1", url, headers, "hi")
            .assert_not_started(code, what);
    }
    assert_eq!(a.routing()["served"], served, "no refused connect was sent");

    // The owner's endpoint checks the same limits before any upgrade.
    let auth = ("x-durability-internal-auth", TOKEN);
    for (what, m, status, code) in [
        (
            "URL 16 KiB + 1",
            meta("c1", &format!("{url}q"), &[]),
            413,
            "request_too_large",
        ),
        (
            "129 headers",
            meta("c1", "/ws", &one_more),
            413,
            "request_too_large",
        ),
        ("no JSON", "{\"class\":".to_owned(), 400, "invalid_request"),
    ] {
        let (got, _, body) = raw_upgrade(&a.endpoint, &m, &[auth]);
        let env: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((got, env["error"].as_str()), (status, Some(code)), "{what}");
    }
    assert_eq!(
        a.routing()["upgrades"],
        1,
        "only the boundary connect upgraded"
    );
    eprintln!(
        "tried: a connect at every limit (16 KiB URL, 128 headers of 128 KiB) upgraded by a; \
         {} one-past requests refused by b before sending; 2 oversized and 1 malformed \
         connect header refused by a's endpoint before any upgrade",
        cases.len()
    );
}

/// A session with `c1` at `/ws` through `client`.
async fn connect_c1(client: &RpcClient) -> durability_host::connect::Socket {
    use durability_host::connect::ConnectRequest;
    client
        .connect("Counter", "c1", ConnectRequest::new("/ws"))
        .await
        .unwrap()
}

/// The greeting of a fresh session, then its answer to `message`.
async fn converse(
    socket: &mut durability_host::connect::Socket,
    message: &str,
) -> (String, String) {
    use durability_host::connect::Message;
    let text = |m: Option<Result<Message, durability_host::HostError>>| match m {
        Some(Ok(Message::Text(t))) => t,
        other => panic!("unexpected {other:?}"),
    };
    let greeting = text(socket.recv().await);
    socket
        .send(Message::Text(message.to_owned()))
        .await
        .unwrap();
    (greeting, text(socket.recv().await))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_client_connects_through_any_host_and_follows_a_takeover() {
    use durability_host::connect::ConnectRequest;
    let (_dir, mut a, mut b, mut c) = a_owns_c1_of_three();
    let client = client(&b.endpoint);

    // Uncached: b's router hands off over the wire; the client connects
    // to a, which upgrades.
    let mut s = connect_c1(&client).await;
    let (greeting, reply) = converse(&mut s, "incr").await;
    assert!(greeting.starts_with("hello task=a "), "{greeting}");
    assert_eq!(reply, "echo task=a msg=n=2");
    s.close().await.unwrap();
    let rb = b.routing();
    assert_eq!(
        (rb["handoffs"], rb["upgrades"]),
        (1, 0),
        "b upgraded nothing"
    );
    let (task, g1, endpoint) = client.hint("Counter", "c1").unwrap().unwrap();
    assert_eq!(
        (task.as_str(), endpoint.as_str()),
        ("a", a.endpoint.as_str())
    );

    // Hinted: straight to a, b sees nothing.
    let served = b.routing()["served"];
    let mut s = connect_c1(&client).await;
    assert!(converse(&mut s, "hi").await.0.starts_with("hello task=a "));
    assert_eq!(
        b.routing()["served"],
        served,
        "the direct connect skipped b"
    );
    let st = client.stats();
    assert_eq!((st.routed, st.direct, st.rediscoveries), (1, 1, 0));

    // Takeover: a drains, c claims; the direct connect to a is refused
    // before any upgrade, one rediscovery through b, handed off to c.
    a.ask("drain", "drained ");
    assert_eq!(c.call_ok("c1", "incr", "{\"by\":1}")["task"], "c");
    let mut s = connect_c1(&client).await;
    let (greeting, reply) = converse(&mut s, "incr").await;
    assert!(greeting.starts_with("hello task=c "), "{greeting}");
    assert_eq!(reply, "echo task=c msg=n=4");
    let st = client.stats();
    assert_eq!((st.routed, st.direct, st.rediscoveries), (2, 2, 1));
    let (task, g2, _) = client.hint("Counter", "c1").unwrap().unwrap();
    assert_eq!(task, "c");
    assert!(g2 > g1);

    // A wrong token is refused by the entry host; nothing upgrades.
    let bad = wrong_token_client(&b.endpoint);
    let e = bad
        .connect("Counter", "c1", ConnectRequest::new("/ws"))
        .await
        .unwrap_err();
    assert_eq!(e.rpc_code(), "unauthorized");
    assert_eq!(
        client.stats().calls,
        durability_host::ClientCalls {
            completed: 3,
            ..Default::default()
        }
    );
    eprintln!(
        "tried: a thin client entering through b: b's wire handoff to a@{g1}, a upgraded; direct \
         to a; a drained and c took over at {g2}: one rediscovery through b, c upgraded; a wrong \
         token refused (401)"
    );
}
