//! Process tests of calls between hosts: real `routing-host` processes (the
//! `tests` package's binary), each serving its internal endpoints over
//! HTTP/1.1 on a loopback port, over one SQLite lease store and one
//! directory of object files. They check forwarding once, owner-hint
//! learning and eviction, one rediscovery after a takeover, no replay of
//! RPC after an unknown outcome, the limits at their boundary and one past,
//! forged fences and headers, a wrong or missing token, hostile owner
//! endpoints, and alarm deliveries claimed by one host's dispatcher and run
//! on the owner (forwarded over the transport, fenced, and not lost when
//! the owner is killed). Each test prints what it tried.
#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use durability_host::RpcClient;
use durability_ownership::{
    ClaimOutcome, Claimant, LeaseStore as _, LifecycleId, OwnerEndpoint, OwnerRecord, ShardCount,
    SystemClock, TaskId,
};
use durability_storage_sqlite::ownership::SqliteLeaseStore;
use durability_tests::host_proc::counter_scope;
use durability_tests::process::{self, field};
use serde_json::Value;

mod connect;
mod fetch;

const TOKEN: &str = "test-internal-token-0123456789";
/// Owner lease (`DO_OWNER_TTL_SECONDS`).
const TTL_S: u64 = 3;
const MIB: usize = 1024 * 1024;

use process::now;

/// One `routing-host` process and its endpoint.
struct Proc {
    proc: process::Proc,
    endpoint: String,
}

impl std::ops::Deref for Proc {
    type Target = process::Proc;
    fn deref(&self) -> &process::Proc {
        &self.proc
    }
}

impl std::ops::DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut process::Proc {
        &mut self.proc
    }
}

/// An answer line parsed: `ok` (its part as `T`) or `err` (its code and
/// outcome).
#[derive(Debug)]
enum Answered<T> {
    Ok(T),
    Err { code: String, outcome: String },
}

impl<T: std::fmt::Debug> Answered<T> {
    fn ok(self) -> T {
        match self {
            Self::Ok(t) => t,
            Self::Err { .. } => panic!("it failed: {self:?}"),
        }
    }

    /// Asserts that it failed `code` with outcome `not_started`.
    fn assert_not_started(self, code: &str, what: &str) {
        let (got, outcome) = self.err();
        assert_eq!(
            (got.as_str(), outcome.as_str()),
            (code, "not_started"),
            "{what}"
        );
    }

    fn err(self) -> (String, String) {
        match self {
            Self::Err { code, outcome } => (code, outcome),
            Self::Ok(_) => panic!("it succeeded: {self:?}"),
        }
    }
}

impl Proc {
    fn spawn(name: &str, dir: &Path) -> Self {
        Self::spawn_with(name, dir, &[])
    }

    /// [`Proc::spawn`] with extra `key=value` arguments.
    fn spawn_with(name: &str, dir: &Path, extra: &[&str]) -> Self {
        let bin = env!("CARGO_BIN_EXE_routing-host");
        let mut command = process::host_command(bin, name, dir, TOKEN);
        command
            .arg("interval=200")
            .args(extra)
            .env("DO_OWNER_TTL_SECONDS", TTL_S.to_string())
            .env("DO_OWNER_LEASE_GUARD_MS", "300")
            .env("DO_DRAIN_IN_FLIGHT_TIMEOUT_MS", "3000")
            .env("DO_DRAIN_TIMEOUT_MS", "5000");
        let proc = process::Proc::spawn(name, command);
        let ready = proc.wait_new("ready ", 0);
        let endpoint = field(&ready, "endpoint").to_owned();
        Self { proc, endpoint }
    }

    /// Sends `command` and parses its answer (`ok <what> …` or `err <what>
    /// …`): `parse` reads an `ok` line.
    fn answer<T>(
        &mut self,
        command: &str,
        what: &str,
        parse: impl FnOnce(&str) -> T,
    ) -> Answered<T> {
        let line = self.ask_for(command, what);
        if line.starts_with("err ") {
            return Answered::Err {
                code: field(&line, "code").to_owned(),
                outcome: field(&line, "outcome").to_owned(),
            };
        }
        Answered::Ok(parse(&line))
    }

    /// `call <name> <method> <args>` → its `ok`/`err` line.
    fn call(&mut self, name: &str, method: &str, args: &str) -> String {
        self.ask_for(
            &format!("call {name} {method} {args}"),
            &format!("call {name} {method}"),
        )
    }

    fn call_ok(&mut self, name: &str, method: &str, args: &str) -> Value {
        let line = self.call(name, method, args);
        let result = line
            .strip_prefix(&format!("ok call {name} {method} result="))
            .unwrap_or_else(|| panic!("{}: {line}", self.name()));
        serde_json::from_str(result).unwrap()
    }

    fn hint(&mut self, name: &str) -> (String, u64) {
        let line = self.ask(&format!("hint {name}"), &format!("hint {name} "));
        (
            field(&line, "task").to_owned(),
            field(&line, "gen").parse().unwrap(),
        )
    }

    fn routing(&mut self) -> std::collections::HashMap<String, u64> {
        let line = self.ask("routing", "routing ");
        line.split_whitespace()
            .skip(1)
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_owned(), v.parse().unwrap())
            })
            .collect()
    }
}

