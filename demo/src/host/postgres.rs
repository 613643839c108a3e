//! `bench host`'s PostgreSQL figures, each against a baseline measured in
//! the same run:
//!
//! - a call on a host on PostgreSQL alone (`HostConfig::postgres`: leases,
//!   alarm jobs and the object in one schema) over its internal HTTP/1.1
//!   endpoint (admission, watchdog, the object's transaction committed
//!   through the owner fence) against a plain axum handler on the same
//!   route that runs the same transaction through one tokio-postgres
//!   connection (`BEGIN`, the same `INSERT … RETURNING`, `COMMIT`), both
//!   called through the same [`HttpTransport`] with the same body, in
//!   interleaved rounds (the median per-round ratio is the figure);
//! - the round trips of claiming a whole class (16 scopes) after its
//!   owner's leases ran out, on the PostgreSQL lease store: its connections
//!   go through a loopback proxy that counts the messages the client sends
//!   (a `Sync` ends an extended-protocol exchange and a `Query` is one
//!   simple-protocol exchange: each is one round trip), checked on a plain
//!   `SELECT 1` (one round trip), and timed against that `SELECT 1`
//!   through the same proxy.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::State;
use durability_host::store::postgres::{
    PostgresAlarmIndex, PostgresLeaseStore, PostgresObjectStorage,
};
use durability_host::transport::{
    Endpoint, EndpointPolicy, HttpTransport, INVOKE_PATH, InternalToken, serve,
};
use durability_host::{BoxError, DatabaseSettings, Handle, Host, HostConfig, PostgresObjectStore};
use durability_ownership::{
    Admission, ClassName, LeaseStore as _, LifecycleAdmin as _, LifecycleId, OwnerScope,
    ShardCount, StorageId, TaskId,
};
use durability_scheduler::{StorageError, Transaction};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::routed::{bare_calls, serve_until};
use super::{BoxResult, ids, median, settings};
use crate::cluster::drop_schemas;

const TOKEN: &str = "bench-postgres-token-0123456789";
/// The transaction of both sides.
const INCR: &str = "INSERT INTO counter (id, n) VALUES (0, 1)
     ON CONFLICT (id) DO UPDATE SET n = counter.n + 1 RETURNING n";
const TABLE: &str =
    "CREATE TABLE IF NOT EXISTS counter (id INT PRIMARY KEY CHECK (id = 0), n BIGINT NOT NULL)";

type PgHost = Host<PostgresLeaseStore, PostgresAlarmIndex, PostgresObjectStore>;

struct Counter;

fn pg(e: tokio_postgres::Error) -> StorageError {
    StorageError::backend("counter sql", e)
}

fn incr(tx: &mut Transaction<'_, '_, PostgresObjectStorage>) -> Result<i64, StorageError> {
    tx.sql().query_one(INCR, &[])?.try_get(0).map_err(pg)
}

