//! A host process for the host's process tests (`tests/it/host_processes.rs`):
//! a `durability-host` with one object class, `Counter`, over a SQLite
//! lease store and a SQLite alarm index in a directory every process of a
//! test shares (objects under `<dir>/objects`), driven by commands on
//! stdin, reporting on stdout one line per step:
//!
//! - `ready task=<t>` once started; `refused <code> <message>` (stderr, exit
//!   code 2) when the configuration or the lifecycle records refuse it;
//! - `acquired scope=<s> gen=<g>`, `lost scope=<s> gen=<g> code=<c>`,
//!   `released scope=<s> gen=<g>`: owner events;
//! - `ok <cmd> <name> value=<v> gen=<g>` / `err <cmd> <name> code=<c>
//!   outcome=<not_started|unknown> <message>`;
//! - `slow-wrote <name> gen=<g>`: the first write of a `slow` call committed;
//! - `fired <name> task=<t>`: the object's timer ran (its alarm was delivered here);
//! - `committed put <name> value=<v>`: a `put` call's write committed (printed
//!   inside the call, while it is admitted);
//! - `deleted complete=<bool> objects=<n> pointer_removed=<bool>` /
//!   `delete-failed code=<c> <message>`: the answer to `delete`;
//! - `drained timed_out=<bool> released=<n>` after SIGTERM, then it exits 0.
//!
//! Commands: `incr <name>`, `timer <name> <delay ms>` (sets the object's
//! timer), `slow <name> <ms>` (one committed write, a pause of `ms`
//! outside any transaction, then a second write), `put <name> <ms>` (a
//! pause of `ms` inside the admitted call, then one write, reported from
//! inside the call), `delete -` (`Host::delete_storage_id`:
//! the whole storage id), `probe`.
//!
//! Arguments `key=value`: `dir`, `task`, `own` (`all` or `none`),
//! `create` (`1`: create the active storage pointer if absent),
//! `interval` (owner loop period, ms), `shards` (shards per class, 16 when
//! absent). Settings come from the `DO_*` environment variables.
//!
//! A host that refuses to start (another shard count:
//! `shard_count_mismatch`) or stops on its own (another live process under
//! its task id: `duplicate_task_id`, `Host::failed`) exits with
//! `refused <code> <message>`, the ownership error's code.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::{Arc, Weak};
use std::time::Duration;

use durability_alarms::DispatcherConfig;
use durability_host::{BoxError, Host, HostConfig, HostError, HostSettings, OwnPolicy, OwnerEvent};
use durability_ownership::{ShardCount, SystemClock};
use durability_scheduler::{Capability, Clock, Scheduler, StorageError, Transaction};
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::ownership::SqliteLeaseStore;
use durability_storage_sqlite::{SqliteStorage, Synchronous};
use futures::future::BoxFuture;
use tokio::io::AsyncBufReadExt as _;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn sql(e: rusqlite::Error) -> StorageError {
    StorageError::backend("counter sql", e)
}

/// The object; it keeps its timer's state alive (the scheduler holds the
/// timer weakly).
struct Counter {
    _state: Arc<CounterInner>,
}

struct CounterInner {
    sched: Scheduler<SqliteStorage>,
    name: String,
    task: String,
}

struct Timer(Weak<CounterInner>);

impl Capability for Timer {
    fn run(&self, now_ms: i64) -> BoxFuture<'_, ()> {
        let inner = self.0.upgrade();
        Box::pin(async move {
            let Some(inner) = inner else { return };
            let done = inner.sched.transaction(|tx| {
                tx.sql()
                    .execute(
                        "INSERT INTO fired (t, task) VALUES (?1, ?2)",
                        rusqlite::params![now_ms, inner.task],
                    )
                    .map_err(sql)?;
                tx.set_due("timer", None)
            });
            match done {
                Ok(()) => say(&format!("fired {} task={}", inner.name, inner.task)),
                Err(e) => say(&format!("fire-failed {} {e}", inner.name)),
            }
        })
    }
}

