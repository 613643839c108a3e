//! The PostgreSQL half of `bench outbox`: the outbox in the caller's own
//! transaction against hand-written SQL on the same server, same run.
//!
//! - `outbox.pg.stage_overhead`: one application row plus one staged entry
//!   per transaction, against the same row plus a hand-written upsert.
//! - `outbox.pg.stage_100_per_txn`: 100 entries per transaction
//!   ([`PgOutbox::stage_batch`]) against one multi-row insert.
//! - `outbox.pg.delivery_1w` / `_4w`: a 10k backlog drained by 1 and 4
//!   deliverers (no-op sink) against a bare `SKIP LOCKED` claim-and-delete
//!   loop with as many workers.
//! - `outbox.pg.notify_latency_p50`: commit of an idle stage to the sink,
//!   against a bare `NOTIFY` commit to a listener receipt.

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
use crate::bench::figure;

async fn connect(url: &str) -> Result<Client> {
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
             CREATE TABLE {schema}.bare_jobs (id bigserial PRIMARY KEY, key text, value bytea);"
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

/// Fills both backlogs with `n` entries.
async fn backlog(schema: &str, outbox: &PgOutbox, client: &mut Client, n: usize) -> Result {
    let body = vec![3u8; 200];
    for chunk in 0..n / 1_000 {
        let keys: Vec<String> = (0..1_000).map(|i| format!("key-{chunk}-{i}")).collect();
        let entries: Vec<(&str, Vec<u8>)> =
            keys.iter().map(|k| (k.as_str(), body.clone())).collect();
        let tx = client.transaction().await?;
        outbox.stage_batch(&tx, "drain", &entries).await?;
        let values = vec![body.clone(); keys.len()];
        tx.execute(
            &format!("INSERT INTO {schema}.bare_jobs (key, value) SELECT * FROM unnest($1::text[], $2::bytea[])"),
            &[&keys, &values],
        )
        .await?;
        tx.commit().await?;
    }
    // One statement each: VACUUM cannot run in the implicit transaction of
    // a multi-statement query.
    for table in ["outbox", "bare_jobs"] {
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
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(connection);
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

#[allow(clippy::disallowed_methods)] // Benchmarks measure wall time.
async fn delivery(
    url: &str,
    schema: &str,
    outbox: &PgOutbox,
    client: &mut Client,
    workers: usize,
) -> Result {
    let n = 10_000;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
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
        let start = Instant::now();
        let runs: Vec<_> = deliverers
            .iter()
            .map(|d| {
                let d = d.clone();
                tokio::spawn(async move { d.deliver_due().await.map(|r| r.delivered) })
            })
            .collect();
        let mut delivered = 0;
        for run in runs {
            delivered += run.await??;
        }
        ours.push(n as f64 / start.elapsed().as_secs_f64());
        assert_eq!(delivered, n as u64, "everything delivered");

        let start = Instant::now();
        let runs: Vec<_> = (0..workers)
            .map(|_| tokio::spawn(bare_worker(url.to_owned(), schema.to_owned())))
            .collect();
        let mut drained = 0;
        for run in runs {
            drained += run.await??;
        }
        base.push(n as f64 / start.elapsed().as_secs_f64());
        assert_eq!(drained, n as u64, "the bare loop drained everything");
    }
    let (ours, base) = (median(&mut ours), median(&mut base));
    eprintln!(
        "postgres delivery, 10k backlog, {workers} worker(s): bare SKIP LOCKED loop {base:.0}/s, ours {ours:.0}/s"
    );
    figure(
        &format!("outbox.pg.delivery_{workers}w"),
        ours,
        base,
        "entries/s",
        ">=0.8",
        3 * n as u64,
        pg(
            json!({"workers": workers, "ours_claims_and_settlements": "synchronous_commit=off", "batch": 100, "value_bytes": 200, "backlog": n,
            "baseline_is": "DELETE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED LIMIT 100)"}),
        ),
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
