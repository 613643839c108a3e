//! RPC through the host: local calls, refusals before dispatch, start-time
//! checks, and the router's replay rules against a scripted transport (a
//! second host owns the scope; the transport's answers are scripted, so
//! every rule is checked without timing).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use durability_host::transport::{
    Endpoint, EndpointPolicy, InternalToken, InvokeRequest, OwnerHeaders, Reply, StaticPeers,
    Transport,
};
use durability_host::{BoxError, Handle, HostConfig, HostError, MethodError};
use durability_ownership::DispatchOutcome;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::support::{Counter, Store, TestHost, World};

pub(crate) const TOKEN: &str = "in-process-token-0123456789";

type H = Handle<Counter, SqliteAlarmIndex>;

pub(crate) fn with_methods(
    config: HostConfig<Store, SqliteAlarmIndex>,
) -> HostConfig<Store, SqliteAlarmIndex> {
    config
        .method("Counter", "incr", |h: H, _args: Value| async move {
            let n = h.scheduler.transaction(|tx| h.object.incr(tx))?;
            Ok(json!({ "n": n }))
        })
        .method("Counter", "fail", |_h: H, _args: Value| async move {
            Err::<Value, BoxError>(Box::new(MethodError::new("out_of_stock", "none left")))
        })
        .method(
            "Counter",
            "echo",
            |_h: H, args: Value| async move { Ok(args) },
        )
}

#[tokio::test]
async fn methods_run_locally_and_bad_calls_are_refused_before_dispatch() {
    let w = World::new();
    let host: TestHost = TestHost::start(with_methods(w.config("a"))).await.unwrap();
    let c1 = host.object_by_name("Counter", "c1");
    assert_eq!(
        c1.call("incr", Value::Null).await.unwrap(),
        json!({ "n": 1 })
    );
    assert_eq!(
        c1.call("incr", Value::Null).await.unwrap(),
        json!({ "n": 2 })
    );
    assert_eq!(
        c1.call("echo", json!({"a": [1, "x", null]})).await.unwrap(),
        json!({"a": [1, "x", null]})
    );
    let completed = host.probe().dispatch.completed;

    let refusals: Vec<(HostError, &str)> = vec![
        (
            c1.call("nope", Value::Null).await.unwrap_err(),
            "host_unknown_method",
        ),
        (
            c1.call("1bad", Value::Null).await.unwrap_err(),
            "host_invalid_method",
        ),
        (
            c1.call(&"m".repeat(257), Value::Null).await.unwrap_err(),
            "host_invalid_method",
        ),
        (
            c1.call("echo", Value::String("x".repeat(1024 * 1024)))
                .await
                .unwrap_err(),
            "host_invalid_args",
        ),
        (
            host.object_by_name("Nope", "c1")
                .call("incr", Value::Null)
                .await
                .unwrap_err(),
            "host_unknown_class",
        ),
        (
            host.object_by_name("Counter", "")
                .call("incr", Value::Null)
                .await
                .unwrap_err(),
            "host_invalid_object_name",
        ),
    ];
    for (e, code) in &refusals {
        assert_eq!(e.code(), *code, "{e}");
        assert_eq!(e.outcome(), DispatchOutcome::NotStarted, "{e}");
    }
    assert_eq!(
        host.probe().dispatch.completed,
        completed,
        "nothing refused ran"
    );

    // A method's own error keeps its code (the handler ran: unknown outcome).
    let e = c1.call("fail", Value::Null).await.unwrap_err();
    assert_eq!(
        (e.code(), e.rpc_code().as_str()),
        ("host_method_error", "out_of_stock")
    );
    assert_eq!(e.outcome(), DispatchOutcome::Unknown);
    assert_eq!(
        c1.call("incr", Value::Null).await.unwrap(),
        json!({ "n": 3 })
    );
    host.shutdown().await;
}

