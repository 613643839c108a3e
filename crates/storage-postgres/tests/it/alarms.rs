//! The PostgreSQL alarm index against the test server: the alarms
//! conformance suite (each case in a schema of its own), concurrent claims
//! from several index instances without double delivery, corrupt rows
//! quarantined without blocking healthy jobs, the dispatcher's retries and
//! discard on this index, and server time.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use durability_alarms::{
    AlarmIndex, Claim, ClaimReady, Delivery, Dispatch, DispatchOutcome, Dispatcher,
    DispatcherConfig, JobState, ObjectId, RetryPolicy, Token,
};
use durability_storage_postgres::alarms::{IndexTime, PostgresAlarmIndex};
use durability_storage_postgres::testkit::{TestSchema, url};
use durability_time::{Clock, ManualClock};

use crate::pg::{raw_client, schema};

/// A set-up index in `schema` on the caller's or the server's clock.
pub(crate) async fn index_in(schema: &TestSchema, time: IndexTime) -> PostgresAlarmIndex {
    let index = PostgresAlarmIndex::connect(&url(), schema.name(), time).unwrap();
    index.setup().await.unwrap();
    index
}

async fn fresh(time: IndexTime) -> Option<(PostgresAlarmIndex, TestSchema)> {
    let schema = schema().await?;
    Some((index_in(&schema, time).await, schema))
}

durability_alarms::alarm_index_conformance!(conformance, fresh(IndexTime::Caller));

pub(crate) fn obj(s: &str) -> ObjectId {
    ObjectId::new(s).unwrap()
}

pub(crate) fn tok(s: &str) -> Token {
    Token::new(s).unwrap()
}

/// Claims the earliest ready job of a server-time index under the run
/// token `run`, at a caller time of 0 (which the index does not read).
pub(crate) async fn claim_on_server_time(
    index: &PostgresAlarmIndex,
    lease_ms: i64,
    run: &str,
) -> Option<Claim> {
    let run = tok(run);
    index
        .claim(ClaimReady {
            now: 0,
            lease_ms,
            run: &run,
        })
        .await
        .unwrap()
}

const T0: i64 = 1_700_000_000_000;

/// Six index instances (six pools, as six hosts have) claim from 300 ready
/// jobs at once in batches: every job is claimed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_from_many_indexes_never_deliver_a_job_twice() {
    let Some((first, schema)) = fresh(IndexTime::Caller).await else {
        return;
    };
    for i in 0..300 {
        first
            .upsert(&obj(&format!("s:C:o{i:03}")), &tok("t"), T0 + i % 7)
            .await
            .unwrap();
    }
    assert_eq!(first.promote(T0 + 10, 1_000).await.unwrap(), 300);
    let mut tasks = Vec::new();
    for host in 0..6 {
        let index = index_in(&schema, IndexTime::Caller).await;
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let runs: Vec<Token> = (0..7).map(|_| Token::random()).collect();
                let got = index.claim_batch(T0 + 10, 60_000, &runs).await.unwrap();
                if got.is_empty() {
                    break;
                }
                for c in got {
                    assert_eq!(c.tries, 1, "host {host}: a first claim");
                    mine.push((c.object, c.run));
                }
            }
            mine
        }));
    }
    let mut claimed = HashSet::new();
    let mut total = 0;
    for t in tasks {
        for (object, run) in t.await.unwrap() {
            total += 1;
            assert!(claimed.insert(object.clone()), "{object} claimed twice");
            assert!(
                first.finish(&object, &run).await.unwrap(),
                "{object}: its run settles"
            );
        }
    }
    assert_eq!(total, 300);
    assert_eq!(first.counts().await.unwrap().total(), 0);
}

/// Rows a bug or an operator left corrupt (a token outside the grammar, a
/// negative due time, a try count out of range, an object id over the
/// object-id limit) are moved to quarantine when claimed, the healthy
/// jobs of the same batch are claimed, `job` reports the corrupt row as
/// `do_alarm_corrupt`, and listing leaves it out.
#[tokio::test]
async fn corrupt_jobs_are_quarantined_and_never_block_healthy_ones() {
    let Some((index, schema)) = fresh(IndexTime::Caller).await else {
        return;
    };
    for name in ["s:C:a", "s:C:z"] {
        index.upsert(&obj(name), &tok("good"), T0).await.unwrap();
    }
    let raw = raw_client().await;
    let jobs = format!("\"{}\".durability_alarm_jobs", schema.name());
    let overlong = format!(
        "s:C:{}",
        "x".repeat(durability_scheduler::MAX_OBJECT_ID_BYTES)
    );
    for (object, token, due, tries) in [
        ("s:C:b", "bad token!", T0, 0_i64),
        ("s:C:c", "t", -5, 0),
        ("s:C:d", "t", T0, -3),
        (overlong.as_str(), "t", T0, 0),
    ] {
        raw.execute(
            &format!(
                "INSERT INTO {jobs} (object, token, due_at, state, run, tries, score)
                 VALUES ($1, $2, $3, 1, NULL, $4, $3)"
            ),
            &[&object, &token, &due, &tries],
        )
        .await
        .unwrap();
    }
    let e = index.job(&obj("s:C:b")).await.unwrap_err();
    assert_eq!(e.code(), "do_alarm_corrupt", "{e}");
    index.promote(T0, 100).await.unwrap();
    // Two tokens: the corrupt jobs come first and take rounds of their
    // own, and the healthy ones are still claimed in this call.
    let runs: Vec<Token> = (0..2).map(|i| tok(&format!("r{i}"))).collect();
    let claims = index.claim_batch(T0, 60_000, &runs).await.unwrap();
    let names: Vec<&str> = claims.iter().map(|c| c.object.as_str()).collect();
    assert_eq!(
        names,
        ["s:C:a", "s:C:z"],
        "the healthy jobs, earliest first"
    );
    assert!(claims.iter().all(|c| runs.contains(&c.run)));
    assert_eq!(index.quarantined().await.unwrap(), 4);
    assert_eq!(
        index.counts().await.unwrap().ready,
        0,
        "nothing corrupt left ready"
    );
    let page = index
        .jobs_with_prefix(durability_alarms::JobPageRequest::first("s:C:", 100))
        .await
        .unwrap();
    assert_eq!(page.jobs.len(), 2, "the two running healthy jobs");
    for c in &claims {
        assert!(
            index.finish(&c.object, &c.run).await.unwrap(),
            "settled under its run"
        );
    }
}