/// Hosts `a` and `b` over one directory, `a` owning `c1` (incremented
/// once).
fn a_owns_c1() -> (tempfile::TempDir, Proc, Proc) {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Proc::spawn("a", dir.path());
    let b = Proc::spawn("b", dir.path());
    a.call_ok("c1", "incr", "{\"by\":1}");
    (dir, a, b)
}

/// [`a_owns_c1`] with a third host `c`.
fn a_owns_c1_of_three() -> (tempfile::TempDir, Proc, Proc, Proc) {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Proc::spawn("a", dir.path());
    let b = Proc::spawn("b", dir.path());
    let c = Proc::spawn("c", dir.path());
    a.call_ok("c1", "incr", "{\"by\":1}");
    (dir, a, b, c)
}

/// Hosts `a` (the only dispatcher) and `b` (`dispatch=off`) over one
/// directory.
fn a_dispatches_b_does_not() -> (tempfile::TempDir, Proc, Proc) {
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::spawn("a", dir.path());
    let b = Proc::spawn_with("b", dir.path(), &["dispatch=off"]);
    (dir, a, b)
}

/// The text of `line` after ` first=` up to ` second=`, and after
/// ` second=` to the end.
fn two_fields<'l>(line: &'l str, first: &str, second: &str) -> (&'l str, &'l str) {
    let (_, rest) = line.split_once(&format!(" {first}=")).unwrap();
    rest.split_once(&format!(" {second}=")).unwrap()
}

/// Asserts that `answer` (b's answer line for `c1`) is `owner_unavailable`
/// with an unknown outcome, and that the failure evicted b's hint.
fn assert_unknown_and_unhinted(b: &mut Proc, answer: &str) {
    assert_eq!(field(answer, "code"), "owner_unavailable", "{answer}");
    assert_eq!(field(answer, "outcome"), "unknown", "{answer}");
    assert_eq!(
        b.hint("c1").0,
        "none",
        "the unmarked failure evicted the hint"
    );
}

/// The lease store of [`victim`], an object and its scope's key.
type Victim = (SqliteLeaseStore<SystemClock>, String, String);

/// Hosts `a` and `b` over one directory, and a [`victim`] on a shard
/// neither owns yet.
fn a_and_b_and_a_victim() -> (tempfile::TempDir, Proc, Proc, Victim) {
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::spawn("a", dir.path());
    let b = Proc::spawn("b", dir.path());
    let victim = victim(dir.path(), &[]);
    (dir, a, b, victim)
}

/// Asserts that `v` (a `Counter` answer) counted to `n` on `task`.
fn assert_ran(v: &Value, n: i64, task: &str, what: &str) {
    assert_eq!((n_of(v), v["task"].as_str()), (n, Some(task)), "{what}");
}

/// Asserts that an internal request `send` sends with the token and a
/// fence of `task` at `generation` is refused `503` `stale_owner`.
fn assert_stale_fence(
    send: impl Fn(&[(&str, &str)]) -> (u16, Vec<(String, String)>, Vec<u8>),
    task: &str,
    generation: &str,
    what: &str,
) {
    let (status, headers, _) = send(&[
        ("x-durability-internal-auth", TOKEN),
        ("x-durability-route-task", task),
        ("x-durability-route-generation", generation),
    ]);
    assert_eq!(
        (status, header(&headers, "x-durability-ownership-error")),
        (503, Some("stale_owner")),
        "{what}"
    );
}

/// Asserts that each routing counter of `deltas` moved by its delta from
/// `before` to `after`.
fn assert_moved(
    before: &std::collections::HashMap<String, u64>,
    after: &std::collections::HashMap<String, u64>,
    deltas: &[(&str, u64)],
    what: &str,
) {
    let moved: Vec<(&str, u64)> = deltas
        .iter()
        .map(|(k, _)| (*k, after[*k] - before[*k]))
        .collect();
    assert_eq!(moved, deltas, "{what}");
}

/// A lease store over `dir`'s hosts, an object on a shard no name of
/// `avoid` is on (the victim of a forged owner record), and its scope's
/// key.
fn victim(dir: &Path, avoid: &[&str]) -> Victim {
    let victim = other_shard(avoid);
    let key = counter_scope(&victim).host_id().to_owned();
    (lease_store(dir), victim, key)
}

fn shard(name: &str) -> u32 {
    counter_scope(name).shard()
}

/// Another object name in the shard of `name`.
fn same_shard(name: &str) -> String {
    (0..10_000)
        .map(|i| format!("obj{i}"))
        .find(|n| n != name && shard(n) == shard(name))
        .unwrap()
}

