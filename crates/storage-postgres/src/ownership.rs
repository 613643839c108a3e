//! PostgreSQL owner lease store (feature `ownership`).
//!
//! [`PostgresLeaseStore`] implements [`LeaseStore`] and [`LifecycleAdmin`]
//! with three tables in a schema the caller chooses ([`SchemaName`]):
//!
//! | table | row | meaning |
//! |---|---|---|
//! | `durability_owner_leases` | `scope`, `record`, `expires_at_ms` | owner record (exact bytes) and its lease end on the server's clock |
//! | `durability_owner_generations` | `scope`, `generation` | monotonic generation counter, never lowered or deleted |
//! | `durability_owner_lifecycle` | `lifecycle`, `active_storage`, `delete_lock` | active storage pointer and `whole`/`version` delete lock |
//! | `durability_storage_shard_count` | `storage_id`, `shard_count` | the storage id's shard count, written once by its first claim (or `record_shard_count`) |
//!
//! Create them once with [`PostgresLeaseStore::setup`] (the SQL is
//! [`PostgresLeaseStore::setup_sql`], for operators who run it themselves).
//!
//! Every operation is one statement, so one round trip: claim, renew and
//! raising the generation floor call PL/pgSQL functions of the schema
//! (`durability_owner_claim`, `durability_owner_renew`,
//! `durability_owner_raise_floor`); release, snapshot and the lifecycle
//! writes are plain statements. [`PostgresLeaseStore::claim_many`] claims a
//! whole class (every shard of it after a failover) in one call, as
//! [`LeaseStore::renew_many`] renews them. Lease time is the database
//! server's clock (`clock_timestamp()`), never the host's; the lease left is
//! reported from it. After a failover the promoted standby's clock decides,
//! so keep the servers' clocks synchronized: a clock that jumps forward ends
//! leases early (a new claim at a higher generation, never two owners at
//! one), one that jumps back makes them last longer.
//!
//! Atomicity: a claim takes a transaction-scoped advisory lock per scope
//! (in scope order) and locks the lifecycle row `FOR SHARE` and the owner
//! row `FOR UPDATE`, so concurrent claims of a scope from any number of
//! hosts hand out one generation to one task, and a lifecycle change waits
//! for the claims and renewals that read it. Renew compares the exact owner
//! record bytes, the storage pointer and the delete lock, then refreshes.
//!
//! Outcomes: a server refusal or a connection that could not be had is
//! [`OwnershipError::StoreUnavailable`] (nothing was applied); a connection
//! lost, or the call deadline ([`DEFAULT_CALL_TIMEOUT`](crate::DEFAULT_CALL_TIMEOUT), see
//! [`PostgresLeaseStore::with_timeout`]) passed, after a write was sent is
//! [`OwnershipError::OwnerUnavailable`]: the write may have landed.
//!
//! Generations survive what the database survives: with the synchronous
//! commit PostgreSQL has by default, a claim that returned is on disk, so a
//! server restart keeps every counter. A database restored from an older
//! backup can lose counters; open objects through
//! `durability_ownership::fence_with_floor` then (this store implements
//! [`LeaseStore::raise_generation_floor`]).

mod sql;

use std::time::Duration;

use durability_ownership::{
    BoxError, ClaimOutcome, Claimant, DeleteLock, Generation, Lease, LeaseStore, LifecycleAdmin,
    LifecycleId, OwnerRecord, OwnerScope, OwnerSnapshot, OwnershipError, Presence, PresenceEntry,
    PresenceGroup, RecordTemplate, ShardCount, StorageId, TaskId, check_lifecycle,
    check_shard_count, stored_shard_count, ttl_refusals,
};
use tokio_postgres::Config;
use tokio_postgres::types::ToSql;

use crate::store_client::{
    Access, DEFAULT_STORE_POOL_SIZE, Failure, SchemaName, StoreClient, target,
};

fn failure(f: Failure) -> OwnershipError {
    match f {
        Failure::NotApplied(source) | Failure::Rejected(source) => {
            OwnershipError::StoreUnavailable { source }
        }
        Failure::Unknown(source) => OwnershipError::OwnerUnavailable { source },
    }
}

