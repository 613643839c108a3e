//! `bench host`'s routed-call figures: two hosts in this process, each
//! serving its internal endpoints over HTTP/1.1 on loopback; host `a` calls
//! an object that host `b` owns. Three ways, measured in interleaved rounds
//! in the same run:
//!
//! - the baseline: a bare HTTP round trip with the same request body (the
//!   same [`HttpTransport`] client) to a plain axum endpoint that parses it,
//!   runs the same transaction on a bare object and answers the same
//!   success envelope;
//! - a routed call: `a`'s router resolves the owner (one lease-store read),
//!   forwards once with the route fence, and `b` admits it (one snapshot),
//!   runs it under the watchdog and commits through the fence (the hint is
//!   forgotten before each call, so each one takes the router's path);
//! - a direct call on the learned owner hint (no resolution on `a`; `b`
//!   still admits);
//! - for the breakdown, the owner's endpoint called straight with the
//!   route fence through the same client (no caller host: what `b` adds to
//!   the bare round trip).
//!
//! Then calls/s per host: `a` keeps eight calls in flight to eight objects
//! `b` owns, for a fixed count of calls.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use durability_host::transport::{
    Endpoint, EndpointPolicy, HttpTransport, INVOKE_PATH, InternalToken, InvokeRequest, Reply,
    RouteFence, StaticPeers, Transport, serve,
};
use durability_host::{BoxError, Handle, Host, HostConfig, RpcArgs};
use durability_ownership::SystemClock;
use durability_scheduler::Scheduler;
use durability_storage_sqlite::SqliteStorage;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::ownership::SqliteLeaseStore;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{BoxResult, Counter, bare_object, create_schema, ids, incr, median, sqlite};

const TOKEN: &str = "bench-internal-token-0123456789";
/// Bytes of padding in every request's arguments.
const PAD: usize = 256;

type RStore = SqliteLeaseStore<SystemClock>;
type RHost = Host<RStore, SqliteAlarmIndex>;

/// What one figure measured.
pub(super) struct Routed {
    /// Medians of the per-round times (us/call): bare, routed, direct,
    /// owner endpoint.
    pub(super) us: [f64; 4],
    /// Medians of the per-round ratios to the bare round trip: routed,
    /// direct, owner endpoint.
    pub(super) ratios: [f64; 3],
    /// Calls/s `b` served with eight calls in flight from `a`.
    pub(super) calls_per_s: f64,
    /// Calls in the throughput run.
    pub(super) throughput_calls: u64,
}

fn args() -> Value {
    json!({ "pad": "p".repeat(PAD) })
}

async fn start_host(
    dir: &std::path::Path,
    task: &str,
    listener: tokio::net::TcpListener,
    peers: StaticPeers,
    stop: &CancellationToken,
) -> BoxResult<RHost> {
    let store = SqliteLeaseStore::open(
        dir.join("leases.db"),
        SystemClock::new(),
        durability_ownership::ShardCount::default(),
    )?;
    let index = SqliteAlarmIndex::open(
        dir.join("alarms.db"),
        durability_storage_sqlite::Synchronous::Normal,
    )?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    // Both hosts listen on one machine, each on its own port: forward only
    // to the ports the peers listen on (the default is the own port only).
    let policy = EndpointPolicy::ports(
        peers
            .0
            .values()
            .filter_map(|e| EndpointPolicy::default().check(e).ok())
            .map(|e| e.port()),
    );
    let config = HostConfig::new(
        Arc::new(store),
        Arc::new(index),
        dir.join("objects"),
        ids("bench:routed", task)?,
    )
    .endpoint(&endpoint)
    .internal_token(TOKEN)
    .endpoint_policy(policy)
    .peers(peers)
    .class("Counter", |ctx| {
        ctx.scheduler.transaction(create_schema)?;
        Ok::<_, BoxError>(Counter)
    })
    .method(
        "Counter",
        "incr",
        |h: Handle<Counter, SqliteAlarmIndex>, _args: Value| async move {
            let n = h.scheduler.transaction(incr)?;
            Ok(json!({ "n": n }))
        },
    )
    .sqlite(sqlite())
    .create_active_storage_if_absent(true);
    let host = Host::start(config).await?;
    tokio::spawn(serve(host.clone(), listener, stop.clone()));
    Ok(host)
}

/// The baseline server: parse the invoke, run the bare transaction, answer
/// the same envelope.
async fn bare_invoke(State(sched): State<Arc<Scheduler<SqliteStorage>>>, body: String) -> String {
    let parsed: Result<Value, _> = serde_json::from_str(&body);
    match (parsed, sched.transaction(incr)) {
        (Ok(_), Ok(n)) => json!({ "ok": true, "result": { "n": n } }).to_string(),
        _ => json!({ "error": "internal_error", "message": "bare call failed" }).to_string(),
    }
}

/// Serves `app` on `listener` until `stop` (a baseline's plain axum
/// server).
pub(super) fn serve_until(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
    });
}

