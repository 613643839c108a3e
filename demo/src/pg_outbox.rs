//! The PostgreSQL half of `bench outbox`: the outbox in the caller's own
//! transaction against hand-written SQL on the same server, same run.
//!
//! - `outbox.pg.stage_overhead`: one application row plus one staged entry
//!   per transaction, against the same row plus a hand-written upsert.
//! - `outbox.pg.stage_100_per_txn`: 100 entries per transaction
//!   ([`PgOutbox::stage_batch`]) against one multi-row insert.
//! - `outbox.pg.delivery_1w` / `_4w`: a 10k backlog drained by 1 and 4
//!   deliverers (no-op sink) against a bare `SKIP LOCKED` claim-and-delete
//!   loop with as many workers (at most once: it deletes before it
//!   delivers, and claims nothing durably).
//! - `outbox.pg.delivery_1w.vs_durable_claim` / `_4w…`: the same drains
//!   against the least an at-least-once loop with durable claims does: per
//!   batch one transaction in one round trip that deletes the batch it
//!   claimed before and claims the next (`UPDATE … SET due_at = deadline …
//!   SKIP LOCKED … RETURNING`), committed asynchronously as ours are. Each
//!   drain also reports the WAL it wrote per entry (the server's whole WAL:
//!   anything else writing meanwhile counts too). This is the figure with a
//!   target (>= 0.8): the contract's durable claims write every row twice,
//!   so the bare loop's one write is no bound for any loop that keeps them.
//! - `outbox.pg.notify_latency_p50`: commit of an idle stage to the sink,
//!   against a bare `NOTIFY` commit to a listener receipt.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use durability_outbox::{ChannelConfig, Entry, Sink, SinkError};
use durability_storage_postgres::outbox::{PgDeliverer, PgOutbox};
use futures::StreamExt as _;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Client, NoTls};

use crate::Result;
use crate::bench::{figure, round};

async fn connect(url: &str) -> std::result::Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// A sink that only counts (and, for latency, says when it ran).
struct Count(Option<mpsc::UnboundedSender<Instant>>);

