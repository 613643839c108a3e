//! Configuration and lifecycle records: the seed's settings rules, and
//! every refusal happens before anything starts.

use std::collections::HashMap;

use durability_host::{ENV_PREVENT_EVICTION, Host, HostError, HostSettings, OwnPolicy, Residency};
use durability_ownership::{
    ClassName, DeleteLock, LeaseStore, LifecycleAdmin, LifecycleId, OwnerScope, ShardCount,
    StorageId,
};

use crate::support::{LIFECYCLE, STORAGE, World, settings};

fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |k| map.get(k).cloned()
}

#[test]
fn prevent_eviction_is_true_false_or_refused() {
    let mode = |v: &[(&str, &str)]| HostSettings::from_lookup(lookup(v)).map(|s| s.residency);
    assert_eq!(mode(&[]).unwrap(), Residency::Resident);
    assert_eq!(
        mode(&[(ENV_PREVENT_EVICTION, "true")]).unwrap(),
        Residency::Resident
    );
    assert_eq!(
        mode(&[(ENV_PREVENT_EVICTION, "false")]).unwrap(),
        Residency::Evictable
    );
    for bad in ["TRUE", "1", "", " false", "no"] {
        let err = mode(&[(ENV_PREVENT_EVICTION, bad)]).unwrap_err();
        assert_eq!(err.code(), "host_invalid_setting", "{bad:?}");
        assert!(
            matches!(
                err,
                HostError::InvalidSetting {
                    setting: "DO_PREVENT_EVICTION",
                    ..
                }
            ),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn ownership_settings_fall_back_as_the_seed_says() {
    for bad in ["abc", "007", "0", "-5", "9007199254741"] {
        let s = HostSettings::from_lookup(lookup(&[("DO_OWNER_TTL_SECONDS", bad)])).unwrap();
        assert_eq!(s.ownership.owner_ttl_ms, 120_000, "{bad:?}");
    }
    let s = HostSettings::from_lookup(lookup(&[
        ("DO_OWNER_TTL_SECONDS", "30"),
        ("DO_DRAIN_TIMEOUT_MS", "x"),
        ("DO_DRAIN_IN_FLIGHT_TIMEOUT_MS", "500"),
    ]))
    .unwrap();
    assert_eq!(s.ownership.owner_ttl_ms, 30_000);
    assert_eq!(s.ownership.drain_timeout_ms, 10_000);
    assert_eq!(s.ownership.drain_in_flight_timeout_ms, 500);
    assert_eq!(s.renew_interval(), 10_000);
    s.validate().unwrap();
}

#[test]
fn alarm_settings_are_read_from_the_workflows_variables() {
    let s = HostSettings::from_lookup(lookup(&[
        ("WORKFLOWS_DO_ALARM_RETRY_DELAY_MS", "250"),
        ("WORKFLOWS_DO_ALARM_RETRY_MAX_DELAY_MS", "60000"),
        ("WORKFLOWS_DO_ALARM_RETRY_JITTER", "0.1"),
        ("WORKFLOWS_DO_ALARM_RETRY_MAX_TRIES", "9"),
        ("WORKFLOWS_DO_ALARM_CLAIM_LEASE_MS", "90000"),
        ("WORKFLOWS_DISPATCH_TIMEOUT_MS", "15000"),
    ]))
    .unwrap();
    assert_eq!(s.alarms.retry.base_delay_ms, 250);
    assert_eq!(s.alarms.retry.max_delay_ms, 60_000);
    assert_eq!(s.alarms.retry.jitter, 0.1);
    assert_eq!(s.alarms.retry.max_tries, 9);
    assert_eq!(s.alarms.claim_lease_ms, 90_000);
    assert_eq!(s.alarms.dispatch_timeout_ms, 15_000);
    // An invalid value falls back to the seed's default (6 tries), loudly.
    let s = HostSettings::from_lookup(lookup(&[("WORKFLOWS_DO_ALARM_RETRY_MAX_TRIES", "six")]))
        .unwrap();
    assert_eq!(s.alarms.retry.max_tries, 6);
}

#[test]
fn error_codes_are_unique_and_stable() {
    let mut codes = HostError::CODES.to_vec();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), HostError::CODES.len());
    assert_eq!(
        HostError::CODES,
        [
            "host_invalid_setting",
            "host_lifecycle_record",
            "host_unknown_class",
            "host_class_type",
            "host_invalid_object_name",
            "host_draining",
            "host_not_owner",
            "host_ownership_refused",
            "host_fenced",
            "host_ownership_lost",
            "host_storage_failed",
            "host_factory_failed",
            "host_handler_failed",
            "host_method_error",
            "host_alarm_failed",
            "host_schema_ahead",
            "host_invalid_method",
            "host_invalid_args",
            "host_unknown_method",
            "host_stale_fence",
            "owner_unavailable",
            "do_rpc_result_unknown",
            "host_remote_error",
            "host_transport_failed",
            "host_invalid_request",
            "host_request_too_large",
            "host_network_file_system",
        ]
    );
    assert_eq!(HostError::Draining.code(), "host_draining");
    assert!(HostError::Draining.is_retryable());
}

fn scope() -> OwnerScope {
    OwnerScope::new(
        StorageId::new(STORAGE).unwrap(),
        ClassName::new("Counter").unwrap(),
        0,
        ShardCount::default(),
    )
    .unwrap()
}

/// Nothing was created: no object root, no storage pointer, no lease.
async fn untouched(w: &World) {
    assert!(!w.root().exists(), "the object root was created");
    let snap = w
        .store()
        .snapshot(&scope(), &LifecycleId::new(LIFECYCLE).unwrap())
        .await
        .unwrap();
    assert_eq!(snap.active_storage, None);
    assert_eq!(snap.owner, None);
    assert_eq!(snap.generation, 0);
}

#[tokio::test]
async fn bad_configuration_refuses_to_start_before_anything_starts() {
    let w = World::new();
    let mut short = settings();
    short.renew_interval_ms = Some(9_500);
    // Bad ids never reach a configuration: each id is checked when it is
    // made ([`durability_host::HostIds`]).
    assert!(StorageId::new("st 1").is_err());
    assert!(durability_host::TaskId::new("").is_err());
    assert!(LifecycleId::new("").is_err());
    let cases: Vec<(&str, durability_host::HostConfig<_, _>)> = vec![
        (
            "classes",
            w.bare("a", STORAGE).create_active_storage_if_absent(true),
        ),
        ("renew_interval_ms", w.config("a").settings(short)),
        (
            "own",
            w.config("a")
                .own(OwnPolicy::Shards(vec![("Room".to_owned(), 0)])),
        ),
        (
            "own",
            w.config("a")
                .own(OwnPolicy::Shards(vec![("Counter".to_owned(), 16)])),
        ),
        ("endpoint", w.config("a").endpoint("")),
        (
            "dispatcher",
            w.config("a")
                .dispatcher(durability_alarms::DispatcherConfig {
                    concurrency: 0,
                    ..Default::default()
                }),
        ),
    ];
    for (setting, config) in cases {
        let err = Host::start(config).await.expect_err(setting);
        eprintln!("refused {setting}: {err}");
        match &err {
            HostError::InvalidSetting { setting: s, .. } => assert_eq!(*s, setting, "{err}"),
            other => panic!("{setting}: {other}"),
        }
        untouched(&w).await;
    }
}

#[tokio::test]
async fn the_active_storage_pointer_is_required_or_created_on_request() {
    let w = World::new();
    let lifecycle = LifecycleId::new(LIFECYCLE).unwrap();
    // Missing, and not to be created: refused, naming the record and the fix.
    let err = Host::start(w.config("a").create_active_storage_if_absent(false))
        .await
        .err()
        .unwrap();
    eprintln!("missing pointer: {err}");
    assert_eq!(err.code(), "host_lifecycle_record");
    let text = err.to_string();
    assert!(
        text.contains("ns:app") && text.contains("missing"),
        "{text}"
    );
    assert!(
        text.contains("set_active_storage") && text.contains("st1"),
        "{text}"
    );
    untouched(&w).await;

    // Pointing at another storage: refused, never overwritten, even with
    // the create option.
    let store = w.store();
    store
        .set_active_storage(&lifecycle, Some(&StorageId::new("st0").unwrap()))
        .await
        .unwrap();
    let err = Host::start(w.config("a")).await.err().unwrap();
    eprintln!("other storage: {err}");
    assert!(
        matches!(&err, HostError::LifecycleRecord { found, .. } if found == "\"st0\""),
        "{err}"
    );
    let snap = store.snapshot(&scope(), &lifecycle).await.unwrap();
    assert_eq!(snap.active_storage, Some(StorageId::new("st0").unwrap()));

    // A whole-delete lock: refused.
    store
        .set_active_storage(&lifecycle, Some(&StorageId::new(STORAGE).unwrap()))
        .await
        .unwrap();
    store
        .set_delete_lock(&lifecycle, Some(DeleteLock::Whole))
        .await
        .unwrap();
    let err = Host::start(w.config("a")).await.err().unwrap();
    assert!(
        matches!(&err, HostError::LifecycleRecord { found, .. } if found == "whole-delete locked"),
        "{err}"
    );
    store.set_delete_lock(&lifecycle, None).await.unwrap();

    // The right pointer: starts (and a fresh world creates it on request).
    let host = Host::start(w.config("a").create_active_storage_if_absent(false))
        .await
        .unwrap();
    assert_eq!(host.probe().state, "running");
    host.shutdown().await;
    let fresh = World::new();
    let host = fresh.host("a").await;
    let snap = fresh.store().snapshot(&scope(), &lifecycle).await.unwrap();
    assert_eq!(snap.active_storage, Some(StorageId::new(STORAGE).unwrap()));
    host.shutdown().await;
}

/// `GET path` on `port`, answered with its status code and body.
async fn get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

#[tokio::test]
async fn readiness_turns_false_at_the_drain_while_liveness_stays_ok() {
    let w = World::new();
    let host = w.host("a").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = durability_host::CancellationToken::new();
    let server = tokio::spawn(durability_host::transport::serve(
        host.clone(),
        listener,
        stop.clone(),
    ));
    assert!(host.is_ready());
    // The probe shows the effective lease settings and the failover
    // budget they give (owner TTL + one owner-loop period).
    let probe = host.probe();
    let expected = settings();
    assert_eq!(probe.owner_ttl_ms, expected.ownership.owner_ttl_ms);
    assert_eq!(probe.renew_interval_ms, expected.renew_interval());
    assert_eq!(
        probe.failover_budget_ms,
        expected.ownership.owner_ttl_ms + expected.renew_interval()
    );
    assert_eq!(get(port, "/ready").await, (200, "ready".to_owned()));
    assert_eq!(get(port, "/health").await, (200, "ok".to_owned()));
    // `/metrics` speaks the facade's vocabulary, with the probe's numbers.
    crate::support::incr(&host, "c1").await.unwrap();
    let (status, metrics) = get(port, "/metrics").await;
    assert_eq!(status, 200);
    let completed = host.probe().dispatch.completed - host.probe().dispatch.handler_failed;
    assert!(
        metrics.contains(&format!(
            "durability_host_dispatches_total{{task=\"a\",outcome=\"completed\"}} {completed}\n"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE durability_ownership_in_flight gauge\n"),
        "{metrics}"
    );
    assert!(!metrics.contains("do_"), "{metrics}");
    // Before this endpoint existed, only `/health` answered, and it said
    // ok through the whole drain.
    host.shutdown().await;
    assert!(!host.is_ready());
    assert_eq!(get(port, "/ready").await, (503, "stopped".to_owned()));
    assert_eq!(get(port, "/health").await, (200, "ok".to_owned()));
    stop.cancel();
    server.await.unwrap().unwrap();
}