/// `n` invokes of `Counter` `c1`'s `incr` (the padded arguments) at
/// `endpoint` through `transport`, one after another; us per call.
#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
pub(super) async fn bare_calls(
    transport: &HttpTransport,
    endpoint: &Endpoint,
    token: &InternalToken,
    fence: Option<RouteFence>,
    n: u64,
) -> BoxResult<f64> {
    let request = InvokeRequest {
        class: "Counter".to_owned(),
        name: "c1".to_owned(),
        method: "incr".to_owned(),
        args: RpcArgs::new(args())?,
        fence,
    };
    let t = Instant::now();
    for _ in 0..n {
        match transport.invoke(endpoint, token, &request).await {
            Reply::Ok { .. } => {}
            other => return Err(format!("bare round trip failed: {other:?}").into()),
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
}

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn host_calls(a: &RHost, n: u64, forget: bool) -> BoxResult<f64> {
    let object = a.object_by_name("Counter", "c1");
    let t = Instant::now();
    for _ in 0..n {
        if forget {
            a.forget_owner_hint("Counter", "c1")?;
        }
        object.call("incr", args()).await?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
}

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn throughput(a: &RHost, calls: u64) -> BoxResult<f64> {
    const IN_FLIGHT: u64 = 8;
    let t = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..IN_FLIGHT {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let object = a.object_by_name("Counter", &format!("t{k}"));
            for _ in 0..calls / IN_FLIGHT {
                object.call("incr", args()).await?;
            }
            Ok::<_, durability_host::HostError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(calls as f64 / t.elapsed().as_secs_f64())
}

/// Runs the figures (see the module docs).
pub(super) async fn routed(dir: &std::path::Path, rounds: usize, n: u64) -> BoxResult<Routed> {
    let stop = CancellationToken::new();
    let la = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let lb = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let lbare = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let b_endpoint = format!("http://{}", lb.local_addr()?);
    let peers = StaticPeers(BTreeMap::from([
        ("a".to_owned(), format!("http://{}", la.local_addr()?)),
        ("b".to_owned(), format!("http://{}", lb.local_addr()?)),
    ]));
    let shared = dir.join("shared");
    std::fs::create_dir_all(&shared)?;
    let a = start_host(&shared, "a", la, peers.clone(), &stop).await?;
    let b = start_host(&shared, "b", lb, peers, &stop).await?;
    // b owns c1 and the throughput objects.
    b.object_by_name("Counter", "c1")
        .call("incr", args())
        .await?;
    for k in 0..8 {
        b.object_by_name("Counter", &format!("t{k}"))
            .call("incr", args())
            .await?;
    }

    let sched = Arc::new(bare_object(&dir.join("bare"))?);
    let bare_endpoint =
        EndpointPolicy::default().check(&format!("http://{}", lbare.local_addr()?))?;
    let app = axum::Router::new()
        .route(INVOKE_PATH, axum::routing::post(bare_invoke))
        .with_state(sched);
    serve_until(lbare, app, stop.clone());
    let transport = HttpTransport::default();
    let token = InternalToken::new(TOKEN)?;

    // Warm every path (connections pooled, objects open, hint learned).
    bare_calls(&transport, &bare_endpoint, &token, None, 20).await?;
    host_calls(&a, 20, true).await?;
    host_calls(&a, 20, false).await?;
    let hint = a
        .owner_hint("Counter", "c1")?
        .ok_or("a learned no owner hint for c1")?;
    let owner_fence = RouteFence {
        task: hint.task.as_str().to_owned(),
        generation: hint.generation.get(),
    };
    let owner_endpoint = EndpointPolicy::default().check(&b_endpoint)?;
    bare_calls(
        &transport,
        &owner_endpoint,
        &token,
        Some(owner_fence.clone()),
        20,
    )
    .await?;

    let mut times: [Vec<f64>; 4] = Default::default();
    for round in 0..rounds {
        for k in 0..4 {
            let which = (round + k) % 4;
            let us = match which {
                0 => bare_calls(&transport, &bare_endpoint, &token, None, n).await?,
                1 => host_calls(&a, n, true).await?,
                2 => host_calls(&a, n, false).await?,
                _ => {
                    bare_calls(
                        &transport,
                        &owner_endpoint,
                        &token,
                        Some(owner_fence.clone()),
                        n,
                    )
                    .await?
                }
            };
            times[which].push(us);
        }
    }
    let routed_before = a.probe().routing;
    let throughput_calls = 8 * n;
    let calls_per_s = throughput(&a, throughput_calls).await?;
    let routing = a.probe().routing;
    if routing.local != routed_before.local {
        return Err("a ran a call locally: the owner moved during the bench".into());
    }
    stop.cancel();
    a.shutdown().await;
    b.shutdown().await;
    let ratio = |i: usize| median((0..rounds).map(|r| times[i][r] / times[0][r]).collect());
    let ratios = [ratio(1), ratio(2), ratio(3)];
    let [bare, routed, direct, owner] = times;
    Ok(Routed {
        us: [median(bare), median(routed), median(direct), median(owner)],
        ratios,
        calls_per_s,
        throughput_calls,
    })
}
