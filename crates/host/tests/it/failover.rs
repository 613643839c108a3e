//! [`durability_host::FailoverClient`] against three hosts serving over
//! HTTP/1.1 on loopback ports: calls continue through the other entries
//! when one entry host is dead (its listener closed: connections are
//! refused), with backoff on the injected clock; an RPC whose answer is
//! lost after it was sent is reported as an unknown outcome and not
//! replayed; an idempotency key lets the client re-send it and it still
//! runs once; a `GET` is replayed per the rules and a `POST` is not.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use durability_host::fetch::{FetchRequest, FetchResponse};
use durability_host::idempotency::IdempotencyKey;
use durability_host::transport::{
    Endpoint, EndpointPolicy, FetchInvoke, HttpTransport, InternalToken, InvokeRequest, Reply,
    Transport,
};
use durability_host::{EntryBackoff, FailoverClient, HostError, OwnPolicy};
use durability_ownership::{Clock as _, ShardCount};
use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::edge::{Node, node};
use crate::rpc::TOKEN;
use crate::support::{STORAGE, World};

/// How a lost answer looks to the caller.
#[derive(Clone, Copy)]
enum Loss {
    /// The connection was reset after the request was sent.
    Reset,
    /// A success whose body could not be read.
    Unreadable,
}

/// HTTP/1.1 that records where each request went and, while `lose` is
/// above zero, sends the request for real and then loses its answer.
#[derive(Clone)]
struct Lossy {
    inner: Arc<HttpTransport>,
    sent: Arc<Mutex<Vec<String>>>,
    lose: Arc<AtomicUsize>,
    loss: Arc<Mutex<Loss>>,
}

impl Lossy {
    fn new() -> Self {
        Self {
            inner: Arc::new(HttpTransport::default()),
            sent: Arc::default(),
            lose: Arc::default(),
            loss: Arc::new(Mutex::new(Loss::Reset)),
        }
    }

    fn lose_next(&self, loss: Loss) {
        *self.loss.lock().unwrap() = loss;
        self.lose.store(1, Ordering::SeqCst);
    }

    fn sent(&self) -> Vec<String> {
        self.sent.lock().unwrap().clone()
    }

    fn count(&self, endpoint: &str) -> usize {
        self.sent()
            .iter()
            .filter(|e| e.as_str() == endpoint)
            .count()
    }

    /// The answer after the request went out: lost, or as it came.
    fn after<T>(&self, reply: Reply<T>) -> Reply<T> {
        if self
            .lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            return reply;
        }
        match *self.loss.lock().unwrap() {
            Loss::Reset => Reply::Unmarked {
                reason: "connection reset after the request was sent".to_owned(),
            },
            Loss::Unreadable => Reply::ResultUnknown {
                reason: "the body was cut".to_owned(),
            },
        }
    }
}

impl Transport for Lossy {
    fn invoke<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        token: &'a InternalToken,
        request: &'a InvokeRequest,
    ) -> BoxFuture<'a, Reply> {
        self.sent.lock().unwrap().push(endpoint.url());
        Box::pin(async move { self.after(self.inner.invoke(endpoint, token, request).await) })
    }

    fn fetch<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        token: &'a InternalToken,
        request: &'a FetchInvoke,
    ) -> BoxFuture<'a, Reply<FetchResponse>> {
        self.sent.lock().unwrap().push(endpoint.url());
        Box::pin(async move { self.after(self.inner.fetch(endpoint, token, request).await) })
    }
}

/// Hosts `a` (owns every shard), `b` and `c` (own none), the fetch
/// handlers' dispatch count, and a client over `entries` of them.
struct Cluster {
    world: World,
    a: Node,
    b: Option<Node>,
    c: Option<Node>,
    dispatched: Arc<AtomicUsize>,
    transport: Lossy,
}

