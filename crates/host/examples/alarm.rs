//! An object's own alarm on the host, in the Durable Objects style: the
//! class registers its `alarm()` handler, a typed method sets the alarm,
//! and the handler runs once the time has come (see
//! `durability_host::alarm`).
//!
//! ```text
//! cargo run -p durability-host --example alarm
//! ```

#![allow(clippy::print_stdout, reason = "an example prints what it shows")]

use std::sync::Arc;
use std::time::Duration;

use durability_host::typed::NoError;
use durability_host::{
    AlarmFired, BoxError, Class, Handle, Host, HostConfig, HostIds, LifecycleId, Method, StorageId,
    TaskId,
};
use durability_ownership::{ShardCount, SystemClock};
use durability_storage_sqlite::Synchronous;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::ownership::SqliteLeaseStore;
use serde::{Deserialize, Serialize};

/// The object class.
struct Reminder;

impl Class for Reminder {
    const NAME: &'static str = "Reminder";
}

/// Sets the reminder's alarm `in_ms` from now; answers the time set.
#[derive(Serialize, Deserialize)]
struct Remind {
    in_ms: i64,
}

impl Method for Remind {
    type Class = Reminder;
    const NAME: &'static str = "remind";
    type Out = i64;
    type Error = NoError;
}

type H = Handle<Reminder, SqliteAlarmIndex>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let leases = SqliteLeaseStore::open(
        dir.path().join("leases.db"),
        SystemClock::new(),
        ShardCount::default(),
    )?;
    let index = SqliteAlarmIndex::open(dir.path().join("alarms.db"), Synchronous::Full)?;
    let ids = HostIds::new(
        StorageId::new("st1")?,
        LifecycleId::new("ns:reminders")?,
        TaskId::new("task-1")?,
    );
    let (rang, mut heard) = tokio::sync::mpsc::unbounded_channel::<AlarmFired>();
    let config = HostConfig::new(
        Arc::new(leases),
        Arc::new(index),
        dir.path().join("objects"),
        ids,
    )
    .create_active_storage_if_absent(true)
    .class_of(|_ctx| Ok::<_, BoxError>(Reminder))
    .rpc(|h: H, remind: Remind| async move {
        let at = h.scheduler.now_ms() + remind.in_ms;
        // Durable once this call returns: the host waits for the alarm
        // index to hold the job.
        h.set_alarm(at)?;
        Ok::<_, BoxError>(at)
    })
    .alarm(move |_h: H, fired: AlarmFired| {
        let rang = rang.clone();
        async move {
            // The object's `alarm()`: after an `Ok` the alarm is cleared
            // (unless it set a new time); an error retries it.
            rang.send(fired)?;
            Ok(())
        }
    })
    .done();
    let host = Host::start(config).await?;

    let at = host
        .object::<Reminder>("r1")
        .call(Remind { in_ms: 200 })
        .await?;
    println!("alarm of Reminder r1 set for {at}");
    let fired = tokio::time::timeout(Duration::from_secs(30), heard.recv())
        .await?
        .ok_or("the handler is gone")?;
    assert_eq!(fired.scheduled_at, at);
    println!(
        "alarm() ran at {} for the alarm set for {}",
        fired.now_ms, fired.scheduled_at
    );
    host.shutdown().await;
    Ok(())
}
