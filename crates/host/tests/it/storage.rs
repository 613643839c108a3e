//! Storage lifecycle: one object's delete-all (paged, fenced, alarm
//! cancelled or kept) and the deletion of a whole storage id (objects,
//! alarm jobs, pointer, tombstone), including a run that finishes what an
//! interrupted one left.

use std::path::{Path, PathBuf};

use durability_alarms::{AlarmIndex, Token};
use durability_host::{
    DeleteAll, Host, HostError, SqliteObjectStore, StorageDeleteReport, TOMBSTONE_FILE,
    delete_storage_id,
};
use durability_ownership::{
    ClassName, DeleteLock, LeaseStore, LifecycleAdmin, LifecycleId, OwnerScope, OwnershipError,
    ShardCount, StorageId,
};
use durability_scheduler::{ObjectId, StorageError};

use crate::support::{Counter, LIFECYCLE, STORAGE, TestHost, World, advance_until, incr, spin};

fn object_file(w: &World, storage: &str, name: &str) -> PathBuf {
    w.root()
        .join(storage)
        .join("Counter")
        .join(format!("{name}.sqlite"))
}

/// The names in the object file's schema (tables, views, triggers, indexes).
fn schema_names(path: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut st = conn
        .prepare("SELECT name FROM sqlite_schema ORDER BY name")
        .unwrap();
    st.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn sql(e: rusqlite::Error) -> StorageError {
    StorageError::backend("test sql", e)
}

fn id(s: &str) -> ObjectId {
    ObjectId::new(s).unwrap()
}

/// A refusal because the storage id is deleted (its pointer gone or its
/// delete lock held).
fn assert_storage_refused(refused: &HostError) {
    assert!(
        matches!(
            refused,
            HostError::Ownership(
                OwnershipError::StorageInactive { .. } | OwnershipError::DeleteLocked { .. }
            )
        ),
        "{refused}"
    );
}

/// [`delete_storage_id`] of `storage` on `w`'s lease store and object
/// root, with the alarm index `index`.
async fn delete_storage(
    w: &World,
    index: &impl AlarmIndex,
    storage: &str,
) -> Result<StorageDeleteReport, HostError> {
    let objects = SqliteObjectStore::new(w.root());
    delete_storage_id(w.store().as_ref(), index, &objects, LIFECYCLE, storage).await
}

/// A world whose host `a` counted `c1` up once and stopped.
async fn one_counter_stored() -> World {
    let (w, a) = World::with_a().await;
    incr(&a, "c1").await.unwrap();
    a.shutdown().await;
    w
}

/// Counts `name` up and sets its timer due at `due_at`, in one
/// transaction on `host`.
async fn counted_with_timer(host: &TestHost, name: &str, due_at: i64) {
    host.transaction::<Counter, _, _>("Counter", name, |c, tx| {
        c.incr(tx)?;
        c.set_timer(tx, due_at)
    })
    .await
    .unwrap();
}

fn lifecycle() -> LifecycleId {
    LifecycleId::new(LIFECYCLE).unwrap()
}

/// The lifecycle's storage pointer and delete lock, as the lease store
/// shows them to a scope of `storage`.
async fn pointer_and_lock(w: &World, storage: &str) -> (Option<StorageId>, Option<DeleteLock>) {
    let scope = OwnerScope::new(
        StorageId::new(storage).unwrap(),
        ClassName::new("Counter").unwrap(),
        0,
        ShardCount::default(),
    )
    .unwrap();
    let snap = w.store().snapshot(&scope, &lifecycle()).await.unwrap();
    (snap.active_storage, snap.delete_lock)
}

#[tokio::test]
async fn delete_all_drops_the_objects_own_tables_in_fenced_pages_and_cancels_its_timer() {
    let (w, a) = World::with_a().await;
    assert_eq!(incr(&a, "c1").await.unwrap(), 1);
    let now = durability_ownership::Clock::now_ms(&w.clock);
    // 300 more tables, a view, a trigger and an index of the object's own,
    // its timer, and an outbox-named due time (committed deliveries stay).
    a.transaction::<Counter, _, _>("Counter", "c1", |c, tx| {
        for i in 0..300 {
            tx.sql()
                .execute_batch(&format!("CREATE TABLE \"t {i}\" (x)"))
                .map_err(sql)?;
        }
        tx.sql()
            .execute_batch(
                "CREATE VIEW v AS SELECT n FROM counter;
                 CREATE VIRTUAL TABLE docs USING fts5(body);
                 CREATE INDEX counter_n ON counter (n);
                 CREATE TRIGGER on_fire AFTER INSERT ON fired BEGIN SELECT 1; END;",
            )
            .map_err(sql)?;
        c.set_timer(tx, now + 1_000)?;
        tx.set_due("outbox:events", Some(now + 500_000))
    })
    .await
    .unwrap();
    let job = w.index().job(&id("st1:Counter:c1")).await.unwrap().unwrap();
    assert_eq!(job.due_at, now + 1_000);

    let report = a
        .delete_all("Counter", "c1", DeleteAll::default())
        .await
        .unwrap();
    eprintln!(
        "delete-all: {} dropped in {} pages, due cleared {:?}",
        report.dropped.len(),
        report.pages,
        report.cancelled_due
    );
    // 300 + counter + fired + the view + the virtual table (its shadow
    // tables, the trigger and the index went with their tables): 304, in
    // three pages of at most 128 listed names.
    assert_eq!(report.dropped.len(), 304, "{:?}", report.dropped);
    assert_eq!(
        report.dropped[..2],
        ["v", "docs"],
        "views, then virtual tables"
    );
    assert_eq!(report.pages, 3);
    assert_eq!(report.cancelled_due, ["timer"]);
    let left = schema_names(&object_file(&w, STORAGE, "c1"));
    assert!(
        left.iter()
            .all(|n| n.starts_with("durability_") || n.starts_with("sqlite_autoindex_durability_")),
        "only the capabilities' tables stay: {left:?}"
    );
    assert!(left.contains(&"durability_owner_fence".to_owned()));
    // The alarm moved to the outbox's due time; the timer never fires.
    let job = w.index().job(&id("st1:Counter:c1")).await.unwrap().unwrap();
    assert_eq!(job.due_at, now + 500_000, "the alarm follows the outbox");
    advance_until(&w.clock, 500, 5_000, || false).await;
    assert!(w.fired().is_empty(), "the cancelled timer never ran");
    // The object reopens on the emptied storage: its factory recreates it.
    assert_eq!(a.probe().open_objects, 0, "the object was closed");
    assert_eq!(incr(&a, "c1").await.unwrap(), 1, "a fresh counter");
    // Running it again is a no-op delete of the recreated tables.
    let again = a
        .delete_all("Counter", "c1", DeleteAll::default())
        .await
        .unwrap();
    assert_eq!(again.pages, 1);
    assert_eq!(again.dropped, ["counter", "fired"]);
    assert!(again.cancelled_due.is_empty());
    a.shutdown().await;
}

#[tokio::test]
async fn delete_all_keeping_the_alarm_still_fires_the_timer() {
    let (w, a) = World::with_a().await;
    let now = durability_ownership::Clock::now_ms(&w.clock);
    counted_with_timer(&a, "c1", now + 1_000).await;
    let report = a
        .delete_all("Counter", "c1", DeleteAll::default().keep_alarm(true))
        .await
        .unwrap();
    assert_eq!(report.dropped, ["counter", "fired"]);
    assert!(report.cancelled_due.is_empty());
    let job = w.index().job(&id("st1:Counter:c1")).await.unwrap().unwrap();
    assert_eq!(job.due_at, now + 1_000, "the alarm job stays");
    assert!(
        advance_until(&w.clock, 200, 5_000, || w.fired() == ["a c1"]).await,
        "{:?}",
        w.fired()
    );
    a.shutdown().await;
}

#[tokio::test]
async fn a_stale_hosts_delete_all_is_refused_and_deletes_nothing() {
    let (w, a, b) = World::with_a_and_b().await;
    assert_eq!(incr(&a, "c1").await.unwrap(), 1);
    w.lapse(&a, "c1").await;
    assert_eq!(incr(&b, "c1").await.unwrap(), 2);
    let refused = a
        .delete_all("Counter", "c1", DeleteAll::default())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, HostError::NotOwner { generation: 2, .. }),
        "{refused}"
    );
    assert_eq!(incr(&b, "c1").await.unwrap(), 3, "nothing was deleted");
    // Draining: refused too.
    b.shutdown().await;
    assert_eq!(
        b.delete_all("Counter", "c1", DeleteAll::default())
            .await
            .unwrap_err()
            .code(),
        "host_draining"
    );
    a.shutdown().await;
}

