//! Process tests of tenant fetch between hosts: `routing-host` processes
//! whose `Counter` class has a fetch handler (see the binary's docs). They
//! check forwarding once and going direct on the learned hint, control
//! headers stripped both ways, the request limits at their boundary and
//! one past (on the caller and on the owner's endpoint), the token on the
//! fetch endpoint, and the replay rules: a `POST` whose outcome is unknown
//! (the owner SIGKILLed after committing, or an untrusted answer) is never
//! replayed, while a `GET` replays once through the router. Each test
//! prints what it tried.

use super::*;

impl Proc {
    /// `fetch <name> <method> <url> <headers> <body>` → its answer: the
    /// status, the headers and the body.
    fn fetch(
        &mut self,
        name: &str,
        method: &str,
        url: &str,
        headers: &[(String, String)],
        body: &str,
    ) -> Answered<(u16, Headers, String)> {
        let headers = serde_json::to_string(headers).unwrap();
        let command = format!("fetch {name} {method} {url} {headers} {body}");
        self.answer(&command, &format!("fetch {name} {method}"), |line| {
            let (headers, body) = two_fields(line, "headers", "body");
            (
                field(line, "status").parse().unwrap(),
                serde_json::from_str(headers).unwrap(),
                body.to_owned(),
            )
        })
    }
}

type Headers = Vec<(String, String)>;

fn seen(headers: &[(String, String)]) -> Vec<String> {
    let v = header(headers, "x-seen").unwrap_or_else(|| panic!("no x-seen in {headers:?}"));
    serde_json::from_str(v).unwrap()
}

/// The request frame of the fetch wire: one JSON line, a newline, the body.
fn fetch_frame(name: &str, method: &str, url: &str, body: &[u8]) -> Vec<u8> {
    let mut out = serde_json::to_vec(&serde_json::json!({
        "class": "Counter", "name": name, "method": method, "url": url, "headers": [],
    }))
    .unwrap();
    out.push(b'\n');
    out.extend_from_slice(body);
    out
}

#[test]
fn a_fetch_is_forwarded_once_then_direct_with_control_headers_stripped() {
    let (_dir, mut a, mut b) = a_owns_c1();
    let forged = pairs(&[
        ("X-Tenant", "t1"),
        ("X-Durability-Route-Task", "evil"),
        ("x-durability-route-generation", "999"),
        ("x-durability-internal-auth", "guess"),
        ("x-durability-owner-task", "forged"),
    ]);
    let (status, headers, body) = b.fetch("c1", "POST", "/incr", &forged, "hello").ok();
    assert_eq!((status, body.as_str()), (200, "n=2 task=a body=5"));
    assert_eq!(
        seen(&headers),
        vec!["x-tenant"],
        "the handler saw the tenant's header, lowercased, and no control header"
    );
    let r = b.routing();
    assert_eq!((r["forwarded"], r["direct"], r["local"]), (1, 0, 0));
    assert_eq!(b.hint("c1").0, "a", "the forward taught b the owner");

    let (status, _, body) = b.fetch("c1", "GET", "/n", &[], "").ok();
    assert_eq!((status, body.as_str()), (200, "n=2 task=a body=0"));
    let (status, headers, body) = b.fetch("c1", "GET", "/teapot", &[], "").ok();
    assert_eq!((status, body.as_str()), (418, "short and stout"));
    assert_eq!(header(&headers, "x-teapot"), Some("yes"));
    assert!(
        headers.iter().all(|(k, _)| !k.starts_with("x-durability-")),
        "the handler's forged control header is stripped: {headers:?}"
    );
    let r = b.routing();
    assert_eq!(
        (r["forwarded"], r["direct"]),
        (1, 2),
        "then direct on the hint"
    );
    assert_eq!(a.routing()["served"], 3, "a served each fetch once");
    // The owner runs its own fetches locally.
    let (_, _, body) = a.fetch("c1", "GET", "/n", &[], "").ok();
    assert_eq!(body, "n=2 task=a body=0");
    eprintln!(
        "tried: b fetched POST /incr on c1 (owned by a) with 4 forged x-durability-* headers → \
         forwarded once, ran once on a, the handler saw only x-tenant; GET /n and /teapot went \
         direct on the learned hint; the handler's forged owner header never left a"
    );
}