impl Cluster {
    async fn new() -> Self {
        let world = World::new();
        let dispatched = Arc::new(AtomicUsize::new(0));
        let a = node(&world, "a", OwnPolicy::AllShards, Arc::clone(&dispatched)).await;
        let b = node(&world, "b", OwnPolicy::OnDemand, Arc::clone(&dispatched)).await;
        let c = node(&world, "c", OwnPolicy::OnDemand, Arc::clone(&dispatched)).await;
        Self {
            world,
            a,
            b: Some(b),
            c: Some(c),
            dispatched,
            transport: Lossy::new(),
        }
    }

    fn client(&self, entries: &[&str]) -> FailoverClient {
        FailoverClient::with(
            entries,
            TOKEN,
            STORAGE,
            ShardCount::default(),
            EndpointPolicy::loopback(),
            Arc::new(self.transport.clone()) as Arc<dyn Transport>,
        )
        .unwrap()
        .clock(Arc::new(self.world.clock.clone()))
        .backoff(EntryBackoff {
            base_ms: 500,
            max_ms: 4_000,
        })
    }

    /// A client entering through b, then c.
    fn client_via_b_and_c(&self) -> FailoverClient {
        self.client(&[&self.b().endpoint, &self.c().endpoint])
    }

    /// The endpoints of b and c, the client's entries.
    fn entries(&self) -> (String, String) {
        (self.b().endpoint.clone(), self.c().endpoint.clone())
    }

    fn b(&self) -> &Node {
        self.b.as_ref().unwrap()
    }

    fn c(&self) -> &Node {
        self.c.as_ref().unwrap()
    }
}

/// `incr` on `Counter` `name` through `client`, which must succeed.
async fn incr(client: &FailoverClient, name: &str) -> Value {
    client
        .call("Counter", name, "incr", Value::Null)
        .await
        .unwrap()
}

fn n(v: &Value) -> i64 {
    v["n"].as_i64().unwrap_or_else(|| panic!("{v}"))
}

/// A name of a shard the client holds no hint for (its call goes through
/// the entries).
fn unhinted(client: &FailoverClient, from: usize) -> String {
    (from..)
        .map(|i| format!("o{i}"))
        .find(|name| client.rpc().hint("Counter", name).unwrap().is_none())
        .unwrap()
}

#[tokio::test]
async fn calls_continue_through_the_other_entries_while_one_entry_host_is_dead() {
    let mut cluster = Cluster::new().await;
    let (b_endpoint, c_endpoint) = cluster.entries();
    let a_endpoint = cluster.a.endpoint.clone();
    let _b_host = cluster.b.take().unwrap().kill_listener().await;
    let client = cluster.client(&[&b_endpoint, &c_endpoint, &a_endpoint]);

    // The first call finds b dead (nothing sent) and goes on to c in the
    // same call; c forwards to the owner a.
    let first = client
        .call("Counter", "o0", "incr", Value::Null)
        .await
        .unwrap();
    assert_eq!(n(&first), 1);
    assert_eq!(
        cluster.transport.sent(),
        vec![b_endpoint.clone(), c_endpoint.clone()]
    );
    let stats = client.stats();
    assert_eq!(stats.failovers, 1);
    assert_eq!(stats.entries[0].failures, 1);
    let start = cluster.world.clock.now_ms();
    assert_eq!(stats.entries[0].down_until_ms, Some(start + 500));

    // While b backs off (the clock does not move), calls through the
    // entries never try it; every call completes.
    let mut names = Vec::new();
    for i in 0..6 {
        let name = unhinted(&client, 100 * (i + 1));
        let v = incr(&client, &name).await;
        assert_eq!(n(&v), 1, "{name}");
        names.push(name);
    }
    assert_eq!(
        cluster.transport.count(&b_endpoint),
        1,
        "{:?}",
        cluster.transport.sent()
    );
    assert_eq!(client.stats().client.calls.completed, 7);

    // Past the backoff, b is tried again (still dead: the next entry
    // serves the same call) and its backoff doubles.
    cluster.world.clock.advance(500);
    let name = unhinted(&client, 10_000);
    let v = incr(&client, &name).await;
    assert_eq!(n(&v), 1);
    assert_eq!(cluster.transport.count(&b_endpoint), 2);
    let stats = client.stats();
    assert_eq!(stats.entries[0].failures, 2);
    assert_eq!(stats.entries[0].down_until_ms, Some(start + 500 + 1_000));
    // The entries that answered carry no failure.
    assert_eq!(stats.entries[1].failures, 0);
    // Each call ran once: a second call on each object counts 2.
    for name in &names {
        let v = incr(&client, name).await;
        assert_eq!(n(&v), 2, "{name}");
    }
    // Every entry dead but the owner: calls still complete.
    let _c_host = cluster.c.take().unwrap().kill_listener().await;
    let name = unhinted(&client, 20_000);
    let v = incr(&client, &name).await;
    assert_eq!(n(&v), 1);
    assert_eq!(
        cluster.transport.sent().last().map(String::as_str),
        Some(a_endpoint.as_str())
    );
}