#[tokio::test]
async fn deleting_a_storage_id_removes_its_objects_jobs_and_pointer_and_tombstones_it() {
    let (w, a) = World::with_a().await;
    let now = durability_ownership::Clock::now_ms(&w.clock);
    for i in 0..5 {
        counted_with_timer(&a, &format!("c{i}"), now + 60_000).await;
    }
    // Jobs of other storage ids, one sharing a leading substring.
    let index = w.index();
    for other in ["st10:Counter:x", "st2:Counter:y"] {
        index
            .upsert(&id(other), &Token::new("keep").unwrap(), now + 60_000)
            .await
            .unwrap();
    }
    let report = a.delete_storage_id().await.unwrap();
    eprintln!("storage delete: {report:?}");
    assert!(report.complete(), "{report:?}");
    assert!(report.pointer_removed);
    assert_eq!(report.objects_deleted, 5);
    assert_eq!(report.jobs_deleted, 5);
    for i in 0..5 {
        assert!(!object_file(&w, STORAGE, &format!("c{i}")).exists());
        assert_eq!(
            index.job(&id(&format!("st1:Counter:c{i}"))).await.unwrap(),
            None
        );
    }
    for other in ["st10:Counter:x", "st2:Counter:y"] {
        assert!(
            index.job(&id(other)).await.unwrap().is_some(),
            "{other} is another storage's job"
        );
    }
    let tombstone = std::fs::read_to_string(w.root().join(STORAGE).join(TOMBSTONE_FILE)).unwrap();
    assert!(tombstone.contains("state=deleted"), "{tombstone}");
    let (pointer, lock) = pointer_and_lock(&w, STORAGE).await;
    assert_eq!(pointer, None, "the pointer is gone");
    assert_eq!(lock, None, "the lock was released");

    // The host serving it refuses new work, and creates no object file,
    // even for an object of a scope it still holds a local lease on.
    let held = a.scope_for("Counter", "c0").unwrap();
    let sibling = (0..10_000)
        .map(|i| format!("n{i}"))
        .find(|n| a.scope_for("Counter", n).unwrap() == held)
        .unwrap();
    let refused = incr(&a, &sibling).await.unwrap_err();
    assert_storage_refused(&refused);
    assert!(
        !object_file(&w, STORAGE, &sibling).exists(),
        "no object file is created under a deleted storage id"
    );
    let refused = incr(&a, "c9").await.unwrap_err();
    assert_storage_refused(&refused);
    assert!(!object_file(&w, STORAGE, "c9").exists());
    a.shutdown().await;
    // No host starts on the deleted storage id, even asked to create the
    // pointer; a new storage id in the same lifecycle does.
    let err = Host::start(w.config("a")).await.err().unwrap();
    eprintln!("tombstoned: {err}");
    assert!(
        matches!(&err, HostError::LifecycleRecord { found, .. } if found.starts_with("tombstoned")),
        "{err}"
    );
    let (pointer, _) = pointer_and_lock(&w, STORAGE).await;
    assert_eq!(pointer, None, "the refusal wrote nothing");
    let b = Host::start(w.config_for("b", "st2")).await.unwrap();
    assert_eq!(
        b.transaction::<Counter, _, _>("Counter", "y", |c, tx| c.incr(tx))
            .await
            .unwrap(),
        1
    );
    b.shutdown().await;
}

