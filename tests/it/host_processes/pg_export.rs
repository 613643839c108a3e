//! Issue 35, item 5, under a failure: the owner of an object (a
//! `pg-object-host` process on PostgreSQL) is SIGKILLed while the object is
//! being exported (`store::moving::export_object`, what `durability objects
//! export` runs), with a transaction of the owner open on the object and
//! increments queued behind it; first, another object is exported under
//! the same load with the owner alive. The export raises the object's fence
//! before it reads, so: every write the owner acknowledged is stored and
//! in the export, no write lands after the export's fence (the stored rows
//! are exactly the exported ones), and a re-run export imported into a
//! SQLite object root carries the whole object.

use durability_host::store::moving::{Export, export_object, import_object};
use durability_host::store::{ObjectKey, ObjectStore as _};
use durability_host::{PostgresObjectStore, SqliteObjectStore};
use durability_ownership::{ShardCount, StorageId};
use durability_scheduler::image::{Table, Value};
use durability_storage_postgres::object::PostgresObjectOptions;

use super::pg_faults::{burst, outcome_violations};
use super::postgres::{Db, check, runtime, runtime_schema_and_db, spawn, stored};
use super::{TTL_S, now, signal};

/// The object's own table `name` in `export`.
/// The key of `Counter` object `name`.
fn counter_key(name: &str) -> ObjectKey {
    ObjectKey {
        class: "Counter".to_owned(),
        name: name.to_owned(),
    }
}

fn table<'e>(export: &'e Export, name: &str) -> &'e Table {
    export
        .image
        .tables
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no table {name} in the export"))
}

/// The `(task, generation, n)` of every row of the `writes` table.
fn exported_writes(export: &Export) -> Vec<(String, i64, i64)> {
    let t = table(export, "writes");
    let col = |name: &str| t.columns.iter().position(|c| c.name == name).unwrap();
    let (task, generation, n) = (col("task"), col("generation"), col("n"));
    let mut rows: Vec<(String, i64, i64)> = t
        .rows
        .iter()
        .map(|r| match (&r[task], &r[generation], &r[n]) {
            (Value::Text(t), Value::Integer(g), Value::Integer(n)) => (t.clone(), *g, *n),
            other => panic!("a writes row of unexpected types: {other:?}"),
        })
        .collect();
    rows.sort_by_key(|r| r.2);
    rows
}

/// The stored `(task, generation, n)` of every write of `name`.
fn stored_writes(db: &Db, name: &str) -> Vec<(String, i64, i64)> {
    let mut rows: Vec<(String, i64, i64)> = stored(db, name)
        .writes
        .into_iter()
        .map(|(_, task, generation, n)| (task, generation, n))
        .collect();
    rows.sort_by_key(|r| r.2);
    rows
}

/// The stored writes of `name` under a generation below the export's
/// fence: exactly the exported ones when nothing landed after the fence.
fn writes_below_fence(db: &Db, name: &str, export: &Export) -> Vec<(String, i64, i64)> {
    let fence = i64::try_from(export.header.fenced_generation).unwrap();
    stored_writes(db, name)
        .into_iter()
        .filter(|w| w.1 < fence)
        .collect()
}