impl Counter {
    fn incr(tx: &mut Transaction<'_, '_, SqliteStorage>) -> Result<i64, StorageError> {
        tx.sql()
            .query_row(
                "INSERT INTO counter (id, n) VALUES (0, 1)
                 ON CONFLICT (id) DO UPDATE SET n = n + 1 RETURNING n",
                [],
                |r| r.get(0),
            )
            .map_err(sql)
    }
}

type Store = SqliteLeaseStore<SystemClock>;

fn refuse(code: &str, message: &str) -> ! {
    eprintln!("refused {code} {message}");
    std::process::exit(2);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: HashMap<String, String> = std::env::args()
        .skip(1)
        .filter_map(|a| a.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    let arg = |k: &str| args.get(k).cloned().unwrap_or_default();
    // Settings first: a bad one refuses before any file is touched.
    let mut settings = match HostSettings::from_env() {
        Ok(s) => s,
        Err(e) => refuse(e.code(), &e.to_string()),
    };
    settings.renew_interval_ms = arg("interval").parse().ok();
    if let Ok(n) = arg("shards").parse::<u32>() {
        settings.ownership.shard_count = ShardCount::new(n).unwrap();
    }
    let dir = std::path::PathBuf::from(arg("dir"));
    let task = arg("task");
    let clock = SystemClock::new();
    let store: Arc<Store> = Arc::new(
        SqliteLeaseStore::open(dir.join("leases.db"), clock, ShardCount::default()).unwrap(),
    );
    let index = Arc::new(SqliteAlarmIndex::open(dir.join("alarms.db"), Synchronous::Full).unwrap());
    let owner = task.clone();
    let config = HostConfig::new(store, index, dir.join("objects"), "st1", "ns:app", &task)
        .endpoint(&format!("http://127.0.0.1:8788/{task}"))
        .class("Counter", move |ctx| {
            ctx.scheduler.transaction(|tx| {
                tx.sql()
                    .execute_batch(
                        "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL);
                         CREATE TABLE IF NOT EXISTS fired (t INTEGER NOT NULL, task TEXT NOT NULL);",
                    )
                    .map_err(sql)
            })?;
            let inner = Arc::new(CounterInner {
                sched: ctx.scheduler.clone(),
                name: ctx.name.clone(),
                task: owner.clone(),
            });
            ctx.scheduler
                .attach("timer", None, Arc::new(Timer(Arc::downgrade(&inner))))?;
            Ok::<_, BoxError>(Counter { _state: inner })
        })
        .clock(Arc::new(clock))
        .settings(settings)
        .own(if arg("own") == "all" {
            OwnPolicy::AllShards
        } else {
            OwnPolicy::OnDemand
        })
        .create_active_storage_if_absent(arg("create") == "1")
        .dispatcher(DispatcherConfig {
            poll_ms: 100,
            idle_ms: 20,
            owner_wait_max_ms: 300,
            ..DispatcherConfig::fast()
        });
    let host = match Host::start(config).await {
        Ok(h) => h,
        Err(HostError::Ownership(e)) => refuse(e.code(), &e.to_string()),
        Err(e) => refuse(e.code(), &e.to_string()),
    };
    let mut events = host.subscribe();
    tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            say(&match e {
                OwnerEvent::Acquired { scope, generation } => {
                    format!("acquired scope={scope} gen={generation}")
                }
                OwnerEvent::Lost {
                    scope,
                    generation,
                    code,
                } => format!("lost scope={scope} gen={generation} code={code}"),
                OwnerEvent::Released { scope, generation } => {
                    format!("released scope={scope} gen={generation}")
                }
                _ => format!("event {e:?}"),
            });
        }
    });
    say(&format!("ready task={task}"));
    let commands = host.clone();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let host = commands.clone();
            tokio::spawn(async move { command(&host, &clock, &line).await });
        }
    });
    let report = host.run_until_signal().await;
    if let Some(HostError::Ownership(e)) = host.failed() {
        refuse(e.code(), &e.to_string());
    }
    let released = match &report {
        durability_ownership::DrainReport::Drained { released, .. } => released.len(),
        _ => 0,
    };
    say(&format!(
        "drained timed_out={} released={released}",
        report.timed_out()
    ));
    // Exit at once: the stdin reader blocks a thread the runtime would
    // otherwise wait for (the seed's supervisor also kills the runtime
    // right after a drain succeeds).
    std::process::exit(if report.timed_out() { 3 } else { 0 });
}

