//! Typed methods ([`durability_host::Method`]) between two hosts serving
//! over HTTP/1.1 on loopback ports (host `a` owns every shard, host `b`
//! none, so `b` forwards): a typed call returns the typed result on both
//! paths, a method's own error reaches the caller as the same
//! [`HostError::Method`] (code, message, details) whether the call ran
//! locally or was forwarded, and arguments that do not decode are refused
//! before the handler runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use durability_host::FailoverClient;
use durability_host::transport::{EndpointPolicy, HttpTransport, Transport};
use durability_host::{
    AppError, BoxError, CallError, Class, Handle, HostError, Method, ObjectRef, OwnPolicy,
};
use durability_ownership::{DispatchOutcome, ShardCount};
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::edge::{Node, node_with};
use crate::rpc::TOKEN;
use crate::support::{Counter, STORAGE, Store, TestConfig, World};

impl Class for Counter {
    const NAME: &'static str = "Counter";
}

/// Adds `by` to the counter (at most [`LIMIT`]).
#[derive(Debug, Serialize, Deserialize)]
struct Add {
    by: u32,
}

/// The counter after an [`Add`].
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Total {
    n: i64,
}

const LIMIT: u32 = 10;

#[derive(Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
enum CounterError {
    #[error("adding {asked} is more than the limit {limit}")]
    TooBig { asked: u32, limit: u32 },
}

impl AppError for CounterError {
    fn code(&self) -> &str {
        match self {
            Self::TooBig { .. } => "too_big",
        }
    }
}

impl Method for Add {
    type Class = Counter;
    const NAME: &'static str = "add";
    type Out = Total;
    type Error = CounterError;
}

/// The typed `add`, counting the handler's runs in `ran`.
fn with_add(ran: Arc<AtomicUsize>) -> impl FnOnce(TestConfig) -> TestConfig {
    move |config| {
        config.rpc(move |h: Handle<Counter, SqliteAlarmIndex>, add: Add| {
            let ran = Arc::clone(&ran);
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                if add.by > LIMIT {
                    return Err(BoxError::from(CounterError::TooBig {
                        asked: add.by,
                        limit: LIMIT,
                    }));
                }
                let mut n = 0;
                for _ in 0..add.by {
                    n = h.scheduler.transaction(|tx| h.object.incr(tx))?;
                }
                Ok(Total { n })
            }
        })
    }
}

async fn two_hosts(world: &World, ran: &Arc<AtomicUsize>) -> (Node, Node) {
    let dispatched = Arc::new(AtomicUsize::new(0));
    let a = node_with(
        world,
        "a",
        OwnPolicy::AllShards,
        Arc::clone(&dispatched),
        with_add(Arc::clone(ran)),
    )
    .await;
    let b = node_with(
        world,
        "b",
        OwnPolicy::OnDemand,
        dispatched,
        with_add(Arc::clone(ran)),
    )
    .await;
    (a, b)
}

/// The method error's fields, and what the error says about the call.
fn shape(
    e: &HostError,
) -> (
    &'static str,
    String,
    String,
    Option<Value>,
    DispatchOutcome,
    bool,
) {
    match e {
        HostError::Method {
            code,
            message,
            details,
        } => (
            e.code(),
            e.rpc_code(),
            format!("{code}|{message}"),
            details.clone(),
            e.outcome(),
            e.is_retryable(),
        ),
        other => panic!("not a method error: {other:?}"),
    }
}