#[test]
fn fetch_limits_hold_at_the_boundary_and_one_past() {
    let (_dir, mut a, mut b) = a_owns_c1();
    // Everything at its limit at once, forwarded b → a: a 16 KiB URL, 128
    // headers of 128 KiB in all (one name of 128 bytes), a 1 MiB body.
    let url = format!("/n?{}", "q".repeat(16 * 1024 - 3));
    let long_name = "n".repeat(128);
    let mut max_headers: Vec<(String, String)> = (0..127)
        .map(|i| (format!("h{i:03}"), "v".repeat(1020)))
        .collect();
    max_headers.push((long_name, "v".repeat(1024 - 128)));
    let total: usize = max_headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert_eq!((max_headers.len(), total), (128, 128 * 1024));
    let (status, headers, body) = b
        .fetch("c1", "POST", &url, &max_headers, &format!("{MIB}xa"))
        .ok();
    assert_eq!(status, 200);
    assert_eq!(body, format!("n=1 task=a body={MIB}"));
    assert_eq!(seen(&headers).len(), 128);
    assert_eq!(b.routing()["forwarded"], 1);

    // One past each limit: refused on the caller before anything is sent.
    let mut one_more = max_headers.clone();
    one_more.push(("h999".to_owned(), String::new()));
    let mut one_byte_more = max_headers.clone();
    one_byte_more[0].1.push('v');
    let mut name_too_long = pairs(&[("x", "1")]);
    name_too_long[0].0 = "n".repeat(129);
    let cases: Vec<(&str, String, Headers, String, &str)> = vec![
        (
            "body 1 MiB + 1",
            "/incr".into(),
            vec![],
            format!("{}xa", MIB + 1),
            "request_too_large",
        ),
        (
            "URL 16 KiB + 1",
            format!("{url}q"),
            vec![],
            String::new(),
            "request_too_large",
        ),
        (
            "129 headers",
            "/incr".into(),
            one_more,
            String::new(),
            "request_too_large",
        ),
        (
            "128 KiB + 1 of headers",
            "/incr".into(),
            one_byte_more,
            String::new(),
            "request_too_large",
        ),
        (
            "header name of 129 bytes",
            "/incr".into(),
            name_too_long,
            String::new(),
            "invalid_request",
        ),
        (
            "header value with a tab",
            "/incr".into(),
            pairs(&[("x", "a\tb")]),
            String::new(),
            "invalid_request",
        ),
        (
            "a URL that is no path",
            "incr".into(),
            vec![],
            String::new(),
            "invalid_request",
        ),
    ];
    for (what, url, headers, body, code) in &cases {
        b.fetch("c1", "POST", url, headers, body)
            .assert_not_started(code, what);
    }
    assert_eq!(b.routing()["forwarded"], 1, "no refused fetch was sent");

    // The owner's endpoint checks the same limits on what arrives.
    let auth = ("x-durability-internal-auth", TOKEN);
    let post = |frame: &[u8]| raw(&a.endpoint, "POST", "/internal/do/fetch", &[auth], frame);
    let (status, _, body) = post(&fetch_frame("c1", "POST", "/incr", &vec![b'a'; MIB + 1]));
    let env: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, env["error"].as_str()),
        (413, Some("request_too_large"))
    );
    let (status, _, body) = post(&fetch_frame("c1", "POST", "/incr", &vec![b'a'; MIB]));
    assert_eq!(
        status,
        200,
        "{}",
        String::from_utf8_lossy(&body[..body.len().min(200)])
    );
    let (status, _, _) = raw(
        &a.endpoint,
        "POST",
        "/internal/do/fetch",
        &[auth, ("content-length", &(64 * MIB).to_string())],
        b"",
    );
    assert_eq!(
        status, 413,
        "an oversized Content-Length is refused before reading"
    );
    let (status, _, body) = post(b"{\"class\":\"Counter\"} no newline");
    let env: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, env["error"].as_str()),
        (400, Some("invalid_request"))
    );
    let (_, _, body) = a.fetch("c1", "GET", "/n", &[], "").ok();
    assert_eq!(
        body, "n=2 task=a body=0",
        "of the increments, only the raw 1 MiB one within the limits ran"
    );
    eprintln!(
        "tried: a fetch with every limit at its boundary at once (16 KiB URL, 128 headers = \
         128 KiB with a 128-byte name, 1 MiB body) forwarded and run once; {} requests one past \
         a limit refused on the caller before sending; on the owner's endpoint: a 1 MiB + 1 body \
         (413), a 1 MiB body (ran), a 64 MiB Content-Length (413 before reading), a frame \
         without its newline (400)",
        cases.len()
    );
}

