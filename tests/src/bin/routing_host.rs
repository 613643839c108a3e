//! A host process for the routing process tests (`tests/it/host_routing.rs`):
//! a `durability-host` serving its internal endpoints over HTTP/1.1 on a
//! loopback port, with one object class, `Counter`, and RPC methods on it,
//! over a SQLite lease store and alarm index in a directory every process
//! of a test shares. Each host advertises its endpoint in the owner records
//! it writes, and also publishes it as the file `<dir>/peers/<task>` (the
//! peer directory, used for records without one); every endpoint read is
//! validated against the endpoint allowlist: loopback on any port (the
//! hosts bind ephemeral ports), or with `policy=derived` the host's default
//! (loopback and private addresses on its own port only).
//!
//! Output, one line per step: `ready task=<t> endpoint=<e>`;
//! `ok call <name> <method> result=<json>` /
//! `err call <name> <method> code=<wire code> host_code=<code>
//! outcome=<not_started|unknown>`; `hint <name> task=<t|none> gen=<g>`;
//! `routing local=.. forwarded=.. direct=.. rediscoveries=.. evictions=..
//! refusals=.. auth=.. served=..`; `hang-committed <name> n=<n>` (the
//! `incr_hang` method committed and now never answers); `drained
//! released=<n>` (after `drain`; the server keeps answering).
//!
//! `ok fetch <name> <METHOD> status=<s> headers=<json pairs> body=<text>` /
//! `err fetch <name> <METHOD> code=.. host_code=.. outcome=..`;
//! `fetch-hang-committed n=<n>` (a `POST /hang` committed and never answers).
//!
//! `ok connect <name> greeting=<hello task=<t> url=<u> seen=<json names>>
//! reply=<echo task=<t> msg=<m>>` (the session's first message, then the
//! answer to the one message sent) / `err connect <name> code=..
//! host_code=.. outcome=..`.
//!
//! Commands on stdin: `call <name> <method> <json args>`, `fetch <name>
//! <METHOD> <url> <json header pairs> [<body>]` (a body `<n>x<c>` is `n`
//! bytes of `c`), `connect <name> <url> <json header pairs> <message>`,
//! `hint <name>`, `routing`, `drain`.
//!
//! The connect handler of `Counter` greets with `hello task=<t> url=<u>
//! seen=<json header names>`, then answers each text message `incr` with
//! `echo task=<t> msg=n=<n>` (adds one) and any other with `echo task=<t>
//! msg=<m>`, until the caller closes.
//!
//! The fetch handler of `Counter`: `POST /incr` (adds one), `POST /hang`
//! (adds one, prints `fetch-hang-committed`, never answers), `/n` (reads),
//! each answering 200 `n=<n> task=<t> body=<request body bytes>` with the
//! header `x-seen` listing the request header names it saw (a query is
//! ignored); `/teapot`
//! answers 418 with a tenant header and a forged control header; anything
//! else 404.
//!
//! Methods of `Counter`: `incr` (`{"by": n}` → `{"n", "task"}`), `get`,
//! `echo` (returns its arguments), `big` (`{"bytes": n}` → a string of `n`
//! bytes), `fail` (a `MethodError` `out_of_stock`), `boom` (a plain error:
//! `internal_error` across hosts), `incr_hang` (commits one increment,
//! prints `hang-committed`, never returns), `arm` (`{"in_ms": n}`: moves
//! the object's `tick` alarm capability to now + n ms), `fired` (the tasks
//! that ran `tick`, in order). When `tick` runs it records this host's task
//! in the object's storage and prints `fired <name> task=<t>`.
//!
//! Arguments `key=value`: `dir`, `task`, `token`, `own` (`all` or `none`),
//! `interval` (owner loop period, ms), `dispatch` (`off`: this host runs no
//! alarm dispatcher, so the alarms of its objects reach it from other
//! hosts). `DO_*` settings from the environment.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::{Arc, Weak};

use durability_alarms::DispatcherConfig;
use durability_host::connect::{ConnectRequest, Message, Socket};
use durability_host::fetch::{FetchRequest, FetchResponse};
use durability_host::transport::{EndpointPolicy, serve};
use durability_host::{
    BoxError, Handle, Host, HostConfig, HostError, HostSettings, MethodError, OwnPolicy,
};
use durability_ownership::SystemClock;
use durability_scheduler::{Capability, Scheduler, StorageError};
use durability_storage_sqlite::SqliteStorage;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::ownership::SqliteLeaseStore;
use durability_tests::host_proc::{
    FilePeers, args, call_line, counter_sql, err_line, say, shared_sqlite, test_ids,
};
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;
use tokio_util::sync::CancellationToken;