#[tokio::test]
async fn a_storage_deletion_interrupted_at_any_step_is_finished_by_running_it_again() {
    // The states a deletion leaves when it stops after each of its writes:
    // (pointer still set, lock) for "tombstone written", "lock taken",
    // "pointer removed" (files and jobs still there in all three).
    for (case, pointer, lock) in [
        ("after the tombstone", true, false),
        ("after the lock", true, true),
        ("after the pointer", false, true),
    ] {
        let w = World::new();
        let a = w.host("a").await;
        let now = durability_ownership::Clock::now_ms(&w.clock);
        for i in 0..3 {
            a.transaction::<Counter, _, _>("Counter", &format!("c{i}"), |c, tx| {
                c.set_timer(tx, now + 60_000)
            })
            .await
            .unwrap();
        }
        a.shutdown().await;
        let store = w.store();
        std::fs::write(
            w.root().join(STORAGE).join(TOMBSTONE_FILE),
            "state=deleting\n",
        )
        .unwrap();
        if lock {
            store
                .set_delete_lock(&lifecycle(), Some(DeleteLock::Whole))
                .await
                .unwrap();
        }
        if !pointer {
            store.set_active_storage(&lifecycle(), None).await.unwrap();
        }
        let report = delete_storage(&w, w.index().as_ref(), STORAGE)
            .await
            .unwrap();
        eprintln!("{case}: {report:?}");
        assert!(report.complete(), "{case}: {report:?}");
        assert_eq!(report.pointer_removed, pointer, "{case}");
        assert_eq!(report.objects_deleted, 3, "{case}");
        assert_eq!(report.jobs_deleted, 3, "{case}");
        assert_eq!(pointer_and_lock(&w, STORAGE).await, (None, None), "{case}");
        assert_eq!(w.index().counts().await.unwrap().total(), 0, "{case}");
        // Once more: nothing left, still complete.
        let again = delete_storage(&w, w.index().as_ref(), STORAGE)
            .await
            .unwrap();
        assert!(again.complete() && again.objects_deleted == 0 && again.jobs_deleted == 0);
    }
}