impl Sink<Vec<u8>> for Count {
    #[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
    async fn publish(&self, _batch: &[Entry<Vec<u8>>]) -> std::result::Result<(), SinkError> {
        if let Some(tx) = &self.0 {
            let _ = tx.send(Instant::now());
        }
        Ok(())
    }
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn pg(extra: serde_json::Value) -> serde_json::Value {
    let mut base =
        json!({"backend": "postgres", "synchronous_commit": "on", "statistic": "median"});
    if let (Some(map), serde_json::Value::Object(more)) = (base.as_object_mut(), extra) {
        map.extend(more);
    }
    base
}

/// Runs the PostgreSQL figures in a schema of their own (dropped after).
pub(crate) async fn bench(url: &str) -> Result {
    let schema = format!("bench_pg_outbox_{}", std::process::id());
    let mut client = connect(url).await?;
    let outbox = PgOutbox::new(&schema)?;
    outbox.setup(&mut client).await?;
    client
        .batch_execute(&format!(
            "CREATE TABLE {schema}.app_rows (id bigint PRIMARY KEY, body bytea);
             CREATE SEQUENCE {schema}.hand_version;
             CREATE TABLE {schema}.hand (channel text COLLATE \"C\", key text COLLATE \"C\",
                 value bytea NOT NULL, version bigint NOT NULL, attempt int NOT NULL,
                 due_at bigint NOT NULL, claimed_until bigint, PRIMARY KEY (channel, key));
             CREATE INDEX ON {schema}.hand (channel, due_at, version);
             CREATE TABLE {schema}.bare_jobs (id bigserial PRIMARY KEY, key text, value bytea);
             CREATE TABLE {schema}.durable_jobs (id bigserial PRIMARY KEY, key text, value bytea,
                 due_at bigint NOT NULL DEFAULT 0);"
        ))
        .await?;
    let result = figures(url, &schema, &outbox, &mut client).await;
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await?;
    result
}

async fn figures(url: &str, schema: &str, outbox: &PgOutbox, client: &mut Client) -> Result {
    stage_single(schema, outbox, client).await?;
    stage_hundred(schema, outbox, client).await?;
    for workers in [1, 4] {
        delivery(url, schema, outbox, client, workers).await?;
    }
    latency(url, schema, outbox, client).await
}

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn stage_single(schema: &str, outbox: &PgOutbox, client: &mut Client) -> Result {
    let body = vec![3u8; 200];
    let app = client
        .prepare(&format!("INSERT INTO {schema}.app_rows VALUES ($1, $2)"))
        .await?;
    let hand = client
        .prepare(&format!(
            "INSERT INTO {schema}.hand VALUES ('probe', $1, $2, nextval('{schema}.hand_version'), 0, $3, NULL)
             ON CONFLICT (channel, key) DO UPDATE SET value = EXCLUDED.value,
             version = EXCLUDED.version, attempt = 0, due_at = EXCLUDED.due_at, claimed_until = NULL"
        ))
        .await?;
    let (rounds, per_round) = (20_i64, 250_i64);
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    let mut id = 0_i64;
    for _ in 0..rounds {
        for mine in [false, true] {
            let start = Instant::now();
            for _ in 0..per_round {
                id += 1;
                let key = format!("key-{id}");
                let tx = client.transaction().await?;
                let row: [&(dyn ToSql + Sync); 2] = [&id, &body];
                tx.execute(&app, &row).await?;
                if mine {
                    outbox.stage(&tx, "probe", &key, &body).await?;
                } else {
                    let upsert: [&(dyn ToSql + Sync); 3] = [&key, &body, &id];
                    tx.execute(&hand, &upsert).await?;
                }
                tx.commit().await?;
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / per_round as f64;
            if mine { ours.push(us) } else { base.push(us) }
        }
    }
    let (ours, base) = (median(&mut ours), median(&mut base));
    eprintln!(
        "postgres staging, 1 entry per transaction (us/txn): hand-written upsert {base:.1}, ours {ours:.1}"
    );
    let n = u64::try_from(rounds * per_round)?;
    figure(
        "outbox.pg.stage_overhead",
        ours,
        base,
        "us/txn",
        "<=1.25",
        n,
        pg(
            json!({"value_bytes": 200, "rounds": rounds, "baseline_is": "app row + hand-written upsert"}),
        ),
    );
    client
        .batch_execute(&format!("TRUNCATE {schema}.outbox, {schema}.hand"))
        .await?;
    Ok(())
}

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn stage_hundred(schema: &str, outbox: &PgOutbox, client: &mut Client) -> Result {
    let body = vec![3u8; 200];
    let multi = client
        .prepare(&format!(
            "INSERT INTO {schema}.bare_jobs (key, value) SELECT * FROM unnest($1::text[], $2::bytea[])"
        ))
        .await?;
    let (rounds, txns, per_tx) = (10, 20, 100);
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    let mut next = 0_u64;
    for _ in 0..rounds {
        for mine in [false, true] {
            let start = Instant::now();
            for _ in 0..txns {
                let keys: Vec<String> = (0..per_tx).map(|i| format!("key-{}", next + i)).collect();
                next += per_tx;
                let tx = client.transaction().await?;
                if mine {
                    let entries: Vec<(&str, Vec<u8>)> =
                        keys.iter().map(|k| (k.as_str(), body.clone())).collect();
                    outbox.stage_batch(&tx, "hundred", &entries).await?;
                } else {
                    let values = vec![body.clone(); keys.len()];
                    tx.execute(&multi, &[&keys, &values]).await?;
                }
                tx.commit().await?;
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / (txns * per_tx) as f64;
            if mine { ours.push(us) } else { base.push(us) }
        }
    }
    let (ours, base) = (median(&mut ours), median(&mut base));
    eprintln!(
        "postgres staging, 100 per transaction (us/entry): one multi-row insert {base:.2}, ours {ours:.2}"
    );
    figure(
        "outbox.pg.stage_100_per_txn",
        ours,
        base,
        "us/entry",
        "<=1.0",
        rounds * txns * per_tx,
        pg(
            json!({"value_bytes": 200, "per_txn": per_tx, "baseline_is": "one multi-row insert (apalis push_bulk's shape)"}),
        ),
    );
    client
        .batch_execute(&format!("TRUNCATE {schema}.outbox, {schema}.bare_jobs"))
        .await?;
    Ok(())
}

/// Fills the three backlogs with `n` entries.
async fn backlog(schema: &str, outbox: &PgOutbox, client: &mut Client, n: usize) -> Result {
    let body = vec![3u8; 200];
    for chunk in 0..n / 1_000 {
        let keys: Vec<String> = (0..1_000).map(|i| format!("key-{chunk}-{i}")).collect();
        let entries: Vec<(&str, Vec<u8>)> =
            keys.iter().map(|k| (k.as_str(), body.clone())).collect();
        let tx = client.transaction().await?;
        outbox.stage_batch(&tx, "drain", &entries).await?;
        let values = vec![body.clone(); keys.len()];
        for table in ["bare_jobs", "durable_jobs"] {
            tx.execute(
                &format!("INSERT INTO {schema}.{table} (key, value) SELECT * FROM unnest($1::text[], $2::bytea[])"),
                &[&keys, &values],
            )
            .await?;
        }
        tx.commit().await?;
    }
    // One statement each: VACUUM cannot run in the implicit transaction of
    // a multi-statement query.
    for table in ["outbox", "bare_jobs", "durable_jobs"] {
        client
            .batch_execute(&format!("VACUUM ANALYZE {schema}.{table}"))
            .await?;
    }
    Ok(())
}

/// The baseline worker: claim and delete 100 at a time until empty.
async fn bare_worker(
    url: String,
    schema: String,
) -> std::result::Result<u64, tokio_postgres::Error> {
    let client = connect(&url).await?;
    let claim = client
        .prepare(&format!(
            "DELETE FROM {schema}.bare_jobs WHERE id IN (SELECT id FROM {schema}.bare_jobs
             ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED) RETURNING key, value"
        ))
        .await?;
    let mut n = 0;
    loop {
        let rows = client.query(&claim, &[]).await?;
        if rows.is_empty() {
            return Ok(n);
        }
        n += rows.len() as u64;
    }
}

/// The durable-claim baseline's worker: per batch of 100, one
/// transaction in one round trip (pipelined) that deletes the batch it
/// claimed before (settled) and claims the next by setting its deadline,
/// committed with `synchronous_commit = off` as ours are; until a claim
/// finds nothing and nothing is held.
async fn durable_worker(
    url: String,
    schema: String,
) -> std::result::Result<u64, tokio_postgres::Error> {
    let client = connect(&url).await?;
    client.batch_execute("SET synchronous_commit = off").await?;
    let settle = client
        .prepare(&format!(
            "DELETE FROM {schema}.durable_jobs WHERE id = ANY($1)"
        ))
        .await?;
    let claim = client
        .prepare(&format!(
            "UPDATE {schema}.durable_jobs SET due_at = $1 WHERE id IN (SELECT id
             FROM {schema}.durable_jobs WHERE due_at <= $2 ORDER BY id LIMIT 100
             FOR UPDATE SKIP LOCKED) RETURNING id, key, value"
        ))
        .await?;
    // Every row is due at 0; a claim holds its rows until `deadline`.
    let (now, deadline) = (1_000_i64, 31_000_i64);
    let (mut n, mut held) = (0, Vec::<i64>::new());
    loop {
        let settles: [&(dyn ToSql + Sync); 1] = [&held];
        let claims: [&(dyn ToSql + Sync); 2] = [&deadline, &now];
        let (begun, settled, claimed, committed) = futures::join!(
            client.batch_execute("BEGIN"),
            client.execute(&settle, &settles),
            client.query(&claim, &claims),
            client.batch_execute("COMMIT")
        );
        begun?;
        settled?;
        committed?;
        let rows = claimed?;
        if rows.is_empty() && held.is_empty() {
            return Ok(n);
        }
        n += rows.len() as u64;
        held = rows.iter().map(|r| r.get(0)).collect();
    }
}

/// The server's WAL position, in bytes.
async fn wal_position(client: &Client) -> Result<i64> {
    let row = client
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

type WorkerResult = std::result::Result<u64, Box<dyn std::error::Error + Send + Sync>>;

/// Runs `workers` drains at once (`drain(i)` is worker `i`), checks they
/// drained all `n` entries, and returns entries per second and WAL bytes
/// per entry.
#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn timed<F>(
    client: &Client,
    workers: usize,
    n: usize,
    drain: impl Fn(usize) -> F,
) -> Result<(f64, f64)>
where
    F: Future<Output = WorkerResult> + Send + 'static,
{
    let wal = wal_position(client).await?;
    let start = Instant::now();
    let runs: Vec<_> = (0..workers).map(|i| tokio::spawn(drain(i))).collect();
    let mut drained = 0;
    for run in runs {
        drained += run.await?.map_err(|e| e.to_string())?;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let wal = (wal_position(client).await? - wal) as f64 / n as f64;
    assert_eq!(drained, n as u64, "everything drained");
    Ok((rate, wal))
}

/// Median entries per second and WAL bytes per entry of a drain's runs.
fn medians(runs: &[(f64, f64)]) -> (f64, f64) {
    let (mut rates, mut wal): (Vec<f64>, Vec<f64>) = runs.iter().copied().unzip();
    (median(&mut rates), median(&mut wal))
}

async fn delivery(
    url: &str,
    schema: &str,
    outbox: &PgOutbox,
    client: &mut Client,
    workers: usize,
) -> Result {
    let n = 10_000;
    let (mut ours, mut bare, mut durable) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        backlog(schema, outbox, client, n).await?;
        let mut deliverers = Vec::new();
        for _ in 0..workers {
            let config = ChannelConfig::new("drain");
            deliverers.push(Arc::new(PgDeliverer::new(
                outbox,
                url.parse()?,
                2,
                config,
                Count(None),
            )?));
        }
        ours.push(
            timed(client, workers, n, |i| {
                let d = Arc::clone(&deliverers[i]);
                async move { Ok(d.deliver_due().await?.delivered) }
            })
            .await?,
        );
        let (url, schema) = (url.to_owned(), schema.to_owned());
        bare.push(
            timed(client, workers, n, |_| {
                let run = bare_worker(url.clone(), schema.clone());
                async move { Ok(run.await?) }
            })
            .await?,
        );
        durable.push(
            timed(client, workers, n, |_| {
                let run = durable_worker(url.clone(), schema.clone());
                async move { Ok(run.await?) }
            })
            .await?,
        );
    }
    let (ours, ours_wal) = medians(&ours);
    let (bare, bare_wal) = medians(&bare);
    let (durable, durable_wal) = medians(&durable);
    eprintln!(
        "postgres delivery, 10k backlog, {workers} worker(s) (entries/s, WAL bytes/entry): \
         bare SKIP LOCKED loop {bare:.0} ({bare_wal:.0}), durable-claim loop {durable:.0} \
         ({durable_wal:.0}), ours {ours:.0} ({ours_wal:.0})"
    );
    let common = json!({"workers": workers, "ours_claims_and_settlements": "synchronous_commit=off",
        "batch": 100, "value_bytes": 200, "backlog": n, "wal_bytes_per_entry": round(ours_wal)});
    let mut vs_bare = pg(common.clone());
    vs_bare["baseline_is"] =
        json!("DELETE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED LIMIT 100)");
    vs_bare["baseline_wal_bytes_per_entry"] = json!(round(bare_wal));
    figure(
        &format!("outbox.pg.delivery_{workers}w"),
        ours,
        bare,
        "entries/s",
        "informational (at most once, no claim: the durable-claim floor itself runs below 0.8 of it)",
        3 * n as u64,
        vs_bare,
    );
    let mut vs_durable = pg(common);
    vs_durable["baseline_is"] = json!(
        "per batch one transaction, one round trip: DELETE … WHERE id = ANY(the batch claimed \
         before); UPDATE … SET due_at = deadline WHERE id IN (SELECT … WHERE due_at <= now \
         FOR UPDATE SKIP LOCKED LIMIT 100) RETURNING …; synchronous_commit=off"
    );
    vs_durable["baseline_wal_bytes_per_entry"] = json!(round(durable_wal));
    figure(
        &format!("outbox.pg.delivery_{workers}w.vs_durable_claim"),
        ours,
        durable,
        "entries/s",
        ">=0.8 (of the least an at-least-once loop with durable claims does)",
        3 * n as u64,
        vs_durable,
    );
    Ok(())
}

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn latency(url: &str, schema: &str, outbox: &PgOutbox, client: &mut Client) -> Result {
    let samples = 200;
    // Ours: an idle deliverer woken by NOTIFY.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let d = Arc::new(
        PgDeliverer::new(
            outbox,
            url.parse()?,
            2,
            ChannelConfig::new("latency"),
            Count(Some(tx)),
        )?
        .poll_interval_ms(60_000),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn({
        let d = d.clone();
        async move {
            d.run(async {
                let _ = stopped.await;
            })
            .await
        }
    });
    let listening = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"{}\"'",
        outbox.notify_channel()
    );
    while client.query_one(&listening, &[]).await?.get::<_, i64>(0) == 0 {
        tokio::task::yield_now().await;
    }
    let mut ours = Vec::new();
    for i in 0..samples {
        let t = client.transaction().await?;
        outbox
            .stage(&t, "latency", &format!("k{i}"), &vec![1u8])
            .await?;
        let start = Instant::now();
        t.commit().await?;
        let got = rx.recv().await.ok_or("the deliverer stopped")?;
        ours.push(got.duration_since(start).as_secs_f64() * 1e6);
    }
    let _ = stop.send(());
    runner.await?;