async fn command(host: &Host<Store, SqliteAlarmIndex>, clock: &SystemClock, line: &str) {
    let parts: Vec<&str> = line.split_whitespace().collect();
    let (cmd, name) = (
        parts.first().copied().unwrap_or(""),
        parts.get(1).copied().unwrap_or(""),
    );
    let number = parts
        .get(2)
        .and_then(|n| n.parse::<i64>().ok())
        .unwrap_or(0);
    let result = match cmd {
        "incr" => {
            host.call::<Counter, _, _, _>("Counter", name, |h| async move {
                let v = h.scheduler.transaction(Counter::incr)?;
                Ok((v, h.generation))
            })
            .await
        }
        "timer" => {
            let at = clock.now_ms() + number;
            host.call::<Counter, _, _, _>("Counter", name, |h| async move {
                h.scheduler
                    .transaction(|tx| tx.set_due("timer", Some(at)))?;
                Ok((at, h.generation))
            })
            .await
        }
        "slow" => {
            let name_owned = name.to_owned();
            host.call::<Counter, _, _, _>("Counter", name, |h| async move {
                h.scheduler.transaction(Counter::incr)?;
                say(&format!("slow-wrote {name_owned} gen={}", h.generation));
                tokio::time::sleep(Duration::from_millis(u64::try_from(number).unwrap_or(0))).await;
                let v = h.scheduler.transaction(Counter::incr)?;
                Ok((v, h.generation))
            })
            .await
        }
        "put" => {
            let name_owned = name.to_owned();
            let pause = Duration::from_millis(u64::try_from(number).unwrap_or(0));
            host.call::<Counter, _, _, _>("Counter", name, |h| async move {
                // Admitted and in flight, not yet written.
                tokio::time::sleep(pause).await;
                let v = h.scheduler.transaction(Counter::incr)?;
                say(&format!("committed put {name_owned} value={v}"));
                Ok((v, h.generation))
            })
            .await
        }
        "delete" => {
            say(&match host.delete_storage_id().await {
                Ok(r) => format!(
                    "deleted complete={} objects={} pointer_removed={}",
                    r.complete(),
                    r.objects_deleted,
                    r.pointer_removed
                ),
                Err(e) => format!("delete-failed code={} {e}", e.code()),
            });
            return;
        }
        "probe" => {
            let p = host.probe();
            say(&format!(
                "probe state={} scopes={} in_flight={} open={} cold={} fenced={} lost={} alarms_delivered={}",
                p.state,
                p.scopes.len(),
                p.in_flight,
                p.open_objects,
                p.dispatch.cold,
                p.dispatch.fenced,
                p.dispatch.ownership_lost,
                p.alarms.delivered
            ));
            return;
        }
        _ => {
            say(&format!("err {cmd} {name} code=unknown_command"));
            return;
        }
    };
    match result {
        Ok((v, g)) => say(&format!("ok {cmd} {name} value={v} gen={g}")),
        Err(e) => say(&format!(
            "err {cmd} {name} code={} outcome={} {e}",
            e.code(),
            match e.outcome() {
                durability_ownership::DispatchOutcome::NotStarted => "not_started",
                _ => "unknown",
            }
        )),
    }
}