struct Counter {
    task: String,
    /// Keeps the scheduler the `tick` capability reaches weakly alive.
    _scheduler: Arc<Scheduler<SqliteStorage>>,
}

const TICK: &str = "tick";

/// The `tick` alarm capability: records which task ran it.
struct Tick {
    scheduler: Weak<Scheduler<SqliteStorage>>,
    task: String,
    name: String,
}

impl Capability for Tick {
    fn run(&self, _now_ms: i64) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let Some(scheduler) = self.scheduler.upgrade() else {
                return;
            };
            let ran = scheduler.transaction(|tx| {
                tx.sql()
                    .execute("INSERT INTO fired (task) VALUES (?1)", [&self.task])
                    .map_err(counter_sql)?;
                tx.set_due(TICK, None)
            });
            if ran.is_ok() {
                say(&format!("fired {} task={}", self.name, self.task));
            }
        })
    }
}

type Store = SqliteLeaseStore<SystemClock>;
type H = Handle<Counter, SqliteAlarmIndex>;

fn add(h: &H, by: i64) -> Result<i64, StorageError> {
    h.scheduler.transaction(|tx| {
        tx.sql()
            .query_row(
                "INSERT INTO counter (id, n) VALUES (0, ?1)
                 ON CONFLICT (id) DO UPDATE SET n = n + ?1 RETURNING n",
                [by],
                |r| r.get(0),
            )
            .map_err(counter_sql)
    })
}