/// A schema name for this run (`<prefix>_<random>`).
fn run_schema(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

async fn connect(url: &str) -> BoxResult<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

async fn pg_host(
    url: &str,
    schema: &str,
    endpoint: &str,
    admission: Admission,
) -> BoxResult<PgHost> {
    let ids = ids("bench:pg", "pg")?;
    let database = DatabaseSettings::new(url, schema);
    let config = HostConfig::postgres(
        &database,
        settings(admission, 120_000, 16)?,
        ids,
    )
    .await?
    .class("Counter", |ctx| {
        ctx.scheduler.transaction(|tx| tx.sql().batch_execute(TABLE))?;
        Ok::<_, BoxError>(Counter)
    })
    .method(
        "Counter",
        "incr",
        |h: Handle<Counter, PostgresAlarmIndex, PostgresObjectStorage>, _args: Value| async move {
            let n = h.scheduler.transaction(incr)?;
            Ok(json!({ "n": n }))
        },
    )
    .endpoint(endpoint)
    .internal_token(TOKEN)
    .create_active_storage_if_absent(true);
    Ok(Host::start(config).await?)
}

/// The baseline: parse the invoke, run the transaction on the one
/// connection, answer the same envelope.
async fn bare_invoke(
    State(client): State<Arc<Mutex<tokio_postgres::Client>>>,
    body: String,
) -> String {
    let parsed: Result<Value, _> = serde_json::from_str(&body);
    let mut client = client.lock().await;
    let n = async {
        let tx = client.transaction().await?;
        let n: i64 = tx.query_one(INCR, &[]).await?.try_get(0)?;
        tx.commit().await?;
        Ok::<_, tokio_postgres::Error>(n)
    }
    .await;
    match (parsed, n) {
        (Ok(_), Ok(n)) => json!({ "ok": true, "result": { "n": n } }).to_string(),
        _ => json!({ "error": "internal_error", "message": "bare call failed" }).to_string(),
    }
}

/// Per-call times (us) of the bare handler and the host, medians of
/// `rounds` interleaved rounds of `n` calls, and the median per-round
/// ratio.
pub(super) async fn call_overhead(
    url: &str,
    admission: Admission,
    rounds: usize,
    n: u64,
) -> BoxResult<([f64; 2], f64)> {
    let schema = run_schema("bench_host");
    let result = call_rounds(url, &schema, admission, rounds, n).await;
    drop_schemas(url, &schema).await?;
    result
}

/// The two sides of the call figure, serving: the host and the bare
/// handler on one database, with the transport that calls them.
struct Sides {
    host: PgHost,
    host_endpoint: Endpoint,
    bare_endpoint: Endpoint,
    transport: HttpTransport,
    token: InternalToken,
    stop: CancellationToken,
}

impl Sides {
    /// Starts both sides on the schema `schema`, the host on the database
    /// at `url`, the bare handler at `bare_url` (the same database), and
    /// warms them (connections, the object open, the scope claimed).
    async fn start(
        url: &str,
        bare_url: &str,
        schema: &str,
        admission: Admission,
    ) -> BoxResult<Self> {
        let stop = CancellationToken::new();
        let lh = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let lbare = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let host_url = format!("http://{}", lh.local_addr()?);
        let host_endpoint = EndpointPolicy::loopback().check(&host_url)?;
        let bare_endpoint =
            EndpointPolicy::loopback().check(&format!("http://{}", lbare.local_addr()?))?;
        let host = pg_host(url, schema, &host_url, admission).await?;
        tokio::spawn(serve(host.clone(), lh, stop.clone()));
        let bare = connect(bare_url).await?;
        bare.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{schema}\"; SET search_path TO \"{schema}\"; {TABLE}"
        ))
        .await?;
        let app = axum::Router::new()
            .route(INVOKE_PATH, axum::routing::post(bare_invoke))
            .with_state(Arc::new(Mutex::new(bare)));
        serve_until(lbare, app, stop.clone());
        let sides = Self {
            host,
            host_endpoint,
            bare_endpoint,
            transport: HttpTransport::default(),
            token: InternalToken::new(TOKEN)?,
            stop,
        };
        sides.calls(false, 20).await?;
        sides.calls(true, 20).await?;
        Ok(sides)
    }

    /// `n` calls on the host (`host`) or the bare handler; the time per
    /// call (us).
    async fn calls(&self, host: bool, n: u64) -> BoxResult<f64> {
        let endpoint = if host {
            &self.host_endpoint
        } else {
            &self.bare_endpoint
        };
        bare_calls(&self.transport, endpoint, &self.token, None, n).await
    }

    async fn stop(self) {
        self.stop.cancel();
        self.host.shutdown().await;
    }
}

async fn call_rounds(
    url: &str,
    schema: &str,
    admission: Admission,
    rounds: usize,
    n: u64,
) -> BoxResult<([f64; 2], f64)> {
    let sides = Sides::start(url, url, schema, admission).await?;
    let mut times: [Vec<f64>; 2] = Default::default();
    for round in 0..rounds {
        for k in 0..2 {
            let which = (round + k) % 2;
            times[which].push(sides.calls(which == 1, n).await?);
        }
    }
    sides.stop().await;
    let ratio = median((0..rounds).map(|r| times[1][r] / times[0][r]).collect());
    let [b, h] = times;
    Ok(([median(b), median(h)], ratio))
}

