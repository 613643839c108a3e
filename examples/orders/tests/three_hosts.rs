//! Runs the orders service as host processes of the `orders` binary, each
//! in a working directory of its own, sharing only the PostgreSQL schema of
//! this test (objects, leases, alarm jobs) and a webhook sink the test
//! serves. Three hosts start; orders and payments go in over the public
//! edge of every host (plain HTTP) and over a `FailoverClient` entering
//! through all three; limits go to members through the coordinator's state
//! channel. Host b dies mid-run (SIGKILL; drained by SIGTERM instead with
//! `ORDERS_TEST_LEAVE=drain`) right after orders on its shards were placed to expire
//! after it is gone; calls go on through the others and a fourth host
//! joins. Then, polling with a deadline: every acknowledged order is stored
//! in the database with its expected state, every order's newest event
//! reached the webhook, the short-lived unpaid orders (b's included) were
//! expired by their alarms, and every member applied the coordinator's
//! latest limits and ignores an older delivery. The survivors drain.
#![allow(clippy::unwrap_used, clippy::print_stderr, clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durability_example_orders::api::{
    self, AppliedLimits, Capture, Limits, OrderStatus, PaymentView, PlaceOrder, Placed,
};
use durability_example_orders::webhook::{Delivery, HttpClient};
use durability_host::transport::{AUTH_HEADER, PROBE_PATH};
use durability_host::{CallError, FailoverClient, HostError, Method};
use durability_ownership::{ClassName, ObjectName, OwnerScope, ShardCount, StorageId};
use durability_scheduler::{Clock as _, SystemClock};
use durability_storage_postgres::testkit::{TestSchema, url};
use serde::Serialize;
use serde::de::DeserializeOwned;

const TOKEN: &str = "orders-example-internal-token";
const STORAGE: &str = "orders-v1";
/// How long the test waits for anything to happen.
const DEADLINE_MS: i64 = 90_000;

/// The wall clock, for deadlines only.
fn now() -> i64 {
    SystemClock::new().now_ms()
}

/// One `orders` process.
struct Proc {
    name: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// The thread copying stdout into `lines` (joined once the child exits,
    /// so its last lines are read before they are looked for).
    reader: Option<std::thread::JoinHandle<()>>,
    public: String,
    internal: String,
}

impl Proc {
    fn spawn(name: &str, cwd: &Path, internal: &str, env: &[(&str, String)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_orders"))
            .current_dir(cwd)
            .env("ORDERS_TASK", name)
            .env("ORDERS_INTERNAL_ADDR", internal)
            .env("ORDERS_PUBLIC_ADDR", "127.0.0.1:0")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        let mut p = Self {
            name: name.to_owned(),
            child,
            lines,
            reader: Some(reader),
            public: String::new(),
            internal: format!("http://{internal}"),
        };
        let ready = p.wait_line("ready ");
        let public = ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix("public="))
            .unwrap();
        p.public = format!("http://{public}");
        eprintln!("{name}: {ready}");
        p
    }

