//! A PostgreSQL server of this test's own, crashed and restarted under the
//! lease store and the alarm index: leases, generations and jobs (a claim
//! included) survive; a write whose reply is lost (its backend paused with
//! SIGSTOP past the call deadline) is reported unknown — and did land once
//! the backend ran again; a call while the server is down is never reported
//! as a definite failure.

use std::time::Duration;

use durability_alarms::{AlarmIndex, JobState};
use durability_ownership::{
    ClaimOutcome, Claimant, ClassName, DispatchOutcome, LeaseStore, OwnerScope, ShardCount, TaskId,
};
use durability_storage_postgres::SchemaName;
use durability_storage_postgres::alarms::{IndexTime, PostgresAlarmIndex};
use durability_storage_postgres::ownership::PostgresLeaseStore;

use crate::alarms::{claim_on_server_time, obj, tok};
use crate::cluster::{Cluster, signal};
use crate::ownership::active;
use crate::pg::class_scopes;

/// The call deadline of the stores here: past it, a paused backend's reply is lost.
const DEADLINE: Duration = Duration::from_millis(1_500);

fn config(cluster: &Cluster, app: &str) -> tokio_postgres::Config {
    let mut c: tokio_postgres::Config = cluster.url().parse().unwrap();
    c.application_name(app);
    c
}

async fn backend_pid(raw: &tokio_postgres::Client, app: &str) -> u32 {
    let pid: i32 = raw
        .query_one(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .unwrap()
        .get(0);
    u32::try_from(pid).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_leases_and_jobs_and_lost_replies_are_unknown() {
    let Some(mut cluster) = Cluster::init("restart") else {
        return;
    };
    cluster.start().await;
    let schema = SchemaName::new("durability").unwrap();
    let count = ShardCount::default();
    let leases = PostgresLeaseStore::new(config(&cluster, "t-leases"), 1, schema.clone(), count)
        .unwrap()
        .with_timeout(DEADLINE);
    leases.setup().await.unwrap();
    let index = PostgresAlarmIndex::new(config(&cluster, "t-alarms"), 1, schema, IndexTime::Server)
        .unwrap()
        .with_timeout(DEADLINE);
    index.setup().await.unwrap();

    let (lifecycle, storage) = active(&leases, "shop").await;
    let scopes = class_scopes(&storage, "Cart");
    let task = TaskId::new("host-a").unwrap();
    let records: Vec<_> = leases
        .claim_many(&scopes, Claimant::new(&lifecycle, &task, 60_000))
        .await
        .into_iter()
        .map(|c| match c.unwrap() {
            ClaimOutcome::Claimed(l) => l.record,
            ClaimOutcome::Held(_) => panic!("fresh scope held"),
        })
        .collect();
    index
        .upsert(&obj("st-shop:Cart:a"), &tok("ta"), 1)
        .await
        .unwrap();
    index
        .upsert(&obj("st-shop:Cart:b"), &tok("tb"), 4_000_000_000_000)
        .await
        .unwrap();
    assert_eq!(index.promote(0, 10).await.unwrap(), 1);
    let claim = claim_on_server_time(&index, 300_000, "r1")
        .await
        .expect("a is ready");

    // Lost replies: both stores' backends paused past the call deadline.
    let (raw, conn) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let paused = [
        backend_pid(&raw, "t-leases").await,
        backend_pid(&raw, "t-alarms").await,
    ];
    for pid in paused {
        signal(pid, "STOP");
    }
    let (c, tc) = (obj("st-shop:Cart:c"), tok("tc"));
    let (renewed, upserted) = tokio::join!(
        leases.renew_many(&records, 60_000),
        index.upsert(&c, &tc, 1),
    );
    for pid in paused {
        signal(pid, "CONT");
    }
    for r in &renewed {
        let e = r.as_ref().expect_err("no reply");
        assert_eq!(e.code(), "owner_unavailable", "{e}");
        assert_eq!(e.outcome(), DispatchOutcome::Unknown);
    }
    let e = upserted.expect_err("no reply");
    assert_eq!(e.code(), "do_alarm_result_unknown", "{e}");
    // It was unknown, not failed: the paused backend ran the upsert when it resumed.
    // Up to 30 s of attempts, 20 ms apart.
    let mut landed = false;
    for _ in 0..1_500 {
        if index.job(&obj("st-shop:Cart:c")).await.unwrap().is_some() {
            landed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(landed, "the upsert reported unknown never landed");
    eprintln!(
        "tried: 16 renewals and 1 upsert with their backends paused: unknown, and the upsert landed"
    );

    cluster.crash();
    let other =
        OwnerScope::new(storage.clone(), ClassName::new("Room").unwrap(), 0, count).unwrap();
    let e = leases
        .claim(&other, &lifecycle, &task, 60_000)
        .await
        .expect_err("server down");
    assert!(
        matches!(e.code(), "owner_store_unavailable" | "owner_unavailable"),
        "never a definite refusal: {e}"
    );
    let e = index
        .upsert(&obj("st-shop:Cart:d"), &tok("td"), 1)
        .await
        .expect_err("server down");
    assert!(
        matches!(
            e.code(),
            "do_alarm_backend_unavailable" | "do_alarm_result_unknown"
        ),
        "never a definite rejection: {e}"
    );

    cluster.start().await;
    for (s, r) in scopes.iter().zip(&records) {
        let snap = leases.snapshot(s, &lifecycle).await.unwrap();
        assert_eq!(
            snap.owner.map(|l| l.record).as_ref(),
            Some(r),
            "{s}: lease survived"
        );
        assert_eq!(snap.generation, 1, "{s}");
    }
    assert!(
        leases
            .renew_many(&records, 60_000)
            .await
            .iter()
            .all(Result::is_ok)
    );
    let a = index
        .job(&obj("st-shop:Cart:a"))
        .await
        .unwrap()
        .expect("claimed job survived");
    assert_eq!((a.state, a.tries), (JobState::Running, 1));
    assert!(
        index.finish(&claim.object, &claim.run).await.unwrap(),
        "its run still settles it"
    );
    assert_eq!(
        index
            .job(&obj("st-shop:Cart:b"))
            .await
            .unwrap()
            .map(|j| j.state),
        Some(JobState::Due)
    );
    // Generations go on from where they were.
    raw_expire(&cluster, &scopes[0]).await;
    match leases
        .claim(
            &scopes[0],
            &lifecycle,
            &TaskId::new("host-b").unwrap(),
            60_000,
        )
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed(l) => assert_eq!(l.record.generation().get(), 2),
        ClaimOutcome::Held(_) => panic!("an expired lease is claimable"),
    }
}

async fn raw_expire(cluster: &Cluster, scope: &OwnerScope) {
    let (raw, conn) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    raw.execute(
        "UPDATE durability.durability_owner_leases SET expires_at_ms = 0 WHERE scope = $1",
        &[&scope.host_id()],
    )
    .await
    .unwrap();
}