#[tokio::test]
async fn a_storage_deletion_leaves_a_redeployed_lifecycle_alone() {
    let w = one_counter_stored().await;
    // A redeploy points the lifecycle at st2 before the old st1 is cleaned.
    let st2 = StorageId::new("st2").unwrap();
    w.store()
        .set_active_storage(&lifecycle(), Some(&st2))
        .await
        .unwrap();
    let report = delete_storage(&w, w.index().as_ref(), STORAGE)
        .await
        .unwrap();
    assert!(report.complete() && !report.pointer_removed, "{report:?}");
    assert_eq!(report.objects_deleted, 1);
    assert_eq!(pointer_and_lock(&w, "st2").await, (Some(st2.clone()), None));
    // Bad input: typed, nothing touched.
    let err = delete_storage(&w, w.index().as_ref(), "bad:id")
        .await
        .unwrap_err();
    assert_eq!(err.code(), "host_invalid_setting");
    let (pointer, _) = pointer_and_lock(&w, "st2").await;
    assert_eq!(pointer, Some(st2));
}

#[tokio::test]
async fn a_storage_deletion_that_cannot_reach_the_alarm_index_reports_a_partial_result() {
    let w = one_counter_stored().await;
    // The index's job table is gone: listing the storage's jobs fails.
    let broken = w.dir.path().join("broken-alarms.db");
    let index = durability_storage_sqlite::alarms::SqliteAlarmIndex::open(
        &broken,
        durability_storage_sqlite::Synchronous::Normal,
    )
    .unwrap();
    rusqlite::Connection::open(&broken)
        .unwrap()
        .execute_batch("DROP TABLE durability_alarm_index_jobs")
        .unwrap();
    let report = delete_storage(&w, &index, STORAGE).await.unwrap();
    eprintln!("partial: {report:?}");
    assert!(!report.complete());
    assert_eq!(report.objects_deleted, 1, "what could be deleted was");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    assert!(report.failures[0].what.contains("alarm jobs of st1:"));
    let tombstone = std::fs::read_to_string(w.root().join(STORAGE).join(TOMBSTONE_FILE)).unwrap();
    assert!(
        tombstone.contains("state=deleting"),
        "an incomplete deletion is not marked deleted: {tombstone}"
    );
    assert_eq!(
        pointer_and_lock(&w, STORAGE).await,
        (None, None),
        "the pointer is gone and the lock released either way"
    );
}