/// The same failure, once per record of a batch.
fn each_failure(f: Failure, n: usize) -> Vec<OwnershipError> {
    let (unknown, text) = match &f {
        Failure::NotApplied(e) | Failure::Rejected(e) => (false, e.to_string()),
        Failure::Unknown(e) => (true, e.to_string()),
    };
    let mut first = Some(failure(f));
    (0..n)
        .map(|_| {
            first.take().unwrap_or_else(|| {
                let source = BoxError::from(text.clone());
                if unknown {
                    OwnershipError::OwnerUnavailable { source }
                } else {
                    OwnershipError::StoreUnavailable { source }
                }
            })
        })
        .collect()
}

fn protocol(reason: &str) -> OwnershipError {
    OwnershipError::OwnerUnavailable {
        source: BoxError::from(format!("unexpected lease store reply: {reason}")),
    }
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn bad_counter(scope: &OwnerScope) -> OwnershipError {
    OwnershipError::InvalidLifecycleState {
        lifecycle: scope.to_string(),
        reason: "generation counter is not a positive safe integer below 2^53-1".to_owned(),
    }
}

/// An owner lease store on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PostgresLeaseStore {
    client: StoreClient,
    schema: SchemaName,
    count: ShardCount,
    sql: std::sync::Arc<sql::Statements>,
}

impl PostgresLeaseStore {
    /// Runs one statement; a failure is classified as the store's calls are.
    async fn run(
        &self,
        access: Access,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, OwnershipError> {
        self.client
            .query(access, sql, params)
            .await
            .map_err(failure)
    }

    /// Runs one statement that answers with one row; no row is a protocol
    /// error, `missing`.
    async fn run_one(
        &self,
        access: Access,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        missing: &'static str,
    ) -> Result<tokio_postgres::Row, OwnershipError> {
        let rows = self.run(access, sql, params).await?;
        rows.into_iter().next().ok_or_else(|| protocol(missing))
    }

    /// Runs a write answering for `n` items in one statement, one row per
    /// item with its 1-based ordinal in column 0, and decodes each row with
    /// `decode(i, row)`: an item without a row fails with `missing` (a
    /// protocol error); a failed statement fails every item.
    async fn per_item<T>(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        n: usize,
        missing: &'static str,
        mut decode: impl FnMut(usize, &tokio_postgres::Row) -> Result<T, OwnershipError>,
    ) -> Vec<Result<T, OwnershipError>> {
        let rows = match self.client.query(Access::Write, sql, params).await {
            Ok(rows) => rows,
            Err(f) => return each_failure(f, n).into_iter().map(Err).collect(),
        };
        let mut out: Vec<Result<T, OwnershipError>> =
            (0..n).map(|_| Err(protocol(missing))).collect();
        for row in &rows {
            if let Some(i) = ordinal(row, n) {
                out[i] = decode(i, row);
            }
        }
        out
    }

    /// A store on a pool of at most `pool_size` connections made from
    /// `config`, with its tables in `schema`. Connects lazily; call
    /// [`PostgresLeaseStore::setup`] once per schema.
    ///
    /// # Errors
    /// [`OwnershipError::StoreUnavailable`] for a pool that cannot be built.
    pub fn new(
        config: Config,
        pool_size: usize,
        schema: SchemaName,
        count: ShardCount,
    ) -> Result<Self, OwnershipError> {
        let client = StoreClient::new(config, pool_size, "lease store")
            .map_err(|source| OwnershipError::StoreUnavailable { source })?;
        Ok(Self {
            client,
            sql: std::sync::Arc::new(sql::Statements::new(&schema)),
            schema,
            count,
        })
    }

    /// A store at `url` (a `postgres://` URL) with its tables in `schema`
    /// (validated: see [`SchemaName`]) and [`DEFAULT_STORE_POOL_SIZE`]
    /// connections. Nothing is sent until the first call.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidInput`] for a schema name outside the
    /// grammar or a malformed URL.
    pub fn connect(url: &str, schema: &str, count: ShardCount) -> Result<Self, OwnershipError> {
        let (config, schema) =
            target(url, schema).map_err(|reason| OwnershipError::InvalidInput {
                what: "postgres store",
                reason,
            })?;
        Self::new(config, DEFAULT_STORE_POOL_SIZE, schema, count)
    }

    /// This store with a deadline of `timeout` per call (default
    /// [`DEFAULT_CALL_TIMEOUT`](crate::DEFAULT_CALL_TIMEOUT)): a write without a reply by then is
    /// [`OwnershipError::OwnerUnavailable`] and its connection is closed.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.client.set_timeout(timeout);
        self
    }