/// Waits until `a` answered `n` calls of `cmd` on `name`.
fn answered(a: &super::Proc, cmd: &str, name: &str, n: usize) {
    let end = now() + 60_000;
    while a.count(&format!("ok {cmd} {name} ")) + a.count(&format!("err {cmd} {name} ")) < n {
        assert!(now() < end, "{cmd} {name}: {:#?}", a.lines());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn sigkill_of_the_owner_mid_export_loses_no_acknowledged_write_and_nothing_lands_after_the_fence() {
    let Some((rt, _schema, db)) = runtime_schema_and_db() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut a = spawn("a", dir.path(), &db, TTL_S, &["own=all", "create=1"]);
    a.wait_line("ready");
    a.wait_n("acquired ", 16);
    for i in 1..=3 {
        let answer = a.run_ok("incr w1");
        assert!(
            answer.starts_with(&format!("ok incr w1 value={i} ")),
            "{answer}"
        );
    }
    // First with the owner alive: w2 exported while a holds a transaction
    // on it with increments queued behind (each waiting for the object
    // row while the export raises the fence: before the fix of
    // `object_fence_wait`, one of them committed past the fence). A holder
    // paused past the lock timeout is ended by the export's fence round
    // (`moving::an_export_on_postgres_ends_a_holder_paused_inside_a_transaction`).
    for _ in 0..2 {
        a.run_ok("incr w2");
    }
    a.send("hold w2 300");
    a.wait_line("in-tx w2 ");
    burst(&mut a, &["w2"], 5);
    let w2 = counter_key("w2");
    let store = PostgresObjectStore::connect(&db.url, &db.schema, PostgresObjectOptions::default())
        .unwrap();
    let live = rt
        .block_on(export_object(&store, "st1", &w2, ShardCount::default()))
        .unwrap();
    answered(&a, "hold", "w2", 1);
    answered(&a, "incr", "w2", 2 + 5);
    eprintln!(
        "tried: export of w2 (fenced at generation {}) under a live owner holding a transaction on \
         it for 300 ms with 5 increments queued: {} increments acknowledged, {} refused",
        live.header.fenced_generation,
        a.count("ok incr w2 "),
        a.count("err incr w2 ")
    );
    assert_eq!(
        writes_below_fence(&db, "w2", &live),
        exported_writes(&live),
        "no write under a generation below the fence landed after the export"
    );
    // In flight at the export: a transaction of a's open on w1 (one write,
    // then a 5 s pause before its commit) and increments queued behind it.
    a.send("hold w1 5000");
    a.wait_line("in-tx w1 ");
    burst(&mut a, &["w1"], 10);
    let object = counter_key("w1");
    let export_at = |store: &PostgresObjectStore| {
        runtime()
            .block_on(export_object(store, "st1", &object, ShardCount::default()))
            .map(|e| (e, now()))
    };
    let started = now();
    let (first, killed) = std::thread::scope(|s| {
        let exporting = s.spawn(|| export_at(&store));
        signal(a.child.id(), "KILL");
        let killed = now();
        (exporting.join().unwrap(), killed)
    });
    let _ = a.child.wait();
    let (first, exported) = first.expect("the export ends the dead owner's hold and completes");
    eprintln!(
        "tried: SIGKILL of host a (owner of w1, a transaction open on it and 10 increments \
         queued) {} ms into the export of w1; the export returned {} ms after the kill, fenced at \
         generation {}",
        killed - started,
        exported - killed,
        first.header.fenced_generation
    );
    assert!(
        killed < exported,
        "the owner was killed before the export returned"
    );
    // Nothing a could still commit after the fence: the stored rows are
    // exactly the exported ones, and each acknowledged answer is stored.
    let stored_now = stored_writes(&db, "w1");
    assert_eq!(
        exported_writes(&first),
        stored_now,
        "no write landed after the export's fence"
    );
    assert_eq!(writes_below_fence(&db, "w2", &live), exported_writes(&live));
    let claims: Vec<u64> = a
        .lines()
        .into_iter()
        .filter(|(_, l)| l.starts_with("acquired "))
        .map(|(_, l)| super::field(&l, "gen").parse().unwrap())
        .collect();
    assert!(
        claims.iter().all(|g| *g < first.header.fenced_generation),
        "the mover's fence is above every claim of a ({claims:?})"
    );
    let mut violations = check(&db, &[&a], &["w1", "w2"]);
    violations.extend(outcome_violations(&db, &[&a], &["w1", "w2"]));
    assert!(violations.is_empty(), "{violations:#?}");
    // A re-run export carries the same object; imported into a SQLite
    // object root through the file format, it is whole there.
    let (again, _) = export_at(&store).unwrap();
    assert!(again.header.fenced_generation > first.header.fenced_generation);
    assert_eq!(exported_writes(&again), stored_now);
    let file = Export::decode(&again.encode().unwrap()).unwrap();
    let root = tempfile::tempdir().unwrap();
    let sqlite = SqliteObjectStore::new(root.path());
    sqlite.prepare(&StorageId::new("st1").unwrap()).unwrap();
    rt.block_on(import_object(&sqlite, &file, None, false))
        .unwrap();
    let back = rt
        .block_on(export_object(
            &sqlite,
            "st1",
            &object,
            ShardCount::default(),
        ))
        .unwrap();
    for name in ["counter", "writes", "fired"] {
        assert_eq!(
            table(&back, name).rows,
            table(&again, name).rows,
            "table {name} after the round trip"
        );
    }
    assert_eq!(
        table(&back, "counter").rows,
        vec![vec![Value::Integer(0), Value::Integer(stored(&db, "w1").n)]],
        "the counter of every stored write"
    );
    eprintln!(
        "round trip: {} writes exported from PostgreSQL, imported into SQLite and exported again",
        stored_now.len()
    );
}