#[tokio::test]
async fn start_refuses_bad_methods_tokens_and_endpoints() {
    let w = World::new();
    let cases: Vec<(HostConfig<Store, SqliteAlarmIndex>, &str)> = vec![
        (
            w.config("a")
                .method("Counter", "1x", |_h: H, a: Value| async move { Ok(a) }),
            "methods",
        ),
        (
            w.config("a")
                .method("Other", "x", |_h: H, a: Value| async move { Ok(a) }),
            "methods",
        ),
        (w.config("a").internal_token("short"), "internal_token"),
        (
            // The support config's endpoint has a path: refused once calls
            // between hosts are on.
            w.config("a").internal_token(TOKEN),
            "endpoint",
        ),
        (
            w.config("a")
                .internal_token(TOKEN)
                .endpoint("http://8.8.8.8:8788"),
            "endpoint",
        ),
        (
            // A token and no endpoint: no internal port to derive a
            // policy from, and no explicit one.
            w.bare("a", "st1").internal_token(TOKEN),
            "endpoint_policy",
        ),
        (
            // An explicit policy its own endpoint does not pass.
            w.config("a")
                .internal_token(TOKEN)
                .endpoint("http://127.0.0.1:8788")
                .endpoint_policy(EndpointPolicy::ports([8789])),
            "endpoint",
        ),
    ];
    for (config, setting) in cases {
        match TestHost::start(config).await {
            Err(HostError::InvalidSetting { setting: s, .. }) => assert_eq!(s, setting),
            Err(e) => panic!("{setting}: {e}"),
            Ok(_) => panic!("{setting}: started"),
        }
    }
}

/// A transport whose replies are scripted; records every request.
#[derive(Clone, Default)]
pub(crate) struct Scripted {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    sent: Arc<Mutex<Vec<(String, InvokeRequest)>>>,
}

impl Scripted {
    pub(crate) fn script(&self, replies: Vec<Reply>) {
        *self.replies.lock().unwrap() = replies.into();
        self.sent.lock().unwrap().clear();
    }

    pub(crate) fn sent(&self) -> Vec<(String, InvokeRequest)> {
        self.sent.lock().unwrap().clone()
    }
}

impl Transport for Scripted {
    fn invoke<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        _token: &'a InternalToken,
        request: &'a InvokeRequest,
    ) -> BoxFuture<'a, Reply> {
        self.sent
            .lock()
            .unwrap()
            .push((endpoint.url(), request.clone()));
        let reply = self
            .replies
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Reply::Unmarked {
                reason: "script exhausted".to_owned(),
            });
        Box::pin(async move { reply })
    }
}

/// Host `a` of `w` with the methods, `c1` incremented once on it.
pub(crate) async fn a_with_c1(w: &World) -> TestHost {
    let a = TestHost::start(with_methods(w.config("a"))).await.unwrap();
    a.object_by_name("Counter", "c1")
        .call("incr", Value::Null)
        .await
        .unwrap();
    a
}

/// Host `b` of `w`, whose router reaches peer `a` (at a fixed loopback
/// endpoint) only through the returned scripted transport.
pub(crate) async fn scripted_b(w: &World) -> (TestHost, Scripted) {
    let transport = Scripted::default();
    let peers = StaticPeers(BTreeMap::from([(
        "a".to_owned(),
        "http://127.0.0.1:18788".to_owned(),
    )]));
    let b = TestHost::start(
        with_methods(w.config("b"))
            .endpoint("http://127.0.0.1:18789")
            .internal_token(TOKEN)
            .peers(peers)
            .endpoint_policy(EndpointPolicy::default())
            .transport(transport.clone()),
    )
    .await
    .unwrap();
    (b, transport)
}

pub(crate) fn ownership(code: &str) -> Reply {
    Reply::Ownership {
        code: code.to_owned(),
    }
}

