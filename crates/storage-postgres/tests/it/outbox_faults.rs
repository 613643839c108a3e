//! Process faults for the outbox in the caller's transaction: a delivering
//! process SIGKILLed while it holds claims, and a private PostgreSQL
//! cluster crashed (`pg_ctl stop -m immediate`) and restarted mid-load.

use std::collections::BTreeSet;
use std::process::{Child, Command};
use std::sync::Arc;

use durability_outbox::ChannelConfig;
use durability_storage_postgres::outbox::{PgDeliverer, PgOutbox};
use durability_storage_postgres::testkit;
use durability_time::{Clock, ManualClock, SystemClock};

use crate::outbox::{Log, fixture};

/// Kills the child on drop, so a failing test leaves no process behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_sigkilled_deliverers_claims_are_redelivered_after_their_deadline() {
    let Some(mut f) = fixture().await else { return };
    let s = f.schema.name().to_owned();
    f.client
        .batch_execute(&format!("CREATE TABLE {s}.seen (key text, version bigint)"))
        .await
        .unwrap();
    // Staged on the system clock, as the worker runs on it.
    let outbox = PgOutbox::new(&s).unwrap();
    let tx = f.client.transaction().await.unwrap();
    let mut staged = BTreeSet::new();
    for i in 0..30 {
        let key = format!("k{i:02}");
        let v = outbox
            .stage(&tx, "jobs", &key, &format!("v{i}"))
            .await
            .unwrap();
        staged.insert((key, v));
    }
    tx.commit().await.unwrap();

    let mut worker = Killed(
        Command::new(env!("CARGO_BIN_EXE_durability-pg-outbox-worker"))
            .args([testkit::url().as_str(), &s, "jobs", "hang"])
            .spawn()
            .unwrap(),
    );
    // The worker claimed a batch and its sink received it: it hangs there.
    let seen = format!("SELECT count(*) FROM {s}.seen");
    while f
        .client
        .query_one(&seen, &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        < 10
    {
        tokio::task::yield_now().await;
    }
    worker.0.kill().unwrap(); // SIGKILL
    worker.0.wait().unwrap();

    let claimed: i64 = f
        .client
        .query_one(
            &format!(
                "SELECT count(*) FROM {s}.outbox WHERE claimed_until IS NOT NULL AND attempt = 1"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // The batch it published, and the next one when its claim ahead had
    // committed before the kill.
    assert!(
        claimed == 10 || claimed == 20,
        "the dead worker's claims are durable: {claimed}"
    );
    let claimed = u64::try_from(claimed).unwrap();

    // Before the deadline the claims hold; after it they are delivered.
    let now = SystemClock::new().now_ms();
    let clock = Arc::new(ManualClock::new(now));
    let outbox = outbox.with_clock(clock.clone());
    let log = Log::default();
    let d = PgDeliverer::new(
        &outbox,
        testkit::url().parse().unwrap(),
        2,
        ChannelConfig::new("jobs"),
        log.clone(),
    )
    .unwrap();
    assert_eq!(d.deliver_due().await.unwrap().delivered, 30 - claimed);
    assert_eq!(d.len().await.unwrap(), claimed);
    clock.set(now + 60_001);
    assert_eq!(d.deliver_due().await.unwrap().delivered, claimed);
    let delivered: BTreeSet<(String, u64)> =
        log.values().into_iter().map(|(k, v, _)| (k, v)).collect();
    assert_eq!(delivered, staged, "every staged entry was delivered");
    // The entries redelivered after the deadline are the ones the dead
    // worker held: the batch its sink saw, and any it claimed ahead.
    let held: BTreeSet<String> = f
        .client
        .query(&format!("SELECT key FROM {s}.seen"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let late: BTreeSet<String> = log
        .values()
        .into_iter()
        .skip(usize::try_from(30 - claimed).unwrap())
        .map(|(k, _, _)| k)
        .collect();
    assert!(held.is_subset(&late), "{held:?} redelivered: {late:?}");
    assert_eq!(held.len(), 10);
}

/// Stages `keys` one transaction each on a fresh connection; returns the
/// keys whose commit was acknowledged, stopping at the first failure (its
/// outcome may be unknown, so it is neither counted nor required).
async fn stage_until_failure(
    url: &str,
    outbox: &PgOutbox,
    keys: std::ops::Range<u32>,
) -> Vec<String> {
    let mut acked = Vec::new();
    let Ok((mut client, connection)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await
    else {
        return acked;
    };
    tokio::spawn(connection);
    for i in keys {
        let key = format!("k{i:04}");
        let Ok(tx) = client.transaction().await else {
            break;
        };
        if outbox
            .stage(&tx, "jobs", &key, &format!("v{i}"))
            .await
            .is_err()
        {
            break;
        }
        if tx.commit().await.is_err() {
            break;
        }
        acked.push(key);
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_and_restarted_server_loses_nothing_acknowledged() {
    let Some(mut cluster) = testkit::cluster::Cluster::init("outbox-crash") else {
        return;
    };
    cluster.start().await;
    let url = cluster.url();
    let outbox = PgOutbox::new("app").unwrap();
    let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    outbox.setup(&mut client).await.unwrap();
    drop(client);

    let log = Log::default();
    let (signal, mut delivered) = tokio::sync::mpsc::unbounded_channel();
    let sink = crate::outbox::Signal {
        log: log.clone(),
        signal,
    };
    let d = Arc::new(
        PgDeliverer::new(
            &outbox,
            url.parse().unwrap(),
            2,
            ChannelConfig::new("jobs").batch_size(20),
            sink,
        )
        .unwrap()
        .poll_interval_ms(500),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn({
        let d = d.clone();
        async move {
            d.run(async {
                let _ = stopped.await;
            })
            .await
        }
    });

    let mut acked = stage_until_failure(&url, &outbox, 0..100).await;
    assert_eq!(acked.len(), 100);
    // Mid-load: a stager runs while the server crashes under it.
    let stager = tokio::spawn({
        let (url, outbox) = (url.clone(), outbox.clone());
        async move { stage_until_failure(&url, &outbox, 100..100_000).await }
    });
    delivered.recv().await.unwrap();
    cluster.crash();
    let during = stager.await.unwrap();
    assert!(during.len() < 99_900, "the crash interrupted the stager");
    acked.extend(during);
    cluster.start().await;
    let after = stage_until_failure(&url, &outbox, 100_000..100_050).await;
    assert_eq!(after.len(), 50, "staging works again after the restart");
    acked.extend(after);

    let want: BTreeSet<String> = acked.into_iter().collect();
    let wait = async {
        loop {
            let got: BTreeSet<String> = log.values().into_iter().map(|(k, _, _)| k).collect();
            if want.is_subset(&got) {
                return;
            }
            delivered.recv().await.unwrap();
        }
    };
    // A guard against a hang, far above any expected time: not a threshold.
    tokio::time::timeout(std::time::Duration::from_secs(300), wait)
        .await
        .expect("every acknowledged entry is delivered after the restart");
    stop.send(()).unwrap();
    runner.await.unwrap();
}