/// Every file left under a storage id's directory, relative to it.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                out.push(path.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Issue 32, item 2: a call admitted before a storage deletion, still
/// running (paused before its write) when the deletion starts. Before the
/// fix the deletion reported complete while the call ran, and the call's
/// write was then acknowledged into the deleted file. Now the deletion
/// enters the shared admission: it waits until the call has committed,
/// counts the object after it, and nothing is admitted after it.
#[tokio::test]
async fn a_storage_deletion_waits_out_a_call_admitted_before_it_so_no_write_is_acknowledged_after_it()
 {
    let (w, a) = World::with_a().await;
    assert_eq!(incr(&a, "c1").await.unwrap(), 1);
    let order: crate::support::Log = std::sync::Arc::default();
    let (entered_tx, entered) = tokio::sync::oneshot::channel::<()>();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let call = tokio::spawn({
        let (a, order) = (a.clone(), order.clone());
        async move {
            let result = a
                .call::<Counter, _, _, _>("Counter", "c1", |h| async move {
                    entered_tx.send(()).unwrap();
                    released.await.unwrap();
                    Ok(h.scheduler.transaction(|tx| h.object.incr(tx))?)
                })
                .await;
            order
                .lock()
                .unwrap()
                .push(format!("call ok={}", result.is_ok()));
            result
        }
    });
    entered.await.unwrap();
    let deletion = tokio::spawn({
        let (a, order) = (a.clone(), order.clone());
        async move {
            let report = a.delete_storage_id().await;
            order.lock().unwrap().push("deletion reported".to_owned());
            report
        }
    });
    spin().await;
    let finished_while_the_call_ran = deletion.is_finished();
    release.send(()).unwrap();
    let called = call.await.unwrap();
    let report = deletion.await.unwrap().unwrap();
    eprintln!(
        "order: {:?}; call: {called:?}; report: {report:?}",
        order.lock().unwrap()
    );
    assert!(
        !finished_while_the_call_ran,
        "the deletion reported while a call admitted before it was still running"
    );
    // The call committed before the deletion counted its object.
    assert_eq!(called.unwrap(), 2);
    assert_eq!(
        *order.lock().unwrap(),
        ["call ok=true", "deletion reported"],
        "no write is acknowledged after the deletion's report"
    );
    assert!(report.complete(), "{report:?}");
    assert_eq!(report.objects_deleted, 1);
    // Nothing is admitted after it, and no object file appears.
    let refused = incr(&a, "c2").await.unwrap_err();
    assert_storage_refused(&refused);
    assert_eq!(
        files_under(&w.root().join(STORAGE)),
        [durability_host::ADMISSION_FILE, TOMBSTONE_FILE]
    );
    a.shutdown().await;
}

/// The longest valid class name: 468 bytes of the ASCII JavaScript
/// class-name grammar.
fn longest_class() -> String {
    format!("Cart{}", "_".repeat(464))
}

/// Every object the object store lists for the test storage id.
async fn listed(w: &World) -> Vec<(String, String)> {
    use durability_host::ObjectStore as _;
    let store = SqliteObjectStore::new(w.root());
    let storage = StorageId::new(STORAGE).unwrap();
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.list(&storage, cursor.as_deref(), 3).await.unwrap();
        all.extend(page.objects.into_iter().map(|o| (o.class, o.name)));
        match page.cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    all.sort();
    all
}

/// Counts every object of `classes` x `names` up once on `host`; each
/// must count `want`.
async fn incr_every(host: &TestHost, classes: &[&str], names: &[String], want: i64) {
    for class in classes {
        for name in names {
            let n = host
                .transaction::<Counter, _, _>(class, name, |c, tx| c.incr(tx))
                .await
                .unwrap_or_else(|e| panic!("{class} {name:?}: {e}"));
            assert_eq!(n, want, "{class} {name:?}");
        }
    }
}

/// Issue 32, item 5: any well-formed Unicode object name up to 512 bytes
/// (emoji, CJK, separators, control characters) and the longest valid
/// class name work through a call, keep their state across a restart (the
/// mapping to files is deterministic) and are listed by their real names.
/// Before the fix a 300-byte class started but named no object (a 256-byte
/// object id) and non-plain names over about 100 bytes passed SQLite's
/// path limit.
#[tokio::test]
async fn any_valid_object_name_and_the_longest_class_work_end_to_end_and_are_listed() {
    let w = World::new();
    let long = longest_class();
    assert_eq!(long.len(), 468);
    let config = |task: &str| {
        let (fired, owner) = (std::sync::Arc::clone(&w.fired), task.to_owned());
        w.config(task).class(&long, move |ctx| {
            Counter::open(ctx, &owner, std::sync::Arc::clone(&fired))
        })
    };
    let names = [
        "🛒".repeat(128),
        "日本語の名前".to_owned(),
        "a/b\\c:d ../..".to_owned(),
        "tab\there\nnewline\u{1}".to_owned(),
        "é".repeat(256),
        "plain-name_1".to_owned(),
    ];
    assert_eq!(names[0].len(), durability_host::MAX_OBJECT_NAME_BYTES);
    let classes = ["Counter", long.as_str()];
    // Each object counts 1 on the first host; 2 on the next one, which
    // reopened its own storage.
    let a = Host::start(config("a")).await.unwrap();
    incr_every(&a, &classes, &names, 1).await;
    a.shutdown().await;
    let b = Host::start(config("b")).await.unwrap();
    incr_every(&b, &classes, &names, 2).await;
    let mut expected: Vec<(String, String)> = classes
        .iter()
        .flat_map(|c| names.iter().map(move |n| ((*c).to_owned(), n.clone())))
        .collect();
    expected.sort();
    assert_eq!(listed(&w).await, expected);
    b.shutdown().await;
}