    /// The call deadline.
    pub fn timeout(&self) -> Duration {
        self.client.timeout()
    }

    /// The schema holding this store's tables.
    pub fn schema(&self) -> &SchemaName {
        &self.schema
    }

    /// The SQL [`PostgresLeaseStore::setup`] runs for `schema`: one
    /// transaction creating the schema, the three tables (if missing) and
    /// the three functions (replaced).
    pub fn setup_sql(schema: &SchemaName) -> String {
        sql::setup(schema)
    }

    /// Creates this store's schema, tables and functions (idempotent;
    /// concurrent setups of one schema wait for each other).
    ///
    /// # Errors
    /// [`OwnershipError::StoreUnavailable`] when the server refuses or
    /// cannot be reached; [`OwnershipError::OwnerUnavailable`] when the
    /// connection was lost midway (run it again).
    pub async fn setup(&self) -> Result<(), OwnershipError> {
        self.client
            .batch(&Self::setup_sql(&self.schema))
            .await
            .map_err(failure)
    }

    /// Claims every scope of `scopes` for `task` (advertising `endpoint`)
    /// under `lifecycle`, as [`LeaseStore::claim_as`] claims one, in one
    /// statement: one round trip for a whole class. One result per scope,
    /// in order; each is what `claim_as` alone would answer, and a scope
    /// refused (lifecycle, a live holder, an invalid stored record or
    /// counter) writes nothing for that scope and never fails another. A
    /// scope named twice is claimed once and held by that claim the second
    /// time.
    ///
    /// A store failure is reported for every scope.
    pub async fn claim_many(
        &self,
        scopes: &[OwnerScope],
        claimant: Claimant<'_>,
    ) -> Vec<Result<ClaimOutcome, OwnershipError>> {
        if let Some(refused) = ttl_refusals(scopes.len(), claimant.ttl_ms) {
            return refused;
        }
        if scopes.is_empty() {
            return Vec::new();
        }
        let templates: Vec<RecordTemplate> = scopes
            .iter()
            .map(|s| RecordTemplate::new(s, claimant.lifecycle, claimant.task, claimant.endpoint))
            .collect();
        let suffix = templates[0].suffix.as_str();
        let names: Vec<&str> = scopes.iter().map(OwnerScope::host_id).collect();
        let storages: Vec<&str> = scopes.iter().map(|s| s.storage_id().as_str()).collect();
        let prefixes: Vec<&str> = templates.iter().map(|t| t.prefix.as_str()).collect();
        let counts: Vec<i32> = scopes.iter().map(count_of).collect();
        let ttl = i64_of(claimant.ttl_ms);
        let params: [&(dyn ToSql + Sync); 7] = [
            &names,
            &storages,
            &claimant.lifecycle.as_str(),
            &prefixes,
            &suffix,
            &ttl,
            &counts,
        ];
        let missing = "claim reply without this scope";
        self.per_item(&self.sql.claim, &params, scopes.len(), missing, |i, row| {
            self.claim_reply(row, &scopes[i], claimant, templates[i].clone())
        })
        .await
    }

