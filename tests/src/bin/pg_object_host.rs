//! A host process on PostgreSQL alone for the process tests
//! (`tests/it/host_processes/postgres.rs`): a `durability-host` whose
//! leases, alarm jobs and objects are in the database `DO_DATABASE_URL`
//! names (schema `DO_DATABASE_SCHEMA`), with no directory shared with any
//! other process. One object class, `Counter`; every write it commits also
//! records `(task, generation, n)` in the object's `writes` table in the
//! same transaction, so a test checks each commit against the claims the
//! hosts printed.
//!
//! Output and commands as `object-host` (`ready`, `acquired`, `lost`,
//! `released`, `ok`/`err`, `slow-wrote`, `fired`, `firing`, `drained`; `incr <name>`,
//! `timer <name> <delay ms>`, `timer-abort <name> <delay ms>`,
//! `slow <name> <ms>`, `probe`), and
//! `hold <name> <ms>`: one write, `in-tx <name> gen=<g>`, then a pause of
//! `ms` inside the same transaction before it commits. Arguments
//! `key=value`: `task`, `own` (`all` or `none`), `create` (`1`: create the
//! active storage pointer if absent), `interval` (owner loop period, ms).
//! Settings from the `DO_*` environment variables.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used)]

use std::time::Duration;

use durability_host::store::postgres::{PostgresAlarmIndex, PostgresLeaseStore};
use durability_host::{DatabaseSettings, Host, HostConfig, PostgresObjectStore};
use durability_ownership::SystemClock;
use durability_scheduler::{StorageError, Transaction};
use durability_storage_postgres::object::PostgresObjectStorage;
use durability_tests::host_proc::{
    TimerObject, answer, args, counter_class, counter_sql, other_command, parse, refuse, say,
    serve, set_timer, settings_or_refuse, start_or_refuse, test_ids, test_options,
};

type PgHost = Host<PostgresLeaseStore, PostgresAlarmIndex, PostgresObjectStore>;

fn record_fired(
    tx: &mut Transaction<'_, '_, PostgresObjectStorage>,
    now_ms: i64,
    task: &str,
) -> Result<(), StorageError> {
    tx.sql().execute(
        "INSERT INTO fired (t, task) VALUES ($1, $2)",
        &[&now_ms, &task],
    )?;
    Ok(())
}

fn create_tables(tx: &mut Transaction<'_, '_, PostgresObjectStorage>) -> Result<(), StorageError> {
    tx.sql().batch_execute(
        "CREATE TABLE IF NOT EXISTS counter (id INT PRIMARY KEY, n BIGINT NOT NULL);
         CREATE TABLE IF NOT EXISTS fired (t BIGINT NOT NULL, task TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS writes (seq BIGINT PRIMARY KEY, task TEXT NOT NULL,
                                            generation BIGINT NOT NULL, n BIGINT NOT NULL);",
    )
}

/// The object: its timer.
type Counter = TimerObject<PostgresObjectStorage>;

/// One increment, recorded with the writer's task and generation. `seq`
/// is the commit order (one writer at a time holds the object's row), with
/// no sequence, so the object can be exported (a sequence is not portable).
fn incr(
    tx: &mut Transaction<'_, '_, PostgresObjectStorage>,
    task: &str,
    generation: u64,
) -> Result<i64, StorageError> {
    let n: i64 = tx
        .sql()
        .query_one(
            "INSERT INTO counter (id, n) VALUES (0, 1)
             ON CONFLICT (id) DO UPDATE SET n = counter.n + 1 RETURNING n",
            &[],
        )?
        .try_get(0)
        .map_err(counter_sql)?;
    let generation = i64::try_from(generation).unwrap();
    tx.sql().execute(
        "INSERT INTO writes (seq, task, generation, n)
         SELECT coalesce(max(seq), 0) + 1, $1, $2, $3 FROM writes",
        &[&task, &generation, &n],
    )?;
    Ok(n)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let arg = |k: &str| args.get(k).cloned().unwrap_or_default();
    let settings = settings_or_refuse(&arg("interval"));
    let database = match DatabaseSettings::from_env() {
        Ok(Some(d)) => d,
        Ok(None) => refuse("host_invalid_setting", "DO_DATABASE_URL is not set"),
        Err(e) => refuse(e.code(), &e.to_string()),
    };
    let task = arg("task");
    let config = match HostConfig::postgres(&database, settings, test_ids(&task)).await {
        Ok(c) => c,
        Err(e) => refuse(e.code(), &e.to_string()),
    };
    let clock = SystemClock::new();
    let config = config.endpoint(&format!("http://127.0.0.1:8788/{task}"));
    let config = counter_class(config, &task, create_tables, record_fired);
    let config = test_options(config, clock, &arg("own"), &arg("create"));
    let host = start_or_refuse(config).await;
    let me = task.clone();
    serve(host, &me, move |host, line| {
        let task = task.clone();
        async move { command(&host, &clock, &task, &line).await }
    })
    .await
}

async fn command(host: &PgHost, clock: &SystemClock, task: &str, line: &str) {
    let (cmd, name, number) = parse(line);
    let result = match cmd {
        "incr" => {
            host.call::<Counter, _, _, _>("Counter", name, |h| async move {
                let g = h.generation;
                let v = h.scheduler.transaction(|tx| incr(tx, task, g))?;
                Ok((v, g))
            })
            .await
        }
        "timer" | "timer-abort" => {
            set_timer::<Counter, _, _, _>(host, clock, name, number, cmd == "timer-abort").await
        }
        "slow" => {
            host.call::<Counter, _, _, _>("Counter", name, |h| async move {
                let g = h.generation;
                h.scheduler.transaction(|tx| incr(tx, task, g))?;
                say(&format!("slow-wrote {name} gen={g}"));
                tokio::time::sleep(Duration::from_millis(u64::try_from(number).unwrap_or(0))).await;
                let v = h.scheduler.transaction(|tx| incr(tx, task, g))?;
                Ok((v, g))
            })
            .await
        }
        "hold" => {
            // Inside one transaction: a write, then a pause of `ms` (the
            // test stops the process here, holding the object row).
            host.call::<Counter, _, _, _>("Counter", name, |h| async move {
                let g = h.generation;
                let v = h.scheduler.transaction(|tx| {
                    let v = incr(tx, task, g)?;
                    say(&format!("in-tx {name} gen={g}"));
                    std::thread::sleep(Duration::from_millis(u64::try_from(number).unwrap_or(0)));
                    Ok::<_, StorageError>(v)
                })?;
                Ok((v, g))
            })
            .await
        }
        _ => return other_command(host, cmd, name),
    };
    say(&answer(cmd, name, result));
}