    // Baseline: a bare NOTIFY commit to a listener's receipt.
    let (listener, mut connection) = tokio_postgres::connect(url, NoTls).await?;
    let (ntx, mut nrx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notification(_) = m {
                let _ = ntx.send(Instant::now());
            }
        }
    });
    listener.batch_execute("LISTEN bench_bare").await?;
    client
        // A logged table: a temporary one would skip the WAL flush.
        .batch_execute(&format!("CREATE TABLE {schema}.bench_latency (n int)"))
        .await?;
    let mut base = Vec::new();
    for _ in 0..samples {
        let t = client.transaction().await?;
        // A row and a notification, so the commit flushes WAL as a stage's does.
        t.execute(
            &format!("INSERT INTO {schema}.bench_latency VALUES (1)"),
            &[],
        )
        .await?;
        t.execute("SELECT pg_notify('bench_bare', 'x')", &[])
            .await?;
        let start = Instant::now();
        t.commit().await?;
        let got = nrx.recv().await.ok_or("the listener stopped")?;
        base.push(got.duration_since(start).as_secs_f64() * 1e6);
    }
    let (ours, base) = (median(&mut ours) / 1e3, median(&mut base) / 1e3);
    eprintln!(
        "postgres idle stage → sink latency p50: ours {ours:.2} ms, a row + NOTIFY to listener receipt {base:.2} ms"
    );
    figure(
        "outbox.pg.notify_latency_p50",
        ours,
        base,
        "ms",
        "informational (peers: <= apalis with_pubsub)",
        samples,
        pg(
            json!({"statistic": "p50", "baseline_is": "commit of a row + NOTIFY to listener receipt"}),
        ),
    );
    Ok(())
}