#[tokio::test]
async fn a_methods_own_error_has_one_shape_locally_and_forwarded() {
    let world = World::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let (a, b) = two_hosts(&world, &ran).await;
    let on_a = a.host.object::<Counter>("c1");
    let on_b = b.host.object::<Counter>("c1");

    // Typed results on both paths; b forwarded to the owner a (its router
    // learned a's hint from the answer).
    assert_eq!(on_a.call(Add { by: 2 }).await.unwrap(), Total { n: 2 });
    assert_eq!(on_b.call(Add { by: 3 }).await.unwrap(), Total { n: 5 });
    let hint = b.host.owner_hint("Counter", "c1").unwrap().unwrap();
    assert_eq!(hint.task.as_str(), "a");
    assert!(a.host.owner_hint("Counter", "c1").unwrap().is_none());

    // The method's own error, typed: the same value on both paths.
    let too_big = CounterError::TooBig {
        asked: 50,
        limit: LIMIT,
    };
    for object in [&on_a, &on_b] {
        match object.call(Add { by: 50 }).await {
            Err(CallError::Method(e)) => assert_eq!(e, too_big),
            other => panic!("{other:?}"),
        }
    }

    // Untyped, the same HostError variant with the same code, message and
    // details, locally and forwarded.
    let local = on_a
        .by_name()
        .call("add", json!({"by": 50}))
        .await
        .unwrap_err();
    let forwarded = on_b
        .by_name()
        .call("add", json!({"by": 50}))
        .await
        .unwrap_err();
    assert_eq!(shape(&local), shape(&forwarded));
    let (code, rpc_code, text, details, outcome, retryable) = shape(&local);
    assert_eq!((code, rpc_code.as_str()), ("host_method_error", "too_big"));
    assert_eq!(text, "too_big|adding 50 is more than the limit 10");
    assert_eq!(
        details,
        Some(json!({"TooBig": {"asked": 50, "limit": LIMIT}}))
    );
    assert_eq!((outcome, retryable), (DispatchOutcome::Unknown, false));

    // An untyped handler's MethodError: one shape too (no details).
    let local = on_a.by_name().call("fail", Value::Null).await.unwrap_err();
    let forwarded = on_b.by_name().call("fail", Value::Null).await.unwrap_err();
    assert_eq!(shape(&local), shape(&forwarded));
    assert_eq!(shape(&local).2, "out_of_stock|none left");

    // A thin client (no host of its own) through b: the same typed result
    // and the same typed error.
    let client = FailoverClient::with(
        &[&b.endpoint],
        TOKEN,
        STORAGE,
        ShardCount::default(),
        EndpointPolicy::loopback(),
        Arc::new(HttpTransport::default()) as Arc<dyn Transport>,
    )
    .unwrap();
    assert_eq!(
        client.call_typed("c1", Add { by: 1 }).await.unwrap(),
        Total { n: 6 }
    );
    match client.call_typed("c1", Add { by: 50 }).await {
        Err(CallError::Method(e)) => assert_eq!(e, too_big),
        other => panic!("{other:?}"),
    }

    // Nothing of the refused adds was written.
    assert_eq!(on_a.call(Add { by: 0 }).await.unwrap(), Total { n: 0 });
    assert_eq!(on_b.call(Add { by: 1 }).await.unwrap(), Total { n: 7 });
}

#[tokio::test]
async fn arguments_that_do_not_decode_are_refused_before_the_handler_runs() {
    let world = World::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let (a, b) = two_hosts(&world, &ran).await;
    let local: ObjectRef<Store, SqliteAlarmIndex> = a.host.object_by_name("Counter", "c1");
    let forwarded: ObjectRef<Store, SqliteAlarmIndex> = b.host.object_by_name("Counter", "c1");
    assert_eq!(
        local.call("add", json!({"by": 1})).await.unwrap(),
        json!({"n": 1})
    );
    let runs = ran.load(Ordering::SeqCst);

    for bad in [
        json!({"by": "one"}),
        json!({"by": -1}),
        json!("add"),
        Value::Null,
    ] {
        let e = local.call("add", bad.clone()).await.unwrap_err();
        assert_eq!(
            (e.code(), e.rpc_code().as_str(), e.outcome()),
            (
                "host_invalid_args",
                "invalid_args",
                DispatchOutcome::NotStarted
            ),
            "{bad}: {e}"
        );
        let e = forwarded.call("add", bad.clone()).await.unwrap_err();
        assert_eq!(
            (e.rpc_code().as_str(), e.outcome()),
            ("invalid_args", DispatchOutcome::NotStarted),
            "{bad}: {e}"
        );
    }
    assert_eq!(ran.load(Ordering::SeqCst), runs, "no handler ran");
    // The untyped path reaches the typed method with the same JSON.
    assert_eq!(
        forwarded.call("add", json!({"by": 2})).await.unwrap(),
        json!({"n": 3})
    );
}
