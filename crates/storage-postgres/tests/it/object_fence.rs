//! The owner fence inside the PostgreSQL commit: stale and equal-generation
//! claims refused with nothing written, the lease budget checked before
//! COMMIT, and a holder paused inside its transaction (a real process,
//! stopped with SIGSTOP) whose commit never lands while the new owner's
//! fence ends its session instead of waiting behind it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use durability_ownership::{
    BudgetCheck, ClassName, Generation, LifecycleId, ObjectFence, OwnerRecord, OwnerScope,
    ShardCount, StorageId, TaskId,
};
use durability_scheduler::{SchedulerTx, Storage, StorageError, StorageErrorKind};
use durability_storage_postgres::object::PostgresObjectStorage;
use durability_time::{Clock, SystemClock};

use crate::object_support::TestDeployment;

pub(crate) fn claim(task: &str, g: u64) -> OwnerRecord {
    let scope = OwnerScope::new(
        StorageId::new("store-1").unwrap(),
        ClassName::new("Shop").unwrap(),
        3,
        ShardCount::new(16).unwrap(),
    )
    .unwrap();
    OwnerRecord::new(
        scope,
        LifecycleId::new("ns:shop").unwrap(),
        TaskId::new(task).unwrap(),
        Generation::new(g).unwrap(),
    )
}

#[test]
fn a_stale_owner_commit_is_refused_by_the_database() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let a = open_fenced(&d, "shop-1", "a", 1);
    a.transaction(|tx| tx.set_alarm(Some(10))).unwrap();

    // Host B claims generation 2 on another handle (another machine).
    let b = open_fenced(&d, "shop-1", "b", 2);
    b.transaction(|tx| tx.set_alarm(Some(20))).unwrap();

    // A's late transaction is refused inside the database; nothing lands.
    let err = a.transaction(|tx| tx.set_alarm(Some(99))).unwrap_err();
    assert_eq!(err.kind(), StorageErrorKind::Fenced, "{err}");
    assert_eq!(b.transaction(|tx| tx.alarm()).unwrap(), Some(20));

    // The fence only rises, and one generation has one holder.
    assert_eq!(
        a.fence(&claim("a", 1)).unwrap_err().kind(),
        StorageErrorKind::Fenced
    );
    let c = d.objects.open("shop-1").unwrap();
    assert_eq!(
        c.fence(&claim("c", 2)).unwrap_err().kind(),
        StorageErrorKind::Fenced
    );
    // The same claim again is accepted (a reopened object).
    c.fence(&claim("b", 2)).unwrap();
    c.transaction(|tx| tx.set_alarm(Some(21))).unwrap();
    assert_eq!(b.transaction(|tx| tx.alarm()).unwrap(), Some(21));
}

#[test]
fn an_object_fenced_under_one_shard_refuses_a_claim_under_another_shard_count() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let a = open_fenced(&d, "shop-9", "a", 1);
    // A host started with 8 shards maps the object to another shard of the
    // same storage id and class: refused, nothing written.
    let eight = OwnerRecord::new(
        OwnerScope::new(
            StorageId::new("store-1").unwrap(),
            ClassName::new("Shop").unwrap(),
            5,
            ShardCount::new(8).unwrap(),
        )
        .unwrap(),
        LifecycleId::new("ns:shop").unwrap(),
        TaskId::new("b").unwrap(),
        Generation::new(7).unwrap(),
    );
    let b = d.objects.open("shop-9").unwrap();
    let err = b.fence_claim(&eight, None).unwrap_err();
    assert_eq!(err.code(), "object_scope_mismatch", "{err}");
    // The first owner still commits: the refused claim wrote no fence.
    a.transaction(|tx| tx.set_alarm(Some(5))).unwrap();
    assert_eq!(a.transaction(|tx| tx.alarm()).unwrap(), Some(5));
}