#[tokio::test]
async fn an_rpc_whose_answer_is_lost_after_sending_is_unknown_and_not_replayed() {
    let cluster = Cluster::new().await;
    let client = cluster.client_via_b_and_c();
    for (i, loss) in [Loss::Reset, Loss::Unreadable].into_iter().enumerate() {
        let name = format!("u{i}");
        let before = cluster.transport.sent().len();
        cluster.transport.lose_next(loss);
        let e = client
            .call("Counter", &name, "incr", Value::Null)
            .await
            .unwrap_err();
        assert!(FailoverClient::outcome_unknown(&e), "{e:?}");
        match loss {
            Loss::Reset => assert!(matches!(e, HostError::OwnerUnavailable { .. }), "{e:?}"),
            Loss::Unreadable => assert!(matches!(e, HostError::RpcResultUnknown { .. }), "{e:?}"),
        }
        // Sent once, not replayed, no other entry tried.
        assert_eq!(cluster.transport.sent().len(), before + 1);
        // It did run, once: the next call counts 2.
        let v = incr(&client, &name).await;
        assert_eq!(n(&v), 2);
    }
    let stats = client.stats();
    assert_eq!(stats.client.calls.unknown, 1);
    assert_eq!(stats.client.calls.unavailable, 1);
    assert_eq!(stats.resends, 0);
}

#[tokio::test]
async fn an_idempotency_key_lets_the_client_resend_and_the_call_still_runs_once() {
    let cluster = Cluster::new().await;
    let client = cluster.client_via_b_and_c();
    let key = IdempotencyKey::new("order-7f3a").unwrap();
    for loss in [Loss::Reset, Loss::Unreadable] {
        cluster.transport.lose_next(loss);
        let v = client
            .call_idempotent("Counter", "k1", "incr_once", &key, json!({}))
            .await
            .unwrap();
        // The lost first send ran; the re-send answered its recorded result.
        assert_eq!(n(&v), 1);
    }
    assert_eq!(client.stats().resends, 2);
    // Ran exactly once: a plain call counts 2, a new key runs again.
    let v = client
        .call("Counter", "k1", "incr", Value::Null)
        .await
        .unwrap();
    assert_eq!(n(&v), 2);
    let other = IdempotencyKey::new("order-7f3b").unwrap();
    let v = client
        .call_idempotent("Counter", "k1", "incr_once", &other, json!({}))
        .await
        .unwrap();
    assert_eq!(n(&v), 3);
    // A bad key is refused before anything is sent.
    assert!(IdempotencyKey::new("").is_err());
    assert!(IdempotencyKey::new("has space").is_err());
}