    /// The first line starting with `prefix`, polling until the deadline.
    fn wait_line(&mut self, prefix: &str) -> String {
        let end = now() + DEADLINE_MS;
        let found = |lines: &Mutex<Vec<String>>| {
            lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.starts_with(prefix))
                .cloned()
        };
        loop {
            if let Some(l) = found(&self.lines) {
                return l;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Its stdout is closed: read what the reader still holds.
                if let Some(reader) = self.reader.take() {
                    reader.join().unwrap();
                }
                if let Some(l) = found(&self.lines) {
                    return l;
                }
                panic!("{} exited ({status}) before printing {prefix:?}", self.name);
            }
            assert!(now() < end, "{}: no {prefix:?} line", self.name);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn sigterm(&mut self) -> String {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let drained = self.wait_line("drained ");
        self.child.wait().unwrap();
        drained
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The webhook sink: records every delivery it acknowledges.
async fn webhook_sink() -> (String, Arc<Mutex<Vec<Delivery>>>) {
    let got: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let record = Arc::clone(&got);
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let record = Arc::clone(&record);
            async move {
                let batch: Vec<Delivery> = serde_json::from_slice(&body).unwrap();
                record.lock().unwrap().extend(batch);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), got)
}

/// Polls `attempt` until it answers, at most [`DEADLINE_MS`].
async fn until<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let end = now() + DEADLINE_MS;
    let mut n = 0;
    loop {
        match attempt(n).await {
            Ok(t) => return t,
            Err(e) => assert!(now() < end, "{what}: {e}"),
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One HTTP exchange with the edge, decoded: `Err` on anything but `200`.
async fn edge<A: Serialize, R: DeserializeOwned>(
    http: &HttpClient,
    method: &str,
    url: &str,
    body: Option<&A>,
) -> Result<R, String> {
    let body = body.map_or_else(Vec::new, |b| serde_json::to_vec(b).unwrap());
    let (status, bytes) = http.send(method, url, body).await?;
    if status != 200 {
        return Err(format!(
            "{method} {url}: {status} {}",
            String::from_utf8_lossy(&bytes)
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("{method} {url}: {e}"))
}

/// A typed call through the failover client; an unknown outcome or an
/// unreachable owner is `Err` (the caller's methods are idempotent, so it
/// sends again), a method's refusal panics.
async fn rpc<M: Method + Clone>(
    client: &FailoverClient,
    name: &str,
    args: &M,
) -> Result<M::Out, String> {
    let class = <M::Class as durability_host::Class>::NAME;
    match client.call_typed(name, args.clone()).await {
        Ok(r) => Ok(r),
        Err(CallError::Method(refusal)) => panic!("{class} {name} {}: {refusal:?}", M::NAME),
        Err(CallError::Host(e @ HostError::Handler(_))) => {
            panic!("{class} {name} {}: {e}", M::NAME)
        }
        Err(CallError::Host(e)) => Err(format!("{class} {name} {}: {} {e}", M::NAME, e.code())),
    }
}

/// What each acknowledged order must end as.
type Expected = BTreeMap<String, OrderStatus>;

async fn place_over_edge(http: &HttpClient, host: &Proc, order: &str, ttl_ms: Option<i64>) {
    let args = PlaceOrder {
        cents: 1_000,
        ttl_ms,
    };
    let url = format!("{}/orders/{order}", host.public);
    let placed: Placed = until(&format!("place {order}"), |_| {
        edge(http, "PUT", &url, Some(&args))
    })
    .await;
    assert_eq!(placed.order.cents, 1_000);
}

async fn capture_over_edge(
    http: &HttpClient,
    host: &Proc,
    payment: &str,
    order: &str,
    cents: i64,
) -> PaymentView {
    let url = format!("{}/payments/{payment}", host.public);
    let args = Capture {
        order: order.to_owned(),
        cents,
    };
    until(&format!("capture {payment}"), |_| {
        edge(http, "POST", &url, Some(&args))
    })
    .await
}

/// The stored status of every order the schema holds.
async fn stored(schema: &TestSchema) -> BTreeMap<String, String> {
    let (c, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let s = schema.name();
    let prefix = format!("{STORAGE}:Order:");
    let mut out = BTreeMap::new();
    let rows = c
        .query(
            &format!("SELECT id, seq FROM {s}.durability_objects WHERE id LIKE $1"),
            &[&format!("{prefix}%")],
        )
        .await
        .unwrap();
    for row in rows {
        let id: String = row.get(0);
        let seq: i64 = row.get(1);
        let status = c
            .query_opt(&format!("SELECT status FROM {s}_o{seq}.order_state"), &[])
            .await;
        if let Ok(Some(r)) = status {
            out.insert(id[prefix.len()..].to_owned(), r.get(0));
        }
    }
    out
}

/// The scopes `host` owns, from its probe (the internal token's endpoint).
async fn owned_scopes(http: &HttpClient, host: &Proc) -> Vec<String> {
    let url = format!("{}{PROBE_PATH}", host.internal);
    let (status, body) = http
        .send_with("GET", &url, &[(AUTH_HEADER, TOKEN)], Vec::new())
        .await
        .unwrap();
    assert_eq!(status, 200);
    let probe: serde_json::Value = serde_json::from_slice(&body).unwrap();
    probe["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["scope"].as_str().unwrap().to_owned())
        .collect()
}

/// The scope of the order named `name`.
fn scope_of(name: &str) -> String {
    OwnerScope::for_object(
        StorageId::new(STORAGE).unwrap(),
        ClassName::new("Order").unwrap(),
        &ObjectName::new(name),
        ShardCount::default(),
    )
    .unwrap()
    .to_string()
}

/// What the database holds for an object's pending work (printed when a
/// wait fails): due capabilities, the scheduler's alarm, the alarm row and
/// the index job.
async fn diagnose(schema: &TestSchema, class: &str, names: &[&String]) -> String {
    let (c, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let s = schema.name();
    let mut out = String::new();
    for name in names {
        let id = format!("{STORAGE}:{class}:{name}");
        for (table, column) in [
            ("durability_object_due", "object_id"),
            ("durability_object_alarm", "object_id"),
            ("durability_object_alarm_row", "object_id"),
            ("durability_alarm_jobs", "object"),
            ("durability_object_outbox", "object_id"),
        ] {
            let rows = c
                .query(
                    &format!("SELECT row_to_json(t)::text FROM {s}.{table} t WHERE {column} = $1"),
                    &[&id],
                )
                .await
                .map(|rows| {
                    rows.iter()
                        .map(|r| r.get::<_, String>(0))
                        .collect::<Vec<_>>()
                });
            out.push_str(&format!("\n  {name} {table}: {rows:?}"));
        }
    }
    out
}

fn newest(deliveries: &[Delivery]) -> BTreeMap<String, Delivery> {
    let mut newest: BTreeMap<String, Delivery> = BTreeMap::new();
    for d in deliveries {
        if newest.get(&d.key).is_none_or(|old| old.version < d.version) {
            newest.insert(d.key.clone(), d.clone());
        }
    }
    newest
}

/// How host b leaves mid-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leave {
    /// SIGTERM: it drains, releasing its leases and alarm claims.
    Drain,
    /// SIGKILL: its leases and claims expire.
    Kill,
}

/// Host b is SIGKILLed (with `ORDERS_TEST_LEAVE=drain` it drains on
/// SIGTERM instead). A killed host can leave an acknowledged order's alarm
/// row pending with no index job; the next owner's repair schedules it
/// again (README, "Alarm rows left without a job").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_serve_orders_over_the_edge_and_a_failover_client_while_one_leaves_and_one_joins()
 {
    let leave = match std::env::var("ORDERS_TEST_LEAVE").as_deref() {
        Ok("drain") => Leave::Drain,
        _ => Leave::Kill,
    };
    scenario(leave).await;
}

async fn scenario(leave: Leave) {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let (hook, deliveries) = webhook_sink().await;
    // Every host listens internally on the same port (the deployment's
    // internal port), each on its own loopback address.
    let port = std::net::TcpListener::bind("127.0.0.2:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env = vec![
        ("DO_DATABASE_URL", url()),
        ("DO_DATABASE_SCHEMA", schema.name().to_owned()),
        ("DO_OWNER_TTL_SECONDS", "4".to_owned()),
        ("DO_OWNER_LEASE_GUARD_MS", "300".to_owned()),
        ("DO_DRAIN_IN_FLIGHT_TIMEOUT_MS", "3000".to_owned()),
        ("DO_DRAIN_TIMEOUT_MS", "5000".to_owned()),
        ("ORDERS_RENEW_INTERVAL_MS", "300".to_owned()),
        // An alarm the killed host had claimed waits for its claim lease:
        // a short one here (the default is 5 minutes).
        ("WORKFLOWS_DO_ALARM_CLAIM_LEASE_MS", "6000".to_owned()),
        ("WORKFLOWS_DISPATCH_TIMEOUT_MS", "4000".to_owned()),
        ("ORDERS_INTERNAL_TOKEN", TOKEN.to_owned()),
        ("ORDERS_WEBHOOK_URL", hook),
        ("ORDERS_ORDER_TTL_MS", "600000".to_owned()),
        ("RUST_LOG", "warn".to_owned()),
    ];
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let spawn = |i: usize, name: &str| {
        Proc::spawn(
            name,
            dirs[i].path(),
            &format!("127.0.0.{}:{port}", i + 2),
            &env,
        )
    };
    let a = spawn(0, "host-a");
    let mut b = spawn(1, "host-b");
    let c = spawn(2, "host-c");
    let http = HttpClient::new(Duration::from_secs(10));
    let mut expected = Expected::new();

    // A bad order is refused with a typed error and stores nothing.
    let (status, body) = http
        .send(
            "PUT",
            &format!("{}/orders/bad", a.public),
            br#"{"cents":0}"#.to_vec(),
        )
        .await
        .unwrap();
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("invalid_order"));
    let (status, _) = http
        .send("GET", &format!("{}/orders/bad", b.public), Vec::new())
        .await
        .unwrap();
    assert_eq!(status, 404);
    let (status, _) = http
        .send(
            "POST",
            &format!("{}/orders/bad/refund", c.public),
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(status, 405, "not a route of the Order class");

    // Over the public edge of every host: whichever host owns the order.
    let hosts = [&a, &b, &c];
    for i in 0..12 {
        let order = format!("e-{i}");
        let short = i % 3 == 0;
        place_over_edge(&http, hosts[i % 3], &order, short.then_some(1_500)).await;
        if i % 3 == 1 {
            let paid =
                capture_over_edge(&http, hosts[(i + 1) % 3], &format!("pe-{i}"), &order, 1_000)
                    .await;
            assert_eq!(paid.status, "applied", "{paid:?}");
            expected.insert(order, OrderStatus::Paid);
        } else {
            expected.insert(
                order,
                if short {
                    OrderStatus::Expired
                } else {
                    OrderStatus::Placed
                },
            );
        }
    }
    // A wrong amount: the order's refusal crosses hosts with its code.
    let wrong = capture_over_edge(&http, &c, "pe-wrong", "e-2", 999).await;
    assert_eq!(
        wrong.reason.as_deref(),
        Some("amount_mismatch"),
        "{wrong:?}"
    );
    let again = capture_over_edge(&http, &a, "pe-wrong", "e-2", 999).await;
    assert_eq!(again, wrong, "a payment is captured once");

    // Limits v1 to eight members, through the coordinator's channel.
    let members: Vec<String> = (0..8).map(|i| format!("m-{i}")).collect();
    let v1 = Limits {
        rps: 100,
        max_order_cents: 5_000,
    };
    let set = api::SetLimits {
        group: "global".to_owned(),
        members: members.clone(),
        limits: v1,
    };
    let limits_url = format!("{}/limits/coordinator", b.public);
    let _: api::LimitsSet =
        until("limits v1", |_| edge(&http, "PUT", &limits_url, Some(&set))).await;

    // Through a failover client entering at b first.
    let entries = [
        b.internal.as_str(),
        a.internal.as_str(),
        c.internal.as_str(),
    ];
    let client = FailoverClient::new(&entries, TOKEN, STORAGE, ShardCount::default()).unwrap();
    for i in 0..6 {
        let order = format!("f-{i}");
        let args = PlaceOrder {
            cents: 1_000,
            ttl_ms: Some(2_000),
        };
        let _: Placed = until(&order, |_| rpc(&client, &order, &args)).await;
        expected.insert(order, OrderStatus::Expired);
    }

    // Orders whose shard b owns, expiring after b is gone: a survivor's
    // alarm must expire them and deliver their events.
    let owned = until("b owns an Order shard", |_| async {
        let owned = owned_scopes(&http, &b).await;
        if owned.iter().any(|s| s.contains(":Order:")) {
            Ok(owned)
        } else {
            Err(format!("b owns {owned:?}"))
        }
    })
    .await;
    let on_b: Vec<String> = (0..10_000)
        .map(|i| format!("b-{i}"))
        .filter(|name| owned.contains(&scope_of(name)))
        .take(3)
        .collect();
    for order in &on_b {
        let args = PlaceOrder {
            cents: 1_000,
            ttl_ms: Some(1_000),
        };
        let _: Placed = until(order, |_| rpc(&client, order, &args)).await;
        expected.insert(order.clone(), OrderStatus::Expired);
    }
    // b leaves: its shards, objects and pending alarms move to the others
    // (at once after a drain, once its leases expire after a kill);
    // meanwhile calls go on.
    match leave {
        Leave::Drain => {
            let drained = b.sigterm();
            assert!(drained.contains("timed_out=false"), "b: {drained}");
        }
        Leave::Kill => {
            b.child.kill().unwrap();
            b.child.wait().unwrap();
        }
    }
    eprintln!("host-b gone ({leave:?})");
    for i in 0..12 {
        let order = format!("k-{i}");
        let args = PlaceOrder {
            cents: 1_000,
            ttl_ms: None,
        };
        if i % 2 == 0 {
            let _: Placed = until(&order, |_| rpc(&client, &order, &args)).await;
        } else {
            place_over_edge(&http, [&a, &c][i % 4 / 2], &order, None).await;
        }
        let payment = format!("pk-{i}");
        let capture = Capture {
            order: order.clone(),
            cents: 1_000,
        };
        let paid: PaymentView = until(&payment, |_| rpc(&client, &payment, &capture)).await;
        assert_eq!(paid.status, "applied", "{paid:?}");
        expected.insert(order, OrderStatus::Paid);
    }
    let v2 = Limits {
        rps: 250,
        max_order_cents: 9_000,
    };
    let mut grown = members.clone();
    grown.push("m-8".to_owned());
    let set = api::SetLimits {
        group: "global".to_owned(),
        members: grown.clone(),
        limits: v2.clone(),
    };
    let _: api::LimitsSet = until("limits v2", |_| rpc(&client, "coordinator", &set)).await;

    // A new host joins and serves at once.
    let d = spawn(3, "host-d");
    for i in 0..6 {
        let order = format!("j-{i}");
        place_over_edge(&http, &d, &order, None).await;
        expected.insert(order, OrderStatus::Placed);
    }

    // Every acknowledged order is stored as expected (alarms fired).
    let got = until("stored orders", |_| async {
        let stored = stored(&schema).await;
        let bad: Vec<&String> = expected
            .iter()
            .filter(|(o, s)| stored.get(*o).map(String::as_str) != Some(s.as_str()))
            .map(|(o, _)| o)
            .collect();
        let wrong: Vec<_> = expected
            .iter()
            .filter(|(o, _)| bad.contains(o))
            .map(|(o, s)| format!("{o}: want {}, stored {:?}", s.as_str(), stored.get(o)))
            .collect();
        if wrong.is_empty() {
            Ok(stored)
        } else {
            Err(wrong.join("; ") + &diagnose(&schema, "Order", &bad).await)
        }
    })
    .await;
    assert!(!got.contains_key("bad"), "a refused order stores nothing");
    // Every order's newest event reached the webhook.
    until("webhook deliveries", |_| async {
        let newest = newest(&deliveries.lock().unwrap());
        let late: Vec<&String> = expected
            .iter()
            .filter(|(o, s)| newest.get(*o).is_none_or(|d| d.event.status != **s))
            .map(|(o, _)| o)
            .collect();
        let missing: Vec<_> = expected
            .iter()
            .filter(|(o, _)| late.contains(o))
            .map(|(o, s)| {
                format!(
                    "{o}: want {}, delivered {:?}",
                    s.as_str(),
                    newest.get(o).map(|d| d.event.status)
                )
            })
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("; ") + &diagnose(&schema, "Order", &late).await)
        }
    })
    .await;
    // Every member converged to the latest limits.
    for m in &grown {
        let url = format!("{}/members/{m}", d.public);
        until(&format!("member {m}"), |_| async {
            let applied: Vec<AppliedLimits> = edge(&http, "GET", &url, None::<&()>).await?;
            match applied.first() {
                Some(a) if a.group == "global" && a.limits == v2 => Ok(()),
                other => Err(format!("{m} applied {other:?}")),
            }
        })
        .await;
    }
    // A member applies only newer versions: a late delivery of v1 (an
    // older version) changes nothing.
    let late = api::ApplyLimits {
        group: "global".to_owned(),
        version: 1,
        limits: Limits {
            rps: 1,
            max_order_cents: 1,
        },
    };
    let kept: AppliedLimits = until("late delivery", |_| rpc(&client, "m-0", &late)).await;
    assert!(!kept.applied, "{kept:?}");
    assert_eq!(kept.limits, v2);
    assert!(kept.version > 1, "{kept:?}");
    let pending: u64 = edge(
        &http,
        "GET",
        &format!("{}/limits/coordinator", a.public),
        None::<&()>,
    )
    .await
    .unwrap();
    assert_eq!(pending, 0, "every delivery acknowledged");

    // The host's Prometheus endpoint.
    let (status, text) = http
        .send("GET", &format!("{}/metrics", d.internal), Vec::new())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&text);
    assert_eq!(status, 200);
    assert!(
        text.contains("durability_host_") && text.contains("task=\"host-d\""),
        "{text}"
    );

    let stats = client.stats();
    eprintln!(
        "orders {} deliveries {} failovers {} resends {}",
        expected.len(),
        deliveries.lock().unwrap().len(),
        stats.failovers,
        stats.resends
    );
    assert!(
        stats.failovers > 0,
        "the client failed over from the dead entry"
    );
    for mut p in [a, c, d] {
        let drained = p.sigterm();
        assert!(drained.contains("timed_out=false"), "{}: {drained}", p.name);
    }
}