#[test]
fn an_unfenced_storage_does_not_check_and_another_object_is_not_fenced() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let _fenced = open_fenced(&d, "one", "a", 5);
    let plain = d.objects.open("two").unwrap();
    plain.transaction(|tx| tx.set_alarm(Some(1))).unwrap();
    let stale_elsewhere = open_fenced(&d, "two", "a", 1);
    stale_elsewhere
        .transaction(|tx| tx.set_alarm(Some(2)))
        .unwrap();
    assert_eq!(plain.transaction(|tx| tx.alarm()).unwrap(), Some(2));
}

struct Spent(AtomicBool);

impl BudgetCheck for Spent {
    fn spent(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn a_spent_lease_budget_rolls_back_before_commit() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = d.fresh();
    let budget = Arc::new(Spent(AtomicBool::new(false)));
    s.fence_claim(&claim("a", 1), Some(budget.clone())).unwrap();
    s.transaction(|tx| tx.set_alarm(Some(1))).unwrap();
    let r = s.transaction(|tx| {
        tx.set_alarm(Some(2))?;
        // The holder is paused past its lease inside the transaction.
        budget.0.store(true, Ordering::SeqCst);
        Ok::<_, StorageError>(())
    });
    assert_eq!(r.unwrap_err().kind(), StorageErrorKind::Fenced);
    budget.0.store(false, Ordering::SeqCst);
    assert_eq!(
        s.transaction(|tx| tx.alarm()).unwrap(),
        Some(1),
        "nothing landed"
    );
}

#[test]
fn a_corrupt_fence_generation_is_a_typed_error() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = open_fenced(&d, "bad-fence", "a", 1);
    crate::object_support::run_sql(
        &d.url,
        &format!(
            "UPDATE {}.durability_object_fences SET generation = {} WHERE object_id = 'bad-fence'",
            d.name,
            1_i64 << 60
        ),
    )
    .unwrap();
    let err = s.transaction(|tx| tx.set_alarm(Some(1))).unwrap_err();
    assert_eq!(err.kind(), StorageErrorKind::Corrupt, "{err}");
}

/// Who wrote the object's marks.
/// Object `id` of `d`, fenced by `task` at generation `g`.
fn open_fenced(d: &TestDeployment, id: &str, task: &str, g: u64) -> PostgresObjectStorage {
    let s = d.objects.open(id).unwrap();
    s.fence(&claim(task, g)).unwrap();
    s
}

/// Object `id` of `d` with an application table `marks (who)`.
fn with_marks(d: &TestDeployment, id: &str) -> PostgresObjectStorage {
    let s = d.objects.open(id).unwrap();
    s.transaction(|tx| {
        tx.sql()
            .batch_execute("CREATE TABLE marks (who TEXT NOT NULL)")
    })
    .unwrap();
    s
}

fn marks(s: &PostgresObjectStorage) -> Vec<String> {
    s.transaction(|tx| {
        tx.sql()
            .query("SELECT who FROM marks ORDER BY who", &[])?
            .iter()
            .map(|r| r.try_get(0).map_err(|e| StorageError::backend("who", e)))
            .collect()
    })
    .unwrap()
}

