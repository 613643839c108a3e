//! The host's figures through the `metrics` facade, read back with the
//! debugging recorder: dispatch outcomes, cold opens and routing (local,
//! forwarded, direct, rediscoveries) after real calls, each equal to the
//! plain number of the probe; and the route, dispatch, owner-resolution
//! and alarm-delivery spans with their fields.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use durability_host::transport::{EndpointPolicy, OwnerHeaders, Reply};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::{Value, json};
use tracing_subscriber::layer::SubscriberExt as _;

use crate::rpc::{Scripted, TOKEN, a_with_c1, ownership, scripted_b, with_methods};
use crate::support::{TestHost, World, block_on, incr};

/// Counters by (name, task, other label value).
type Counters = BTreeMap<(String, String, String), u64>;

/// Every counter of the snapshot: (name, task, other label value) → value.
fn counters(snapshotter: &Snapshotter) -> Counters {
    let mut out = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut task = String::new();
        let mut other = String::new();
        for label in key.labels() {
            if label.key() == "task" {
                task = label.value().to_owned();
            } else {
                other = label.value().to_owned();
            }
        }
        if let DebugValue::Counter(n) = value {
            *out.entry((key.name().to_owned(), task, other)).or_default() += n;
        }
    }
    out
}

/// Runs `f` to completion on a runtime of its own under a debugging
/// recorder; returns its output and every counter it recorded.
fn recorded<F: Future>(f: F) -> (F::Output, Counters) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let out = metrics::with_local_recorder(&recorder, || block_on(f));
    (out, counters(&snapshotter))
}

fn get(c: &Counters, name: &str, task: &str, label: &str) -> u64 {
    c.get(&(name.to_owned(), task.to_owned(), label.to_owned()))
        .copied()
        .unwrap_or(0)
}

#[test]
fn dispatch_and_routing_figures_reach_the_facade_and_match_the_probe() {
    let ((pa, pb), c) = recorded(async {
        let w = World::new();
        let a = TestHost::start(with_methods(w.config("a"))).await.unwrap();
        let c1 = a.object_by_name("Counter", "c1");
        c1.call("incr", Value::Null).await.unwrap();
        c1.call("incr", Value::Null).await.unwrap();
        // The method's own error: a dispatch whose body failed.
        assert!(c1.call("fail", Value::Null).await.is_err());
        // Refused before anything opens.
        assert_eq!(
            incr(&a, "").await.unwrap_err().code(),
            "host_invalid_object_name"
        );
        let generation = a.probe().scopes[0].generation;
        let key = a.scope_for("Counter", "c1").unwrap().host_id().to_owned();

        let (b, transport) = scripted_b(&w).await;
        let ok = || Reply::Ok {
            result: json!({"n": 7}),
            owner: Some(OwnerHeaders {
                task: "a".to_owned(),
                generation,
                key: key.clone(),
                endpoint: None,
            }),
        };
        let b1 = b.object_by_name("Counter", "c1");
        // Forwarded through b's router (b learns the hint), then sent
        // direct, then direct again answered stale_owner: one
        // rediscovery through the router, forwarded.
        transport.script(vec![ok()]);
        b1.call("incr", Value::Null).await.unwrap();
        transport.script(vec![ok()]);
        b1.call("incr", Value::Null).await.unwrap();
        transport.script(vec![ownership("stale_owner"), ok()]);
        b1.call("incr", Value::Null).await.unwrap();
        assert_eq!(transport.sent().len(), 2);
        // A direct dispatch on b of an object a owns: refused.
        assert!(matches!(
            incr(&b, "c1").await.unwrap_err(),
            durability_host::HostError::NotOwner { .. }
        ));
        b.shutdown().await;
        a.shutdown().await;
        // A drained host refuses.
        assert_eq!(incr(&a, "c1").await.unwrap_err().code(), "host_draining");
        (a.probe(), b.probe())
    });
    let d = "durability_host_dispatches_total";
    // Host a: two calls completed, one failed in its body, one bad name,
    // one refused while draining; one cold open; three local routes.
    assert_eq!(get(&c, d, "a", "completed"), 2);
    assert_eq!(get(&c, d, "a", "handler_failed"), 1);
    assert_eq!(get(&c, d, "a", "failed"), 1);
    assert_eq!(get(&c, d, "a", "refused_draining"), 1);
    assert_eq!(get(&c, d, "a", "refused_not_owner"), 0);
    assert_eq!(get(&c, "durability_host_cold_opens_total", "a", ""), 1);
    assert_eq!(get(&c, "durability_host_routed_total", "a", "local"), 3);
    // Host b: one refused (a owns the scope); routed: forwarded twice,
    // direct twice, one rediscovery, one hint evicted.
    assert_eq!(get(&c, d, "b", "refused_not_owner"), 1);
    assert_eq!(get(&c, d, "b", "completed"), 0);
    let r = "durability_host_routed_total";
    assert_eq!(get(&c, r, "b", "forwarded"), 2);
    assert_eq!(get(&c, r, "b", "direct"), 2);
    assert_eq!(get(&c, r, "b", "local"), 0);
    assert_eq!(get(&c, "durability_host_rediscoveries_total", "b", ""), 1);
    // One mechanism: every facade figure is the probe's number.
    for (task, p) in [("a", &pa), ("b", &pb)] {
        let s = &p.dispatch;
        assert_eq!(
            get(&c, d, task, "completed") + get(&c, d, task, "handler_failed"),
            s.completed,
            "{task}"
        );
        let q = &p.routing;
        for (name, label, n) in [
            (d, "handler_failed", s.handler_failed),
            (d, "refused_draining", s.refused_draining),
            (d, "refused_not_owner", s.refused_not_owner),
            (d, "refused_ownership", s.refused_ownership),
            (d, "fenced", s.fenced),
            (d, "ownership_lost", s.ownership_lost),
            ("durability_host_cold_opens_total", "", s.cold),
            ("durability_host_evictions_total", "", s.evicted),
            (r, "local", q.local),
            (r, "forwarded", q.forwarded),
            (r, "direct", q.direct),
            ("durability_host_rediscoveries_total", "", q.rediscoveries),
            ("durability_host_hint_evictions_total", "", q.hint_evictions),
            (
                "durability_host_refusals_total",
                "endpoint",
                q.endpoint_refusals,
            ),
            ("durability_host_refusals_total", "auth", q.auth_refusals),
            ("durability_host_invokes_served_total", "", q.served),
            (
                "durability_host_alarm_forwards_total",
                "sent",
                q.alarms_forwarded,
            ),
            (
                "durability_host_alarm_forwards_total",
                "served",
                q.alarms_served,
            ),
        ] {
            assert_eq!(get(&c, name, task, label), n, "{task} {name} {label}");
        }
    }
}