fn read(h: &H) -> Result<i64, StorageError> {
    h.scheduler.transaction(|tx| {
        tx.sql()
            .query_row("SELECT COALESCE(MAX(n), 0) FROM counter", [], |r| r.get(0))
            .map_err(counter_sql)
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let arg = |k: &str| args.get(k).cloned().unwrap_or_default();
    let mut settings = HostSettings::from_env().unwrap();
    settings.renew_interval_ms = arg("interval").parse().ok();
    let dir = PathBuf::from(arg("dir"));
    let task = arg("task");
    let peers = dir.join("peers");
    std::fs::create_dir_all(&peers).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let clock = SystemClock::new();
    let (store, index) = shared_sqlite(&dir, clock);
    let owner = task.clone();
    let config = HostConfig::new(store, index, dir.join("objects"), test_ids(&task))
        .endpoint(&endpoint)
        .internal_token(&arg("token"))
        .peers(FilePeers(peers.clone()))
        .class("Counter", move |ctx| {
            ctx.scheduler.transaction(|tx| {
                tx.sql()
                    .execute_batch(
                        "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL);
                         CREATE TABLE IF NOT EXISTS fired (task TEXT NOT NULL);",
                    )
                    .map_err(counter_sql)
            })?;
            let scheduler = Arc::new(ctx.scheduler.clone());
            ctx.scheduler.attach(
                TICK,
                None,
                Arc::new(Tick {
                    scheduler: Arc::downgrade(&scheduler),
                    task: owner.clone(),
                    name: ctx.name.clone(),
                }),
            )?;
            Ok::<_, BoxError>(Counter {
                task: owner.clone(),
                _scheduler: scheduler,
            })
        })
        .method("Counter", "arm", |h: H, args: Value| async move {
            let in_ms = args.get("in_ms").and_then(Value::as_i64).unwrap_or(0);
            let at = h.scheduler.now_ms().saturating_add(in_ms);
            h.scheduler.transaction(|tx| tx.set_due(TICK, Some(at)))?;
            Ok(json!({ "at": at, "task": h.object.task }))
        })
        .method("Counter", "fired", |h: H, _args: Value| async move {
            let tasks: Vec<String> = h.scheduler.transaction(|tx| {
                let mut stmt = tx
                    .sql()
                    .prepare("SELECT task FROM fired ORDER BY rowid")
                    .map_err(counter_sql)?;
                let rows = stmt
                    .query_map([], |r| r.get(0))
                    .map_err(counter_sql)?
                    .collect::<Result<Vec<String>, _>>()
                    .map_err(counter_sql)?;
                Ok::<_, StorageError>(rows)
            })?;
            Ok(json!({ "fired": tasks, "task": h.object.task }))
        })
        .method("Counter", "incr", |h: H, args: Value| async move {
            let by = args.get("by").and_then(Value::as_i64).unwrap_or(1);
            let n = add(&h, by)?;
            Ok(json!({ "n": n, "task": h.object.task }))
        })
        .method("Counter", "get", |h: H, _args: Value| async move {
            Ok(json!({ "n": read(&h)?, "task": h.object.task }))
        })
        .method("Counter", "echo", |_h: H, args: Value| async move { Ok(args) })
        .method("Counter", "big", |_h: H, args: Value| async move {
            let n = args.get("bytes").and_then(Value::as_u64).unwrap_or(0);
            Ok(Value::String("b".repeat(usize::try_from(n).unwrap_or(0))))
        })
        .method("Counter", "fail", |_h: H, _args: Value| async move {
            Err::<Value, BoxError>(Box::new(MethodError::new("out_of_stock", "none left")))
        })
        .method("Counter", "boom", |_h: H, _args: Value| async move {
            Err::<Value, BoxError>("secret internal detail at 10.0.0.9".into())
        })
        .method("Counter", "incr_hang", |h: H, _args: Value| async move {
            let n = add(&h, 1)?;
            say(&format!("hang-committed n={n}"));
            std::future::pending::<()>().await;
            Ok(Value::Null)
        })
        .fetch("Counter", |h: H, req: FetchRequest| async move {
            // What the handler saw: its method, URL and every header name.
            let seen: Vec<&str> = req.headers.iter().map(|(k, _)| k.as_str()).collect();
            let seen = serde_json::to_string(&seen)?;
            let path = req.url.split('?').next().unwrap_or("");
            let n = match (req.method.as_str(), path) {
                ("POST", "/incr") => add(&h, 1)?,
                ("POST", "/hang") => {
                    let n = add(&h, 1)?;
                    say(&format!("fetch-hang-committed n={n}"));
                    std::future::pending::<()>().await;
                    n
                }
                (_, "/n") => read(&h)?,
                (_, "/teapot") => {
                    return Ok(FetchResponse::new(418, "short and stout")
                        .header("x-teapot", "yes")
                        .header("x-durability-owner-task", "forged"));
                }
                _ => return Ok(FetchResponse::new(404, "no such route")),
            };
            Ok(FetchResponse::new(200, format!("n={n} task={} body={}", h.object.task, req.body.len()))
                .header("x-seen", &seen))
        })
        .connect("Counter", |h: H, req: ConnectRequest, mut socket: Socket| async move {
            let seen: Vec<&str> = req.headers.iter().map(|(k, _)| k.as_str()).collect();
            let greeting = format!(
                "hello task={} url={} seen={}",
                h.object.task,
                req.url,
                serde_json::to_string(&seen)?
            );
            socket.send(Message::Text(greeting)).await?;
            while let Some(message) = socket.recv().await {
                let reply = match message? {
                    Message::Text(t) if t == "incr" => format!("n={}", add(&h, 1)?),
                    Message::Text(t) => t,
                    Message::Binary(b) => format!("{} bytes", b.len()),
                };
                socket
                    .send(Message::Text(format!("echo task={} msg={reply}", h.object.task)))
                    .await?;
            }
            Ok(())
        })
        .clock(Arc::new(clock))
        .settings(settings)
        .own(if arg("own") == "all" {
            OwnPolicy::AllShards
        } else {
            OwnPolicy::OnDemand
        })
        .create_active_storage_if_absent(true)
        .alarm_dispatcher(arg("dispatch") != "off")
        .dispatcher(DispatcherConfig {
            poll_ms: 100,
            idle_ms: 20,
            owner_wait_max_ms: 300,
            ..DispatcherConfig::fast()
        });
    // Hosts of this machine bind ephemeral ports, so there is no one
    // internal port: loopback on any port, unless `policy=derived` asks for
    // the host's default (its own port only).
    let config = if arg("policy") == "derived" {
        config
    } else {
        config.endpoint_policy(EndpointPolicy::loopback())
    };
    let host = match Host::start(config).await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("refused {} {e}", e.code());
            std::process::exit(2);
        }
    };
    let stop = CancellationToken::new();
    tokio::spawn(serve(host.clone(), listener, stop.clone()));
    // Publish the endpoint atomically (a reader never sees half of it).
    let tmp = peers.join(format!(".{task}.tmp"));
    std::fs::write(&tmp, &endpoint).unwrap();
    std::fs::rename(&tmp, peers.join(&task)).unwrap();
    say(&format!("ready task={task} endpoint={endpoint}"));
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let host = host.clone();
        tokio::spawn(async move { command(&host, &line).await });
    }
    std::process::exit(0);
}

