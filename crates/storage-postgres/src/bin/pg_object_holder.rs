//! A test helper process (feature `testkit`): an owner that fences one
//! PostgreSQL object, opens a transaction that writes a mark and moves the
//! alarm, says `inside`, and waits for a line on stdin before it tries to
//! commit; then prints `outcome committed` or `outcome <error code>`.
//!
//! Usage: `pg_object_holder <url> <deployment> <object> <task> <generation>`.
//! The object's table `marks (who TEXT)` must exist.

use std::io::{BufRead, Write};

use durability_ownership::{
    ClassName, Generation, LifecycleId, OwnerRecord, OwnerScope, ShardCount, StorageId, TaskId,
};
use durability_scheduler::{SchedulerTx, Storage, StorageError};
use durability_storage_postgres::object::{PostgresObjectOptions, PostgresObjects};

type Error = Box<dyn std::error::Error>;

/// The owner claim of `task` at `generation`, on the scope the tests use.
fn claim(task: &str, generation: u64) -> Result<OwnerRecord, Error> {
    let scope = OwnerScope::new(
        StorageId::new("store-1")?,
        ClassName::new("Shop")?,
        3,
        ShardCount::new(16)?,
    )?;
    Ok(OwnerRecord::new(
        scope,
        LifecycleId::new("ns:shop")?,
        TaskId::new(task)?,
        Generation::new(generation)?,
    ))
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, deployment, object, task, generation] = args.as_slice() else {
        return Err(
            "usage: pg_object_holder <url> <deployment> <object> <task> <generation>".into(),
        );
    };
    let generation: u64 = generation.parse()?;
    let objects = PostgresObjects::connect(url, deployment, PostgresObjectOptions::default())?;
    let storage = objects.open(object)?;
    storage.fence(&claim(task, generation)?)?;
    let at = i64::try_from(generation)?;
    let outcome = storage.transaction(|tx| {
        tx.sql()
            .execute("INSERT INTO marks (who) VALUES ($1)", &[task])?;
        tx.set_alarm(Some(at))?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "inside")
            .and_then(|()| out.flush())
            .map_err(|e| StorageError::backend("say inside", e))?;
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .map_err(|e| StorageError::backend("wait for stdin", e))?;
        Ok::<_, StorageError>(())
    });
    let said = match outcome {
        Ok(()) => "committed".to_owned(),
        Err(e) => e.code().to_owned(),
    };
    writeln!(std::io::stdout(), "outcome {said}")?;
    Ok(())
}