/// A loopback TCP proxy to the PostgreSQL server that counts the round
/// trips its clients start.
struct Proxy {
    port: u16,
    trips: Arc<AtomicU64>,
}

impl Proxy {
    /// Starts the proxy on a thread and runtime of its own (for the rest
    /// of the process), so its forwarding never waits for a worker of the
    /// runtime whose clients it counts.
    async fn start(upstream: String) -> BoxResult<Self> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let port = std_listener.local_addr()?.port();
        let trips = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&trips);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("pg-proxy".to_owned())
            .spawn(move || runtime.block_on(serve_proxy(std_listener, upstream, counted)))?;
        Ok(Self { port, trips })
    }

    fn trips(&self) -> u64 {
        self.trips.load(Ordering::SeqCst)
    }
}

/// The proxy's accept loop (see [`Proxy::start`]).
async fn serve_proxy(
    std_listener: std::net::TcpListener,
    upstream: String,
    counted: Arc<AtomicU64>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else {
        return;
    };
    while let Ok((client, _)) = listener.accept().await {
        let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
            continue;
        };
        let counted = Arc::clone(&counted);
        tokio::spawn(async move {
            let (from_client, mut to_client) = client.into_split();
            let (mut from_server, to_server) = server.into_split();
            let down =
                tokio::spawn(
                    async move { tokio::io::copy(&mut from_server, &mut to_client).await },
                );
            let _ = count_up(from_client, to_server, &counted).await;
            down.abort();
        });
    }
}

