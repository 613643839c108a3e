//! A host process for the host's process tests (`tests/it/host_processes.rs`):
//! a `durability-host` with one object class, `Counter`, over a SQLite
//! lease store and a SQLite alarm index in a directory every process of a
//! test shares (objects under `<dir>/objects`), driven by commands on
//! stdin, reporting on stdout one line per step:
//!
//! - `ready task=<t>` once started; `refused <code> <message>` (stderr, exit
//!   code 2) when the configuration or the lifecycle records refuse it;
//! - `acquired scope=<s> gen=<g>`, `lost scope=<s> gen=<g> code=<c>`,
//!   `released scope=<s> gen=<g>`: owner events;
//! - `ok <cmd> <name> value=<v> gen=<g>` / `err <cmd> <name> code=<c>
//!   outcome=<not_started|unknown> <message>`;
//! - `slow-wrote <name> gen=<g>`: the first write of a `slow` call committed;
//! - `fired <name> task=<t>`: the object's timer ran (its alarm was delivered here);
//! - `firing <name> task=<t>`: with `DURABILITY_TEST_FIRE_PAUSE_MS` set, the
//!   timer is inside its firing and pauses that long before it writes;
//! - `committed put <name> value=<v>`: a `put` call's write committed (printed
//!   inside the call, while it is admitted);
//! - `deleted complete=<bool> objects=<n> pointer_removed=<bool>` /
//!   `delete-failed code=<c> <message>`: the answer to `delete`;
//! - `drained timed_out=<bool> released=<n>` after SIGTERM, then it exits 0.
//!
//! Commands: `incr <name>`, `timer <name> <delay ms>` (sets the object's
//! timer), `timer-abort <name> <delay ms>` (sets it, then aborts the
//! process inside the call right after the commit, before the alarm
//! sync), `slow <name> <ms>` (one committed write, a pause of `ms` outside
//! any transaction, then a second write), `put <name> <ms>` (a
//! pause of `ms` inside the admitted call, then one write, reported from
//! inside the call), `delete -` (`Host::delete_storage_id`:
//! the whole storage id), `probe`.
//!
//! Arguments `key=value`: `dir`, `task`, `own` (`all` or `none`),
//! `create` (`1`: create the active storage pointer if absent),
//! `interval` (owner loop period, ms), `shards` (shards per class, 16 when
//! absent). Settings come from the `DO_*` environment variables.
//!
//! A host that refuses to start (another shard count:
//! `shard_count_mismatch`) or stops on its own (another live process under
//! its task id: `duplicate_task_id`, `Host::failed`) exits with
//! `refused <code> <message>`, the ownership error's code.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used)]

use std::time::Duration;

use durability_host::{Host, HostConfig};
use durability_ownership::{ShardCount, SystemClock};
use durability_scheduler::{StorageError, Transaction};
use durability_storage_sqlite::SqliteStorage;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::ownership::SqliteLeaseStore;
use durability_tests::host_proc::{
    TimerObject, answer, args, counter_class, counter_sql, incr_sqlite_counter, other_command,
    parse, say, serve, set_timer, settings_or_refuse, shared_sqlite, start_or_refuse, test_ids,
    test_options,
};

fn record_fired(
    tx: &mut Transaction<'_, '_, SqliteStorage>,
    now_ms: i64,
    task: &str,
) -> Result<(), StorageError> {
    tx.sql()
        .execute(
            "INSERT INTO fired (t, task) VALUES (?1, ?2)",
            rusqlite::params![now_ms, task],
        )
        .map_err(counter_sql)?;
    Ok(())
}

fn create_tables(tx: &mut Transaction<'_, '_, SqliteStorage>) -> Result<(), StorageError> {
    tx.sql()
        .execute_batch(
            "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS fired (t INTEGER NOT NULL, task TEXT NOT NULL);",
        )
        .map_err(counter_sql)
}

/// The object: its timer.
type Counter = TimerObject<SqliteStorage>;

type Store = SqliteLeaseStore<SystemClock>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let arg = |k: &str| args.get(k).cloned().unwrap_or_default();
    // Settings first: a bad one refuses before any file is touched.
    let mut settings = settings_or_refuse(&arg("interval"));
    if let Ok(n) = arg("shards").parse::<u32>() {
        settings.ownership.shard_count = ShardCount::new(n).unwrap();
    }
    let dir = std::path::PathBuf::from(arg("dir"));
    let task = arg("task");
    let clock = SystemClock::new();
    let (store, index) = shared_sqlite(&dir, clock);
    let config = HostConfig::new(store, index, dir.join("objects"), test_ids(&task))
        .endpoint(&format!("http://127.0.0.1:8788/{task}"));
    let config = counter_class(config, &task, create_tables, record_fired).settings(settings);
    let config = test_options(config, clock, &arg("own"), &arg("create"));
    let host = start_or_refuse(config).await;
    serve(host, &task, move |host, line| async move {
        command(&host, &clock, &line).await;
    })
    .await
}

async fn command(host: &Host<Store, SqliteAlarmIndex>, clock: &SystemClock, line: &str) {
    let (cmd, name, number) = parse(line);
    let result = match cmd {
        "incr" => {
            host.call::<Counter, _, _, _>("Counter", name, |h| async move {
                let v = h.scheduler.transaction(incr_sqlite_counter)?;
                Ok((v, h.generation))
            })
            .await
        }
        "timer" | "timer-abort" => {
            set_timer::<Counter, _, _, _>(host, clock, name, number, cmd == "timer-abort").await
        }
        "slow" => {
            let name_owned = name.to_owned();
            host.call::<Counter, _, _, _>("Counter", name, |h| async move {
                h.scheduler.transaction(incr_sqlite_counter)?;
                say(&format!("slow-wrote {name_owned} gen={}", h.generation));
                tokio::time::sleep(Duration::from_millis(u64::try_from(number).unwrap_or(0))).await;
                let v = h.scheduler.transaction(incr_sqlite_counter)?;
                Ok((v, h.generation))
            })
            .await
        }
        "put" => {
            let name_owned = name.to_owned();
            let pause = Duration::from_millis(u64::try_from(number).unwrap_or(0));
            host.call::<Counter, _, _, _>("Counter", name, |h| async move {
                // Admitted and in flight, not yet written.
                tokio::time::sleep(pause).await;
                let v = h.scheduler.transaction(incr_sqlite_counter)?;
                say(&format!("committed put {name_owned} value={v}"));
                Ok((v, h.generation))
            })
            .await
        }
        "delete" => {
            say(&match host.delete_storage_id().await {
                Ok(r) => format!(
                    "deleted complete={} objects={} pointer_removed={}",
                    r.complete(),
                    r.objects_deleted,
                    r.pointer_removed
                ),
                Err(e) => format!("delete-failed code={} {e}", e.code()),
            });
            return;
        }
        _ => return other_command(host, cmd, name),
    };
    say(&answer(cmd, name, result));
}
