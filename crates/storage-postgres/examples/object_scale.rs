//! Measures how many objects one PostgreSQL database holds before
//! something degrades (not part of the test run):
//!
//! ```text
//! cargo run -p durability-storage-postgres --example object_scale -- \
//!     [url] [checkpoints, e.g. 1000,10000,50000] [own tables per object, e.g. 1]
//! ```
//!
//! It fills one fresh deployment with objects, each with `tables` tables of
//! its own (in its own schema) holding one row, and at each checkpoint
//! prints one JSON line: the cost of creating an object, a first
//! transaction on a freshly opened handle of a random existing object
//! (open + lock + read its own table and its alarm), a steady
//! transaction, and the same reads hand-written on a tokio-postgres
//! connection of its own (`bare`, the baseline), as medians and 99th
//! percentiles, and the catalog's size.
//! The deployment and every object schema are dropped at the end.
#![allow(clippy::disallowed_methods)] // A measurement reads the wall clock.

use std::io::Write;
use std::time::{Duration, Instant};

use durability_scheduler::{SchedulerTx, Storage, StorageError};
use durability_storage_postgres::object::{PostgresObjectOptions, PostgresObjects};

type Error = Box<dyn std::error::Error>;

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

fn create(objects: &PostgresObjects, n: usize, tables: usize) -> Result<(), StorageError> {
    let s = objects.open(&format!("o-{n}"))?;
    s.transaction(|tx| {
        for t in 0..tables {
            tx.sql().batch_execute(&format!(
                "CREATE TABLE items{t} (id BIGINT PRIMARY KEY, v TEXT NOT NULL);
                 INSERT INTO items{t} VALUES (1, 'one')"
            ))?;
        }
        tx.set_alarm(Some(i64::try_from(n).unwrap_or(0)))
    })
}

fn first_and_steady(
    objects: &PostgresObjects,
    n: usize,
    tables: usize,
) -> Result<(Duration, Duration), StorageError> {
    let read = |s: &durability_storage_postgres::object::PostgresObjectStorage| {
        s.transaction(|tx| {
            if tables > 0 {
                tx.sql()
                    .query_one("SELECT v FROM items0 WHERE id = 1", &[])?;
            }
            tx.alarm()
        })
    };
    let started = Instant::now();
    let s = objects.open(&format!("o-{n}"))?;
    read(&s)?;
    let first = started.elapsed();
    let started = Instant::now();
    read(&s)?;
    Ok((first, started.elapsed()))
}

/// Runs `f` with a client of its own connected to `url`, on a runtime of
/// its own.
fn on_client<T>(
    url: &str,
    f: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T, Error>,
) -> Result<T, Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        f(&c).await
    })
}

/// The same reads as a hand-written tokio-postgres transaction on a
/// connection of its own (the baseline of the steady transaction): lock
/// the object row, read its own table and its alarm, commit.
fn baseline(
    url: &str,
    deployment: &str,
    objects: &[usize],
    tables: usize,
) -> Result<Vec<Duration>, Error> {
    on_client(url, async |c: &tokio_postgres::Client| {
        let lock = c
            .prepare(&format!(
                "SELECT 1 FROM \"{deployment}\".durability_objects WHERE id = $1 FOR UPDATE"
            ))
            .await?;
        let alarm = c
            .prepare(&format!(
                "SELECT at FROM \"{deployment}\".durability_object_alarm WHERE object_id = $1"
            ))
            .await?;
        let mut took = Vec::new();
        for &n in objects {
            let id = format!("o-{n}");
            let seq: i64 = c
                .query_one(
                    &format!("SELECT seq FROM \"{deployment}\".durability_objects WHERE id = $1"),
                    &[&id],
                )
                .await?
                .try_get(0)?;
            let started = Instant::now();
            c.batch_execute(&format!(
                "BEGIN; SET LOCAL search_path TO \"{deployment}_o{seq}\""
            ))
            .await?;
            c.query(&lock, &[&id]).await?;
            if tables > 0 {
                c.query_one("SELECT v FROM items0 WHERE id = 1", &[])
                    .await?;
            }
            c.query(&alarm, &[&id]).await?;
            c.batch_execute("COMMIT").await?;
            took.push(started.elapsed());
        }
        Ok(took)
    })
}