/// The spans opened, as `name{field=value,…}` (fields sorted).
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<String>>>);

struct Fields(BTreeMap<String, String>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields(BTreeMap::new());
        attrs.record(&mut fields);
        let fields: Vec<String> = fields.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.0.lock().unwrap().push(format!(
            "{}{{{}}}",
            attrs.metadata().name(),
            fields.join(",")
        ));
    }
}

#[test]
fn calls_and_alarm_deliveries_open_spans_naming_the_object() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    tracing::subscriber::with_default(subscriber, || {
        block_on(async {
            let w = World::new();
            let a = a_with_c1(&w).await;
            w.set_timer_in(&a, "c1", 1_000).await;
            assert!(w.fires("a c1").await);
            a.shutdown().await;
        });
    });
    let spans = spans.0.lock().unwrap().clone();
    let scope = "st1:Counter:shard";
    let route = spans
        .iter()
        .find(|s| s.starts_with("durability.host.route{"))
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert!(
        route.contains("class=Counter")
            && route.contains("object=c1")
            && route.contains("method=incr"),
        "{route}"
    );
    assert!(route.contains(&format!("scope={scope}")), "{route}");
    // The call's route and its dispatch carry one request id; the alarm
    // delivery carries its own.
    let id_of = |span: &str| {
        span.split_once("request_id=")
            .and_then(|(_, rest)| rest.split([',', '}']).next())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no request_id on {span}"))
    };
    let id = id_of(route);
    assert!(
        spans.iter().any(|s| *s
            == format!("durability.host.dispatch{{class=Counter,object=c1,request_id={id}}}")),
        "{spans:#?}"
    );
    let delivery = spans
        .iter()
        .find(|s| s.starts_with("durability.host.alarm_delivery{"))
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_ne!(id_of(delivery), id, "{delivery}");
    assert!(
        spans
            .iter()
            .any(|s| s.starts_with("durability.ownership.resolve{")
                && s.contains(&format!("scope={scope}"))),
        "{spans:#?}"
    );
}