#[tokio::test]
async fn the_router_follows_the_replay_rules() {
    let w = World::new();
    let a = a_with_c1(&w).await;
    let generation = a.probe().scopes[0].generation;
    let key = a.scope_for("Counter", "c1").unwrap().host_id().to_owned();

    let (b, transport) = scripted_b(&w).await;
    let c1 = b.object_by_name("Counter", "c1");
    let ok = |owner: Option<OwnerHeaders>| Reply::Ok {
        result: json!({"n": 7}),
        owner,
    };
    let headers = |key: &str| {
        Some(OwnerHeaders {
            task: "a".to_owned(),
            generation,
            key: key.to_owned(),
            endpoint: None,
        })
    };
    let mut tried = 0;

    // A stale_owner twice: one rediscovery, then the trusted code, not started.
    transport.script(vec![ownership("stale_owner"), ownership("stale_owner")]);
    let e = c1.call("incr", Value::Null).await.unwrap_err();
    assert_eq!(
        (e.rpc_code().as_str(), e.outcome()),
        ("stale_owner", DispatchOutcome::NotStarted)
    );
    assert_eq!(transport.sent().len(), 2, "exactly one rediscovery");
    tried += 1;

    // Trusted but not a rediscovery code: terminal for RPC.
    transport.script(vec![ownership("draining")]);
    let e = c1.call("incr", Value::Null).await.unwrap_err();
    assert_eq!(e.rpc_code(), "draining");
    assert_eq!(transport.sent().len(), 1);
    tried += 1;

    // Unknown outcomes are never replayed.
    for (reply, code) in [
        (
            Reply::ResultUnknown {
                reason: "cut".to_owned(),
            },
            "do_rpc_result_unknown",
        ),
        (
            Reply::Unmarked {
                reason: "reset".to_owned(),
            },
            "owner_unavailable",
        ),
    ] {
        transport.script(vec![reply, ok(headers(&key))]);
        let e = c1.call("incr", Value::Null).await.unwrap_err();
        assert_eq!((e.code(), e.outcome()), (code, DispatchOutcome::Unknown));
        assert_eq!(transport.sent().len(), 1, "{code} not replayed");
        tried += 1;
    }

    // A success whose owner headers name another scope teaches nothing.
    transport.script(vec![ok(headers("st1:Counter:shard999"))]);
    assert_eq!(c1.call("incr", Value::Null).await.unwrap(), json!({"n": 7}));
    assert_eq!(b.owner_hint("Counter", "c1").unwrap(), None);
    tried += 1;

    // A matching one does; the next call goes direct with the fence.
    transport.script(vec![ok(headers(&key)), ok(headers(&key))]);
    c1.call("incr", Value::Null).await.unwrap();
    let hint = b.owner_hint("Counter", "c1").unwrap().unwrap();
    assert_eq!(
        (hint.task.as_str(), hint.generation.get()),
        ("a", generation)
    );
    c1.call("incr", Value::Null).await.unwrap();
    let sent = transport.sent();
    assert_eq!(sent.len(), 2);
    for (endpoint, request) in &sent {
        assert_eq!(endpoint, "http://127.0.0.1:18788");
        let fence = request.fence.clone().unwrap();
        assert_eq!((fence.task.as_str(), fence.generation), ("a", generation));
    }
    assert_eq!(b.probe().routing.direct, 1);
    tried += 1;

    // A hinted call answered stale_owner rediscovers once through the router.
    transport.script(vec![ownership("stale_owner"), ok(headers(&key))]);
    c1.call("incr", Value::Null).await.unwrap();
    assert_eq!(transport.sent().len(), 2);
    assert_eq!(b.probe().routing.rediscoveries, 2);
    tried += 1;

    // An unmarked failure on the hinted path evicts the hint.
    transport.script(vec![Reply::Unmarked {
        reason: "reset".to_owned(),
    }]);
    let e = c1.call("incr", Value::Null).await.unwrap_err();
    assert_eq!(e.code(), "owner_unavailable");
    assert_eq!(b.owner_hint("Counter", "c1").unwrap(), None);
    tried += 1;

    // The owner's validated error passes with its code.
    transport.script(vec![Reply::Failed {
        status: 422,
        code: "out_of_stock".to_owned(),
        message: "none left".to_owned(),
        details: None,
    }]);
    let e = c1.call("fail", Value::Null).await.unwrap_err();
    assert_eq!(
        (e.rpc_code().as_str(), e.outcome()),
        ("out_of_stock", DispatchOutcome::Unknown)
    );
    tried += 1;
    eprintln!("tried: {tried} scripted owner answers against b's router");
    b.shutdown().await;
    a.shutdown().await;
}

/// A listener that accepts, counts and drops every connection.
fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            // Counted before the connection is dropped, so a caller that saw
            // it fail sees the count.
            seen.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (port, count)
}

#[tokio::test]
async fn a_forged_owner_record_on_another_local_port_gets_no_request() {
    let w = World::new();
    let (port, connections) = counting_listener();
    // The "owner" a writes records advertising the counting listener (a
    // local service that is not a host): a forged owner record.
    let a = TestHost::start(
        with_methods(w.config("a"))
            .endpoint(&format!("http://127.0.0.1:{port}"))
            .internal_token(TOKEN)
            .endpoint_policy(EndpointPolicy::ports([port])),
    )
    .await
    .unwrap();
    a.object_by_name("Counter", "c1")
        .call("incr", Value::Null)
        .await
        .unwrap();
    // b has the default policy: its own internal port only.
    let b = TestHost::start(
        with_methods(w.config("b"))
            .endpoint("http://127.0.0.1:18789")
            .internal_token(TOKEN),
    )
    .await
    .unwrap();
    let e = b
        .object_by_name("Counter", "c1")
        .call("incr", Value::Null)
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.outcome()),
        ("owner_unavailable", DispatchOutcome::NotStarted),
        "{e}"
    );
    assert_eq!(b.probe().routing.endpoint_refusals, 1);
    assert_eq!(connections.load(Ordering::SeqCst), 0, "nothing connects");
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn debug_output_names_the_host_but_never_its_internal_token() {
    let w = World::new();
    let config = w
        .config("a")
        .internal_token(TOKEN)
        .endpoint("http://127.0.0.1:8788");
    let shown = format!("{config:?}");
    assert!(
        shown.contains("HostConfig") && shown.contains("\"a\""),
        "{shown}"
    );
    assert!(
        !shown.contains(TOKEN),
        "the config leaks its token: {shown}"
    );
    let host: TestHost = TestHost::start(config).await.unwrap();
    let shown = format!("{host:?} {:?}", host.object_by_name("Counter", "c1"));
    assert!(
        shown.contains("Host {") && shown.contains("ObjectRef"),
        "{shown}"
    );
    assert!(!shown.contains(TOKEN), "the host leaks its token: {shown}");
    host.shutdown().await;
}