/// Reads one line from the holder's stdout.
fn line(out: &mut impl BufRead) -> String {
    let mut s = String::new();
    out.read_line(&mut s).unwrap();
    s.trim().to_owned()
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Kills the holder process if the test fails while it is stopped (its
/// open transaction would otherwise hold the test schema forever).
struct Reaper(std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-CONT", &self.0.id().to_string()])
                .status();
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts the holder process (claim `a` at generation 1) on `object` and
/// waits until it is inside its transaction.
fn holder_inside(
    url: &str,
    deployment: &str,
    object: &str,
) -> (Reaper, BufReader<std::process::ChildStdout>) {
    let mut holder = Reaper(
        Command::new(env!("CARGO_BIN_EXE_pg_object_holder"))
            .args([url, deployment, object, "a", "1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(holder.0.stdout.take().unwrap());
    assert_eq!(line(&mut out), "inside");
    (holder, out)
}

#[test]
fn a_paused_holder_never_commits_and_does_not_block_the_new_owner() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let id = "paused-object";
    let b = with_marks(&d, id);
    let (mut holder, mut out) = holder_inside(&d.url, &d.name, id);
    signal(holder.0.id(), "-STOP");

    // The new owner claims generation 2 while the stopped holder still
    // holds the object row inside its open transaction.
    let started = SystemClock.now_ms();
    b.fence(&claim("b", 2))
        .expect("the new owner is not blocked by the paused holder");
    let waited = SystemClock.now_ms() - started;
    b.transaction(|tx| {
        tx.sql()
            .execute("INSERT INTO marks (who) VALUES ($1)", &[&"b"])?;
        tx.set_alarm(Some(2))
    })
    .unwrap();
    eprintln!("the new owner's fence ended the paused holder's session in {waited} ms");

    // The holder resumes and tries to commit: its session is gone.
    signal(holder.0.id(), "-CONT");
    let mut stdin = holder.0.stdin.take().unwrap();
    writeln!(stdin).unwrap();
    let outcome = line(&mut out);
    assert!(holder.0.wait().unwrap().success());
    assert_ne!(
        outcome, "outcome committed",
        "the paused holder's commit never lands"
    );
    assert!(outcome.starts_with("outcome STORAGE_"), "{outcome}");

    let marks = marks(&b);
    assert_eq!(marks, ["b"], "only the new owner's write is stored");
    assert_eq!(b.transaction(|tx| tx.alarm()).unwrap(), Some(2));
}

#[test]
fn a_holder_killed_inside_its_transaction_leaves_nothing_and_blocks_nobody() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let id = "killed-object";
    let b = with_marks(&d, id);
    let (mut holder, _out) = holder_inside(&d.url, &d.name, id);
    signal(holder.0.id(), "-KILL");
    assert!(!holder.0.wait().unwrap().success());

    b.fence(&claim("b", 2)).unwrap();
    b.transaction(|tx| {
        tx.sql()
            .execute("INSERT INTO marks (who) VALUES ($1)", &[&"b"])?;
        tx.set_alarm(Some(2))
    })
    .unwrap();
    let marks = marks(&b);
    assert_eq!(marks, ["b"], "the killed holder's write never landed");
}

/// The test server's connection string for another role.
fn url_as(url: &str, role: &str) -> String {
    let config: tokio_postgres::Config = url.parse().unwrap();
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or("postgres");
    format!("host={host} port={port} dbname={db} user={role}")
}

#[test]
fn without_the_right_to_end_the_holder_the_new_owner_fails_retryably() {
    use durability_ownership::OwnershipError;
    use durability_storage_postgres::object::{PostgresObjectOptions, PostgresObjects};
    let url = durability_storage_postgres::testkit::url();
    if crate::object_support::available(&url).is_none() {
        return;
    }
    // A role that may not end a superuser's session owns the deployment;
    // the holder runs as the (superuser) test role.
    let role = crate::object_support::fresh_name();
    let name = crate::object_support::fresh_name();
    let db = url_as(&url, "x")
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("dbname=").map(str::to_owned))
        .unwrap();
    crate::object_support::run_sql(
        &url,
        &format!("CREATE ROLE {role} LOGIN; GRANT CREATE ON DATABASE \"{db}\" TO {role}"),
    )
    .unwrap();
    let cleanup = format!(
        "{};
         REVOKE CREATE ON DATABASE \"{db}\" FROM {role}; DROP ROLE {role}",
        crate::object_support::drop_deployment(&name)
    );
    let result = std::panic::catch_unwind(|| {
        let options = PostgresObjectOptions {
            fence_wait: std::time::Duration::from_millis(50),
            lock_timeout: std::time::Duration::from_millis(200),
            ..PostgresObjectOptions::default()
        };
        let objects = PostgresObjects::connect(&url_as(&url, &role), &name, options).unwrap();
        let b = objects.open("guarded").unwrap();
        b.transaction(|tx| {
            tx.sql()
                .batch_execute("CREATE TABLE marks (who TEXT NOT NULL)")
        })
        .unwrap();
        let (holder, _out) = holder_inside(&url, &name, "guarded");
        signal(holder.0.id(), "-STOP");
        let err = b.fence_claim(&claim("b", 2), None).unwrap_err();
        assert!(matches!(err, OwnershipError::OwnerRace { .. }), "{err}");
        assert!(err.is_retryable(), "{err}");
        // Once the holder is gone, the claim goes through.
        drop(holder);
        b.fence(&claim("b", 2)).unwrap();
        b.transaction(|tx| tx.set_alarm(Some(2))).unwrap();
        assert_eq!(
            marks(&b),
            Vec::<String>::new(),
            "the holder's write never landed"
        );
    });
    crate::object_support::run_sql(&url, &cleanup).unwrap();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// The generation floor procedure on PostgreSQL object storage: a lease
/// store that lost its counters reissues a generation the object's fence
/// already accepted; `fence_with_floor` raises the store above the fence
/// and claims again, and the old holder's late commit is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_lease_store_is_raised_above_the_fence() {
    use durability_ownership::memory::InMemoryLeaseStore;
    use durability_ownership::{
        ClaimOutcome, FloorSettings, LeaseStore, LifecycleAdmin, ManualClock, fence_with_floor,
    };
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let clock = ManualClock::new(1_000_000);
    let scope = claim("x", 1).scope().clone();
    let lifecycle = LifecycleId::new("ns:shop").unwrap();
    let leases = InMemoryLeaseStore::new(clock.clone(), ShardCount::new(16).unwrap());
    leases
        .set_active_storage(&lifecycle, Some(&StorageId::new("store-1").unwrap()))
        .await
        .unwrap();
    let take = |task: &'static str| {
        let (leases, scope, lifecycle) = (&leases, &scope, &lifecycle);
        async move {
            match leases
                .claim(scope, lifecycle, &TaskId::new(task).unwrap(), 1000)
                .await
                .unwrap()
            {
                ClaimOutcome::Claimed(l) => l,
                ClaimOutcome::Held(l) => panic!("held by {:?}", l.record.task()),
            }
        }
    };
    let cfg = FloorSettings {
        clock: Arc::new(clock.clone()),
        ttl_ms: 1000,
        guard_ms: 100,
    };
    let a = d.objects.open("floored").unwrap();
    let la = take("task-a").await;
    let fa = fence_with_floor(&leases, &a, &cfg, la, 1_000_000)
        .await
        .unwrap();
    assert_eq!(fa.lease.record.generation().get(), 1);
    a.transaction(|tx| tx.set_alarm(Some(1))).unwrap();

    leases.wipe();
    let b = d.objects.open("floored").unwrap();
    let lb = take("task-b").await;
    assert_eq!(
        lb.record.generation().get(),
        1,
        "the wiped store reissues 1"
    );
    let e = b.fence_claim(&lb.record, None).unwrap_err();
    assert_eq!(e.code(), "stale_generation", "{e}");
    let fb = fence_with_floor(&leases, &b, &cfg, lb, 1_000_000)
        .await
        .unwrap();
    assert_eq!(fb.lease.record.generation().get(), 2);
    b.transaction(|tx| tx.set_alarm(Some(2))).unwrap();

    let e = a.transaction(|tx| tx.set_alarm(Some(99))).unwrap_err();
    assert_eq!(e.kind(), StorageErrorKind::Fenced, "{e}");
    assert_eq!(b.transaction(|tx| tx.alarm()).unwrap(), Some(2));
}