    /// One scope's claim reply.
    fn claim_reply(
        &self,
        row: &tokio_postgres::Row,
        scope: &OwnerScope,
        claim: Claimant<'_>,
        template: RecordTemplate,
    ) -> Result<ClaimOutcome, OwnershipError> {
        let outcome: String = row.try_get(1).map_err(|_| protocol("claim outcome"))?;
        let record: Option<Vec<u8>> = row.try_get(2).map_err(|_| protocol("claim record"))?;
        let number: Option<i64> = row.try_get(3).map_err(|_| protocol("claim number"))?;
        match outcome.as_str() {
            "claimed" => {
                let generation = number
                    .and_then(|n| u64::try_from(n).ok())
                    .ok_or_else(|| protocol("claim without a generation"))?;
                let record = template.record(
                    scope.clone(),
                    claim.lifecycle.clone(),
                    claim.task.clone(),
                    claim.endpoint.cloned(),
                    Generation::new(generation)?,
                );
                Ok(ClaimOutcome::Claimed(Lease {
                    record,
                    remaining_ms: claim.ttl_ms,
                }))
            }
            "held" => {
                let raw = record.ok_or_else(|| protocol("held without a record"))?;
                let record = OwnerRecord::decode(&raw, scope, self.count)?;
                let left = number.and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
                Ok(ClaimOutcome::Held(Lease {
                    record,
                    remaining_ms: left,
                }))
            }
            "lifecycle" => Err(lifecycle_error(scope, claim.lifecycle, row, 4)),
            "shards" => Err(shards_error(scope, number)),
            "badgen" => Err(bad_counter(scope)),
            _ => Err(protocol("unknown claim outcome")),
        }
    }

    /// Renews up to every record in one statement (the one implementation
    /// behind `renew` and `renew_many`).
    async fn renew_batch(
        &self,
        records: &[OwnerRecord],
        ttl_ms: u64,
    ) -> Vec<Result<Lease, OwnershipError>> {
        let scopes: Vec<&str> = records.iter().map(|r| r.scope().host_id()).collect();
        let bytes: Vec<&[u8]> = records.iter().map(|r| r.encoded().as_bytes()).collect();
        let lifecycles: Vec<&str> = records.iter().map(|r| r.lifecycle().as_str()).collect();
        let storages: Vec<&str> = records
            .iter()
            .map(|r| r.scope().storage_id().as_str())
            .collect();
        let counts: Vec<i32> = records.iter().map(|r| count_of(r.scope())).collect();
        let ttl = i64_of(ttl_ms);
        let params: [&(dyn ToSql + Sync); 6] =
            [&scopes, &bytes, &lifecycles, &storages, &ttl, &counts];
        let missing = "renew reply without this record";
        self.per_item(
            &self.sql.renew,
            &params,
            records.len(),
            missing,
            |i, row| {
                let record = &records[i];
                let outcome: Option<String> = row.try_get(1).ok();
                match outcome.as_deref() {
                    Some("renewed") => Ok(Lease {
                        record: record.clone(),
                        remaining_ms: ttl_ms,
                    }),
                    Some("stale") => Err(OwnershipError::StaleOwner {
                        scope: record.scope().to_string(),
                    }),
                    Some("lifecycle") => {
                        Err(lifecycle_error(record.scope(), record.lifecycle(), row, 2))
                    }
                    Some("shards") => {
                        let recorded: Option<i32> = row.try_get(4).ok().flatten();
                        Err(shards_error(record.scope(), recorded.map(i64::from)))
                    }
                    _ => Err(protocol("unknown renew outcome")),
                }
            },
        )
        .await
    }
}

/// A scope's shard count as the functions take it.
fn count_of(scope: &OwnerScope) -> i32 {
    // A count is at most 1024.
    i32::try_from(scope.shard_count().get()).unwrap_or(i32::MAX)
}

/// The refusal of a `shards` outcome: the recorded count differs from the
/// scope's (or is not a valid count).
fn shards_error(scope: &OwnerScope, recorded: Option<i64>) -> OwnershipError {
    match stored_shard_count(recorded, scope.storage_id()).and_then(|c| check_shard_count(scope, c))
    {
        Err(e) => e,
        // The function saw a count the check accepts: a race.
        Ok(()) => OwnershipError::OwnerRace {
            scope: scope.to_string(),
        },
    }
}