/// A job that keeps failing on the PostgreSQL index is retried with the
/// policy's backoff (each retry due within the policy's bounds for its try)
/// and discarded after `max_tries`.
#[tokio::test]
async fn failing_alarm_is_retried_with_backoff_then_discarded() {
    struct Fails(AtomicU32);
    impl Dispatch for Fails {
        async fn dispatch(&self, d: Delivery) -> DispatchOutcome {
            self.0.fetch_add(1, Ordering::SeqCst);
            assert_eq!(d.final_attempt, d.attempt == 3);
            DispatchOutcome::Failed {
                reason: "handler failed".to_owned(),
            }
        }
    }
    let Some((index, _schema)) = fresh(IndexTime::Caller).await else {
        return;
    };
    let index = Arc::new(index);
    let clock = ManualClock::new(T0);
    let retry = RetryPolicy {
        max_tries: 3,
        ..RetryPolicy::default()
    };
    let config = DispatcherConfig {
        retry,
        seed: Some(7),
        ..DispatcherConfig::default()
    };
    let fails = Arc::new(Fails(AtomicU32::new(0)));
    let d = Dispatcher::new(
        Arc::clone(&index),
        Arc::clone(&fails),
        Arc::new(clock.clone()),
        config,
    )
    .unwrap();
    let a = obj("s:C:a");
    index.upsert(&a, &tok("t"), T0).await.unwrap();
    for tries in 1..=3_u32 {
        d.tick().await.unwrap();
        assert_eq!(fails.0.load(Ordering::SeqCst), tries);
        if tries == 3 {
            break;
        }
        let job = index.job(&a).await.unwrap().expect("retried, not gone");
        assert_eq!((job.state, job.tries), (JobState::Due, tries));
        let next = index.next_due().await.unwrap().unwrap();
        let (lo, hi) = retry.bounds(tries);
        let delay = next - clock.now_ms();
        assert!(
            (lo..=hi).contains(&delay),
            "try {tries}: delay {delay} in {lo}..={hi}"
        );
        clock.advance(delay);
    }
    let counts = d.counters().snapshot();
    assert_eq!((counts.retry_scheduled, counts.discarded), (2, 1));
    assert_eq!(index.job(&a).await.unwrap(), None, "discarded");
}

/// On server time, the claim lease ends on the database's clock: a claim
/// at a caller `now` far in the past still gets a lease from the server's
/// now, and promotion ignores the caller's `now`.
#[tokio::test]
async fn server_time_decides_leases_and_due_jobs() {
    let Some((index, _schema)) = fresh(IndexTime::Server).await else {
        return;
    };
    let raw = raw_client().await;
    let server_now: i64 = raw
        .query_one(
            "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let a = obj("s:C:a");
    index.upsert(&a, &tok("t"), 1).await.unwrap();
    // A caller clock at 0 would see nothing due; the server sees it due.
    assert_eq!(index.promote(0, 10).await.unwrap(), 1);
    let c = claim_on_server_time(&index, 60_000, "r").await.unwrap();
    assert!(
        c.lease_until >= server_now + 60_000,
        "{} vs {server_now}",
        c.lease_until
    );
    let far = index
        .upsert(&obj("s:C:far"), &tok("t"), server_now + 3_600_000)
        .await;
    assert!(far.unwrap());
    assert_eq!(
        index.promote(i64::MAX / 2, 10).await.unwrap(),
        0,
        "a caller's now far ahead promotes nothing on server time"
    );
}

/// A schema name outside the grammar is refused as a configuration error
/// before anything is sent; the setup SQL of a valid one names it quoted.
#[test]
fn hostile_schema_names_are_refused_by_the_index() {
    for name in [
        "x\"; DROP SCHEMA public CASCADE; --",
        "a.b",
        "Jobs",
        "pg_toast",
        "",
    ] {
        let e = PostgresAlarmIndex::connect(&url(), name, IndexTime::Server).expect_err(name);
        assert_eq!(e.code(), "do_alarm_invalid_config", "{name:?}: {e}");
    }
    let sql = PostgresAlarmIndex::setup_sql(
        &durability_storage_postgres::SchemaName::new("tenant_1").unwrap(),
    );
    assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"tenant_1\".durability_alarm_jobs"));
}