/// A raw HTTP/1.1 exchange: (status, headers lowercased, body).
fn raw(
    endpoint: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let addr = endpoint.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    let mut has_length = false;
    for (k, v) in headers {
        has_length |= k.eq_ignore_ascii_case("content-length");
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !has_length {
        req.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let (status, headers) = parse_head(&out[..split]);
    (status, headers, out[split + 4..].to_vec())
}

/// A response head: its status and its headers (names lowercased).
fn parse_head(head: &[u8]) -> (u16, Vec<(String, String)>) {
    let head = String::from_utf8_lossy(head);
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
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A raw invoke of `method` with `args` on `Counter` `name` at an
/// internal endpoint, with `headers`.
fn invoke(
    endpoint: &str,
    headers: &[(&str, &str)],
    name: &str,
    method: &str,
    args: &str,
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let body = invoke_body(name, method, args);
    raw(endpoint, "POST", "/internal/do/invoke", headers, &body)
}

fn invoke_body(name: &str, method: &str, args: &str) -> Vec<u8> {
    format!("{{\"class\":\"Counter\",\"name\":\"{name}\",\"method\":\"{method}\",\"args\":{args}}}")
        .into_bytes()
}

fn pairs(headers: &[(&str, &str)]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Sends `send` (an internal endpoint's request with the headers given)
/// with a missing, a wrong (same length), a truncated and an empty token;
/// each must be refused `401 unauthorized`. Returns how many it tried (each
/// counts in the routing probe's `auth`).
fn assert_bad_tokens_refused(send: impl Fn(&[(&str, &str)]) -> (u16, Vec<u8>)) -> u64 {
    let wrong: String = TOKEN.chars().rev().collect();
    let cases = [
        ("missing token", vec![]),
        (
            "wrong token",
            vec![("x-durability-internal-auth", wrong.as_str())],
        ),
        (
            "token prefix",
            vec![("x-durability-internal-auth", &TOKEN[..TOKEN.len() - 1])],
        ),
        ("empty token", vec![("x-durability-internal-auth", "")]),
    ];
    for (what, headers) in &cases {
        let (status, body) = send(headers);
        let env: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (status, env["error"].as_str()),
            (401, Some("unauthorized")),
            "{what}"
        );
    }
    cases.len() as u64
}

/// A thin client entering through `endpoint`.
fn client(endpoint: &str) -> RpcClient {
    RpcClient::new(endpoint, TOKEN, "st1", ShardCount::default()).unwrap()
}

/// A thin client entering through `endpoint` with a wrong token.
fn wrong_token_client(endpoint: &str) -> RpcClient {
    RpcClient::new(
        endpoint,
        "wrong-token-0123456789",
        "st1",
        ShardCount::default(),
    )
    .unwrap()
}

fn n_of(v: &Value) -> i64 {
    v["n"].as_i64().unwrap()
}

#[test]
fn a_call_is_forwarded_once_then_goes_direct_on_the_learned_hint() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Proc::spawn("a", dir.path());
    let mut b = Proc::spawn("b", dir.path());
    // a claims the scope of c1 by calling it.
    let v = a.call_ok("c1", "incr", "{\"by\":1}");
    assert_eq!((n_of(&v), v["task"].as_str()), (1, Some("a")));
    assert_eq!(b.hint("c1").0, "none");

    assert_ran(
        &b.call_ok("c1", "incr", "{\"by\":1}"),
        2,
        "a",
        "ran on the owner",
    );
    let r = b.routing();
    assert_eq!((r["forwarded"], r["direct"], r["local"]), (1, 0, 0));
    let (task, generation) = b.hint("c1");
    assert_eq!(task, "a");
    assert!(generation >= 1);

    let v = b.call_ok("c1", "incr", "{\"by\":1}");
    assert_eq!(n_of(&v), 3);
    let r = b.routing();
    assert_eq!(
        (r["forwarded"], r["direct"]),
        (1, 1),
        "the second call went direct"
    );

    // Another object of the same shard shares the hint.
    let sibling = same_shard("c1");
    assert_eq!(b.hint(&sibling), ("a".to_owned(), generation));
    let v = b.call_ok(&sibling, "get", "null");
    assert_eq!((n_of(&v), v["task"].as_str()), (0, Some("a")));
    let r = b.routing();
    assert_eq!((r["forwarded"], r["direct"]), (1, 2));
    let served = a.routing()["served"];
    assert_eq!(served, 3, "a served each of b's calls exactly once");
    eprintln!(
        "tried: b called c1 (owned by a) uncached → forwarded once and learned hint a@{generation}; \
         then c1 and {sibling} (same shard) went direct; a served {served} invokes"
    );
}

#[test]
fn a_stale_hint_after_a_takeover_costs_one_rediscovery() {
    let (_dir, mut a, mut b, mut c) = a_owns_c1_of_three();
    b.call_ok("c1", "incr", "{\"by\":1}");
    let (_, g1) = b.hint("c1");
    let drained = a.ask("drain", "drained ");
    assert!(
        field(&drained, "released").parse::<u64>().unwrap() >= 1,
        "{drained}"
    );
    // c takes the scope over (a released it) and runs a call locally.
    let v = c.call_ok("c1", "incr", "{\"by\":1}");
    assert_eq!((n_of(&v), v["task"].as_str()), (3, Some("c")));

    // b's hint still says a@g1: a answers a trusted stale_owner before
    // dispatch; b rediscovers once and reaches c.
    let v = b.call_ok("c1", "incr", "{\"by\":1}");
    assert_ran(&v, 4, "c", "ran once, on the new owner");
    let r = b.routing();
    assert_eq!((r["direct"], r["rediscoveries"], r["forwarded"]), (1, 1, 2));
    let (task, g2) = b.hint("c1");
    assert_eq!(task, "c");
    assert!(g2 > g1, "new generation {g2} > {g1}");
    eprintln!(
        "tried: b's hint a@{g1}, a drained, c took over at {g2}; b's direct call got a trusted \
         stale_owner from a, rediscovered once and ran on c (n=4: every call ran exactly once)"
    );
}

#[test]
fn rpc_is_not_replayed_after_an_unknown_outcome() {
    let (_dir, mut a, mut b) = a_owns_c1();
    b.call_ok("c1", "get", "null");
    assert_eq!(b.hint("c1").0, "a");
    // The method commits on a, then a dies before answering.
    let before = b.count("err call c1 incr_hang ");
    b.send("call c1 incr_hang null");
    let committed = a.wait_new("hang-committed", 0);
    assert_eq!(field(&committed, "n"), "2");
    a.kill();
    let answer = b.wait_new("err call c1 incr_hang ", before);
    assert_unknown_and_unhinted(&mut b, &answer);
    assert_eq!(b.routing()["rediscoveries"], 0);

    // Until a's lease runs out, b gets owner_unavailable (a's endpoint is
    // dead: the connection is refused, so nothing ran and the outcome says
    // so); then b claims the scope and reads what a committed, once.
    let end = now() + 30_000;
    let mut unavailable = 0;
    let v = loop {
        let line = b.call("c1", "get", "null");
        if let Some(r) = line.strip_prefix("ok call c1 get result=") {
            break serde_json::from_str::<Value>(r).unwrap();
        }
        assert_eq!(field(&line, "code"), "owner_unavailable", "{line}");
        assert_eq!(field(&line, "outcome"), "not_started", "{line}");
        unavailable += 1;
        assert!(now() < end, "b never took over");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        (n_of(&v), v["task"].as_str()),
        (2, Some("b")),
        "the method ran once, not replayed"
    );
    eprintln!(
        "tried: incr_hang committed on a, a SIGKILLed before answering → b got owner_unavailable \
         (unknown), no replay; {unavailable} calls refused at connect (not started) until a's {TTL_S} s \
         lease ran out; n=2 on b"
    );
}

#[test]
fn limits_hold_at_the_boundary_and_one_past() {
    let (_dir, mut a, mut b) = a_owns_c1();
    let mut tried = Vec::new();

    // Method names: 256 bytes pass the grammar (the class has no such
    // method), 257 are refused before anything is sent.
    let m256 = "m".repeat(256);
    let line = b.call("c1", &m256, "null");
    assert_eq!(field(&line, "code"), "unknown_method", "{line}");
    assert_eq!(field(&line, "outcome"), "not_started");
    let m257 = "m".repeat(257);
    let served = a.routing()["served"];
    let line = b.call("c1", &m257, "null");
    assert_eq!(field(&line, "code"), "invalid_method", "{line}");
    assert_eq!(a.routing()["served"], served, "refused before sending");
    tried.push("method 256 B ok / 257 B refused");

    // Arguments: exactly 1 MiB encoded passes, one byte more is refused
    // before sending. `{"by":1,"pad":"…"}` is 17 bytes + the pad.
    let args_of = |len: usize| format!("{{\"by\":1,\"pad\":\"{}\"}}", "p".repeat(len - 17));
    assert_eq!(args_of(MIB).len(), MIB);
    let v = b.call_ok("c1", "incr", &args_of(MIB));
    assert_eq!(n_of(&v), 2);
    let served = a.routing()["served"];
    let line = b.call("c1", "incr", &args_of(MIB + 1));
    assert_eq!(field(&line, "code"), "invalid_args", "{line}");
    assert_eq!(a.routing()["served"], served);
    tried.push("args 1 MiB ok / 1 MiB + 1 refused");

    // Responses: the envelope `{"ok":true,"result":"…"}` is 23 bytes + the
    // string; exactly 1 MiB is read, one more is do_rpc_result_unknown.
    let v = b.call_ok("c1", "big", &format!("{{\"bytes\":{}}}", MIB - 23));
    assert_eq!(v.as_str().unwrap().len(), MIB - 23);
    let line = b.call("c1", "big", &format!("{{\"bytes\":{}}}", MIB - 22));
    assert_eq!(field(&line, "code"), "do_rpc_result_unknown", "{line}");
    assert_eq!(field(&line, "outcome"), "unknown");
    tried.push("response 1 MiB ok / 1 MiB + 1 result unknown");

    // The owner's own reader: an announced body over its cap is refused
    // before reading (413); a method name of 257 bytes sent raw is 400.
    let (status, _, body) = raw(
        &a.endpoint,
        "POST",
        "/internal/do/invoke",
        &[
            ("x-durability-internal-auth", TOKEN),
            ("content-length", &(MIB + 8 * 1024 + 1).to_string()),
        ],
        b"",
    );
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    let auth = ("x-durability-internal-auth", TOKEN);
    let (status, _, body) = invoke(&a.endpoint, &[auth], "c1", &m257, "null");
    assert_eq!(status, 400);
    let env: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(env["error"], "invalid_method");
    // Lone surrogates in an object name are refused by the reader.
    let (status, _, _) = invoke(&a.endpoint, &[auth], "\\ud800", "get", "null");
    assert_eq!(status, 400);
    tried.push(
        "owner: 413 on oversized Content-Length, 400 on 257-byte method, 400 on a lone surrogate",
    );
    let v = b.call_ok("c1", "get", "null");
    assert_eq!(n_of(&v), 2, "nothing refused ran");
    eprintln!("tried: {}", tried.join("; "));
}

#[test]
fn forged_fences_headers_and_tokens_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Proc::spawn("a", dir.path());
    let v = a.call_ok("c1", "incr", "{\"by\":1}");
    assert_eq!(n_of(&v), 1);
    let endpoint = a.endpoint.clone();
    let post = |headers: &[(&str, &str)]| invoke(&endpoint, headers, "c1", "incr", "{\"by\":100}");

    let tried = assert_bad_tokens_refused(|headers| {
        let (status, _, body) = post(headers);
        (status, body)
    });
    assert_eq!(a.routing()["auth"], tried);
    let (status, _, _) = raw(&a.endpoint, "GET", "/internal/do/probe", &[], b"");
    assert_eq!(status, 401, "the probe needs the token");
    let (status, _, body) = raw(
        &a.endpoint,
        "GET",
        "/internal/do/probe",
        &[("x-durability-internal-auth", TOKEN)],
        b"",
    );
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["task"], "a");
    for path in ["/health", "/ready", "/metrics"] {
        let (status, _, _) = raw(&a.endpoint, "GET", path, &[], b"");
        assert_eq!(status, 200, "{path} is unauthenticated");
    }

    // Forged fences: a generation this host does not own, malformed ones.
    let auth = ("x-durability-internal-auth", TOKEN);
    let (status, headers, body) = post(&[
        auth,
        ("x-durability-route-task", "a"),
        ("x-durability-route-generation", "999999"),
    ]);
    assert_eq!(status, 503);
    assert_eq!(
        header(&headers, "x-durability-ownership-error"),
        Some("stale_owner")
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"],
        "stale_owner"
    );
    assert_stale_fence(post, "zz", "1", "a task that owns nothing");
    for bad in [
        vec![
            auth,
            ("x-durability-route-task", "a"),
            ("x-durability-route-generation", "0"),
        ],
        vec![
            auth,
            ("x-durability-route-task", "a"),
            ("x-durability-route-generation", "9007199254740992"),
        ],
        vec![
            auth,
            ("x-durability-route-task", "a"),
            ("x-durability-route-generation", "01"),
        ],
        vec![auth, ("x-durability-route-task", "a")],
        vec![auth, ("x-durability-route-generation", "1")],
    ] {
        let (status, _, body) = post(&bad);
        assert_eq!(status, 400, "{bad:?}");
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap()["error"],
            "invalid_fence"
        );
    }

    // Tenant-looking control headers on a request are ignored: the owner
    // answers with its own trusted headers.
    let (status, headers, _) = invoke(
        &a.endpoint,
        &[
            auth,
            ("x-durability-owner-task", "evil"),
            ("x-durability-ownership-error", "stale_owner"),
        ],
        "c1",
        "get",
        "null",
    );
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "x-durability-owner-task"), Some("a"));
    assert_eq!(header(&headers, "x-durability-ownership-error"), None);

    // A method's own error keeps its code; an unknown one is downgraded
    // and leaks nothing.
    let (status, _, body) = invoke(&a.endpoint, &[auth], "c1", "fail", "null");
    assert_eq!(status, 422);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"],
        "out_of_stock"
    );
    let (status, _, body) = invoke(&a.endpoint, &[auth], "c1", "boom", "null");
    assert_eq!(status, 500);
    let env: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (env["error"].as_str(), env["message"].as_str()),
        (Some("internal_error"), Some("Internal error"))
    );
    assert!(!String::from_utf8_lossy(&body).contains("10.0.0.9"));

    let v = a.call_ok("c1", "get", "null");
    assert_eq!(n_of(&v), 1, "no refused invoke ran");
    eprintln!(
        "tried: 4 bad tokens (401), probe without token (401), health/metrics open, 2 stale fences \
         (503 stale_owner), 5 malformed fences (400), forged control headers ignored, \
         method error kept, internal error downgraded"
    );
}