/// Issue 32, item 5: invalid names are typed errors and write nothing: an
/// object name over 512 bytes, an empty one or one holding NUL
/// (`host_invalid_object_name`); a class name over 468 bytes or outside
/// the grammar refuses the host's start (`host_invalid_setting`).
#[tokio::test]
async fn invalid_object_and_class_names_are_typed_errors_and_write_nothing() {
    let (w, a) = World::with_a().await;
    let too_long = format!("{}x", "🛒".repeat(128));
    for name in [too_long.as_str(), "", "nul\0inside"] {
        let refused = incr(&a, name).await.unwrap_err();
        assert_eq!(
            refused.code(),
            "host_invalid_object_name",
            "{name:?}: {refused}"
        );
    }
    assert_eq!(listed(&w).await, []);
    assert_eq!(files_under(&w.root().join(STORAGE)), Vec::<String>::new());
    a.shutdown().await;
    for class in [
        format!("{}x", longest_class()),
        "1Cart".to_owned(),
        "Ca-rt".to_owned(),
        "class".to_owned(),
        "Cärt".to_owned(),
    ] {
        let w = World::new();
        let fired = std::sync::Arc::clone(&w.fired);
        let refused = Host::start(
            w.bare("a", STORAGE)
                .create_active_storage_if_absent(true)
                .class(&class, move |ctx| {
                    Counter::open(ctx, "a", std::sync::Arc::clone(&fired))
                }),
        )
        .await
        .unwrap_err();
        assert_eq!(refused.code(), "host_invalid_setting", "{class}: {refused}");
        assert!(
            !w.root().join(STORAGE).exists(),
            "{class}: nothing was written"
        );
    }
}

/// Issue 32, item 5: names arrive on the wire as JSON; a lone surrogate
/// (`\ud800`) is a typed `invalid_request` (400), not a panic or a
/// replacement character, and nothing is written; a valid escaped Unicode
/// name is called and stored under its real name.
#[tokio::test]
async fn a_lone_surrogate_on_the_wire_is_a_typed_error_and_writes_nothing() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let w = World::new();
    let host: TestHost = Host::start(
        crate::rpc::with_methods(w.config("a"))
            .internal_token(crate::rpc::TOKEN)
            .endpoint("http://127.0.0.1:8788"),
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = durability_host::CancellationToken::new();
    let server = tokio::spawn(durability_host::transport::serve(
        host.clone(),
        listener,
        stop.clone(),
    ));
    let post = |body: &'static str| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST /internal/do/invoke HTTP/1.1\r\nhost: x\r\n{}: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            durability_host::transport::AUTH_HEADER,
            crate::rpc::TOKEN,
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    };
    for body in [
        r#"{"class":"Counter","name":"\ud800","method":"incr","args":null}"#,
        r#"{"class":"Counter","name":"x\udfff","method":"incr","args":null}"#,
        r#"{"class":"Counter","name":"\ud800\u0041","method":"incr","args":null}"#,
    ] {
        let response = post(body).await;
        assert!(response.starts_with("HTTP/1.1 400"), "{body}: {response}");
        assert!(response.contains("invalid_request"), "{body}: {response}");
    }
    assert_eq!(listed(&w).await, []);
    let response =
        post(r#"{"class":"Counter","name":"\ud83d\uded2 \u00e9","method":"incr","args":null}"#)
            .await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(
        listed(&w).await,
        [("Counter".to_owned(), "🛒 é".to_owned())]
    );
    stop.cancel();
    server.await.unwrap().unwrap();
    host.shutdown().await;
}