/// The 0-based position a function row answers for (its 1-based `o_ord`).
fn ordinal(row: &tokio_postgres::Row, len: usize) -> Option<usize> {
    let ord: i32 = row.try_get(0).ok()?;
    usize::try_from(ord)
        .ok()
        .and_then(|o| o.checked_sub(1))
        .filter(|i| *i < len)
}

/// The lifecycle refusal a function reported, from the pointer and lock it
/// read (columns `at` and `at + 1`), decoded strictly.
fn lifecycle_error(
    scope: &OwnerScope,
    lifecycle: &LifecycleId,
    row: &tokio_postgres::Row,
    at: usize,
) -> OwnershipError {
    let active: Option<String> = row.try_get(at).ok().flatten();
    let lock: Option<String> = row.try_get(at + 1).ok().flatten();
    match decode_lifecycle(lifecycle, active, lock) {
        Err(e) => e,
        Ok((active, lock)) => {
            match check_lifecycle(scope.storage_id(), lifecycle, active.as_ref(), lock) {
                Err(e) => e,
                // The function saw a refusal the check does not: a race.
                Ok(()) => OwnershipError::OwnerRace {
                    scope: scope.to_string(),
                },
            }
        }
    }
}

fn decode_lifecycle(
    lifecycle: &LifecycleId,
    active: Option<String>,
    lock: Option<String>,
) -> Result<(Option<StorageId>, Option<DeleteLock>), OwnershipError> {
    let active = active
        .map(|s| {
            StorageId::new(&s).map_err(|e| OwnershipError::InvalidLifecycleState {
                lifecycle: lifecycle.as_str().to_owned(),
                reason: format!("active storage pointer: {e}"),
            })
        })
        .transpose()?;
    let lock = lock
        .map(|l| DeleteLock::parse(l.as_bytes(), lifecycle))
        .transpose()?;
    Ok((active, lock))
}

impl LeaseStore for PostgresLeaseStore {
    /// A [`PostgresLeaseStore::claim_many`] of one scope.
    async fn claim_as(
        &self,
        scope: &OwnerScope,
        claimant: Claimant<'_>,
    ) -> Result<ClaimOutcome, OwnershipError> {
        self.claim_many(std::slice::from_ref(scope), claimant)
            .await
            .pop()
            .unwrap_or_else(|| Err(protocol("claim answered no result")))
    }

    /// A [`LeaseStore::renew_many`] of one record: the same statement and checks.
    async fn renew(&self, record: &OwnerRecord, ttl_ms: u64) -> Result<Lease, OwnershipError> {
        self.renew_many(std::slice::from_ref(record), ttl_ms)
            .await
            .pop()
            .unwrap_or_else(|| Err(protocol("renew answered no result")))
    }

    /// Renews the whole batch in one statement (one round trip), each record
    /// with every check of [`LeaseStore::renew`], in one transaction.
    async fn renew_many(
        &self,
        records: &[OwnerRecord],
        ttl_ms: u64,
    ) -> Vec<Result<Lease, OwnershipError>> {
        if let Some(refused) = ttl_refusals(records.len(), ttl_ms) {
            return refused;
        }
        if records.is_empty() {
            return Vec::new();
        }
        self.renew_batch(records, ttl_ms).await
    }

    /// One statement for the whole batch ([`PostgresLeaseStore::claim_many`]).
    async fn claim_many(
        &self,
        scopes: &[OwnerScope],
        claimant: Claimant<'_>,
    ) -> Vec<Result<ClaimOutcome, OwnershipError>> {
        PostgresLeaseStore::claim_many(self, scopes, claimant).await
    }

    async fn write_presence(&self, presence: Presence<'_>) -> Result<(), OwnershipError> {
        let (key, ttl) = (presence.group().key(), i64_of(presence.ttl_ms()));
        let (task, value) = (presence.task().as_str(), presence.value());
        let params: [&(dyn ToSql + Sync); 4] = [&key, &task, &value, &ttl];
        self.run(Access::Write, &self.sql.announce, &params).await?;
        Ok(())
    }