/// A fetch body from the command line: `<n>x<c>` is `n` bytes of `c`
/// (`1048576xa`), anything else is itself.
fn expand(body: &str) -> String {
    match body.split_once('x') {
        Some((n, c)) if c.len() == 1 && n.parse::<usize>().is_ok() => c.repeat(n.parse().unwrap()),
        _ => body.to_owned(),
    }
}

async fn command(host: &Host<Store, SqliteAlarmIndex>, line: &str) {
    let mut parts = line.splitn(4, ' ');
    let cmd = parts.next().unwrap_or("");
    match cmd {
        "call" => {
            let name = parts.next().unwrap_or("");
            let method = parts.next().unwrap_or("");
            let args = parts.next().unwrap_or("");
            say(&call_line(host, "Counter", name, method, args).await);
        }
        "fetch" => {
            // fetch <name> <METHOD> <url> <headers as compact JSON pairs> [<body>]
            let name = parts.next().unwrap_or("");
            let method = parts.next().unwrap_or("");
            let mut rest = parts.next().unwrap_or("").splitn(3, ' ');
            let url = rest.next().unwrap_or("");
            let headers: Vec<(String, String)> =
                serde_json::from_str(rest.next().unwrap_or("[]")).unwrap();
            let body = expand(rest.next().unwrap_or(""));
            let mut request = FetchRequest::new(method, url).body(body);
            request.headers = headers;
            match host.object_by_name("Counter", name).fetch(request).await {
                Ok(r) => say(&format!(
                    "ok fetch {name} {method} status={} headers={} body={}",
                    r.status,
                    serde_json::to_string(&r.headers).unwrap(),
                    String::from_utf8_lossy(&r.body)
                )),
                Err(e) => say(&err_line(&format!("fetch {name} {method}"), &e)),
            }
        }
        "connect" => {
            // connect <name> <url> <headers as compact JSON pairs> <message>
            let name = parts.next().unwrap_or("");
            let url = parts.next().unwrap_or("");
            let mut rest = parts.next().unwrap_or("").splitn(2, ' ');
            let headers: Vec<(String, String)> =
                serde_json::from_str(rest.next().unwrap_or("[]")).unwrap();
            let message = rest.next().unwrap_or("").to_owned();
            let mut request = ConnectRequest::new(url);
            request.headers = headers;
            match host.object_by_name("Counter", name).connect(request).await {
                Ok(mut socket) => {
                    let text = |m: Option<Result<Message, HostError>>| match m {
                        Some(Ok(Message::Text(t))) => t,
                        other => format!("unexpected {other:?}"),
                    };
                    let greeting = text(socket.recv().await);
                    socket.send(Message::Text(message)).await.unwrap();
                    let reply = text(socket.recv().await);
                    socket.close().await.unwrap();
                    say(&format!(
                        "ok connect {name} greeting={greeting} reply={reply}"
                    ));
                }
                Err(e) => say(&err_line(&format!("connect {name}"), &e)),
            }
        }
        "hint" => {
            let name = parts.next().unwrap_or("");
            match host.owner_hint("Counter", name).unwrap() {
                Some(h) => say(&format!(
                    "hint {name} task={} gen={}",
                    h.task.as_str(),
                    h.generation.get()
                )),
                None => say(&format!("hint {name} task=none gen=0")),
            }
        }
        "routing" => {
            let r = host.probe().routing;
            say(&format!(
                "routing local={} forwarded={} direct={} rediscoveries={} evictions={} refusals={} auth={} served={} handoffs={} upgrades={} alarms_forwarded={} alarms_served={}",
                r.local,
                r.forwarded,
                r.direct,
                r.rediscoveries,
                r.hint_evictions,
                r.endpoint_refusals,
                r.auth_refusals,
                r.served,
                r.handoffs,
                r.upgrades,
                r.alarms_forwarded,
                r.alarms_served
            ));
        }
        "drain" => {
            let report = host.shutdown().await;
            let released = match &report {
                durability_ownership::DrainReport::Drained { released, .. } => released.len(),
                _ => 0,
            };
            say(&format!("drained released={released}"));
        }
        other => say(&format!("err {other} unknown_command")),
    }
}