/// An object name in a shard other than those of `avoid`.
fn other_shard(avoid: &[&str]) -> String {
    (0..10_000)
        .map(|i| format!("obj{i}"))
        .find(|n| avoid.iter().all(|a| shard(n) != shard(a)))
        .unwrap()
}

/// The test's own handle on the lease store the hosts share.
fn lease_store(dir: &Path) -> SqliteLeaseStore<SystemClock> {
    SqliteLeaseStore::open(
        dir.join("leases.db"),
        SystemClock::new(),
        ShardCount::default(),
    )
    .unwrap()
}

/// Writes an owner record of `task` advertising `endpoint` for the scope
/// of `name` (free, or after releasing `previous`), as a hostile or
/// broken writer of the lease store would.
async fn plant_owner(
    store: &SqliteLeaseStore<SystemClock>,
    name: &str,
    task: &str,
    endpoint: &str,
    previous: Option<OwnerRecord>,
) -> OwnerRecord {
    if let Some(old) = previous {
        assert!(store.release(&old).await.unwrap());
    }
    match store
        .claim_as(
            &counter_scope(name),
            Claimant::new(
                &LifecycleId::new("ns:app").unwrap(),
                &TaskId::new(task).unwrap(),
                60_000,
            )
            .with_endpoint(Some(&OwnerEndpoint::new(endpoint).unwrap())),
        )
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed(lease) => lease.record,
        ClaimOutcome::Held(lease) => panic!("{name}'s scope is held: {lease:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_owner_records_are_refused_before_the_token_is_sent() {
    let (dir, _a, mut b) = a_owns_c1();
    let store = lease_store(dir.path());
    let victim = other_shard(&["c1"]);
    let trap = TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let port = trap.local_addr().unwrap().port();
    // Each passes the record's grammar (so the store keeps it) and fails
    // the host's endpoint policy.
    let hostile = [
        format!("http://localhost:{port}"),
        format!("http://127.0.0.1:{port}/evil"),
        format!("http://user@127.0.0.1:{port}"),
        format!("http://127.0.0.1:0{port}"),
        format!("http://127.0.0.1:{port}?x=1"),
        "http://8.8.8.8:80".to_owned(),
        "http://169.254.169.254:80".to_owned(),
    ];
    let mut record = None;
    for endpoint in &hostile {
        record = Some(plant_owner(&store, &victim, "evil", endpoint, record).await);
        let line = b.call(&victim, "incr", "{\"by\":100}");
        assert_eq!(
            field(&line, "code"),
            "owner_unavailable",
            "{endpoint:?}: {line}"
        );
        assert_eq!(
            field(&line, "outcome"),
            "not_started",
            "{endpoint:?}: nothing was sent: {line}"
        );
        assert!(
            trap.accept().is_err(),
            "{endpoint:?}: a connection reached the trap"
        );
    }
    assert_eq!(b.routing()["refusals"], hostile.len() as u64);
    assert_eq!(b.hint(&victim).0, "none");
    // Once the hostile record is gone, b claims the scope: nothing ran.
    assert!(store.release(&record.unwrap()).await.unwrap());
    let v = b.call_ok(&victim, "get", "null");
    assert_eq!(
        (n_of(&v), v["task"].as_str()),
        (0, Some("b")),
        "no refused call ran"
    );
    eprintln!(
        "tried: {} owner records of task evil advertising hostile endpoints for {victim}'s \
         scope, each refused by b before connecting: {hostile:?}",
        hostile.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_owner_record_on_another_loopback_port_gets_no_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Proc::spawn("a", dir.path());
    // b forwards by its default policy: loopback and private addresses on
    // its own (internal) port only.
    let mut b = Proc::spawn_with("b", dir.path(), &["policy=derived"]);
    a.call_ok("c1", "incr", "{\"by\":1}");
    let store = lease_store(dir.path());
    let victim = other_shard(&["c1"]);
    // Another local service (a database, an admin port): counts every
    // connection it accepts, before dropping it.
    let trap = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = trap.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&connections);
    std::thread::spawn(move || {
        for stream in trap.incoming() {
            seen.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    let forged = format!("http://127.0.0.1:{port}");
    let record = plant_owner(&store, &victim, "evil", &forged, None).await;
    let line = b.call(&victim, "incr", "{\"by\":100}");
    assert_eq!(
        (field(&line, "code"), field(&line, "outcome")),
        ("owner_unavailable", "not_started"),
        "{line}"
    );
    assert_eq!(connections.load(Ordering::SeqCst), 0, "nothing connects");
    assert_eq!(b.routing()["refusals"], 1);
    // Once the forged record is gone, b claims the scope: nothing ran.
    assert!(store.release(&record).await.unwrap());
    let v = b.call_ok(&victim, "get", "null");
    assert_eq!((n_of(&v), v["task"].as_str()), (0, Some("b")));
}

/// Answers one connection with `response` and returns what it received.
fn impostor(listener: TcpListener, response: String) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // Read the head and the announced body.
        loop {
            let n = s.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
            if let Some(split) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..split]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().unwrap())
                    .unwrap_or(0);
                if got.len() >= split + 4 + len {
                    break;
                }
            }
            if n == 0 {
                break;
            }
        }
        s.write_all(response.as_bytes()).unwrap();
        String::from_utf8_lossy(&got).to_string()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_answers_evict_the_hint_and_are_never_replayed() {
    let (_dir, _a, mut b, (store, victim, key)) = a_and_b_and_a_victim();
    let body = "{\"error\":\"stale_owner\",\"message\":\"replay me\"}";
    let answers = [
        // A tenant-shaped body naming a rediscovery code, no marker.
        format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ),
        // The marker on the wrong status.
        format!(
            "HTTP/1.1 500 Internal Server Error\r\nx-durability-ownership-error: stale_owner\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ),
        // A gateway error.
        "HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned(),
    ];
    let mut record = None;
    for answer in answers {
        // An impostor "owner" whose record advertises its listener: it
        // first answers a valid success with owner headers (b learns the
        // hint), then the untrusted answer to b's direct call.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let planted = plant_owner(&store, &victim, "imp", &endpoint, record.take()).await;
        let generation = planted.generation().get();
        record = Some(planted);
        let ok = "{\"ok\":true,\"result\":{\"n\":0,\"task\":\"imp\"}}";
        let first = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-durability-owner-task: imp\r\nx-durability-owner-generation: {generation}\r\nx-durability-owner-key: {key}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{ok}",
            ok.len()
        );
        let seen = impostor(listener.try_clone().unwrap(), first);
        b.call_ok(&victim, "get", "null");
        let request = seen.join().unwrap();
        assert!(
            request.contains("x-durability-route-task: imp"),
            "a fenced forward to the record's endpoint: {request}"
        );
        assert_eq!(b.hint(&victim).0, "imp");
        let seen = impostor(listener, answer.clone());
        let before = b.routing();
        let line = b.call(&victim, "incr", "{\"by\":100}");
        let request = seen.join().unwrap();
        assert!(
            request.contains("x-durability-route-task: imp"),
            "a fenced direct call: {request}"
        );
        assert_eq!(
            field(&line, "code"),
            "owner_unavailable",
            "{answer:?}: {line}"
        );
        assert_eq!(field(&line, "outcome"), "unknown");
        let after = b.routing();
        assert_eq!(
            after["rediscoveries"], before["rediscoveries"],
            "no replay after {answer:?}"
        );
        assert_eq!(
            after["forwarded"], before["forwarded"],
            "no replay after {answer:?}"
        );
        assert_eq!(after["direct"], before["direct"] + 1, "{answer:?}");
        assert_eq!(b.hint(&victim).0, "none", "hint evicted after {answer:?}");
    }
    assert!(store.release(&record.unwrap()).await.unwrap());
    let v = b.call_ok(&victim, "get", "null");
    assert_eq!(n_of(&v), 0, "nothing b sent the impostor ran anywhere");
    eprintln!(
        "tried: 3 untrusted answers from an impostor owner of {victim}'s scope (its record \
         advertising its listener; unmarked 503 naming stale_owner, marker on a 500, 504): \
         each direct call on the learned hint evicted it and returned owner_unavailable \
         without a replay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_client_routes_through_any_host_and_follows_a_takeover() {
    let (_dir, mut a, mut b, mut c) = a_owns_c1_of_three();
    let client = client(&b.endpoint);

    // Uncached: through b's router, forwarded once to a.
    let v = client
        .call("Counter", "c1", "incr", serde_json::json!({"by": 1}))
        .await
        .unwrap();
    assert_eq!((n_of(&v), v["task"].as_str()), (2, Some("a")));
    let (task, g1, endpoint) = client.hint("Counter", "c1").unwrap().unwrap();
    assert_eq!(
        (task.as_str(), endpoint.as_str()),
        ("a", a.endpoint.as_str())
    );
    assert_eq!(b.routing()["forwarded"], 1);

    // Hinted: straight to a; b sees nothing.
    let v = client
        .call("Counter", "c1", "get", Value::Null)
        .await
        .unwrap();
    assert_eq!(n_of(&v), 2);
    assert_eq!(client.stats().direct, 1);
    assert_eq!(b.routing()["served"], 1, "the direct call skipped b");

    // Takeover: a drains, c claims; the client's direct call gets a trusted
    // stale_owner from a, rediscovers once through b, which forwards to c.
    a.ask("drain", "drained ");
    let v = c.call_ok("c1", "incr", "{\"by\":1}");
    assert_eq!(v["task"], "c");
    let v = client
        .call("Counter", "c1", "incr", serde_json::json!({"by": 1}))
        .await
        .unwrap();
    assert_eq!((n_of(&v), v["task"].as_str()), (4, Some("c")));
    let s = client.stats();
    assert_eq!((s.direct, s.rediscoveries, s.routed), (2, 1, 2));
    let (task, g2, endpoint) = client.hint("Counter", "c1").unwrap().unwrap();
    assert_eq!(
        (task.as_str(), endpoint.as_str()),
        ("c", c.endpoint.as_str())
    );
    assert!(g2 > g1);

    // A wrong token is refused by the entry host before anything runs.
    let bad = wrong_token_client(&b.endpoint);
    let e = bad
        .call("Counter", "c1", "incr", Value::Null)
        .await
        .unwrap_err();
    assert_eq!(e.rpc_code(), "unauthorized");
    assert_eq!(
        e.outcome(),
        durability_ownership::DispatchOutcome::NotStarted
    );
    // A trusted error envelope: one `failed` call, nothing else.
    assert_eq!(
        bad.stats().calls,
        durability_host::ClientCalls {
            failed: 1,
            ..Default::default()
        }
    );
    let v = client
        .call("Counter", "c1", "get", Value::Null)
        .await
        .unwrap();
    assert_eq!(n_of(&v), 4, "every call ran exactly once");
    assert_eq!(
        client.stats().calls,
        durability_host::ClientCalls {
            completed: 4,
            ..Default::default()
        },
        "four calls, each completed once (the rediscovery is not a call)"
    );
    eprintln!(
        "tried: a thin client entering through b: forwarded to a@{g1}, direct to a, a drained and \
         c took over at {g2}, one rediscovery through b to c; a wrong token refused (401)"
    );
}

fn fired(p: &mut Proc, name: &str) -> Vec<String> {
    let v = p.call_ok(name, "fired", "null");
    v["fired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn an_alarm_claimed_by_another_hosts_dispatcher_runs_once_on_the_owner() {
    // a runs the only dispatcher; b owns the object and runs none, so the
    // alarm can only reach b through a's forward over the transport.
    let (_dir, mut a, mut b) = a_dispatches_b_does_not();
    let armed = b.call_ok("t1", "arm", "{\"in_ms\":200}");
    assert_eq!(armed["task"].as_str(), Some("b"));
    let line = b.wait_new("fired t1 ", 0);
    assert_eq!(field(&line, "task"), "b");
    assert_eq!(fired(&mut b, "t1"), vec!["b".to_owned()], "ran once, on b");
    let ra = a.routing();
    let rb = b.routing();
    assert_eq!(
        (ra["alarms_forwarded"], rb["alarms_served"]),
        (1, 1),
        "a forwarded the delivery once and b served it once"
    );
    assert_eq!(a.count("fired "), 0, "a never ran it");
    eprintln!(
        "tried: b owns t1 and runs no dispatcher; b armed t1's alarm; a's dispatcher claimed \
         the job, resolved b as the owner and forwarded the delivery over HTTP with the fence; \
         b admitted it at that generation and ran it once (fired=[b]); forwarded=1 served=1"
    );
}

#[test]
fn an_alarm_of_a_killed_owner_runs_on_the_survivor_after_the_lease() {
    let (_dir, mut a, mut b) = a_dispatches_b_does_not();
    b.call_ok("t2", "arm", "{\"in_ms\":400}");
    b.kill();
    // a's forward finds no one listening (connection refused: provably
    // never started), waits for b's lease, then claims the scope and runs
    // the alarm itself.
    let line = a.wait_new("fired t2 ", 0);
    assert_eq!(field(&line, "task"), "a");
    assert_eq!(fired(&mut a, "t2"), vec!["a".to_owned()], "ran once, on a");
    let r = a.routing();
    assert!(r["alarms_forwarded"] >= 1, "{r:?}");
    eprintln!(
        "tried: b armed t2 and was SIGKILLed before it was due; a's forwards to b were \
         refused at connect ({} tried, each never started, no try used), then b's lease \
         expired, a took the scope over and ran the alarm once (fired=[a])",
        r["alarms_forwarded"]
    );
}

#[test]
fn the_alarm_endpoint_admits_only_at_its_fence() {
    let (_dir, mut a, mut b) = a_dispatches_b_does_not();
    b.call_ok("t3", "get", "null");
    a.call_ok("t3", "get", "null");
    let (owner, g) = a.hint("t3");
    assert_eq!(owner, "b");
    let body = |object: &str| {
        format!(
            "{{\"object\":\"{object}\",\"token\":\"0123456789abcdef0123456789abcdef\",\
             \"scheduledAt\":1,\"attempt\":1,\"finalAttempt\":false}}"
        )
        .into_bytes()
    };
    let g_s = g.to_string();
    let stale = (g + 1).to_string();
    let post = |headers: &[(&str, &str)], body: &[u8]| {
        let (status, _, out) = raw(&b.endpoint, "POST", "/internal/do/alarm", headers, body);
        (status, String::from_utf8(out).unwrap())
    };
    let auth = ("x-durability-internal-auth", TOKEN);
    let fence_b = [
        auth,
        ("x-durability-route-task", "b"),
        ("x-durability-route-generation", g_s.as_str()),
    ];
    // No live row carries this token: admitted at b@g, then ignored.
    assert_eq!(
        post(&fence_b, &body("st1:Counter:t3")),
        (200, r#"{"ok":true,"ignored":true}"#.to_owned())
    );
    let never = (
        200,
        r#"{"ok":false,"error":"do_alarm_dispatch_failed","started":false}"#.to_owned(),
    );
    // A fence naming another task, or a stale generation: never started.
    let fence_a = [
        auth,
        ("x-durability-route-task", "a"),
        ("x-durability-route-generation", g_s.as_str()),
    ];
    assert_eq!(post(&fence_a, &body("st1:Counter:t3")), never);
    let fence_stale = [
        auth,
        ("x-durability-route-task", "b"),
        ("x-durability-route-generation", stale.as_str()),
    ];
    assert_eq!(post(&fence_stale, &body("st1:Counter:t3")), never);
    // No fence, no token, a wrong token, a malformed delivery: refused
    // before anything runs.
    assert_eq!(post(&[auth], &body("st1:Counter:t3")).0, 400);
    assert_eq!(post(&fence_b[1..], &body("st1:Counter:t3")).0, 401);
    let wrong = [
        ("x-durability-internal-auth", "wrong-token-0123456789abc"),
        fence_b[1],
        fence_b[2],
    ];
    assert_eq!(post(&wrong, &body("st1:Counter:t3")).0, 401);
    assert_eq!(post(&fence_b, b"{\"object\":\"st1:Counter:t3\"}").0, 400);
    let zero_attempt = String::from_utf8(body("st1:Counter:t3"))
        .unwrap()
        .replace("\"attempt\":1", "\"attempt\":0");
    assert_eq!(post(&fence_b, zero_attempt.as_bytes()).0, 400);
    assert_eq!(fired(&mut b, "t3"), Vec::<String>::new(), "nothing ran");
    let rb = b.routing();
    assert_eq!(rb["alarms_served"], 3, "{rb:?}");
    assert!(rb["auth"] >= 2, "{rb:?}");
    eprintln!(
        "tried: POST /internal/do/alarm on b (owner at {g}): fence b@{g} with an unknown token \
         → ignored; fence a@{g} and b@{} → never started; no fence → 400; no/wrong token → \
         401; a malformed delivery and attempt 0 → 400; nothing ran",
        g + 1
    );
}
