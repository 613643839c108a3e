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
    assert_eq!(claimed, 10, "the dead worker's claims are durable");

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
    assert_eq!(d.deliver_due().await.unwrap().delivered, 20);
    assert_eq!(d.len().await.unwrap(), 10);
    clock.set(now + 60_001);
    assert_eq!(d.deliver_due().await.unwrap().delivered, 10);
    let delivered: BTreeSet<(String, u64)> =
        log.values().into_iter().map(|(k, v, _)| (k, v)).collect();
    assert_eq!(delivered, staged, "every staged entry was delivered");
    // The entries redelivered after the deadline are the ones the dead
    // worker held.
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
        .skip(20)
        .map(|(k, _, _)| k)
        .collect();
    assert_eq!(held, late);
}
