//! The child side of the cluster scene: `durability-demo cluster-host
//! key=value…`, one `durability-host` process owning shards of the
//! `Counter` class over a lease store and an alarm index every process of
//! the scene shares (SQLite files in one directory, or Redis under one key
//! prefix), with the objects' SQLite files under `<dir>/objects`.
//!
//! Arguments: `dir` (its working directory), `task`, `ttl` (owner lease,
//! ms), `interval` (owner loop period, ms), `guard` (lease guard, ms),
//! `shards`, `balance` (`true`/`false`: `HostSettings::balance`), and for
//! Redis `redis` (URL) and `prefix` (key prefix), for PostgreSQL alone
//! `postgres` (URL) and `schema` (objects, leases and alarm jobs there; no
//! directory shared with another host). It owns every shard of the class
//! (`OwnPolicy::AllShards`), an even share of them with balancing on.
//!
//! Each host serves its internal endpoints over HTTP/1.1 on a loopback
//! port (`durability_host::transport::serve`, a shared internal token),
//! advertises that endpoint in the owner records it writes and publishes it
//! as `<dir>/peers/<task>` (the peer directory, for records without one);
//! `incr`, `timer` and `read` are RPC methods of the
//! class, so a call that enters any host runs once on the owner.
//!
//! Commands on stdin, one a line, each with a request id the answer
//! repeats: `<id> incr <name>`, `<id> timer <name> <tag> <delay ms>` (an
//! alarm: the object records `<tag>` as fired, with the task that ran it,
//! when it is due), `<id> slow <name> <ms>` (one committed increment, a
//! pause of `ms` outside any transaction, a second increment), `<id> read
//! <name>`, `<id> probe`; `<id> via incr|timer|read …` is the same call
//! routed (`host.object_by_name(..).call(..)`: run here if this host owns the
//! object, else forwarded once to the owner, or sent straight to it on an
//! owner hint). End of input drains the host.
//!
//! Lines on stdout: `ready task=<t>`; `acquired|lost|released scope=<s>
//! gen=<g>`; `ans <id> ok gen=<g> <key=value…>` (routed: `ans <id> ok
//! gen=<g> ran=<task> <key=value…>`) or `ans <id> err code=<c>
//! outcome=<not_started|unknown> <message>`; `slow-wrote <id> gen=<g>`;
//! `fired <name> tag=<tag> task=<t>`; `drained timed_out=<bool>
//! released=<n>` before it exits.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use durability_alarms::{AlarmIndex, DispatcherConfig, RetryPolicy};
use durability_host::store::postgres::PostgresObjectStorage;
use durability_host::transport::EndpointPolicy;
use durability_host::{
    BoxError, DatabaseSettings, Host, HostConfig, HostError, HostIds, HostSettings, ObjectStore,
    OwnPolicy,
};
use durability_ownership::{
    DrainReport, LeaseStore, LifecycleAdmin, LifecycleId, OwnershipSettings, ShardCount, StorageId,
    SystemClock, TaskId,
};
use durability_scheduler::{Capability, Clock, Scheduler, Storage, StorageError, Transaction};
use durability_storage_redis::alarms::{IndexTime, RedisAlarmIndex};
use durability_storage_redis::ownership::RedisLeaseStore;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::ownership::SqliteLeaseStore;
use durability_storage_sqlite::{SqliteStorage, Synchronous};
use durability_tests::host_proc::{
    FilePeers, counter_sql, incr_sqlite_counter, outcome, say, say_owner_events,
};
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::io::AsyncBufReadExt as _;

use crate::Result;

type SqlResult<T> = std::result::Result<T, StorageError>;

/// The object class every host of the scene serves.
pub(crate) const CLASS: &str = "Counter";
/// The storage id of the scene's objects.
pub(crate) const STORAGE: &str = "st1";
/// The lifecycle whose active storage pointer names [`STORAGE`].
pub(crate) const LIFECYCLE: &str = "demo:cluster";