#[test]
fn the_fetch_endpoint_needs_the_token_and_admits_only_at_its_fence() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Proc::spawn("a", dir.path());
    a.call_ok("c1", "incr", "{\"by\":1}");
    let frame = fetch_frame("c1", "POST", "/incr", b"");
    let post =
        |headers: &[(&str, &str)]| raw(&a.endpoint, "POST", "/internal/do/fetch", headers, &frame);
    let tokens = assert_bad_tokens_refused(|headers| {
        let (status, _, body) = post(headers);
        (status, body)
    });
    let auth = ("x-durability-internal-auth", TOKEN);
    assert_stale_fence(
        post,
        "a",
        "999999",
        "a fence at a generation a does not hold",
    );
    let (status, _, body) = post(&[auth, ("x-durability-route-task", "a")]);
    let env: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, env["error"].as_str()),
        (400, Some("invalid_fence"))
    );
    let (status, headers, body) = post(&[auth]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(header(&headers, "x-durability-owner-task"), Some("a"));
    let r = a.routing();
    assert_eq!(r["auth"], tokens);
    let (_, _, body) = a.fetch("c1", "GET", "/n", &[], "").ok();
    assert_eq!(
        body, "n=2 task=a body=0",
        "only the authorized, unfenced fetch ran"
    );
    eprintln!(
        "tried: the fetch endpoint with a missing, wrong, truncated and empty token (401 each), a fence \
         at a generation a does not hold (trusted stale_owner), half a fence (400), then the \
         token alone (ran once, owner headers set)"
    );
}