/// Copies what a client sends to the server, message by message, adding
/// one to `trips` per `Sync` (`S`) and simple `Query` (`Q`): the messages
/// after which the client waits for the server's `ReadyForQuery`. The
/// first packets have no type byte: an SSL or GSS encryption request
/// (answered with one byte, then the startup follows) and the startup
/// message.
async fn count_up(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    trips: &AtomicU64,
) -> std::io::Result<()> {
    const SSL_REQUEST: u32 = 80_877_103;
    const GSS_REQUEST: u32 = 80_877_104;
    let mut started = false;
    loop {
        let mut message = Vec::new();
        let kind = if started {
            let kind = from.read_u8().await?;
            message.push(kind);
            Some(kind)
        } else {
            None
        };
        let len = from.read_u32().await?;
        message.extend_from_slice(&len.to_be_bytes());
        let body = usize::try_from(len.saturating_sub(4)).unwrap_or(0);
        let at = message.len();
        message.resize(at + body, 0);
        from.read_exact(&mut message[at..]).await?;
        to.write_all(&message).await?;
        match kind {
            None => {
                let code = message
                    .get(4..8)
                    .map_or(0, |c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                started = code != SSL_REQUEST && code != GSS_REQUEST;
            }
            Some(b'S' | b'Q') => {
                trips.fetch_add(1, Ordering::SeqCst);
            }
            Some(_) => {}
        }
    }
}

/// `url`'s settings, connecting to `127.0.0.1:port` instead.
fn via(url: &str, port: u16) -> BoxResult<tokio_postgres::Config> {
    let parsed: tokio_postgres::Config = url.parse()?;
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(port);
    if let Some(user) = parsed.get_user() {
        config.user(user);
    }
    if let Some(password) = parsed.get_password() {
        config.password(password);
    }
    if let Some(db) = parsed.get_dbname() {
        config.dbname(db);
    }
    Ok(config)
}

/// `host:port` of `url`'s first TCP host.
fn upstream(url: &str) -> BoxResult<String> {
    let parsed: tokio_postgres::Config = url.parse()?;
    let host = match parsed.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = parsed.get_ports().first().copied().unwrap_or(5432);
    Ok(format!("{host}:{port}"))
}

/// What the claim figure measured.
pub(super) struct Claims {
    /// Scopes per claim.
    pub(super) scopes: usize,
    /// Round trips of each claim (all rounds).
    pub(super) trips: Vec<u64>,
    /// Round trips of one `SELECT 1` (the counter's check: 1).
    pub(super) select_trips: u64,
    /// Median time of the claims (us).
    pub(super) claim_us: f64,
    /// Median time of a `SELECT 1` through the same proxy (us).
    pub(super) select_us: f64,
}

/// `rounds` times: the previous owner's leases of a class's 16 shards
/// run out (1 s leases), then a new task claims all 16 with
/// `claim_many`; counts each claim's round trips and times it.
pub(super) async fn claim_class(url: &str, rounds: usize) -> BoxResult<Claims> {
    let schema = run_schema("bench_claim");
    let result = claim_rounds(url, &schema, rounds).await;
    drop_schemas(url, &schema).await?;
    result
}

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn claim_rounds(url: &str, schema: &str, rounds: usize) -> BoxResult<Claims> {
    const TTL_MS: u64 = 1_000;
    let proxy = Proxy::start(upstream(url)?).await?;
    let count = ShardCount::new(16)?;
    let store = PostgresLeaseStore::new(
        via(url, proxy.port)?,
        1,
        durability_storage_postgres::SchemaName::new(schema)?,
        count,
    )?;
    store.setup().await?;
    let (storage, lifecycle) = (StorageId::new("st1")?, LifecycleId::new("bench:claim")?);
    store.set_active_storage(&lifecycle, Some(&storage)).await?;
    let class = ClassName::new("Counter")?;
    let scopes = (0..count.get())
        .map(|s| OwnerScope::new(storage.clone(), class.clone(), s, count))
        .collect::<Result<Vec<_>, _>>()?;
    let (raw, conn) = via(url, proxy.port)?.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let before = proxy.trips();
    raw.simple_query("SELECT 1").await?;
    let select_trips = proxy.trips() - before;
    let mut selects = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        raw.simple_query("SELECT 1").await?;
        selects.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (mut trips, mut times) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        let task = TaskId::new(&format!("t{round}"))?;
        let before = proxy.trips();
        let t = Instant::now();
        let claims = store
            .claim_many(
                &scopes,
                durability_ownership::Claimant::new(&lifecycle, &task, TTL_MS),
            )
            .await;
        let us = t.elapsed().as_secs_f64() * 1e6;
        let after = proxy.trips();
        let claimed = claims
            .iter()
            .filter(|c| matches!(c, Ok(durability_ownership::ClaimOutcome::Claimed(_))))
            .count();
        if claimed != scopes.len() {
            return Err(format!(
                "round {round}: claimed {claimed} of {}: {claims:?}",
                scopes.len()
            )
            .into());
        }
        // Round 0 claims free scopes and warms the connection.
        if round > 0 {
            trips.push(after - before);
            times.push(us);
        }
        expire(&store, &scopes, &lifecycle).await?;
    }
    Ok(Claims {
        scopes: scopes.len(),
        trips,
        select_trips,
        claim_us: median(times),
        select_us: median(selects),
    })
}

