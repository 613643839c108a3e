//! The outbox in the caller's own PostgreSQL transaction, against the real
//! server: the contract (newest per key, versions, guarded settlement,
//! retries on injected time, dead letters, events), concurrent deliverers,
//! corrupt rows and hostile names. Each test works in a schema of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durability_outbox::{
    ChannelConfig, DeadLetter, DeadLetterFn, Entry, EventKind, OutboxEvent, RetryPolicy, Sink,
    SinkError,
};
use durability_storage_postgres::outbox::{CrashAt, PgDeliverer, PgOutbox};
use durability_storage_postgres::testkit::{self, TestSchema};
use durability_time::ManualClock;
use futures::FutureExt as _;
use tokio_postgres::{Client, NoTls};

const START: i64 = 1_000_000;

/// A schema with the outbox's tables, a client, and a manual clock.
pub(crate) struct Fixture {
    pub(crate) schema: TestSchema,
    pub(crate) outbox: PgOutbox,
    pub(crate) client: Client,
    pub(crate) clock: Arc<ManualClock>,
}

pub(crate) async fn client() -> Client {
    let (client, connection) = tokio_postgres::connect(&testkit::url(), NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

pub(crate) async fn fixture() -> Option<Fixture> {
    let schema = TestSchema::create().await?;
    let clock = Arc::new(ManualClock::new(START));
    let outbox = PgOutbox::new(schema.name())
        .unwrap()
        .with_clock(clock.clone());
    let mut client = client().await;
    outbox.setup(&mut client).await.unwrap();
    Some(Fixture {
        schema,
        outbox,
        client,
        clock,
    })
}

/// Records every batch; fails the first `fail` calls.
#[derive(Clone, Default)]
pub(crate) struct Log {
    pub(crate) got: Arc<Mutex<Vec<(String, u64, String)>>>,
    fail: Arc<Mutex<u32>>,
}

impl Log {
    fn failing(n: u32) -> Self {
        let log = Self::default();
        *log.fail.lock().unwrap() = n;
        log
    }
    pub(crate) fn values(&self) -> Vec<(String, u64, String)> {
        self.got.lock().unwrap().clone()
    }
}

impl Sink<String> for Log {
    async fn publish(&self, batch: &[Entry<String>]) -> Result<(), SinkError> {
        {
            let mut fail = self.fail.lock().unwrap();
            if *fail > 0 {
                *fail -= 1;
                return Err(SinkError::new("sink down"));
            }
        }
        let mut got = self.got.lock().unwrap();
        got.extend(
            batch
                .iter()
                .map(|e| (e.key().to_owned(), e.version(), e.value().clone())),
        );
        Ok(())
    }
}

impl Fixture {
    fn deliverer<K: Sink<String>>(
        &self,
        config: ChannelConfig<String>,
        sink: K,
    ) -> PgDeliverer<String, K> {
        let config_pg = testkit::url().parse().unwrap();
        PgDeliverer::new(&self.outbox, config_pg, 2, config, sink).unwrap()
    }

    async fn stage(&mut self, channel: &str, key: &str, value: &str) -> u64 {
        let tx = self.client.transaction().await.unwrap();
        let v = self
            .outbox
            .stage(&tx, channel, key, &value.to_owned())
            .await
            .unwrap();
        tx.commit().await.unwrap();
        v
    }

    async fn count(&self, sql: &str) -> i64 {
        let sql = sql.replace("{s}", self.schema.name());
        self.client.query_one(&sql, &[]).await.unwrap().get(0)
    }

    /// Waits (real time, at most 10 s) until no other session holds a lock
    /// on the outbox table: a dropped deliverer's connection closes in the
    /// background, and until the server ends its session the rows its open
    /// transaction claimed stay locked (`SKIP LOCKED` passes them over). A
    /// process that crashed loses its sockets with it, so a restarted one
    /// finds its sessions gone; an in-process drop must wait for that.
    async fn wait_until_dropped_sessions_ended(&self) {
        let clock = durability_time::SystemClock::new();
        let end = durability_time::Clock::now_ms(&clock) + 10_000;
        let held = "SELECT count(*) FROM pg_locks \
                    WHERE relation = '{s}.outbox'::regclass AND pid <> pg_backend_pid()";
        while self.count(held).await > 0 {
            assert!(
                durability_time::Clock::now_ms(&clock) < end,
                "a dropped deliverer's session still holds the outbox after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn events() -> (Arc<Mutex<Vec<OutboxEvent>>>, durability_outbox::EventHook) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hook_seen = seen.clone();
    let hook: durability_outbox::EventHook =
        Arc::new(move |e: &OutboxEvent| hook_seen.lock().unwrap().push(e.clone()));
    (seen, hook)
}

#[tokio::test]
async fn newest_value_per_key_commits_with_the_callers_transaction() {
    let Some(mut f) = fixture().await else { return };
    // A rolled-back transaction stages nothing.
    let tx = f.client.transaction().await.unwrap();
    f.outbox
        .stage(&tx, "orders", "o-1", &"lost".to_owned())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(f.count("SELECT count(*) FROM {s}.outbox").await, 0);

    let v1 = f.stage("orders", "o-1", "placed").await;
    let v2 = f.stage("orders", "o-1", "paid").await;
    let w = f.stage("orders", "o-2", "placed").await;
    assert!(v1 < v2 && v2 < w, "versions only increase: {v1} {v2} {w}");

    let log = Log::default();
    let d = f.deliverer(ChannelConfig::new("orders"), log.clone());
    assert_eq!(
        d.len().await.unwrap(),
        2,
        "only the newest value of a key is pending"
    );
    assert_eq!(d.pending("o-1").await.unwrap(), Some((v2, 0)));
    let report = d.deliver_due().await.unwrap();
    assert_eq!(report.delivered, 2);
    assert_eq!(
        log.values(),
        [
            ("o-1".into(), v2, "paid".into()),
            ("o-2".into(), w, "placed".into())
        ]
    );
    assert!(d.is_empty().await.unwrap());
    // Versions survive delivery: the next stage of the key is newer still.
    assert!(f.stage("orders", "o-1", "shipped").await > w);
}

/// Stages a newer value of the key it publishes, from another connection,
/// while the attempt is in flight.
struct Restager {
    outbox: PgOutbox,
    log: Log,
}

impl Sink<String> for Restager {
    async fn publish(&self, batch: &[Entry<String>]) -> Result<(), SinkError> {
        if self.log.values().is_empty() {
            let mut c = client().await;
            let tx = c.transaction().await.unwrap();
            self.outbox
                .stage(&tx, "orders", batch[0].key(), &"newer".to_owned())
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        self.log.publish(batch).await
    }
}

#[tokio::test]
async fn a_value_staged_while_its_older_version_is_in_flight_is_delivered_next() {
    let Some(mut f) = fixture().await else { return };
    let v1 = f.stage("orders", "o-1", "older").await;
    let log = Log::default();
    let sink = Restager {
        outbox: f.outbox.clone(),
        log: log.clone(),
    };
    let d = f.deliverer(ChannelConfig::new("orders"), sink);
    // The acknowledgement of the older version leaves the newer one, which
    // is due too (the clock stands still) and goes next in the same run.
    let report = d.deliver_due().await.unwrap();
    assert_eq!(report.delivered, 2, "{report:?}");
    let got = log.values();
    assert_eq!(got[0], ("o-1".into(), v1, "older".into()));
    assert_eq!((got[1].0.as_str(), got[1].2.as_str()), ("o-1", "newer"));
    assert!(got[1].1 > v1, "the newer value has a newer version");
    assert!(d.is_empty().await.unwrap());
}

#[tokio::test]
async fn failed_attempts_retry_after_the_delay_on_the_injected_clock() {
    let Some(mut f) = fixture().await else { return };
    let v = f.stage("mail", "m-1", "hello").await;
    let (seen, hook) = events();
    let policy = RetryPolicy {
        delay: Some(Arc::new(|attempt| 1_000.0 * f64::from(attempt))),
        ..RetryPolicy::default()
    };
    let log = Log::failing(2);
    let d = f.deliverer(
        ChannelConfig::new("mail").retry(policy).on_event(hook),
        log.clone(),
    );

    let r = d.deliver_due().await.unwrap();
    assert_eq!((r.delivered, r.retried), (0, 1));
    assert_eq!(d.pending("m-1").await.unwrap(), Some((v, 1)));
    // Not due before its delay, however often the deliverer runs.
    f.clock.advance(999);
    assert_eq!(d.deliver_due().await.unwrap().retried, 0);
    f.clock.advance(1);
    assert_eq!(d.deliver_due().await.unwrap().retried, 1);
    f.clock.advance(2_000);
    assert_eq!(d.deliver_due().await.unwrap().delivered, 1);
    assert_eq!(log.values(), [("m-1".into(), v, "hello".into())]);

    let kinds: Vec<EventKind> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.clone())
        .collect();
    assert_eq!(
        kinds,
        [
            EventKind::AttemptStarted,
            EventKind::RetryScheduled {
                next_at: START + 1_000,
                error: "sink down".into()
            },
            EventKind::AttemptStarted,
            EventKind::RetryScheduled {
                next_at: START + 1_000 + 2_000,
                error: "sink down".into()
            },
            EventKind::AttemptStarted,
            EventKind::Delivered,
        ]
    );
}

#[tokio::test]
async fn entries_out_of_attempts_go_to_the_dead_letter_sink() {
    let Some(mut f) = fixture().await else { return };
    let v = f.stage("mail", "m-1", "hello").await;
    let dead: Arc<Mutex<Vec<DeadLetter<String>>>> = Arc::default();
    let dead_in = dead.clone();
    let letters: DeadLetterFn<String> = Arc::new(move |l| {
        dead_in.lock().unwrap().push(l);
        async { Ok(()) }.boxed()
    });
    let policy = RetryPolicy {
        delay: Some(Arc::new(|_| 10.0)),
        max_attempts: Some(2),
        ..RetryPolicy::default()
    };
    let d = f.deliverer(
        ChannelConfig::new("mail")
            .retry(policy)
            .dead_letter(letters),
        Log::failing(u32::MAX),
    );
    assert_eq!(d.deliver_due().await.unwrap().retried, 1);
    f.clock.advance(10);
    let r = d.deliver_due().await.unwrap();
    assert_eq!(r.gave_up.len(), 1, "{r:?}");
    assert!(d.is_empty().await.unwrap());
    let dead = dead.lock().unwrap();
    assert_eq!(
        (dead[0].key.as_str(), dead[0].version, dead[0].attempts),
        ("m-1", v, 2)
    );
    assert_eq!(dead[0].value.as_deref(), Some("hello"));
}

#[tokio::test]
async fn concurrent_deliverers_never_claim_the_same_entry() {
    let Some(mut f) = fixture().await else { return };
    let tx = f.client.transaction().await.unwrap();
    for i in 0..400 {
        f.outbox
            .stage(&tx, "jobs", &format!("k{i}"), &format!("v{i}"))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let log = Log::default();
    let deliverers: Vec<_> = (0..4)
        .map(|_| Arc::new(f.deliverer(ChannelConfig::new("jobs").batch_size(10), log.clone())))
        .collect();
    let runs = deliverers.iter().map(|d| {
        let d = d.clone();
        tokio::spawn(async move { d.deliver_due().await.unwrap().delivered })
    });
    let mut delivered = 0;
    for run in runs {
        delivered += run.await.unwrap();
    }
    assert_eq!(delivered, 400);
    let mut seen: HashMap<String, u32> = HashMap::new();
    for (k, _, _) in log.values() {
        *seen.entry(k).or_default() += 1;
    }
    assert_eq!(seen.len(), 400);
    assert!(
        seen.values().all(|&n| n == 1),
        "an entry was delivered twice"
    );
    assert!(deliverers[0].is_empty().await.unwrap());
}

/// Logs, then says so.
pub(crate) struct Signal {
    pub(crate) log: Log,
    pub(crate) signal: tokio::sync::mpsc::UnboundedSender<()>,
}

impl Sink<String> for Signal {
    async fn publish(&self, batch: &[Entry<String>]) -> Result<(), SinkError> {
        self.log.publish(batch).await?;
        let _ = self.signal.send(());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_loop_wakes_on_notify() {
    let Some(mut f) = fixture().await else { return };
    let log = Log::default();
    let (signal, mut delivered) = tokio::sync::mpsc::unbounded_channel();
    let sink = Signal {
        log: log.clone(),
        signal,
    };
    // The clock is manual and stands still: only NOTIFY (or the first run)
    // delivers.
    let d = Arc::new(f.deliverer(ChannelConfig::new("jobs"), sink));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn({
        let d = d.clone();
        async move { d.run(stopped.map(|_| ())).await }
    });
    // The stage commits after the listener is up: wait until it listens.
    let listening = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"{}\"'",
        f.outbox.notify_channel()
    );
    while f
        .client
        .query_one(&listening, &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        tokio::task::yield_now().await;
    }
    let v = f.stage("jobs", "j-1", "go").await;
    delivered
        .recv()
        .await
        .expect("the run loop delivers after NOTIFY");
    assert_eq!(log.values(), [("j-1".into(), v, "go".into())]);
    stop.send(()).unwrap();
    runner.await.unwrap();
}

#[tokio::test]
async fn corrupt_rows_are_quarantined_without_blocking_the_channel_and_stay_deletable() {
    let Some(mut f) = fixture().await else { return };
    f.stage("jobs", "bad", "x").await;
    f.stage("jobs", "bad2", "y").await;
    f.stage("jobs", "good", "z").await;
    let s = f.schema.name().to_owned();
    f.client
        .batch_execute(&format!(
            "UPDATE {s}.outbox SET version = -3 WHERE key = 'bad';
             UPDATE {s}.outbox SET attempt = -1 WHERE key = 'bad2'"
        ))
        .await
        .unwrap();
    let log = Log::default();
    let (seen, hook) = events();
    let d = f.deliverer(ChannelConfig::new("jobs").on_event(hook), log.clone());
    assert_eq!(d.pending("bad").await.unwrap_err().code(), "OUTBOX_CORRUPT");
    let r = d.deliver_due().await.unwrap();
    assert_eq!(r.delivered, 1);
    assert_eq!(r.quarantined.len(), 2, "{r:?}");
    assert_eq!(log.values().len(), 1);
    assert_eq!(d.quarantined().await.unwrap(), 2);
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e.kind, EventKind::Quarantined { .. }) && e.key == "bad")
    );
    assert!(d.is_empty().await.unwrap());
    assert_eq!(d.purge_quarantined().await.unwrap(), 2);
    assert_eq!(d.quarantined().await.unwrap(), 0);
}

#[tokio::test]
async fn hostile_names_inject_nothing_and_bad_input_writes_nothing() {
    let Some(mut f) = fixture().await else { return };
    let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = '{s}'";
    let before = f.count(tables).await;
    let s = f.schema.name().to_owned();
    for hostile in [
        format!("{s}\"; DROP SCHEMA {s} CASCADE; --"),
        format!("{s}.outbox"),
        "public; DROP TABLE x".to_owned(),
    ] {
        let e = PgOutbox::new(&hostile).unwrap_err();
        assert_eq!(e.code(), "PG_OUTBOX_INVALID_NAME");
        let e = PgOutbox::with_table(&s, &hostile).unwrap_err();
        assert_eq!(e.code(), "PG_OUTBOX_INVALID_NAME");
    }
    // Channel names and keys are data, bound as parameters.
    let channel = format!("x'); DROP TABLE {s}.outbox; --");
    let key = "k\"; DELETE FROM outbox; --";
    let v = f.stage(&channel, key, "v").await;
    assert_eq!(f.count(tables).await, before);

    // Refused before anything is sent: the caller's transaction goes on.
    let tx = f.client.transaction().await.unwrap();
    let long = "k".repeat(1_025);
    for (ch, k) in [
        ("", "k"),
        ("c", ""),
        ("c", long.as_str()),
        ("c\n", "k"),
        ("c", "k\u{7}"),
    ] {
        let e = f
            .outbox
            .stage(&tx, ch, k, &"v".to_owned())
            .await
            .unwrap_err();
        assert!(e.code().starts_with("OUTBOX_INVALID"), "{e}");
    }
    let big = "x".repeat(1 << 20);
    let e = f.outbox.stage(&tx, "c", "k", &big).await.unwrap_err();
    assert_eq!(e.code(), "OUTBOX_VALUE_TOO_LARGE");
    tx.execute("SELECT 1", &[]).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(f.count("SELECT count(*) FROM {s}.outbox").await, 1);

    let log = Log::default();
    let d = f.deliverer(ChannelConfig::new(channel.clone()), log.clone());
    assert_eq!(d.deliver_due().await.unwrap().delivered, 1);
    assert_eq!(log.values(), [(key.to_owned(), v, "v".to_owned())]);
}

#[tokio::test]
async fn setup_is_idempotent_and_concurrent_setups_agree() {
    let Some(f) = fixture().await else { return };
    let runs = (0..3).map(|_| {
        let outbox = f.outbox.clone();
        tokio::spawn(async move {
            let mut c = client().await;
            outbox.setup(&mut c).await
        })
    });
    for run in runs {
        run.await.unwrap().unwrap();
    }
    assert_eq!(
        f.count("SELECT count(*) FROM pg_tables WHERE schemaname = '{s}'")
            .await,
        2
    );
}

/// One crash scenario: stage, deliver with a crash at the `nth` commit of
/// the deliverer, then deliver with a fresh one ("restarted") past every
/// claim's deadline. Returns whether the crash point was reached.
async fn crash_scenario(at: CrashAt) -> Option<bool> {
    let mut f = fixture().await?;
    let mut newest = HashMap::new();
    for (key, value) in [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1"), ("d", "1")] {
        let v = f.stage("jobs", key, value).await;
        newest.insert(key.to_owned(), (v, value.to_owned()));
    }
    let log = Log::failing(1);
    let config = || {
        let policy = RetryPolicy {
            delay: Some(Arc::new(|_| 10.0)),
            ..RetryPolicy::default()
        };
        ChannelConfig::new("jobs").batch_size(2).retry(policy)
    };
    let crashy = f.deliverer(config(), log.clone());
    crashy.crash_at(at);
    let mut crashed = false;
    for _ in 0..10 {
        match crashy.deliver_due().await {
            Err(e) => {
                assert_eq!(e.code(), "PG_OUTBOX_UNAVAILABLE", "{e}");
                crashed = true;
                break;
            }
            Ok(_) if crashy.is_empty().await.unwrap() => break,
            Ok(_) => f.clock.advance(10),
        }
    }
    drop(crashy);
    f.wait_until_dropped_sessions_ended().await;
    f.clock.advance(30_001);
    let restarted = f.deliverer(config(), log.clone());
    for _ in 0..10 {
        restarted.deliver_due().await.unwrap();
        f.clock.advance(10);
    }
    assert!(
        restarted.is_empty().await.unwrap(),
        "{at:?}: everything delivered"
    );
    assert_eq!(restarted.quarantined().await.unwrap(), 0);
    let got = log.values();
    for (key, (version, value)) in &newest {
        assert!(
            got.contains(&(key.clone(), *version, value.clone())),
            "{at:?}: the newest value of {key} was delivered: {got:?}"
        );
    }
    Some(crashed)
}

#[tokio::test]
async fn crash_at_every_commit_then_restart_delivers_the_newest_of_every_key() {
    if TestSchema::create().await.is_none() {
        return;
    }
    let mut tried = 0;
    for after_commit in [false, true] {
        for nth in 1.. {
            let at = CrashAt { nth, after_commit };
            if !crash_scenario(at).await.unwrap() {
                assert!(nth > 4, "the scenario commits claims and settlements");
                break;
            }
            tried += 1;
        }
    }
    eprintln!(
        "pg outbox crash injection: {tried} crash points tried (each commit, before and after)"
    );
}

#[tokio::test]
async fn a_batch_stages_the_newest_value_of_each_key_in_one_statement() {
    let Some(mut f) = fixture().await else { return };
    let before = f.stage("jobs", "a", "old").await;
    let tx = f.client.transaction().await.unwrap();
    let entries = [
        ("a", "1".to_owned()),
        ("b", "1".to_owned()),
        ("a", "2".to_owned()),
    ];
    let versions = f.outbox.stage_batch(&tx, "jobs", &entries).await.unwrap();
    // A bad key anywhere refuses the whole batch before anything is sent.
    let bad = [("c", "1".to_owned()), ("", "1".to_owned())];
    let e = f.outbox.stage_batch(&tx, "jobs", &bad).await.unwrap_err();
    assert_eq!(e.code(), "OUTBOX_INVALID_KEY");
    tx.commit().await.unwrap();
    assert_eq!(
        versions[0], versions[2],
        "a key given twice keeps one version"
    );
    assert!(versions.iter().all(|&v| v > before));

    let log = Log::default();
    let d = f.deliverer(ChannelConfig::new("jobs"), log.clone());
    assert_eq!(d.len().await.unwrap(), 2);
    d.deliver_due().await.unwrap();
    let mut got = log.values();
    got.sort();
    assert_eq!(
        got,
        [
            ("a".into(), versions[0], "2".into()),
            ("b".into(), versions[1], "1".into())
        ]
    );
}

#[cfg(feature = "sqlx")]
#[tokio::test]
async fn stages_in_a_sqlx_transaction_with_the_same_contract() {
    let Some(f) = fixture().await else { return };
    let pool = sqlx::PgPool::connect(&testkit::url()).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    f.outbox
        .stage(&mut tx, "orders", "o-1", &"lost".to_owned())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(f.count("SELECT count(*) FROM {s}.outbox").await, 0);

    let mut tx = pool.begin().await.unwrap();
    let v1 = f
        .outbox
        .stage(&mut tx, "orders", "o-1", &"placed".to_owned())
        .await
        .unwrap();
    let batch = [("o-1", "paid".to_owned()), ("o-2", "placed".to_owned())];
    let vs = f
        .outbox
        .stage_batch(&mut tx, "orders", &batch)
        .await
        .unwrap();
    let e = f
        .outbox
        .stage(&mut tx, "orders", "", &"x".to_owned())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "OUTBOX_INVALID_KEY");
    tx.commit().await.unwrap();
    assert!(vs[0] > v1);

    let log = Log::default();
    let d = f.deliverer(ChannelConfig::new("orders"), log.clone());
    assert_eq!(d.deliver_due().await.unwrap().delivered, 2);
    let mut got = log.values();
    got.sort();
    assert_eq!(
        got,
        [
            ("o-1".into(), vs[0], "paid".into()),
            ("o-2".into(), vs[1], "placed".into())
        ]
    );
}
