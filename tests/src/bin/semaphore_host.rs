//! A host process for the semaphore process tests
//! (`tests/it/semaphore_processes.rs`): a `durability-host` serving its
//! internal endpoints on a loopback port, with the semaphore holder class
//! (`Semaphore`) and a `Shard` class whose outbox channel `sink` delivers
//! under two cross-host limits from the holder `limits`: pool `conc`
//! (concurrency: one permit per delivery) and pool `rate` (one permit per
//! entry, leased for `interval` ms). Every host of a test shares one
//! directory (SQLite leases, alarm index, objects) and nothing else.
//!
//! Output, one line per step: `ready task=<t> endpoint=<e>`; `acquired
//! scope=<s>` and `released scope=<s>` (owner events);
//! `ok call <name> <method> result=<json>` / `err call <name> <method>
//! code=<rpc code> host_code=<c> outcome=<not_started|unknown>`; `ok stage <name> n=<n>`;
//! `start <key> at=<unix ms> task=<t>` and `end <key> at=<unix ms>` around
//! each publish of the sink (batches of one entry); `granted id=<id>
//! count=<n> lease_until=<ms> holder=<h> at=<unix ms>` for each grant of
//! `hold` (kept, never released); `refused hold <code>`.
//!
//! Commands on stdin: `call <name> <method> <json args>` (on the holder
//! `<name>`), `stage <shard> <n>` (stages `n` entries `<shard>-<i>`),
//! `hold <pool> <key> <lease ms>` (acquires one permit of `<pool>` on the
//! holder `limits` as holder `<task>`, waiting up to 30 s). The holder's
//! extra method `whoami` answers `{"task": <the task it runs on>}`.
//!
//! Arguments `key=value`: `dir`, `task`, `token`, `interval` (the rate
//! pool's interval, ms), `work` (ms a publish of an even entry takes; odd
//! entries take 10 ms).
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use durability_alarms::DispatcherConfig;
use durability_host::semaphore::{HolderCall, Limit, SemaphoreHolder, SemaphorePermits};
use durability_host::transport::{EndpointPolicy, serve};
use durability_host::{Handle, Host, HostConfig, HostError, HostSettings, OwnPolicy, OwnerEvent};
use durability_outbox::{ChannelConfig, Entry, Outbox, Sink, SinkError};
use durability_ownership::SystemClock;
use durability_scheduler::{Clock, Permit, PermitError, Permits, StorageError};
use durability_storage_sqlite::SqliteStorage;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::ownership::SqliteLeaseStore;
use durability_tests::host_proc::{args, call_line, outcome, say, shared_sqlite, test_ids};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;
use tokio_util::sync::CancellationToken;

type Store = SqliteLeaseStore<SystemClock>;
type TheHost = Host<Store, SqliteAlarmIndex>;

fn now() -> i64 {
    SystemClock::new().now_ms()
}

/// The holder `limits`, reached through this host's router once it runs.
struct Limits(Arc<OnceLock<TheHost>>);

impl HolderCall for Limits {
    fn call_holder<'a>(
        &'a self,
        method: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, HostError>> {
        async move {
            let host = self.0.get().ok_or_else(|| HostError::Draining)?;
            host.object_by_name("Semaphore", "limits")
                .call(method, args)
                .await
        }
        .boxed()
    }
}

/// Both limits: the concurrency permit first (so a rate permit is granted
/// right before its delivery), then the rate permit; both held together.
struct Both(SemaphorePermits, SemaphorePermits);

impl Permits for Both {
    fn acquire(&self, want: usize) -> BoxFuture<'_, Result<Permit, PermitError>> {
        async move {
            let conc = self.0.acquire(want).await?;
            let rate = self.1.acquire(conc.entries()).await?;
            let entries = conc.entries().min(rate.entries());
            Ok(Permit::new(entries).on_release(move || drop((rate, conc))))
        }
        .boxed()
    }
}

/// Prints the start and end of every publish.
struct Print {
    task: String,
    work_ms: u64,
}

impl Sink<u32> for Print {
    async fn publish(&self, batch: &[Entry<u32>]) -> Result<(), SinkError> {
        for e in batch {
            say(&format!(
                "start {} at={} task={}",
                e.key(),
                now(),
                self.task
            ));
            let ms = if e.value() % 2 == 0 { self.work_ms } else { 10 };
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            say(&format!("end {} at={}", e.key(), now()));
        }
        Ok(())
    }
}

/// A shard object: its outbox channel `sink`.
struct Shard {
    outbox: Outbox<SqliteStorage, u32, Print>,
}