/// The object's rows on one object storage (SQLite files or PostgreSQL):
/// a counter, pending timer tags with their due time, and fired tags with
/// the task that ran them.
trait CounterSql: Storage + Sized {
    /// Creates the object's tables if missing.
    fn create_tables(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<()>;
    /// Adds one to the counter; returns the new value.
    fn incr(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<i64>;
    /// Records tag `tag` as pending, due at `at`.
    fn pend(tx: &mut Transaction<'_, '_, Self>, tag: &str, at: i64) -> SqlResult<()>;
    /// Moves every tag due by `now_ms` from pending to fired (run by
    /// `task`); returns them, sorted.
    fn fire_due(
        tx: &mut Transaction<'_, '_, Self>,
        now_ms: i64,
        task: &str,
    ) -> SqlResult<Vec<String>>;
    /// The earliest pending due time.
    fn next_due(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<Option<i64>>;
    /// The counter, the pending count and the fired tags
    /// (`tag@task,…`, sorted; `None` when none fired).
    fn read(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<(i64, i64, Option<String>)>;
}

impl CounterSql for SqliteStorage {
    fn create_tables(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<()> {
        tx.sql()
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL);
                 CREATE TABLE IF NOT EXISTS pending (tag TEXT PRIMARY KEY, due INTEGER NOT NULL);
                 CREATE TABLE IF NOT EXISTS fired (tag TEXT PRIMARY KEY, task TEXT NOT NULL, at INTEGER NOT NULL);",
            )
            .map_err(counter_sql)
    }

    fn incr(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<i64> {
        incr_sqlite_counter(tx)
    }

    fn pend(tx: &mut Transaction<'_, '_, Self>, tag: &str, at: i64) -> SqlResult<()> {
        tx.sql()
            .execute(
                "INSERT INTO pending (tag, due) VALUES (?1, ?2)
                 ON CONFLICT (tag) DO UPDATE SET due = excluded.due",
                rusqlite::params![tag, at],
            )
            .map_err(counter_sql)?;
        Ok(())
    }

    fn fire_due(
        tx: &mut Transaction<'_, '_, Self>,
        now_ms: i64,
        task: &str,
    ) -> SqlResult<Vec<String>> {
        let tags: Vec<String> = {
            let mut stmt = tx
                .sql()
                .prepare("SELECT tag FROM pending WHERE due <= ?1 ORDER BY tag")
                .map_err(counter_sql)?;
            stmt.query_map([now_ms], |r| r.get(0))
                .map_err(counter_sql)?
                .collect::<std::result::Result<_, _>>()
                .map_err(counter_sql)?
        };
        tx.sql()
            .execute(
                "INSERT INTO fired (tag, task, at)
                 SELECT tag, ?2, ?1 FROM pending WHERE due <= ?1",
                rusqlite::params![now_ms, task],
            )
            .map_err(counter_sql)?;
        tx.sql()
            .execute("DELETE FROM pending WHERE due <= ?1", [now_ms])
            .map_err(counter_sql)?;
        Ok(tags)
    }

    fn next_due(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<Option<i64>> {
        tx.sql()
            .query_row("SELECT MIN(due) FROM pending", [], |r| r.get(0))
            .map_err(counter_sql)
    }

    fn read(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<(i64, i64, Option<String>)> {
        tx.sql()
            .query_row(
                "SELECT (SELECT COALESCE(MAX(n), 0) FROM counter),
                        (SELECT COUNT(*) FROM pending),
                        (SELECT group_concat(tag || '@' || task, ',')
                         FROM (SELECT tag, task FROM fired ORDER BY tag))",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .map_err(counter_sql)
    }
}

impl CounterSql for PostgresObjectStorage {
    fn create_tables(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<()> {
        tx.sql().batch_execute(
            "CREATE TABLE IF NOT EXISTS counter (id INT PRIMARY KEY CHECK (id = 0), n BIGINT NOT NULL);
             CREATE TABLE IF NOT EXISTS pending (tag TEXT PRIMARY KEY, due BIGINT NOT NULL);
             CREATE TABLE IF NOT EXISTS fired (tag TEXT PRIMARY KEY, task TEXT NOT NULL, at BIGINT NOT NULL);",
        )
    }

    fn incr(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<i64> {
        tx.sql()
            .query_one(
                "INSERT INTO counter (id, n) VALUES (0, 1)
                 ON CONFLICT (id) DO UPDATE SET n = counter.n + 1 RETURNING n",
                &[],
            )?
            .try_get(0)
            .map_err(counter_sql)
    }

    fn pend(tx: &mut Transaction<'_, '_, Self>, tag: &str, at: i64) -> SqlResult<()> {
        tx.sql().execute(
            "INSERT INTO pending (tag, due) VALUES ($1, $2)
             ON CONFLICT (tag) DO UPDATE SET due = excluded.due",
            &[&tag, &at],
        )?;
        Ok(())
    }

    fn fire_due(
        tx: &mut Transaction<'_, '_, Self>,
        now_ms: i64,
        task: &str,
    ) -> SqlResult<Vec<String>> {
        let rows = tx.sql().query(
            "WITH due AS (DELETE FROM pending WHERE due <= $1 RETURNING tag)
             INSERT INTO fired (tag, task, at) SELECT tag, $2, $1 FROM due RETURNING tag",
            &[&now_ms, &task],
        )?;
        let mut tags = rows
            .iter()
            .map(|r| r.try_get::<_, String>(0))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(counter_sql)?;
        tags.sort();
        Ok(tags)
    }

    fn next_due(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<Option<i64>> {
        tx.sql()
            .query_one("SELECT MIN(due) FROM pending", &[])?
            .try_get(0)
            .map_err(counter_sql)
    }

    fn read(tx: &mut Transaction<'_, '_, Self>) -> SqlResult<(i64, i64, Option<String>)> {
        let row = tx.sql().query_one(
            "SELECT (SELECT COALESCE(MAX(n), 0) FROM counter),
                    (SELECT COUNT(*) FROM pending),
                    (SELECT string_agg(tag || '@' || task, ',' ORDER BY tag) FROM fired)",
            &[],
        )?;
        Ok((
            row.try_get(0).map_err(counter_sql)?,
            row.try_get(1).map_err(counter_sql)?,
            row.try_get(2).map_err(counter_sql)?,
        ))
    }
}

/// The object. It holds its timer's state (the scheduler holds the timer
/// capability weakly through it).
struct Counter<D> {
    state: Arc<CounterState<D>>,
}

impl<D> Counter<D> {
    fn task(&self) -> &str {
        &self.state.task
    }
}

struct CounterState<D> {
    sched: Scheduler<D>,
    name: String,
    task: String,
}

/// The object's timer: moves every due tag from `pending` to `fired` and
/// sets the object's alarm to the next pending one, in one transaction.
struct Timer<D>(Weak<CounterState<D>>);

impl<D: CounterSql + Sync> Capability for Timer<D> {
    fn run(&self, now_ms: i64) -> BoxFuture<'_, ()> {
        let state = self.0.upgrade();
        Box::pin(async move {
            let Some(state) = state else { return };
            let done = state.sched.transaction(|tx| {
                let tags = D::fire_due(tx, now_ms, &state.task)?;
                rearm(tx)?;
                Ok::<_, StorageError>(tags)
            });
            match done {
                Ok(tags) => {
                    for tag in tags {
                        say(&format!(
                            "fired {} tag={tag} task={}",
                            state.name, state.task
                        ));
                    }
                }
                Err(e) => say(&format!("fire-failed {} {e}", state.name)),
            }
        })
    }
}

/// Sets the object's alarm to its earliest pending tag (or clears it).
fn rearm<D: CounterSql>(tx: &mut Transaction<'_, '_, D>) -> SqlResult<()> {
    let next = D::next_due(tx)?;
    tx.set_due("timer", next)
}

/// The shared internal token of the scene's hosts.
const TOKEN: &str = "demo-cluster-internal-token-0123456789";

type Handle<I, D> = durability_host::Handle<Counter<D>, I, D>;

fn incr_call<I, D: CounterSql>(h: &Handle<I, D>) -> SqlResult<String> {
    let v = h.scheduler.transaction(D::incr)?;
    Ok(format!("value={v}"))
}

fn timer_call<I, D: CounterSql>(h: &Handle<I, D>, tag: &str, delay: u64) -> SqlResult<String> {
    let at = SystemClock::new()
        .now_ms()
        .saturating_add(i64::try_from(delay).unwrap_or(i64::MAX));
    h.scheduler.transaction(|tx| {
        D::pend(tx, tag, at)?;
        rearm(tx)
    })?;
    Ok(format!("due={at}"))
}

fn read_call<I, D: CounterSql>(h: &Handle<I, D>) -> SqlResult<String> {
    let (n, pending, fired) = h.scheduler.transaction(D::read)?;
    Ok(format!(
        "value={n} pending={pending} fired={}",
        fired.as_deref().unwrap_or("-")
    ))
}

/// A method's result: the payload of the answer line, the generation and
/// the task it ran under.
fn ran<I, D>(h: &Handle<I, D>, payload: String) -> Value {
    serde_json::json!({ "payload": payload, "gen": h.generation, "task": h.object.task() })
}

/// What one child was started with.
struct Args {
    /// Its working directory: with SQLite or Redis, the directory every
    /// host of the scene shares (objects, peers, SQLite stores); on
    /// PostgreSQL, its own (it writes nothing there).
    dir: PathBuf,
    task: String,
    settings: HostSettings,
}

/// `cluster-host key=value…`: runs one host until SIGTERM (drain) or the
/// end of its input.
pub(crate) fn main(raw: &[String]) -> Result {
    let kv: HashMap<&str, &str> = raw.iter().filter_map(|a| a.split_once('=')).collect();
    let get = |k: &str| -> Result<&str> {
        kv.get(k)
            .copied()
            .ok_or_else(|| format!("cluster-host: missing {k}=").into())
    };
    let num = |k: &str| -> Result<u64> { Ok(get(k)?.parse()?) };
    let settings = HostSettings {
        ownership: OwnershipSettings {
            owner_ttl_ms: num("ttl")?,
            lease_guard_ms: num("guard")?,
            drain_in_flight_timeout_ms: 3_000,
            drain_timeout_ms: 5_000,
            shard_count: ShardCount::new(u32::try_from(num("shards")?)?)?,
            ..OwnershipSettings::default()
        },
        renew_interval_ms: Some(num("interval")?),
        balance: get("balance")? != "false",
        ..HostSettings::default()
    };
    let args = Args {
        dir: PathBuf::from(get("dir")?),
        task: get("task")?.to_owned(),
        settings,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let shards = args.settings.ownership.shard_count;
        if let Some(url) = kv.get("postgres") {
            // Leases, alarm jobs and objects in one schema of the
            // database: no directory shared with another host.
            let database = DatabaseSettings::new(url, get("schema")?);
            let ids = HostIds {
                storage: StorageId::new(STORAGE)?,
                lifecycle: LifecycleId::new(LIFECYCLE)?,
                task: TaskId::new(&args.task)?,
            };
            let config = HostConfig::postgres(&database, args.settings, ids).await?;
            return serve(config, args, false).await;
        }
        let dir = args.dir.clone();
        if let Some(url) = kv.get("redis") {
            let prefix = kv.get("prefix").copied().unwrap_or_default();
            let store = RedisLeaseStore::connect(url, &format!("{prefix}leases:"), shards).await?;
            let index =
                RedisAlarmIndex::connect(url, &format!("{prefix}alarms:"), IndexTime::Server)
                    .await?;
            return serve(on_dir(store, index, &args)?, args, true).await;
        }
        let store = SqliteLeaseStore::open(dir.join("leases.db"), SystemClock::new(), shards)?;
        let index = SqliteAlarmIndex::open(dir.join("alarms.db"), Synchronous::Full)?;
        serve(on_dir(store, index, &args)?, args, true).await
    })
}

/// A host with its objects' SQLite files under the shared `<dir>/objects`.
fn on_dir<S, I>(
    store: S,
    index: I,
    args: &Args,
) -> std::result::Result<HostConfig<S, I>, Box<dyn std::error::Error>> {
    let ids = HostIds::new(
        StorageId::new(STORAGE)?,
        LifecycleId::new(LIFECYCLE)?,
        TaskId::new(&args.task)?,
    );
    Ok(HostConfig::new(
        Arc::new(store),
        Arc::new(index),
        args.dir.join("objects"),
        ids,
    ))
}

/// Runs the host of `config` with the scene's class, methods and settings.
/// `shared`: `args.dir` is the directory every host shares, where each
/// publishes its endpoint (`peers/<task>`) for records without one.
async fn serve<S, I, O>(config: HostConfig<S, I, O>, args: Args, shared: bool) -> Result
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
    O: ObjectStore<Storage: CounterSql>,
{
    let task = args.task.clone();
    let owner = task.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let peers = args.dir.join("peers");
    let config = config
        .class(CLASS, move |ctx| {
            ctx.scheduler.transaction(O::Storage::create_tables)?;
            let state = Arc::new(CounterState {
                sched: ctx.scheduler.clone(),
                name: ctx.name.clone(),
                task: owner.clone(),
            });
            ctx.scheduler
                .attach("timer", None, Arc::new(Timer(Arc::downgrade(&state))))?;
            Ok::<_, BoxError>(Counter { state })
        })
        .method(
            CLASS,
            "incr",
            |h: Handle<I, O::Storage>, _: Value| async move {
                let payload = incr_call(&h)?;
                Ok(ran(&h, payload))
            },
        )
        .method(
            CLASS,
            "timer",
            |h: Handle<I, O::Storage>, args: Value| async move {
                let tag = args.get("tag").and_then(Value::as_str).unwrap_or("");
                let delay = args.get("delay").and_then(Value::as_u64).unwrap_or(0);
                let payload = timer_call(&h, tag, delay)?;
                Ok(ran(&h, payload))
            },
        )
        .method(
            CLASS,
            "read",
            |h: Handle<I, O::Storage>, _: Value| async move {
                let payload = read_call(&h)?;
                Ok(ran(&h, payload))
            },
        )
        .endpoint(&endpoint)
        .internal_token(TOKEN)
        // Hosts of this machine bind ephemeral ports: no one internal port.
        .endpoint_policy(EndpointPolicy::loopback())
        .settings(args.settings)
        .own(OwnPolicy::AllShards)
        .dispatcher(DispatcherConfig {
            claim_lease_ms: 5_000,
            dispatch_timeout_ms: 3_000,
            poll_ms: i64::try_from(super::POLL_MS)?,
            idle_ms: 20,
            owner_wait_max_ms: i64::try_from(super::OWNER_WAIT_MAX_MS)?,
            retry: RetryPolicy {
                max_delay_ms: super::RETRY_MAX_DELAY_MS,
                ..DispatcherConfig::fast().retry
            },
            ..DispatcherConfig::fast()
        });
    let config = if shared {
        std::fs::create_dir_all(&peers)?;
        config.peers(FilePeers(peers.clone()))
    } else {
        config
    };
    let host = Host::start(config).await?;
    let server_stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(durability_host::transport::serve(
        host.clone(),
        listener,
        server_stop.clone(),
    ));
    if shared {
        // Publish the endpoint atomically (a reader never sees half of it).
        let tmp = peers.join(format!(".{task}.tmp"));
        std::fs::write(&tmp, &endpoint)?;
        std::fs::rename(&tmp, peers.join(&task))?;
    }
    say_owner_events(&host);
    say(&format!("ready task={task}"));
    let commands = host.clone();
    let eof = tokio::sync::Notify::new();
    let eof = Arc::new(eof);
    let on_eof = Arc::clone(&eof);
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let host = commands.clone();
            tokio::spawn(async move { command(&host, &line).await });
        }
        // The parent is gone: drain rather than linger as an orphan.
        on_eof.notify_one();
    });
    let report = tokio::select! {
        r = host.run_until_signal() => r,
        () = eof.notified() => host.shutdown().await,
    };
    let released = match &report {
        DrainReport::Drained { released, .. } => released.len(),
        _ => 0,
    };
    say(&format!(
        "drained timed_out={} released={released}",
        report.timed_out()
    ));
    // Stop serving gracefully: requests already received get their answer
    // (a trusted refusal now that the leases are released), new
    // connections are refused (so callers know nothing ran).
    server_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    // Exit at once: the stdin reader blocks a thread the runtime would
    // otherwise wait for.
    std::process::exit(if report.timed_out() { 3 } else { 0 });
}

type Answer = std::result::Result<(String, u64), HostError>;

async fn command<S, I, O>(host: &Host<S, I, O>, line: &str)
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
    O: ObjectStore<Storage: CounterSql>,
{
    let parts: Vec<&str> = line.split_whitespace().collect();
    let (id, cmd, name) = match parts.as_slice() {
        [id, cmd, rest @ ..] => (*id, *cmd, rest.first().copied().unwrap_or("")),
        _ => {
            say(&format!("bad-command {line:?}"));
            return;
        }
    };
    let arg = |i: usize| parts.get(i).copied().unwrap_or("");
    let number = |i: usize| arg(i).parse::<u64>().unwrap_or(0);
    if cmd == "via" {
        routed(host, id, &parts[2..]).await;
        return;
    }
    let answer: Answer = match cmd {
        "incr" => {
            host.call::<Counter<O::Storage>, _, _, _>(CLASS, name, |h| async move {
                Ok((incr_call(&h)?, h.generation))
            })
            .await
        }
        "timer" => {
            let (tag, delay) = (arg(3).to_owned(), number(4));
            host.call::<Counter<O::Storage>, _, _, _>(CLASS, name, |h| async move {
                Ok((timer_call(&h, &tag, delay)?, h.generation))
            })
            .await
        }
        "slow" => {
            let (pause, id) = (number(3), id.to_owned());
            host.call::<Counter<O::Storage>, _, _, _>(CLASS, name, |h| async move {
                h.scheduler.transaction(O::Storage::incr)?;
                say(&format!("slow-wrote {id} gen={}", h.generation));
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let v = h.scheduler.transaction(O::Storage::incr)?;
                Ok((format!("value={v}"), h.generation))
            })
            .await
        }
        "read" => {
            host.call::<Counter<O::Storage>, _, _, _>(CLASS, name, |h| async move {
                Ok((read_call(&h)?, h.generation))
            })
            .await
        }
        "probe" => {
            let p = host.probe();
            let r = p.routing;
            Ok((
                format!(
                    "state={} scopes={} completed={} fenced={} lost={} refused_not_owner={} alarms_delivered={} forwarded={} direct={} rediscoveries={} served={} alarms_forwarded={} alarms_served={}",
                    p.state,
                    p.scopes.len(),
                    p.dispatch.completed,
                    p.dispatch.fenced,
                    p.dispatch.ownership_lost,
                    p.dispatch.refused_not_owner,
                    p.alarms.delivered,
                    r.forwarded,
                    r.direct,
                    r.rediscoveries,
                    r.served,
                    r.alarms_forwarded,
                    r.alarms_served
                ),
                0,
            ))
        }
        other => {
            say(&format!(
                "ans {id} err code=unknown_command outcome=not_started {other}"
            ));
            return;
        }
    };
    match answer {
        Ok((payload, generation)) => say(&format!("ans {id} ok gen={generation} {payload}")),
        Err(e) => say_err(id, &e),
    }
}

fn say_err(id: &str, e: &HostError) {
    say(&format!(
        "ans {id} err code={} outcome={} {e}",
        e.code(),
        outcome(e)
    ));
}

/// `<id> via <method> <name> [<tag> <delay>]`: the call through this
/// host's router.
async fn routed<S, I, O>(host: &Host<S, I, O>, id: &str, parts: &[&str])
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
    O: ObjectStore,
{
    let (method, name) = match parts {
        [method, name, ..] => (*method, *name),
        _ => {
            say(&format!("bad-command via {parts:?}"));
            return;
        }
    };
    let args = match method {
        "timer" => serde_json::json!({
            "tag": parts.get(2).copied().unwrap_or(""),
            "delay": parts.get(3).and_then(|d| d.parse::<u64>().ok()).unwrap_or(0),
        }),
        _ => Value::Null,
    };
    match host.object_by_name(CLASS, name).call(method, args).await {
        Ok(v) => say(&format!(
            "ans {id} ok gen={} ran={} {}",
            v["gen"],
            v["task"].as_str().unwrap_or("?"),
            v["payload"].as_str().unwrap_or("")
        )),
        Err(e) => say_err(id, &e),
    }
}