fn catalog(url: &str) -> Result<(i64, i64, i64), Error> {
    on_client(url, async |c: &tokio_postgres::Client| {
        let r = c
            .query_one(
                "SELECT (SELECT count(*) FROM pg_class), (SELECT count(*) FROM pg_namespace),
                        pg_database_size(current_database())",
                &[],
            )
            .await?;
        Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))
    })
}

fn drop_all(url: &str, name: &str) -> Result<(), Error> {
    on_client(url, async |c: &tokio_postgres::Client| {
        let schemas = c
            .query(
                "SELECT nspname FROM pg_namespace WHERE nspname = $1 OR nspname LIKE $1 || '\\_o%'",
                &[&name],
            )
            .await?;
        for (i, r) in schemas.iter().enumerate() {
            let n: String = r.try_get(0)?;
            c.batch_execute(&format!("DROP SCHEMA \"{n}\" CASCADE"))
                .await?;
            if i % 1000 == 999 {
                eprintln!("dropped {} schemas", i + 1);
            }
        }
        Ok(())
    })
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let checkpoints: Vec<usize> = args
        .get(2)
        .map_or("1000,10000", String::as_str)
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let tables: usize = args.get(3).map_or(Ok(1), |t| t.parse())?;
    let name = format!("scale_{}", std::process::id());
    let objects = PostgresObjects::connect(&url, &name, PostgresObjectOptions::default())?;
    let mut made = 0;
    let mut out = std::io::stdout().lock();
    let result = (|| -> Result<(), Error> {
        for &target in &checkpoints {
            // Four creators at once (the pool has eight connections).
            let creating: Vec<Duration> = std::thread::scope(|scope| {
                let workers: Vec<_> = (0..4)
                    .map(|w| {
                        let objects = &objects;
                        scope.spawn(move || -> Result<Vec<Duration>, StorageError> {
                            let mut took = Vec::new();
                            for n in (made + w..target).step_by(4) {
                                let started = Instant::now();
                                create(objects, n, tables)?;
                                took.push(started.elapsed());
                                if n % 5000 == 0 {
                                    eprintln!("{n} objects");
                                }
                            }
                            Ok(took)
                        })
                    })
                    .collect();
                let mut all = Vec::new();
                for w in workers {
                    all.extend(w.join().map_err(|_| "a creator panicked")??);
                }
                Ok::<_, Error>(all)
            })?;
            made = target;
            let mut creating = creating;
            let (mut first, mut steady) = (Vec::new(), Vec::new());
            let sample: Vec<usize> = (0..200).map(|i| (i * 7919) % made).collect();
            for &n in &sample {
                let (f, s) = first_and_steady(&objects, n, tables)?;
                first.push(f);
                steady.push(s);
            }
            let mut bare = baseline(&url, &name, &sample, tables)?;
            let last = creating.len().saturating_sub(200);
            let create_recent = &mut creating[last..];
            let (classes, schemas, bytes) = catalog(&url)?;
            writeln!(
                out,
                "{{\"name\":\"objects.scale\",\"objects\":{made},\"own_tables\":{tables},\
                 \"create_ms_p50\":{:.2},\"create_ms_p99\":{:.2},\
                 \"first_tx_ms_p50\":{:.2},\"first_tx_ms_p99\":{:.2},\
                 \"steady_tx_ms_p50\":{:.2},\"steady_tx_ms_p99\":{:.2},\
                 \"bare_tx_ms_p50\":{:.2},\"bare_tx_ms_p99\":{:.2},\
                 \"pg_class\":{classes},\"pg_namespace\":{schemas},\"db_bytes\":{bytes}}}",
                percentile(create_recent, 0.5),
                percentile(create_recent, 0.99),
                percentile(&mut first, 0.5),
                percentile(&mut first, 0.99),
                percentile(&mut steady, 0.5),
                percentile(&mut steady, 0.99),
                percentile(&mut bare, 0.5),
                percentile(&mut bare, 0.99),
            )?;
            out.flush()?;
        }
        Ok(())
    })();
    drop(objects);
    drop_all(&url, &name)?;
    result
}
