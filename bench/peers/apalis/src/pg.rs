//! The apalis-postgres 1.0 side of the PostgreSQL figures (`pg` group).
//!
//! In a database of its own (`bench_peers_apalis` on the server of the
//! given URL, created when missing; `PostgresStorage::setup` migrates it
//! into its `apalis` schema), as its README shows: `push` (one task, one
//! statement that commits on its own), `push_bulk` of 100 (one multi-row
//! insert), a `WorkerBuilder` worker with a fetch batch of 100 draining a
//! backlog (polling every 100 ms, as the SQLite side), and an idle worker
//! woken by `with_pubsub` (its `LISTEN/NOTIFY` on inserts; the README's
//! 5 s interval as the fallback) for the stage → handler latency. The
//! jobs table is emptied before every figure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::{
    BATCH, BoxResult, Counter, POLL, body, emit, err, handle, now, percentile, push_many, timed,
};

/// The database the apalis figures run in.
const DATABASE: &str = "bench_peers_apalis";
/// The queue of every figure.
const QUEUE: &str = "bench_pg";

/// `url` with its database replaced by [`DATABASE`], after creating it.
async fn database(url: &str) -> BoxResult<PgPool> {
    let admin = PgPoolOptions::new().max_connections(1).connect(url).await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(DATABASE)
            .fetch_one(&admin)
            .await?;
    if !exists {
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {DATABASE}")))
            .execute(&admin)
            .await?;
    }
    admin.close().await;
    let options: sqlx::postgres::PgConnectOptions = url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.database(DATABASE))
        .await?;
    PostgresStorage::setup(&pool).await.map_err(err)?;
    Ok(pool)
}

async fn empty(pool: &PgPool) -> BoxResult {
    sqlx::query("TRUNCATE apalis.jobs").execute(pool).await?;
    Ok(())
}

fn storage(pool: &PgPool) -> PostgresStorage<String> {
    PostgresStorage::new(pool)
        .with_config(Config::default().queue(QUEUE).batch_size(BATCH as usize))
}

async fn count(pool: &PgPool, status: &str) -> BoxResult<u64> {
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM apalis.jobs WHERE job_type = $1 AND status = $2")
            .bind(QUEUE)
            .bind(status)
            .fetch_one(pool)
            .await?;
    Ok(n.unsigned_abs())
}

/// The PostgreSQL figures of apalis-postgres.
pub(crate) async fn pg(enqueue: u64, backlog: u64, samples: u64, url: &str) -> BoxResult {
    let pool = database(url).await?;
    for (figure, per_push) in [
        ("pg_outbox.enqueue_single", 1),
        ("pg_outbox.enqueue_batched", BATCH),
    ] {
        empty(&pool).await?;
        let mut s = storage(&pool);
        let push = push_many(&mut s, enqueue, per_push);
        timed(figure, enqueue, push, "pending", count(&pool, "Pending")).await?;
    }

    let figure = format!("pg_outbox.drain_{}k", backlog / 1000);
    empty(&pool).await?;
    let mut s = storage(&pool);
    push_many(&mut s, backlog, 1_000).await?;
    sqlx::query("VACUUM ANALYZE apalis.jobs")
        .execute(&pool)
        .await?;
    let worker = WorkerBuilder::new(format!("pg-drain-{backlog}"))
        .backend(s.poll_with_interval(POLL))
        .data(Counter::to(backlog))
        .build(handle);
    let run = async { worker.run().await.map_err(err) };
    timed(&figure, backlog, run, "done", count(&pool, "Done")).await?;

    latency(&pool, samples).await?;
    pool.close().await;
    Ok(())
}

/// Says when the handler ran.
async fn mark(
    _body: String,
    ran: Data<Arc<tokio::sync::mpsc::UnboundedSender<Instant>>>,
) -> Result<(), BoxDynError> {
    let _ = ran.send(now());
    Ok(())
}

/// Idle push → handler, `samples` times, the worker woken by its pubsub.
async fn latency(pool: &PgPool, samples: u64) -> BoxResult {
    empty(pool).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let lazy = Strategy::new().interval(Duration::from_secs(5));
    let backend = storage(pool).with_pubsub().poll_with_strategy(lazy);
    let worker = WorkerBuilder::new("pg-latency")
        .backend(backend)
        .data(Arc::new(tx))
        .build(mark);
    let running = tokio::spawn(async move { worker.run().await });
    // Its listener is up once the server shows it.
    while listening(pool).await? == 0 {
        tokio::task::yield_now().await;
    }
    let mut s = storage(pool);
    let mut got = Vec::new();
    for _ in 0..samples {
        let t = now();
        s.push(body()).await.map_err(err)?;
        let ran = rx.recv().await.ok_or("the worker stopped")?;
        got.push(ran.duration_since(t).as_secs_f64() * 1e3);
    }
    running.abort();
    got.sort_by(f64::total_cmp);
    emit(
        "pg_outbox.latency_p50",
        percentile(&got, 0.5),
        "ms",
        false,
        samples,
    );
    Ok(())
}

async fn listening(pool: &PgPool) -> BoxResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND query LIKE 'LISTEN%'",
    )
    .fetch_one(pool)
    .await?)
}