/// A class as a type: it knows its name.
struct Ledger;

impl durability_host::Class for Ledger {
    const NAME: &'static str = "Ledger";
}

impl Ledger {
    fn add(
        tx: &mut durability_scheduler::Transaction<
            '_,
            '_,
            durability_storage_sqlite::SqliteStorage,
        >,
        n: i64,
    ) -> Result<i64, durability_scheduler::StorageError> {
        let sql = |e| durability_scheduler::StorageError::backend("ledger", e);
        tx.sql()
            .execute_batch("CREATE TABLE IF NOT EXISTS ledger (n INTEGER NOT NULL)")
            .map_err(sql)?;
        tx.sql()
            .execute("INSERT INTO ledger (n) VALUES (?1)", [n])
            .map_err(sql)?;
        tx.sql()
            .query_row("SELECT SUM(n) FROM ledger", [], |r| r.get(0))
            .map_err(sql)
    }
}

#[tokio::test]
async fn a_class_type_names_its_class_once_and_keeps_the_wire_names() {
    let w = World::new();
    let config = w
        .config("a")
        .class_of(|_ctx| Ok::<_, BoxError>(Ledger))
        .method(
            "add",
            |h: Handle<Ledger, SqliteAlarmIndex>, args: Value| async move {
                let n = args["n"].as_i64().unwrap_or(0);
                let total = h.scheduler.transaction(|tx| Ledger::add(tx, n))?;
                Ok(json!({ "total": total }))
            },
        )
        .done();
    let host: TestHost = TestHost::start(config).await.unwrap();
    let l1 = host.object::<Ledger>("l1");
    assert_eq!(
        l1.by_name().call("add", json!({"n": 2})).await.unwrap(),
        json!({"total": 2})
    );
    // No turbofish, no class name: the type says both.
    assert_eq!(l1.transaction(|_, tx| Ledger::add(tx, 3)).await.unwrap(), 5);
    let generation = l1
        .run(|h| async move { Ok::<_, BoxError>(h.generation) })
        .await
        .unwrap();
    assert!(generation > 0);
    // The wire keeps the class name: the untyped path reaches the same
    // object, in the same scope.
    assert_eq!(
        host.object_by_name("Ledger", "l1")
            .call("add", json!({"n": 1}))
            .await
            .unwrap(),
        json!({"total": 6})
    );
    assert_eq!(
        host.scope_for(<Ledger as durability_host::Class>::NAME, "l1")
            .unwrap()
            .to_string(),
        host.scope_for("Ledger", "l1").unwrap().to_string()
    );
    assert_eq!(l1.by_name().class(), "Ledger");
    host.shutdown().await;
}

#[tokio::test]
async fn another_object_store_plugs_in_through_with_store_and_typed_ids() {
    use durability_host::{SqliteObjectStore, StorageId};
    let w = World::new();
    let ids = crate::support::ids(crate::support::STORAGE, "a");
    // The ids were checked when they were made: a bad one never reaches a
    // configuration.
    assert!(StorageId::new("bad:id").is_err());
    let config =
        HostConfig::with_store(w.store(), w.index(), SqliteObjectStore::new(w.root()), ids)
            .clock(Arc::new(w.clock.clone()))
            .create_active_storage_if_absent(true)
            .class_of(|_ctx| Ok::<_, BoxError>(Ledger))
            .done();
    let host: TestHost = TestHost::start(config).await.unwrap();
    let l1 = host.object::<Ledger>("l1");
    assert_eq!(l1.transaction(|_, tx| Ledger::add(tx, 4)).await.unwrap(), 4);
    assert_eq!(host.probe().task, "a");
    assert_eq!(host.probe().storage_id, crate::support::STORAGE);
    host.shutdown().await;
}