/// Waits (polling, bounded) until no scope of `scopes` has a live owner.
#[allow(clippy::disallowed_methods)] // Polls a real server's clock.
async fn expire(
    store: &PostgresLeaseStore,
    scopes: &[OwnerScope],
    lifecycle: &LifecycleId,
) -> BoxResult<()> {
    let end = Instant::now() + std::time::Duration::from_secs(15);
    for scope in scopes {
        while store.snapshot(scope, lifecycle).await?.owner.is_some() {
            if Instant::now() > end {
                return Err(format!("the lease of {scope} did not run out").into());
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proxy counts one round trip per exchange the client then waits
    /// on: a simple query is one however many statements it holds, a
    /// prepare is one, and running a prepared statement is one.
    #[tokio::test]
    async fn the_proxy_counts_round_trips() -> BoxResult<()> {
        let url = crate::postgres_url();
        let proxy = Proxy::start(upstream(&url)?).await?;
        let (client, conn) = via(&url, proxy.port)?
            .connect(tokio_postgres::NoTls)
            .await?;
        tokio::spawn(conn);
        let before = proxy.trips();
        client.simple_query("SELECT 1").await?;
        assert_eq!(proxy.trips() - before, 1, "one simple query");
        let before = proxy.trips();
        client.batch_execute("BEGIN; SELECT 1; COMMIT").await?;
        assert_eq!(proxy.trips() - before, 1, "three statements in one query");
        let before = proxy.trips();
        let statement = client.prepare("SELECT $1::int").await?;
        assert_eq!(proxy.trips() - before, 1, "a prepare");
        let before = proxy.trips();
        let row = client.query_one(&statement, &[&7_i32]).await?;
        assert_eq!(proxy.trips() - before, 1, "a prepared statement run");
        assert_eq!(row.try_get::<_, i32>(0)?, 7, "the bytes passed unchanged");
        Ok(())
    }

    /// `url` with its first host and port replaced by `127.0.0.1:port`.
    fn via_url(url: &str, port: u16) -> BoxResult<String> {
        let parsed: tokio_postgres::Config = url.parse()?;
        let user = parsed.get_user().unwrap_or("postgres");
        let password = parsed
            .get_password()
            .map(|p| format!(":{}", String::from_utf8_lossy(p)))
            .unwrap_or_default();
        let db = parsed.get_dbname().unwrap_or("postgres");
        Ok(format!("postgres://{user}{password}@127.0.0.1:{port}/{db}"))
    }

    /// The exchanges of a call with the server (a `Sync` or a simple
    /// `Query`, each answered by a `ReadyForQuery`), counted at the proxy
    /// each side's connections go through. The bare handler: `BEGIN`, the
    /// statement's prepare, its run, the unnamed statement's close and
    /// `COMMIT` (5; the close goes out with `COMMIT`: 4 round trips). The
    /// host: the admission snapshot; the transaction's `BEGIN` batch, its
    /// object row lock, its fence read and the statement (pipelined: one
    /// round trip); `COMMIT` (6 exchanges, 3 round trips).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn round_trips_of_a_call() -> BoxResult<()> {
        // Single calls, many times: the fewest exchanges any one call made.
        // Background work lands in a window only now and then (a loaded
        // machine makes the windows longer, so a batch of calls was never
        // free of it); some single call is.
        const N: u64 = 1;
        const ROUNDS: usize = 30;
        let url = crate::postgres_url();
        // One proxy per side: the host's background work (renewals,
        // the alarm index) is not counted as the bare side's.
        let proxies = [
            Proxy::start(upstream(&url)?).await?,
            Proxy::start(upstream(&url)?).await?,
        ];
        let schema = run_schema("test_host_trips");
        let counted = async {
            let [bare_url, host_url] = [
                via_url(&url, proxies[0].port)?,
                via_url(&url, proxies[1].port)?,
            ];
            let sides = Sides::start(&host_url, &bare_url, &schema, Admission::Snapshot).await?;
            // The fewest of the rounds: a round can only gain exchanges
            // that are not the call's (a connection the pool opened
            // meanwhile prepares its statements, background work).
            let mut trips = [u64::MAX; 2];
            for _ in 0..ROUNDS {
                for (side, (trips, proxy)) in trips.iter_mut().zip(&proxies).enumerate() {
                    let before = proxy.trips();
                    sides.calls(side == 1, N).await?;
                    *trips = (*trips).min(proxy.trips() - before);
                }
            }
            sides.stop().await;
            Ok::<_, Box<dyn std::error::Error>>(trips)
        }
        .await;
        drop_schemas(&url, &schema).await?;
        let [bare, host] = counted?;
        assert_eq!(bare, 5 * N, "BEGIN, prepare, run, close, COMMIT");
        assert_eq!(
            host,
            6 * N,
            "snapshot, BEGIN batch, row lock, fence read, statement, COMMIT"
        );
        Ok(())
    }
}