#[test]
fn client_calls_reach_the_facade_one_outcome_each_and_match_its_stats() {
    use durability_host::transport::Transport;
    use durability_host::{ClientCalls, ClientStats, RpcClient};
    use durability_ownership::{ClassName, ObjectName, OwnerScope, ShardCount, StorageId};

    let ((stats, sent), c) = recorded(async {
        let key = OwnerScope::for_object(
            StorageId::new("st1").unwrap(),
            ClassName::new("Counter").unwrap(),
            &ObjectName::new("c1"),
            ShardCount::default(),
        )
        .unwrap()
        .host_id()
        .to_owned();
        let owner = "http://127.0.0.1:18788";
        let ok = || Reply::Ok {
            result: json!({"n": 1}),
            owner: Some(OwnerHeaders {
                task: "a".to_owned(),
                generation: 1,
                key: key.clone(),
                endpoint: Some(owner.to_owned()),
            }),
        };
        let transport = Scripted::default();
        transport.script(vec![
            // 1: through the entry, the hint learned: completed.
            ok(),
            // 2: direct, the method's own error: failed.
            Reply::Failed {
                status: 500,
                code: "app_error".to_owned(),
                message: "no".to_owned(),
                details: None,
            },
            // 3: direct, stale (hint evicted, one rediscovery), then
            // through the entry: completed.
            ownership("stale_owner"),
            ok(),
            // 4: direct, never sent (hint evicted): unreachable.
            Reply::NotSent {
                reason: "refused".to_owned(),
            },
            // 5: through the entry, unreadable success: unknown.
            Reply::ResultUnknown {
                reason: "truncated".to_owned(),
            },
            // 6: through the entry, unmarked answer: unavailable.
            Reply::Unmarked {
                reason: "502".to_owned(),
            },
            // 7: a refusal that is not rediscovered: refused_ownership.
            ownership("draining"),
            // 8: stale twice (one rediscovery allowed): refused_ownership.
            ownership("stale_owner"),
            ownership("owner_race"),
        ]);
        let client = RpcClient::with(
            "http://127.0.0.1:18789",
            TOKEN,
            "st1",
            ShardCount::default(),
            EndpointPolicy::default(),
            Arc::new(transport.clone()) as Arc<dyn Transport>,
        )
        .unwrap();
        let call = || client.call("Counter", "c1", "incr", Value::Null);
        let remote = |e: durability_host::HostError| match e {
            durability_host::HostError::Remote { code, .. } => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(call().await.unwrap(), json!({"n": 1}));
        assert_eq!(remote(call().await.unwrap_err()), "app_error");
        assert_eq!(call().await.unwrap(), json!({"n": 1}));
        assert!(matches!(
            call().await.unwrap_err(),
            durability_host::HostError::OwnerUnreachable { .. }
        ));
        assert!(matches!(
            call().await.unwrap_err(),
            durability_host::HostError::RpcResultUnknown { .. }
        ));
        assert!(matches!(
            call().await.unwrap_err(),
            durability_host::HostError::OwnerUnavailable { .. }
        ));
        assert_eq!(remote(call().await.unwrap_err()), "draining");
        // The last trusted code, as a host's own router reports it.
        assert_eq!(remote(call().await.unwrap_err()), "owner_race");
        // 9: refused by the client, nothing sent: invalid.
        assert!(client.call("Counter", "c1", "", Value::Null).await.is_err());
        (client.stats(), transport.sent())
    });
    // Every scripted reply was consumed, none more.
    assert_eq!(sent.len(), 10);
    assert_eq!(
        stats,
        ClientStats {
            routed: 7,
            direct: 3,
            rediscoveries: 2,
            hint_evictions: 2,
            calls: ClientCalls {
                completed: 2,
                failed: 1,
                refused_ownership: 2,
                unreachable: 1,
                unavailable: 1,
                unknown: 1,
                invalid: 1,
            },
        }
    );
    let calls = "durability_host_client_calls_total";
    let s = &stats.calls;
    for (outcome, n) in [
        ("completed", s.completed),
        ("failed", s.failed),
        ("refused_ownership", s.refused_ownership),
        ("unreachable", s.unreachable),
        ("unavailable", s.unavailable),
        ("unknown", s.unknown),
        ("invalid", s.invalid),
    ] {
        assert_eq!(get(&c, calls, "", outcome), n, "{outcome}");
    }
    let r = "durability_host_client_routed_total";
    assert_eq!(get(&c, r, "", "entry"), stats.routed);
    assert_eq!(get(&c, r, "", "direct"), stats.direct);
    assert_eq!(
        get(&c, "durability_host_client_rediscoveries_total", "", ""),
        stats.rediscoveries
    );
    assert_eq!(
        get(&c, "durability_host_client_hint_evictions_total", "", ""),
        stats.hint_evictions
    );
    // The client is not a host: no task label, and no host figure moved.
    assert!(
        c.keys()
            .all(|(name, task, _)| task.is_empty() && name.starts_with("durability_host_client_")),
        "{c:#?}"
    );
}
