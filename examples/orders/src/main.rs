//! `orders`: one host process of the orders service, over Redis (lease
//! store and alarm index, under a key prefix) with the shops' SQLite files
//! in a directory every host shares.
//!
//! ```text
//! orders redis=redis://127.0.0.1:6379 prefix=shop: dir=/srv/orders task=host-1 [cancel_ms=900000]
//! ```
//!
//! Commands on stdin, one reply line each on stdout:
//! `place <shop> <order> <cents>` → `ok place <shop> <order> <true|false>` (`false`: the order exists);
//! `pay <shop> <order>` → `ok pay <shop> <order> <true|false>`;
//! `status <shop> <order>` → `ok status <shop> <order> <placed|paid|cancelled|none>`;
//! a refusal is `err <cmd> <shop> <order> code=<code>` (`host_not_owner`: another
//! host owns the shop: this example does not configure the hosts' RPC routing).
//! It prints `ready task=<t>` once started, and on SIGTERM or ctrl-c drains
//! (releasing its shards so another host takes them at once), prints
//! `drained` and exits.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::Arc;

use durability_alarms::DispatcherConfig;
use durability_example_orders::{FileSink, SHOP, Shop};
use durability_host::{BoxError, Host, HostConfig, HostError, HostSettings, OwnPolicy};
use durability_ownership::ShardCount;
use durability_storage_redis::alarms::{IndexTime, RedisAlarmIndex};
use durability_storage_redis::ownership::RedisLeaseStore;
use tokio::io::AsyncBufReadExt as _;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

type OrdersHost = Host<RedisLeaseStore, RedisAlarmIndex>;

async fn run(host: &OrdersHost, line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let (cmd, shop, order) = match words.as_slice() {
        [cmd, shop, order, ..] => (*cmd, *shop, (*order).to_owned()),
        _ => return format!("err {line} code=bad_command"),
    };
    let result: Result<String, HostError> = match (cmd, words.get(3)) {
        ("place", Some(cents)) => match cents.parse::<i64>() {
            Ok(cents) => host
                .call::<Shop, _, _, _>(SHOP, shop, |h| async move { h.object.place(&order, cents) })
                .await
                .map(|placed| format!(" {placed}")),
            Err(_) => return format!("err {cmd} {shop} code=bad_cents"),
        },
        ("pay", None) => host
            .call::<Shop, _, _, _>(SHOP, shop, |h| async move { h.object.pay(&order) })
            .await
            .map(|paid| format!(" {paid}")),
        ("status", None) => host
            .call::<Shop, _, _, _>(SHOP, shop, |h| async move { h.object.status(&order) })
            .await
            .map(|s| format!(" {}", s.as_deref().unwrap_or("none"))),
        _ => return format!("err {line} code=bad_command"),
    };
    let order = words[2];
    match result {
        Ok(rest) => format!("ok {cmd} {shop} {order}{rest}"),
        Err(e) => format!("err {cmd} {shop} {order} code={} {e}", e.code()),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: HashMap<String, String> = std::env::args()
        .skip(1)
        .filter_map(|a| a.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    let arg = |k: &str| {
        args.get(k)
            .cloned()
            .ok_or_else(|| format!("missing argument {k}=…"))
    };
    let (url, prefix, dir, task) = (arg("redis")?, arg("prefix")?, arg("dir")?, arg("task")?);
    let cancel_ms: i64 = args
        .get("cancel_ms")
        .map_or(Ok(15 * 60_000), |v| v.parse())
        .map_err(|e| format!("cancel_ms: {e}"))?;
    let dir = std::path::PathBuf::from(dir);
    let mut settings = HostSettings::from_env()?;
    if let Some(ms) = args.get("interval") {
        settings.renew_interval_ms = Some(ms.parse().map_err(|e| format!("interval: {e}"))?);
    }
    let shards: ShardCount = settings.ownership.shard_count;
    let leases = RedisLeaseStore::connect(&url, &prefix, shards).await?;
    let index = RedisAlarmIndex::connect(&url, &prefix, IndexTime::Server).await?;
    let sink = FileSink::new(dir.join("events.jsonl"));
    let config = HostConfig::new(
        Arc::new(leases),
        Arc::new(index),
        dir.join("shops"),
        "orders-v1",
        "orders",
        &task,
    )
    .class(SHOP, move |ctx| Shop::open(ctx, sink.clone(), cancel_ms))
    .settings(settings)
    // These hosts serve no transport (no internal token), so an alarm
    // claimed by the dispatcher of a host that does not own the shop is not
    // forwarded: it waits for the owner's dispatcher, at most this long per
    // bounce (default 30 s). With `internal_token`, an `endpoint` (its port
    // is the internal port every host shares: a host forwards to no other)
    // and `transport::serve`, the delivery is forwarded to the owner instead.
    .dispatcher(DispatcherConfig {
        owner_wait_max_ms: 1_000,
        ..DispatcherConfig::default()
    })
    .create_active_storage_if_absent(true)
    .own(OwnPolicy::AllShards);
    let host = Host::start(config).await?;
    say(&format!("ready task={task}"));
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let signal = durability_host::shutdown_signal();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            () = &mut signal => break,
            line = lines.next_line() => match line {
                Ok(Some(line)) if !line.trim().is_empty() => say(&run(&host, &line).await),
                Ok(Some(_)) => {}
                // stdin closed: keep serving alarms until a signal.
                Ok(None) | Err(_) => { (&mut signal).await; break; }
            },
        }
    }
    let report = host.shutdown().await;
    say(&format!("drained timed_out={}", report.timed_out()));
    // Exit now: tokio's stdin reader is a blocking thread that a runtime
    // shutdown would wait for until stdin closes.
    std::process::exit(0)
}
