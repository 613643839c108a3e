//! Our side of the PostgreSQL figures (`pg` group): the outbox in the
//! caller's own PostgreSQL transaction (`durability_storage_postgres::outbox`)
//! against apalis-postgres, same server, same run.
//!
//! In a schema of its own (`bench_peers_ours_<pid>`, dropped after) on the
//! given URL's database: one entry staged per transaction (`BEGIN`, stage,
//! `COMMIT`), 100 per transaction (`stage_batch`), a backlog drained by one
//! `PgDeliverer` (batches of 100, a no-op sink), and the idle stage → sink
//! latency of a `PgDeliverer::run` woken by `LISTEN/NOTIFY` (its fallback
//! poll 5 s, as apalis' README strategy). 200-byte string payloads.

use std::sync::Arc;
use std::time::Instant;

use durability_outbox::{ChannelConfig, Entry, Sink, SinkError};
use durability_storage_postgres::outbox::{PgDeliverer, PgOutbox};
use tokio::sync::mpsc;
use tokio_postgres::{Client, NoTls};

use crate::{BATCH, BoxResult, body, emit, now, percentile, rate};

/// A sink that acknowledges everything; with a sender, says when it ran.
struct Noop(Option<mpsc::UnboundedSender<Instant>>);

impl Sink<String> for Noop {
    async fn publish(&self, _batch: &[Entry<String>]) -> Result<(), SinkError> {
        if let Some(tx) = &self.0 {
            let _ = tx.send(now());
        }
        Ok(())
    }
}

/// Stages `n` entries on `channel`, `per_txn` per transaction, keys from
/// `prefix`.
async fn stage_many(
    client: &mut Client,
    outbox: &PgOutbox,
    channel: &str,
    n: u64,
    per_txn: u64,
) -> BoxResult {
    let value = body();
    let mut i = 0;
    while i < n {
        let end = (i + per_txn).min(n);
        let keys: Vec<String> = (i..end).map(|k| format!("{channel}-{k}")).collect();
        let tx = client.transaction().await?;
        if per_txn == 1 {
            outbox.stage(&tx, channel, &keys[0], &value).await?;
        } else {
            let entries: Vec<(&str, String)> =
                keys.iter().map(|k| (k.as_str(), value.clone())).collect();
            outbox.stage_batch(&tx, channel, &entries).await?;
        }
        tx.commit().await?;
        i = end;
    }
    Ok(())
}

async fn pending(client: &Client, schema: &str, channel: &str) -> BoxResult<u64> {
    let n: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM {schema}.outbox WHERE channel = $1"),
            &[&channel],
        )
        .await?
        .get(0);
    Ok(n.unsigned_abs())
}

/// The PostgreSQL figures of ours: `args` are `ENQUEUE BACKLOG SAMPLES URL`.
pub(crate) async fn pg(args: &[String]) -> BoxResult {
    let [enqueue, backlog, samples, url] = args else {
        return Err("usage: pg ENQUEUE BACKLOG SAMPLES URL".into());
    };
    let size = |raw: &String| match raw.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("pg: {raw:?} is not a positive count")),
    };
    let (enqueue, backlog, samples) = (size(enqueue)?, size(backlog)?, size(samples)?);
    let schema = format!("bench_peers_ours_{}", std::process::id());
    let (mut client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    let outbox = PgOutbox::new(&schema)?;
    outbox.setup(&mut client).await?;
    let result = figures(
        &mut client,
        &outbox,
        &schema,
        [enqueue, backlog, samples],
        url,
    )
    .await;
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await?;
    result
}

/// Fails unless `got` entries of `figure` are `what`, as `want` are.
fn expect(figure: &str, got: u64, want: u64, what: &str) -> BoxResult {
    (got == want)
        .then_some(())
        .ok_or_else(|| format!("{figure}: {got} {what} of {want}").into())
}

async fn figures(
    client: &mut Client,
    outbox: &PgOutbox,
    schema: &str,
    [enqueue, backlog, samples]: [u64; 3],
    url: &str,
) -> BoxResult {
    for (figure, channel, per_txn) in [
        ("pg_outbox.enqueue_single", "single", 1),
        ("pg_outbox.enqueue_batched", "batched", BATCH),
    ] {
        let t = now();
        stage_many(client, outbox, channel, enqueue, per_txn).await?;
        let entries_per_s = rate(enqueue, t.elapsed());
        let staged = pending(client, schema, channel).await?;
        expect(figure, staged, enqueue, "pending")?;
        emit(figure, "ours", entries_per_s, "entries/s", true, enqueue);
    }

    let figure = format!("pg_outbox.drain_{}k", backlog / 1000);
    stage_many(client, outbox, "drain", backlog, 1_000).await?;
    client
        .batch_execute(&format!("VACUUM ANALYZE {schema}.outbox"))
        .await?;
    let deliverer = PgDeliverer::new(
        outbox,
        url.parse()?,
        2,
        ChannelConfig::new("drain").batch_size(BATCH as usize),
        Noop(None),
    )?;
    let t = now();
    let delivered = deliverer.deliver_due().await?.delivered;
    let entries_per_s = rate(backlog, t.elapsed());
    expect(&figure, delivered, backlog, "delivered")?;
    expect(&figure, deliverer.len().await?, 0, "left")?;
    emit(&figure, "ours", entries_per_s, "entries/s", true, backlog);

    latency(client, outbox, samples, url).await
}

/// Idle stage → sink, `samples` times, the deliverer woken by `NOTIFY`.
async fn latency(client: &mut Client, outbox: &PgOutbox, samples: u64, url: &str) -> BoxResult {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let deliverer = Arc::new(
        PgDeliverer::new(
            outbox,
            url.parse()?,
            2,
            ChannelConfig::new("latency"),
            Noop(Some(tx)),
        )?
        .poll_interval_ms(5_000),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn({
        let d = Arc::clone(&deliverer);
        async move {
            d.run(async {
                let _ = stopped.await;
            })
            .await;
        }
    });
    // Its listener is up once the server shows it.
    let listening = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"{}\"'",
        outbox.notify_channel()
    );
    while client.query_one(&listening, &[]).await?.get::<_, i64>(0) == 0 {
        tokio::task::yield_now().await;
    }
    let value = body();
    let mut got = Vec::new();
    for i in 0..samples {
        let t = now();
        let txn = client.transaction().await?;
        outbox
            .stage(&txn, "latency", &format!("k{i}"), &value)
            .await?;
        txn.commit().await?;
        let ran = rx.recv().await.ok_or("the deliverer stopped")?;
        got.push(ran.duration_since(t).as_secs_f64() * 1e3);
    }
    let _ = stop.send(());
    runner.await?;
    got.sort_by(f64::total_cmp);
    let p50 = percentile(&got, 0.5);
    emit("pg_outbox.latency_p50", "ours", p50, "ms", false, samples);
    Ok(())
}