#[tokio::test]
async fn a_get_is_replayed_per_the_rules_through_the_next_entry_and_a_post_is_not() {
    let cluster = Cluster::new().await;
    let (b, c) = cluster.entries();
    let client = cluster.client_via_b_and_c();

    cluster.transport.lose_next(Loss::Reset);
    let r = client
        .fetch("Counter", "g1", FetchRequest::new("GET", "/g1"))
        .await
        .unwrap();
    assert_eq!(r.status, 201);
    // Lost through b, replayed once through c; the handler ran twice (a
    // GET is safe to replay).
    assert_eq!(cluster.transport.sent(), vec![b.clone(), c.clone()]);
    assert_eq!(cluster.dispatched.load(Ordering::SeqCst), 2);

    cluster.transport.lose_next(Loss::Reset);
    let e = client
        .fetch("Counter", "p1", FetchRequest::new("POST", "/p1").body("x"))
        .await
        .unwrap_err();
    assert!(FailoverClient::outcome_unknown(&e), "{e:?}");
    // Sent once, not replayed; it ran.
    assert_eq!(cluster.transport.sent().len(), 3);
    assert_eq!(cluster.dispatched.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_corrupt_recorded_result_is_a_typed_error_for_its_key_only_and_keys_can_be_pruned() {
    let cluster = Cluster::new().await;
    let client = cluster.client_via_b_and_c();
    let (k1, k2) = (
        IdempotencyKey::new("k-1").unwrap(),
        IdempotencyKey::new("k-2").unwrap(),
    );
    for key in [&k1, &k2] {
        let v = client
            .call_idempotent("Counter", "z1", "incr_once", key, json!({}))
            .await
            .unwrap();
        assert!(n(&v) >= 1);
    }
    // Corrupt k-1's recorded result in the object's own table, on its owner.
    let changed = cluster
        .a
        .host
        .transaction::<crate::support::Counter, _, _>("Counter", "z1", |_, tx| {
            tx.sql()
                .execute(
                    "UPDATE idempotency_keys SET result = 'not json' WHERE key = 'k-1'",
                    [],
                )
                .map_err(|e| durability_scheduler::StorageError::backend("test", e))
        })
        .await
        .unwrap();
    assert_eq!(changed, 1);
    let sent = cluster.transport.sent().len();
    let e = client
        .call_idempotent("Counter", "z1", "incr_once", &k1, json!({}))
        .await
        .unwrap_err();
    // A definite, typed failure (the method's storage error), not an
    // unknown outcome: not re-sent.
    assert!(!FailoverClient::outcome_unknown(&e), "{e:?}");
    assert_eq!(e.rpc_code(), "internal_error", "{e:?}");
    assert_eq!(cluster.transport.sent().len(), sent + 1);
    // The other key still answers its recorded result.
    let v = client
        .call_idempotent("Counter", "z1", "incr_once", &k2, json!({}))
        .await
        .unwrap();
    assert_eq!(n(&v), 2);
    // Pruning removes the recorded keys; the same key then runs again.
    let pruned = cluster
        .a
        .host
        .transaction::<crate::support::Counter, _, _>("Counter", "z1", |_, tx| {
            durability_host::idempotency::prune(tx, 10)
        })
        .await
        .unwrap();
    assert_eq!(pruned, 2);
    let v = client
        .call_idempotent("Counter", "z1", "incr_once", &k2, json!({}))
        .await
        .unwrap();
    assert_eq!(n(&v), 3);
}

#[tokio::test]
async fn a_draining_entry_host_is_left_for_the_next_entry() {
    let cluster = Cluster::new().await;
    let (b, c) = cluster.entries();
    let client = cluster.client_via_b_and_c();
    // b drains (SIGTERM) but keeps its listener open.
    let _ = cluster.b().host.shutdown().await;
    let mut results = Vec::new();
    for i in 0..4 {
        let name = unhinted(&client, 1_000 * (i + 1));
        results.push(client.call("Counter", &name, "incr", Value::Null).await);
    }
    eprintln!(
        "{results:?} {:?} {:?}",
        cluster.transport.sent(),
        client.stats()
    );
    // Only the first call meets the draining entry: a trusted refusal
    // before dispatch (nothing ran), never an unknown outcome, not re-sent.
    let e = results[0].as_ref().unwrap_err();
    assert!(!FailoverClient::outcome_unknown(e), "{e:?}");
    assert_eq!(e.rpc_code(), "draining", "{e:?}");
    for r in &results[1..] {
        assert_eq!(n(r.as_ref().unwrap()), 1);
    }
    assert_eq!(
        cluster.transport.count(&b),
        1,
        "{:?}",
        cluster.transport.sent()
    );
    assert_eq!(cluster.transport.count(&c), 3);
    assert_eq!(client.stats().entries[0].failures, 1);
}