fn permits(host: &Arc<OnceLock<TheHost>>, task: &str, interval_ms: i64) -> Arc<dyn Permits> {
    let holder =
        |h: &Arc<OnceLock<TheHost>>| -> Arc<dyn HolderCall> { Arc::new(Limits(Arc::clone(h))) };
    let conc = SemaphorePermits::new(holder(host), "conc", task, Limit::Concurrency)
        .lease_ms(20_000)
        .wait_ms(2_000, 50);
    let rate = Limit::Rate {
        interval_ms,
        per_delivery: 1,
    };
    let rate = SemaphorePermits::new(holder(host), "rate", task, rate).wait_ms(2_000, 50);
    Arc::new(Both(conc, rate))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let arg = |k: &str| args.get(k).cloned().unwrap_or_default();
    let dir = PathBuf::from(arg("dir"));
    let task = arg("task");
    let interval: i64 = arg("interval").parse().unwrap_or(1_000);
    let work_ms: u64 = arg("work").parse().unwrap_or(200);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let clock = SystemClock::new();
    let (store, index) = shared_sqlite(&dir, clock);
    let cell: Arc<OnceLock<TheHost>> = Arc::default();
    let (factory_cell, owner) = (Arc::clone(&cell), task.clone());
    let mut settings = HostSettings::from_env().unwrap();
    settings.renew_interval_ms = Some(200);
    let config = HostConfig::new(store, index, dir.join("objects"), test_ids(&task))
        .endpoint(&endpoint)
        .internal_token(&arg("token"))
        .endpoint_policy(EndpointPolicy::loopback())
        .semaphore_holder()
        .method("Semaphore", "whoami", {
            let task = task.clone();
            move |_: Handle<SemaphoreHolder<SqliteStorage>, SqliteAlarmIndex>, _| {
                let task = task.clone();
                async move { Ok(json!({ "task": task })) }
            }
        })
        .class("Shard", move |ctx| {
            let sink = Print {
                task: owner.clone(),
                work_ms,
            };
            let channel = ChannelConfig::new("sink")
                .batch_size(1)
                .attempt_timeout_ms(20_000)
                .permits(permits(&factory_cell, &owner, interval));
            Ok::<_, durability_host::BoxError>(Shard {
                outbox: Outbox::attach(&ctx.scheduler, channel, sink)?,
            })
        })
        .clock(Arc::new(clock))
        .settings(settings)
        .own(OwnPolicy::AllShards)
        .create_active_storage_if_absent(true)
        .dispatcher(DispatcherConfig {
            poll_ms: 100,
            idle_ms: 20,
            owner_wait_max_ms: 300,
            dispatch_timeout_ms: 60_000,
            claim_lease_ms: 90_000,
            ..DispatcherConfig::fast()
        });
    let host = match Host::start(config).await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("refused {} {e}", e.code());
            std::process::exit(2);
        }
    };
    let _ = cell.set(host.clone());
    let mut events = host.subscribe();
    tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            match e {
                OwnerEvent::Acquired { scope, .. } => say(&format!("acquired scope={scope}")),
                OwnerEvent::Released { scope, .. } => say(&format!("released scope={scope}")),
                _ => {}
            }
        }
    });
    tokio::spawn(serve(host.clone(), listener, CancellationToken::new()));
    say(&format!("ready task={task} endpoint={endpoint}"));
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let host = host.clone();
        let task = task.clone();
        tokio::spawn(async move { command(&host, &task, &line).await });
    }
    std::process::exit(0);
}

async fn command(host: &TheHost, task: &str, line: &str) {
    let mut parts = line.splitn(4, ' ');
    let (cmd, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    match cmd {
        "call" => {
            let method = parts.next().unwrap_or("");
            let args = parts.next().unwrap_or("");
            say(&call_line(host, "Semaphore", name, method, args).await);
        }
        "stage" => {
            let n: u32 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
            let staged = host
                .transaction::<Shard, _, _>("Shard", name, |s, tx| {
                    for i in 0..n {
                        s.outbox
                            .stage(tx, &format!("{name}-{i}"), &i)
                            .map_err(|e| StorageError::backend("stage", e))?;
                    }
                    Ok(())
                })
                .await;
            match staged {
                Ok(()) => say(&format!("ok stage {name} n={n}")),
                Err(e) => say(&format!("err stage {name} code={}", e.code())),
            }
        }
        "hold" => {
            // hold <pool> <key> <lease ms>
            let key = parts.next().unwrap_or("");
            let lease: i64 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
            let args = json!({"pool": name, "key": key, "holder": task, "count": 1,
                "lease_ms": lease, "wait_ms": 30_000, "poll_ms": 10_000});
            hold(host, task, args).await;
        }
        other => say(&format!("err {other} unknown_command")),
    }
}

/// Acquires until granted (the same key: never granted twice) and prints
/// the grant; the permit is never released.
async fn hold(host: &TheHost, task: &str, args: Value) {
    let end = now() + 60_000;
    while now() < end {
        match host
            .object_by_name("Semaphore", "limits")
            .call("acquire", args.clone())
            .await
        {
            Ok(v) if v.get("granted").is_some() => {
                let g = &v["granted"];
                say(&format!(
                    "granted id={} count={} lease_until={} holder={task} at={}",
                    g["id"],
                    g["count"],
                    g["lease_until"],
                    now()
                ));
                return;
            }
            Ok(v) if v.get("queued").is_some() => {}
            Ok(v) => return say(&format!("refused hold answer={v}")),
            // The holder's host may be down: ask again with the same key.
            Err(e) if e.is_retryable() || outcome(&e) == "unknown" => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return say(&format!("refused hold {}", e.code())),
        }
    }
    say("refused hold timed_out");
}
