//! PostgreSQL lease figures for `cargo xtask bench ownership`, next to the
//! Redis ones: claiming a whole class (16 scopes) with one `claim_many`
//! statement against claiming it scope by scope, renewing the class with
//! one `renew_many` against one renew per scope, and one `renew` against a
//! bare compare-and-extend `UPDATE` on the same server (the least a renew
//! by exact record bytes on server time costs). Medians, in a schema of the
//! bench's own, dropped after.

use std::time::Duration;

use durability_ownership::{
    ClaimOutcome, Claimant, ClassName, LeaseStore, LifecycleAdmin, LifecycleId, OwnerRecord,
    OwnerScope, ShardCount, StorageId, TaskId,
};
use durability_storage_postgres::ownership::PostgresLeaseStore;
use serde_json::json;

use crate::Result;
use crate::ownership::{median_us, start};

const ROUNDS: u64 = 200;
const TTL_MS: u64 = 60_000;

/// The figures; the bench schema is dropped whatever happened.
///
/// # Errors
/// PostgreSQL failures, or a claim or renew that did not succeed.
pub(crate) async fn bench(url: &str) -> Result {
    let schema = format!("durability_bench_{}", std::process::id());
    let (raw, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let out = figures(url, &schema, &raw).await;
    raw.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await?;
    out
}

fn class(
    storage: &StorageId,
    name: &str,
) -> std::result::Result<Vec<OwnerScope>, Box<dyn std::error::Error>> {
    (0..16)
        .map(|n| {
            Ok(OwnerScope::new(
                storage.clone(),
                ClassName::new(name)?,
                n,
                ShardCount::default(),
            )?)
        })
        .collect()
}

fn claimed(outcome: ClaimOutcome) -> std::result::Result<OwnerRecord, Box<dyn std::error::Error>> {
    match outcome {
        ClaimOutcome::Claimed(l) => Ok(l.record),
        ClaimOutcome::Held(_) => Err("a fresh bench scope was held".into()),
    }
}

async fn figures(url: &str, schema: &str, raw: &tokio_postgres::Client) -> Result {
    let store = PostgresLeaseStore::connect(url, schema, ShardCount::default())?;
    store.setup().await?;
    let lifecycle = LifecycleId::new("bench:pg")?;
    let storage = StorageId::new("st-pg")?;
    store.set_active_storage(&lifecycle, Some(&storage)).await?;
    let task = TaskId::new("bench-pg")?;
    let (mut batched, mut single) = (Vec::new(), Vec::new());
    let mut last = Vec::new();
    for round in 0..ROUNDS {
        let a = class(&storage, &format!("A{round}"))?;
        let t = start();
        let claims = store
            .claim_many(&a, Claimant::new(&lifecycle, &task, TTL_MS))
            .await;
        batched.push(t.elapsed());
        last = claims
            .into_iter()
            .map(|c| claimed(c?))
            .collect::<std::result::Result<_, _>>()?;
        let b = class(&storage, &format!("B{round}"))?;
        let t = start();
        for s in &b {
            claimed(store.claim(s, &lifecycle, &task, TTL_MS).await?)?;
        }
        single.push(t.elapsed());
    }
    // One statement for the class against sixteen.
    report("ownership.pg.claim_class_16", (batched, single), 16, "< 1");
    renew_figures(&store, raw, schema, &last).await
}

async fn renew_figures(
    store: &PostgresLeaseStore,
    raw: &tokio_postgres::Client,
    schema: &str,
    records: &[OwnerRecord],
) -> Result {
    let bare = raw
        .prepare(&format!(
            "UPDATE \"{schema}\".durability_owner_leases
             SET expires_at_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + $3
             WHERE scope = $1 AND record = $2
               AND expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
        ))
        .await?;
    let ttl = i64::try_from(TTL_MS)?;
    let (mut batched, mut single, mut ours, mut base) = (vec![], vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        let t = start();
        let renewed = store.renew_many(records, TTL_MS).await;
        batched.push(t.elapsed());
        let t = start();
        for r in records {
            store.renew(r, TTL_MS).await?;
        }
        single.push(t.elapsed());
        if renewed.iter().any(|r| r.is_err()) {
            return Err("a batched renew failed".into());
        }
        let one = &records[0];
        let t = start();
        store.renew(one, TTL_MS).await?;
        ours.push(t.elapsed());
        let t = start();
        let n = raw
            .execute(
                &bare,
                &[&one.scope().host_id(), &one.encoded().as_bytes(), &ttl],
            )
            .await?;
        base.push(t.elapsed());
        if n != 1 {
            return Err("the bare renew matched no row".into());
        }
    }
    report("ownership.pg.renew_class_16", (batched, single), 16, "< 1");
    // No bound in the issue: reported against the bare statement.
    report("ownership.pg.renew", (ours, base), 1, "reported");
    Ok(())
}

/// One figure: the median of `ours` against the median of `base`, for
/// `scopes` scopes per operation, with the bound `target`.
fn report(name: &str, (ours, base): (Vec<Duration>, Vec<Duration>), scopes: u32, target: &str) {
    let (value, baseline) = (median_us(ours), median_us(base));
    eprintln!("{name}: {value:.1} us vs baseline {baseline:.1} us ({scopes} scopes)");
    crate::bench::figure(
        name,
        value,
        baseline,
        "us/op",
        target,
        ROUNDS,
        json!({ "backend": "postgres", "scopes": scopes }),
    );
}