#[test]
fn a_post_fetch_is_not_replayed_after_its_owner_is_killed() {
    let (_dir, mut a, mut b) = a_owns_c1();
    b.fetch("c1", "GET", "/n", &[], "").ok();
    assert_eq!(b.hint("c1").0, "a");
    let answer =
        |l: &str| l.starts_with("ok fetch c1 POST ") || l.starts_with("err fetch c1 POST ");
    let before = b.texts().iter().filter(|l| answer(l)).count();
    b.send("fetch c1 POST /hang [] x");
    let committed = a.wait_new("fetch-hang-committed", 0);
    assert_eq!(field(&committed, "n"), "2");
    a.kill();
    let line = b
        .wait_matching("b's answer to the interrupted POST", answer, before + 1)
        .swap_remove(before)
        .1;
    assert_unknown_and_unhinted(&mut b, &line);
    // After a's lease runs out b owns the scope: the POST ran once, on a.
    let end = now() + 30_000;
    let body = loop {
        match b.fetch("c1", "GET", "/n", &[], "") {
            Answered::Ok((_, _, body)) => break body,
            Answered::Err { code, .. } => assert_eq!(code, "owner_unavailable"),
        }
        assert!(now() < end, "b never took over");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(body, "n=2 task=b body=0", "the POST was not replayed");
    eprintln!(
        "tried: POST /hang committed on a, a SIGKILLed before answering → b got \
         owner_unavailable (unknown) and did not replay; after a's {TTL_S} s lease b read n=2"
    );
}

/// An impostor's answer to a fetch: a success frame with owner headers.
fn fetch_success(generation: u64, key: &str, body: &str) -> String {
    let frame = format!("{{\"status\":200,\"headers\":[]}}\n{body}");
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\nx-durability-owner-task: imp\r\nx-durability-owner-generation: {generation}\r\nx-durability-owner-key: {key}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{frame}",
        frame.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_untrusted_answer_a_get_replays_once_and_a_post_never() {
    let (_dir, _a, mut b, (store, victim, key)) = a_and_b_and_a_victim();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let planted = plant_owner(&store, &victim, "imp", &endpoint, None).await;
    let generation = planted.generation().get();
    let unmarked =
        "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            .to_owned();
    // Learn the hint, then a POST meets an unmarked 503: no replay.
    let seen = impostor(
        listener.try_clone().unwrap(),
        fetch_success(generation, &key, "hi"),
    );
    b.fetch(&victim, "GET", "/n", &[], "").ok();
    seen.join().unwrap();
    assert_eq!(b.hint(&victim).0, "imp");
    let seen = impostor(listener.try_clone().unwrap(), unmarked.clone());
    let before = b.routing();
    let (code, outcome) = b.fetch(&victim, "POST", "/incr", &[], "").err();
    let request = seen.join().unwrap();
    assert!(request.starts_with("POST /internal/do/fetch"), "{request}");
    assert!(
        request.contains("x-durability-route-task: imp"),
        "fenced: {request}"
    );
    assert_eq!(
        (code.as_str(), outcome.as_str()),
        ("owner_unavailable", "unknown")
    );
    assert_moved(
        &before,
        &b.routing(),
        &[("direct", 1), ("forwarded", 0)],
        "one send, no replay",
    );
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "no second connection for the POST"
    );
    listener.set_nonblocking(false).unwrap();
    assert_eq!(b.hint(&victim).0, "none", "the hint was evicted");

    // Learn the hint again; a GET meets the same answer and replays once
    // through the router, which resolves the owner record anew.
    let seen = impostor(
        listener.try_clone().unwrap(),
        fetch_success(generation, &key, "hi"),
    );
    b.fetch(&victim, "GET", "/n", &[], "").ok();
    seen.join().unwrap();
    let first = impostor(listener.try_clone().unwrap(), unmarked);
    let before = b.routing();
    b.send(&format!("fetch {victim} GET /n [] "));
    first.join().unwrap();
    let second = impostor(listener, fetch_success(generation, &key, "replayed"));
    let request = second.join().unwrap();
    assert!(request.starts_with("POST /internal/do/fetch"), "{request}");
    let line = b.wait_new(&format!("ok fetch {victim} GET "), 2);
    assert!(line.ends_with("body=replayed"), "{line}");
    assert!(store.release(&planted).await.unwrap());
    assert_moved(
        &before,
        &b.routing(),
        &[("direct", 1), ("forwarded", 1)],
        "the direct send, then one replay through the router",
    );
    eprintln!(
        "tried: an impostor owner of {victim}'s scope answered an unmarked 503: a POST on the \
         hint returned owner_unavailable (unknown) after one connection; a GET replayed once \
         through the router (a second connection) and returned the replay's answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_client_fetches_through_any_host_and_replays_only_a_get() {
    use durability_host::fetch::FetchRequest;
    let (_dir, mut a, mut b, mut c) = a_owns_c1_of_three();
    let client = client(&b.endpoint);
    let text =
        |r: &durability_host::fetch::FetchResponse| String::from_utf8_lossy(&r.body).to_string();

    // Uncached: through b's router, forwarded once to a; the forged
    // control header never reaches the handler.
    let r = client
        .fetch(
            "Counter",
            "c1",
            FetchRequest::new("POST", "/incr").header("x-durability-route-task", "evil"),
        )
        .await
        .unwrap();
    assert_eq!((r.status, text(&r).as_str()), (200, "n=2 task=a body=0"));
    assert_eq!(seen(&r.headers), Vec::<String>::new());
    assert_eq!(client.hint("Counter", "c1").unwrap().unwrap().0, "a");
    // Hinted: straight to a.
    let r = client
        .fetch("Counter", "c1", FetchRequest::new("GET", "/n"))
        .await
        .unwrap();
    assert_eq!(text(&r), "n=2 task=a body=0");
    assert_eq!(b.routing()["served"], 1, "the direct fetch skipped b");
    // Takeover: one rediscovery after a's trusted stale_owner.
    a.ask("drain", "drained ");
    assert_eq!(c.call_ok("c1", "incr", "{\"by\":1}")["task"], "c");
    let r = client
        .fetch("Counter", "c1", FetchRequest::new("POST", "/incr"))
        .await
        .unwrap();
    assert_eq!(text(&r), "n=4 task=c body=0");
    let s = client.stats();
    assert_eq!((s.direct, s.rediscoveries, s.routed), (2, 1, 2));

    // The owner dies (its lease still runs): a GET on the hint finds no
    // one and replays once through b, whose forward fails too; a POST
    // through b is not replayed.
    c.kill();
    let before = client.stats();
    let e = client
        .fetch("Counter", "c1", FetchRequest::new("GET", "/n"))
        .await
        .unwrap_err();
    let after = client.stats();
    assert_eq!(
        (after.direct - before.direct, after.routed - before.routed),
        (1, 1),
        "the direct GET, then one replay through the entry host: {e}"
    );
    assert!(client.hint("Counter", "c1").unwrap().is_none());
    let e = client
        .fetch("Counter", "c1", FetchRequest::new("POST", "/incr"))
        .await
        .unwrap_err();
    assert_eq!(e.rpc_code(), "owner_unavailable", "{e}");
    let last = client.stats();
    assert_eq!(
        (last.direct, last.routed - after.routed),
        (after.direct, 1),
        "the POST went once through the entry host, never again"
    );
    let e = client
        .fetch("Counter", "c1", FetchRequest::new("GET", "/n"))
        .await
        .unwrap_err();
    assert_eq!(
        client.stats().routed - last.routed,
        2,
        "an unhinted GET replays once through the entry host: {e}"
    );
    // Refused before anything is sent.
    let e = client
        .fetch("Counter", "c1", FetchRequest::new("GET", "no-path"))
        .await
        .unwrap_err();
    assert_eq!(e.rpc_code(), "invalid_request");
    assert_eq!(client.stats().calls.invalid, 1);
    eprintln!(
        "tried: an RpcClient fetched through host b: forwarded to a, then direct on the hint; \
         after a drained and c took over, one rediscovery; after c was SIGKILLed, a GET replayed \
         once through b and a POST did not; a malformed URL refused before sending"
    );
}
