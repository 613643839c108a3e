//! An object's own alarm ([`durability_host::alarm`]): a class registers
//! its `alarm()` handler, a method sets the alarm, and the handler runs
//! once per set alarm, on the clock, and again once after the host was
//! drained and another host took over (the object opened by the delivery).

use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};

use durability_host::{AlarmFired, BoxError, Class, Handle, Host, HostError, OwnPolicy};
use durability_ownership::Clock as _;
use durability_scheduler::{Permit, PermitError, Permits};
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::support::{STORAGE, TestConfig, TestHost, World, advance_until};

/// A class whose alarm writes a row.
struct Reminder;

impl Class for Reminder {
    const NAME: &'static str = "Reminder";
}

type H = Handle<Reminder, SqliteAlarmIndex>;
type Rang = Arc<Mutex<Vec<(String, i64)>>>;

fn sql(e: rusqlite::Error) -> durability_scheduler::StorageError {
    durability_scheduler::StorageError::backend("reminder", e)
}

/// Host `task`: `remind { at }` sets the alarm and answers it; the alarm
/// handler records `(task, scheduled_at)` in `rang` and a row in the
/// object.
fn config(w: &World, task: &str, rang: &Rang) -> TestConfig {
    let (rang, owner) = (Arc::clone(rang), task.to_owned());
    w.bare(task, STORAGE)
        .create_active_storage_if_absent(true)
        .class_of(|ctx| {
            ctx.scheduler.transaction(|tx| {
                tx.sql()
                    .execute_batch("CREATE TABLE IF NOT EXISTS rang (at INTEGER NOT NULL)")
                    .map_err(sql)
            })?;
            Ok::<_, BoxError>(Reminder)
        })
        .method("remind", |h: H, args: Value| async move {
            let at = args["at"].as_i64().ok_or("remind needs an at")?;
            h.set_alarm(at)?;
            Ok(json!({ "alarm": h.get_alarm()? }))
        })
        .alarm(move |h: H, fired: AlarmFired| {
            let (rang, owner) = (Arc::clone(&rang), owner.clone());
            async move {
                assert!(fired.now_ms >= fired.scheduled_at, "{fired:?}");
                h.scheduler.transaction(|tx| {
                    tx.sql()
                        .execute("INSERT INTO rang (at) VALUES (?1)", [fired.scheduled_at])
                        .map_err(sql)
                })?;
                rang.lock().unwrap().push((owner, fired.scheduled_at));
                Ok(())
            }
        })
        .done()
}

/// The rows the handler wrote, and the alarm still set.
async fn stored(host: &TestHost) -> (i64, Option<i64>) {
    host.object::<Reminder>("r1")
        .run(|h| async move {
            let rows = h.scheduler.transaction(|tx| {
                tx.sql()
                    .query_row("SELECT COUNT(*) FROM rang", [], |r| r.get(0))
                    .map_err(sql)
            })?;
            Ok::<_, BoxError>((rows, h.get_alarm()?))
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn the_alarm_handler_runs_once_per_set_alarm_and_after_a_restart() {
    let w = World::new();
    let rang: Rang = Arc::default();
    let count = || rang.lock().unwrap().len();
    let a = Host::start(config(&w, "a", &rang)).await.unwrap();
    let r1 = a.object::<Reminder>("r1");

    let first = w.clock.now_ms() + 1_000;
    assert_eq!(
        r1.by_name()
            .call("remind", json!({ "at": first }))
            .await
            .unwrap(),
        json!({ "alarm": first })
    );
    assert!(advance_until(&w.clock, 100, 5_000, || count() == 1).await);
    // Long after: still once, the row written once, the alarm cleared.
    assert!(!advance_until(&w.clock, 500, 20_000, || count() > 1).await);
    assert_eq!(stored(&a).await, (1, None));

    // Set again, then the host drains before the time comes: the next
    // host opens the object for the delivery and runs the handler once.
    let second = w.clock.now_ms() + 5_000;
    r1.by_name()
        .call("remind", json!({ "at": second }))
        .await
        .unwrap();
    a.shutdown().await;
    assert_eq!(count(), 1, "not due yet");
    let b = Host::start(config(&w, "b", &rang).own(OwnPolicy::OnDemand))
        .await
        .unwrap();
    assert!(advance_until(&w.clock, 250, 20_000, || count() == 2).await);
    assert!(!advance_until(&w.clock, 500, 20_000, || count() > 2).await);
    assert_eq!(
        *rang.lock().unwrap(),
        [("a".to_owned(), first), ("b".to_owned(), second)]
    );
    assert_eq!(stored(&b).await, (2, None));

    // Bad input is refused with a typed error and writes nothing.
    let e = b
        .object::<Reminder>("r1")
        .run(|h| async move { Ok::<_, BoxError>(h.set_alarm(-1)) })
        .await
        .unwrap();
    assert!(matches!(e, Err(HostError::InvalidArgs { .. })), "{e:?}");
    assert_eq!(stored(&b).await, (2, None));
    b.shutdown().await;
}

/// Permits that are refused until opened, counting what was asked and
/// what was given back.
#[derive(Default)]
struct Gate {
    open: AtomicBool,
    asked: AtomicUsize,
    held: Arc<AtomicUsize>,
    given: AtomicUsize,
}

impl Permits for Gate {
    fn acquire(&self, _want: usize) -> BoxFuture<'_, Result<Permit, PermitError>> {
        self.asked.fetch_add(1, SeqCst);
        let answer = if self.open.load(SeqCst) {
            self.given.fetch_add(1, SeqCst);
            self.held.fetch_add(1, SeqCst);
            let held = Arc::clone(&self.held);
            Ok(Permit::new(1).on_release(move || {
                held.fetch_sub(1, SeqCst);
            }))
        } else {
            Err(PermitError::new(500, "the gate is shut"))
        };
        Box::pin(async move { answer })
    }
}

#[tokio::test]
async fn the_hosts_alarm_dispatcher_delivers_only_under_a_permit_and_gives_it_back() {
    let w = World::new();
    let rang: Rang = Arc::default();
    let count = || rang.lock().unwrap().len();
    let gate = Arc::new(Gate::default());
    let a = Host::start(config(&w, "a", &rang).alarm_permits(gate.clone()))
        .await
        .unwrap();
    let r1 = a.object::<Reminder>("r1");
    let at = w.clock.now_ms() + 1_000;
    r1.by_name()
        .call("remind", json!({ "at": at }))
        .await
        .unwrap();
    // Due, but no permit: asked for one, never delivered, the alarm kept.
    assert!(!advance_until(&w.clock, 250, 10_000, || count() > 0).await);
    assert!(gate.asked.load(SeqCst) > 0, "the dispatcher never asked");
    assert_eq!(gate.given.load(SeqCst), 0);
    assert_eq!(stored(&a).await, (0, Some(at)));
    // A permit: delivered once, and the permit is back.
    gate.open.store(true, SeqCst);
    assert!(advance_until(&w.clock, 250, 10_000, || count() == 1).await);
    assert!(!advance_until(&w.clock, 500, 10_000, || count() > 1).await);
    assert_eq!(stored(&a).await, (1, None));
    assert!(gate.given.load(SeqCst) >= 1);
    assert_eq!(gate.held.load(SeqCst), 0, "a permit was not given back");
    a.shutdown().await;
}