    async fn withdraw(&self, group: &PresenceGroup, task: &TaskId) -> Result<bool, OwnershipError> {
        let key = group.key();
        let params: [&(dyn ToSql + Sync); 2] = [&key, &task.as_str()];
        let rows = self.run(Access::Write, &self.sql.withdraw, &params).await?;
        Ok(rows.len() == 1)
    }

    async fn live_tasks(
        &self,
        group: &PresenceGroup,
    ) -> Result<Vec<PresenceEntry>, OwnershipError> {
        let key = group.key();
        let params: [&(dyn ToSql + Sync); 1] = [&key];
        let rows = self.run(Access::Read, &self.sql.live, &params).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let task: String = row.try_get(0).map_err(|_| protocol("presence task"))?;
            let value: Vec<u8> = row.try_get(1).map_err(|_| protocol("presence value"))?;
            let left: i64 = row.try_get(2).map_err(|_| protocol("presence lease"))?;
            out.extend(PresenceEntry::stored(
                &task,
                value,
                u64::try_from(left).unwrap_or(0),
            ));
        }
        Ok(out)
    }

    async fn release(&self, record: &OwnerRecord) -> Result<bool, OwnershipError> {
        let bytes = record.encoded().as_bytes();
        let params: [&(dyn ToSql + Sync); 2] = [&record.scope().host_id(), &bytes];
        let rows = self.run(Access::Write, &self.sql.release, &params).await?;
        Ok(rows.len() == 1)
    }

    async fn snapshot(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<OwnerSnapshot, OwnershipError> {
        let params: [&(dyn ToSql + Sync); 3] = [
            &scope.host_id(),
            &lifecycle.as_str(),
            &scope.storage_id().as_str(),
        ];
        let missing = "snapshot without a row";
        let row = self
            .run_one(Access::Read, &self.sql.snapshot, &params, missing)
            .await?;
        self.decode_snapshot(scope, lifecycle, &row)
    }

    async fn raise_generation_floor(
        &self,
        scope: &OwnerScope,
        floor: Generation,
    ) -> Result<u64, OwnershipError> {
        let floor_value = i64_of(floor.get());
        let params: [&(dyn ToSql + Sync); 2] = [&scope.host_id(), &floor_value];
        let missing = "floor without a row";
        let row = self
            .run_one(Access::Write, &self.sql.raise_floor, &params, missing)
            .await?;
        let outcome: String = row.try_get(0).map_err(|_| protocol("floor outcome"))?;
        let generation: Option<i64> = row.try_get(1).map_err(|_| protocol("floor value"))?;
        match outcome.as_str() {
            "raised" | "kept" => generation
                .and_then(|g| u64::try_from(g).ok())
                .ok_or_else(|| protocol("floor without a generation")),
            "badgen" => Err(bad_counter(scope)),
            _ => Err(protocol("unknown floor outcome")),
        }
    }

    async fn record_shard_count(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<(), OwnershipError> {
        let count = count_of(scope);
        let params: [&(dyn ToSql + Sync); 3] =
            [&lifecycle.as_str(), &scope.storage_id().as_str(), &count];
        let missing = "shard count check without a row";
        let row = self
            .run_one(Access::Write, &self.sql.record_count, &params, missing)
            .await?;
        let outcome: String = row.try_get(0).map_err(|_| protocol("count outcome"))?;
        match outcome.as_str() {
            "ok" => Ok(()),
            "lifecycle" => Err(lifecycle_error(scope, lifecycle, &row, 1)),
            "shards" => {
                let recorded: Option<i32> = row.try_get(3).ok().flatten();
                Err(shards_error(scope, recorded.map(i64::from)))
            }
            _ => Err(protocol("unknown shard count outcome")),
        }
    }
}

impl PostgresLeaseStore {
    fn decode_snapshot(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
        row: &tokio_postgres::Row,
    ) -> Result<OwnerSnapshot, OwnershipError> {
        let cell = |what: &str| protocol(&format!("snapshot column {what}"));
        let now: i64 = row.try_get(0).map_err(|_| cell("now"))?;
        let record: Option<Vec<u8>> = row.try_get(1).map_err(|_| cell("record"))?;
        let expires: Option<i64> = row.try_get(2).map_err(|_| cell("expiry"))?;
        let counter: Option<i64> = row.try_get(3).map_err(|_| cell("generation"))?;
        let active: Option<String> = row.try_get(4).map_err(|_| cell("pointer"))?;
        let lock: Option<String> = row.try_get(5).map_err(|_| cell("lock"))?;
        let count: Option<i32> = row.try_get(6).map_err(|_| cell("shard count"))?;
        let owner = match record.zip(expires) {
            Some((raw, exp)) if exp > now => Some(Lease {
                record: OwnerRecord::decode(&raw, scope, self.count)?,
                remaining_ms: u64::try_from(exp - now).unwrap_or(0),
            }),
            _ => None,
        };
        let generation = match counter {
            None => 0,
            Some(g) => u64::try_from(g)
                .ok()
                .filter(|g| Generation::new(*g).is_ok())
                .ok_or_else(|| bad_counter(scope))?,
        };
        if let Some(o) = &owner
            && o.record.generation().get() > generation
        {
            return Err(OwnershipError::InvalidLifecycleState {
                lifecycle: lifecycle.as_str().to_owned(),
                reason: "owner generation is ahead of the generation counter".to_owned(),
            });
        }
        let (active_storage, delete_lock) = decode_lifecycle(lifecycle, active, lock)?;
        let shard_count = stored_shard_count(count.map(i64::from), scope.storage_id())?;
        Ok(OwnerSnapshot {
            store_now_ms: u64::try_from(now).unwrap_or(0),
            owner,
            generation,
            active_storage,
            delete_lock,
            shard_count,
        })
    }
}

impl PostgresLeaseStore {
    /// Lists the live owner leases, a page of at most `limit` at a time in
    /// scope order (byte order), with the lease left on the server's clock.
    /// Start with `cursor: None` and pass back the page's cursor until it
    /// is `None`. Each record is decoded strictly; an invalid one is listed
    /// with its problem. Read-only.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidInput`] for a `limit` of 0;
    /// [`OwnershipError::StoreUnavailable`] when the server fails.
    pub async fn list_leases(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<durability_ownership::listing::LeaseListing, OwnershipError> {
        use durability_ownership::listing::{LeaseListing, LeaseReport, validate_list_limit};
        validate_list_limit(limit)?;
        let limit_value = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .run(Access::Read, &self.sql.list, &[&cursor, &limit_value])
            .await?;
        let mut leases = Vec::with_capacity(rows.len());
        for row in &rows {
            let scope: String = row.try_get(0).map_err(|_| protocol("listed scope"))?;
            let raw: Vec<u8> = row.try_get(1).map_err(|_| protocol("listed record"))?;
            let left: i64 = row.try_get(2).map_err(|_| protocol("listed lease"))?;
            let left = u64::try_from(left).unwrap_or(0);
            leases.push(LeaseReport::from_stored(&scope, &raw, left, self.count));
        }
        let cursor = (rows.len() == limit)
            .then(|| leases.last().map(|l| l.scope.clone()))
            .flatten();
        Ok(LeaseListing { leases, cursor })
    }
}

impl LifecycleAdmin for PostgresLeaseStore {
    async fn set_active_storage(
        &self,
        lifecycle: &LifecycleId,
        storage: Option<&StorageId>,
    ) -> Result<(), OwnershipError> {
        let storage = storage.map(StorageId::as_str);
        let params: [&(dyn ToSql + Sync); 2] = [&lifecycle.as_str(), &storage];
        self.run(Access::Write, &self.sql.set_active, &params)
            .await?;
        Ok(())
    }

    async fn set_delete_lock(
        &self,
        lifecycle: &LifecycleId,
        lock: Option<DeleteLock>,
    ) -> Result<(), OwnershipError> {
        let lock = lock.map(DeleteLock::as_str);
        let params: [&(dyn ToSql + Sync); 2] = [&lifecycle.as_str(), &lock];
        self.run(Access::Write, &self.sql.set_lock, &params).await?;
        Ok(())
    }
}
