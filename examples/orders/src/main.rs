//! `orders`: one host process of the orders service. Every host of a
//! deployment shares the PostgreSQL database and schema (objects, leases,
//! alarm jobs) and the internal token; none shares a directory.
//!
//! Environment (the host's `DO_*` settings too, e.g. `DO_OWNER_TTL_SECONDS`):
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `DO_DATABASE_URL`, `DO_DATABASE_SCHEMA` | the database and schema | required, `durability` |
//! | `ORDERS_TASK` | this host's task id (unique per process) | required |
//! | `ORDERS_PUBLIC_ADDR` | the public listener (edge, `/healthz`) | `0.0.0.0:8080` |
//! | `ORDERS_INTERNAL_ADDR` | the internal listener (calls between hosts, `/health`, `/ready`, `/metrics`); advertised as `http://<addr>`, so an address the other hosts reach, on the port every host shares | required |
//! | `ORDERS_INTERNAL_TOKEN` | the shared internal token (16+ visible ASCII bytes) | required |
//! | `ORDERS_WEBHOOK_URL` | where order events are `POST`ed | required |
//! | `ORDERS_ORDER_TTL_MS` | unpaid orders expire after this | `900000` |
//! | `ORDERS_STORAGE_ID`, `ORDERS_LIFECYCLE` | the storage id and lifecycle | `orders-v1`, `orders` |
//! | `ORDERS_CREATE_POINTER` | `true`: create the active storage pointer if absent | `true` |
//! | `ORDERS_RENEW_INTERVAL_MS` | the owner loop's period | a third of the TTL |
//!
//! It prints `ready task=<t> public=<addr> internal=<addr> owner_failover_ms=<ms>
//! alarm_failover_ms=<ms>` once serving (how long a dead host's objects, and
//! an alarm it had claimed, wait for another host),
//! and on SIGTERM or ctrl-c drains (readiness `503`, in-flight work
//! finishes, leases and alarm claims released so the other hosts take the
//! shards at once), prints `drained timed_out=<bool>` and exits.
#![allow(clippy::print_stdout)]

use std::sync::{Arc, OnceLock};

use durability_example_orders::{HostSlot, OrdersConfig, ServiceConfig, classes, router};
use durability_host::{
    BoxError, CancellationToken, DatabaseSettings, Host, HostConfig, HostIds, HostSettings,
    OwnPolicy,
};
use durability_ownership::{LifecycleId, StorageId, TaskId};

fn env(name: &str) -> Result<String, BoxError> {
    std::env::var(name).map_err(|_| format!("{name} is not set").into())
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// The host's configuration from the environment.
/// Also the failover budget of an alarm a dead host had claimed (owner
/// TTL + alarm claim lease + one dispatcher poll), for the ready line.
async fn configure(slot: &HostSlot) -> Result<(OrdersConfig, i64), BoxError> {
    let mut settings = HostSettings::from_env()?;
    if let Ok(ms) = std::env::var("ORDERS_RENEW_INTERVAL_MS") {
        settings.renew_interval_ms = Some(
            ms.parse()
                .map_err(|e| format!("ORDERS_RENEW_INTERVAL_MS: {e}"))?,
        );
    }
    let ttl_ms = i64::try_from(settings.ownership.owner_ttl_ms).unwrap_or(i64::MAX);
    let alarm_budget_ms = settings.alarms.failover_budget_ms(ttl_ms);
    let database = DatabaseSettings::from_env()?.ok_or("DO_DATABASE_URL is not set")?;
    let ids = HostIds {
        storage: StorageId::new(&env_or("ORDERS_STORAGE_ID", "orders-v1"))?,
        lifecycle: LifecycleId::new(&env_or("ORDERS_LIFECYCLE", "orders"))?,
        task: TaskId::new(&env("ORDERS_TASK")?)?,
    };
    let service = ServiceConfig {
        webhook_url: env("ORDERS_WEBHOOK_URL")?,
        order_ttl_ms: env_or("ORDERS_ORDER_TTL_MS", "900000")
            .parse()
            .map_err(|e| format!("ORDERS_ORDER_TTL_MS: {e}"))?,
    };
    let create = match env_or("ORDERS_CREATE_POINTER", "true").as_str() {
        "true" => true,
        "false" => false,
        other => {
            return Err(format!("ORDERS_CREATE_POINTER: {other:?} is not true or false").into());
        }
    };
    let config: OrdersConfig = HostConfig::postgres(&database, settings, ids).await?;
    let config = classes(config, &service, slot)
        .internal_token(&env("ORDERS_INTERNAL_TOKEN")?)
        .endpoint(&format!("http://{}", env("ORDERS_INTERNAL_ADDR")?))
        .create_active_storage_if_absent(create)
        .own(OwnPolicy::AllShards);
    Ok((config, alarm_budget_ms))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let slot: HostSlot = Arc::new(OnceLock::new());
    let (config, alarm_budget_ms) = configure(&slot).await?;
    let internal = tokio::net::TcpListener::bind(env("ORDERS_INTERNAL_ADDR")?).await?;
    let public =
        tokio::net::TcpListener::bind(env_or("ORDERS_PUBLIC_ADDR", "0.0.0.0:8080")).await?;
    let host = Host::start(config).await?;
    let _ = slot.set(host.clone());
    let stop = CancellationToken::new();
    let internal_addr = internal.local_addr()?;
    let wire = tokio::spawn(durability_host::wire::serve(
        host.clone(),
        internal,
        stop.clone(),
    ));
    let public_addr = public.local_addr()?;
    let app = router(&host)?;
    let edge_stop = stop.clone();
    let edge = tokio::spawn(async move {
        axum::serve(public, app)
            .with_graceful_shutdown(async move { edge_stop.cancelled().await })
            .await
    });
    let probe = host.probe();
    println!(
        "ready task={} public={public_addr} internal={internal_addr} \
         owner_failover_ms={} alarm_failover_ms={alarm_budget_ms}",
        probe.task, probe.failover_budget_ms
    );
    let report = host.run_until_signal().await;
    stop.cancel();
    let _ = wire.await;
    let _ = edge.await;
    println!("drained timed_out={}", report.timed_out());
    Ok(())
}
