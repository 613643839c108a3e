//! SQLite owner lease store and object storage fence.
//!
//! [`SqliteLeaseStore`] implements [`LeaseStore`] and [`LifecycleAdmin`] on a
//! SQLite file shared by every task of a deployment (each task opens its own
//! connection). Every operation is one `BEGIN IMMEDIATE` transaction, so
//! claim, renew and release are atomic across processes. Lease expiry is
//! decided by the store's injected [`Clock`]: with several hosts, give them
//! one time source (the system clock on one machine).
//!
//! The fence functions ([`ensure_fence_schema`], [`record_generation`],
//! [`check_generation`]) close the gap leases alone leave open: a stale owner
//! finishing a commit after losing its lease. They run inside the object
//! database's own transaction: the first dispatch after a claim records the
//! claim (its generation and its holder, the exact owner record bytes), and
//! every transaction checks it, so a commit from an older generation, or
//! from another claim of the same generation (a lease store that lost its
//! counters reissues generations), is refused by the storage itself.
//!
//! The lease store's generation counters must be durable: this store syncs
//! them as the connection's `synchronous` setting says, and
//! [`LeaseStore::raise_generation_floor`] restores them from an object's
//! fence (see `durability_ownership::fence_with_floor`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use durability_ownership::{
    BoxError, ClaimOutcome, Claimant, Clock, DeleteLock, Generation, Lease, LeaseStore,
    LifecycleAdmin, LifecycleId, OwnerRecord, OwnerScope, OwnerSnapshot, OwnershipError, Presence,
    PresenceEntry, PresenceGroup, ShardCount, StorageId, TaskId, check_lifecycle,
    check_shard_count, stored_shard_count, ttl_refusals, validate_ttl,
};
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

const LEASE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS durability_owner_leases (
    scope TEXT PRIMARY KEY NOT NULL,
    record BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS durability_owner_generations (
    scope TEXT PRIMARY KEY NOT NULL,
    generation INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS durability_owner_lifecycle (
    lifecycle TEXT PRIMARY KEY NOT NULL,
    active_storage TEXT,
    delete_lock BLOB
) STRICT;
CREATE TABLE IF NOT EXISTS durability_storage_shard_count (
    storage_id TEXT PRIMARY KEY NOT NULL,
    shard_count INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS durability_presence (
    grp TEXT NOT NULL,
    task TEXT NOT NULL,
    value BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (grp, task)
) STRICT;
";

const FENCE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS durability_owner_fence (
    scope TEXT PRIMARY KEY NOT NULL,
    generation INTEGER NOT NULL CHECK (generation > 0),
    holder BLOB
) STRICT;
";

/// The lease store's pragmas: durable commits (a generation handed out is
/// on disk), WAL, and a 5 s busy timeout between tasks.
const LEASE_CONNECTION: crate::connection::ConnectionOptions =
    crate::connection::ConnectionOptions {
        wal: true,
        synchronous: crate::connection::Synchronous::Full,
        busy_timeout: std::time::Duration::from_secs(5),
    };

/// A rusqlite error that rolled its transaction back: nothing was applied.
fn not_applied(e: rusqlite::Error) -> OwnershipError {
    OwnershipError::StoreUnavailable {
        source: Box::new(e) as BoxError,
    }
}

/// A failed commit: the outcome is unknown.
fn unknown(e: rusqlite::Error) -> OwnershipError {
    OwnershipError::OwnerUnavailable {
        source: Box::new(e) as BoxError,
    }
}

fn begin_error(e: rusqlite::Error, scope: &OwnerScope) -> OwnershipError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => OwnershipError::OwnerRace {
            scope: scope.to_string(),
        },
        _ => not_applied(e),
    }
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// An owner lease store on a SQLite file.
#[derive(Debug)]
pub struct SqliteLeaseStore<C> {
    conn: Mutex<Connection>,
    clock: C,
    count: ShardCount,
    /// Owner records already decoded, by their stored bytes: decoding is a
    /// pure function of the bytes (and the scope, checked on every hit), and
    /// every admission snapshot reads the same record again.
    decoded: Mutex<HashMap<Vec<u8>, OwnerRecord>>,
    /// Snapshots already read, valid while the database is unchanged (see
    /// [`SnapshotCache`]).
    snapshots: Mutex<SnapshotCache>,
}

/// Decoded owner records kept per store (cleared when full).
const DECODED_RECORDS: usize = 4_096;

/// Snapshots kept per store (cleared when full).
const CACHED_SNAPSHOTS: usize = 4_096;

/// The rows of a snapshot, as read (the lease time left is computed from
/// the expiry at every use).
#[derive(Debug, Clone)]
struct SnapshotRows {
    /// A live owner record when read, and its expiry.
    owner: Option<(OwnerRecord, u64)>,
    generation: u64,
    active: Option<StorageId>,
    lock: Option<DeleteLock>,
    count: Option<ShardCount>,
}

/// Snapshot rows by (scope, lifecycle), valid for one database state: the
/// stamp is SQLite's `PRAGMA data_version` (it changes when any other
/// connection, in this process or another, commits to the file) and this
/// connection's `total_changes` (it changes when this store writes). A
/// snapshot whose stamp, read before the snapshot's own rows were, still
/// matches is exactly what reading the rows again would return; any commit
/// since makes every entry stale at once.
#[derive(Debug, Default)]
struct SnapshotCache {
    stamp: Option<(i64, u64)>,
    rows: HashMap<(String, String), SnapshotRows>,
}

struct Lifecycle {
    active: Option<StorageId>,
    lock: Option<DeleteLock>,
}

impl SnapshotRows {
    /// The snapshot these rows give at `now`, as a fresh read would.
    fn snapshot(&self, now: u64) -> OwnerSnapshot {
        OwnerSnapshot {
            store_now_ms: now,
            owner: self
                .owner
                .as_ref()
                .filter(|(_, exp)| *exp > now)
                .map(|(record, exp)| Lease {
                    record: record.clone(),
                    remaining_ms: exp - now,
                }),
            generation: self.generation,
            active_storage: self.active.clone(),
            delete_lock: self.lock,
            shard_count: self.count,
        }
    }
}

impl<C: Clock> SqliteLeaseStore<C> {
    /// Opens (creating if needed) the lease store at `path` in WAL mode with
    /// `synchronous=FULL`: every claim's generation is synced before the
    /// claim returns, so a power loss cannot forget a generation and issue
    /// it again.
    ///
    /// # Errors
    /// [`OwnershipError::StoreUnavailable`] when the file cannot be opened or
    /// the schema created.
    pub fn open(
        path: impl AsRef<Path>,
        clock: C,
        count: ShardCount,
    ) -> Result<Self, OwnershipError> {
        let conn = crate::connection::open_connection(path, &LEASE_CONNECTION).map_err(|e| {
            OwnershipError::StoreUnavailable {
                source: Box::new(e) as BoxError,
            }
        })?;
        Self::from_connection(conn, clock, count)
    }

    /// Uses an open connection, creating the schema if needed.
    ///
    /// # Errors
    /// [`OwnershipError::StoreUnavailable`] when the schema cannot be created.
    pub fn from_connection(
        conn: Connection,
        clock: C,
        count: ShardCount,
    ) -> Result<Self, OwnershipError> {
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(not_applied)?;
        conn.execute_batch(LEASE_SCHEMA).map_err(not_applied)?;
        Ok(Self {
            decoded: Mutex::new(HashMap::new()),
            snapshots: Mutex::new(SnapshotCache::default()),
            conn: Mutex::new(conn),
            clock,
            count,
        })
    }

    /// The store's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Runs `f` on the connection (tests and tools: raw inspection and fault injection).
    pub fn with_connection<T>(&self, f: impl FnOnce(&Connection) -> T) -> T {
        f(&self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lifecycle(conn: &Connection, lifecycle: &LifecycleId) -> Result<Lifecycle, OwnershipError> {
        let row: Option<(Option<String>, Option<Vec<u8>>)> = conn
            .prepare_cached(
                "SELECT active_storage, delete_lock FROM durability_owner_lifecycle WHERE lifecycle = ?1",
            )
            .and_then(|mut st| {
                st.query_row([lifecycle.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(not_applied)?;
        let (active, lock) = row.unwrap_or((None, None));
        Self::decode_lifecycle(lifecycle, active, lock)
    }

    fn decode_lifecycle(
        lifecycle: &LifecycleId,
        active: Option<String>,
        lock: Option<Vec<u8>>,
    ) -> Result<Lifecycle, OwnershipError> {
        let active = match active {
            Some(s) => {
                Some(
                    StorageId::new(&s).map_err(|e| OwnershipError::InvalidLifecycleState {
                        lifecycle: lifecycle.as_str().to_owned(),
                        reason: e.to_string(),
                    })?,
                )
            }
            None => None,
        };
        let lock = lock
            .map(|raw| DeleteLock::parse(&raw, lifecycle))
            .transpose()?;
        Ok(Lifecycle { active, lock })
    }

    /// The shard count recorded for `storage`.
    fn recorded_count(
        conn: &Connection,
        storage: &StorageId,
    ) -> Result<Option<ShardCount>, OwnershipError> {
        let n: Option<i64> = conn
            .prepare_cached(
                "SELECT shard_count FROM durability_storage_shard_count WHERE storage_id = ?1",
            )
            .and_then(|mut st| st.query_row([storage.as_str()], |r| r.get(0)).optional())
            .map_err(not_applied)?;
        stored_shard_count(n, storage)
    }

    /// The lifecycle and shard count checks of a claim of `scope` inside
    /// `tx`. Returns whether the storage id has no count recorded yet.
    fn check_claim(
        tx: &Connection,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<bool, OwnershipError> {
        let lc = Self::lifecycle(tx, lifecycle)?;
        check_lifecycle(scope.storage_id(), lifecycle, lc.active.as_ref(), lc.lock)?;
        let recorded = Self::recorded_count(tx, scope.storage_id())?;
        check_shard_count(scope, recorded)?;
        Ok(recorded.is_none())
    }

    /// Records `scope`'s shard count for its storage id inside `tx` (once:
    /// [`Self::check_claim`] said none is recorded).
    fn record_count(tx: &Connection, scope: &OwnerScope) -> Result<(), OwnershipError> {
        tx.prepare_cached(
            "INSERT INTO durability_storage_shard_count (storage_id, shard_count) VALUES (?1, ?2)",
        )
        .and_then(|mut st| {
            st.execute(params![
                scope.storage_id().as_str(),
                scope.shard_count().get()
            ])
        })
        .map_err(not_applied)?;
        Ok(())
    }

    fn owner(
        &self,
        conn: &Connection,
        scope: &OwnerScope,
        now: u64,
    ) -> Result<Option<Lease>, OwnershipError> {
        let row = Self::owner_row(conn, scope).map_err(not_applied)?;
        self.decode_owner(scope, row, now)
    }

    fn decode_owner(
        &self,
        scope: &OwnerScope,
        row: Option<(Vec<u8>, i64)>,
        now: u64,
    ) -> Result<Option<Lease>, OwnershipError> {
        match row {
            Some((raw, exp)) if u64_of(exp) > now => {
                let record = self.decode_record(raw, scope)?;
                Ok(Some(Lease {
                    record,
                    remaining_ms: u64_of(exp) - now,
                }))
            }
            _ => Ok(None),
        }
    }

    /// The stored owner record of `scope` and its expiry, live or not.
    fn owner_row(
        conn: &Connection,
        scope: &OwnerScope,
    ) -> Result<Option<(Vec<u8>, i64)>, rusqlite::Error> {
        conn.prepare_cached(
            "SELECT record, expires_at_ms FROM durability_owner_leases WHERE scope = ?1",
        )
        .and_then(|mut st| {
            st.query_row([scope.host_id()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
    }

    fn generation(conn: &Connection, scope: &OwnerScope) -> Result<u64, OwnershipError> {
        let g: Option<i64> = conn
            .prepare_cached("SELECT generation FROM durability_owner_generations WHERE scope = ?1")
            .and_then(|mut st| st.query_row([scope.host_id()], |r| r.get(0)).optional())
            .map_err(not_applied)?;
        Self::decode_generation(scope, g)
    }

    /// [`OwnerRecord::decode`], remembered by the stored bytes; a cached
    /// record is used only under the scope it was decoded for.
    fn decode_record(
        &self,
        raw: Vec<u8>,
        scope: &OwnerScope,
    ) -> Result<OwnerRecord, OwnershipError> {
        let mut cache = self.decoded.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(record) = cache.get(&raw)
            && record.scope() == scope
        {
            return Ok(record.clone());
        }
        let record = OwnerRecord::decode(&raw, scope, self.count)?;
        if cache.len() >= DECODED_RECORDS {
            cache.clear();
        }
        cache.insert(raw, record.clone());
        Ok(record)
    }

    fn decode_generation(scope: &OwnerScope, g: Option<i64>) -> Result<u64, OwnershipError> {
        match g {
            None => Ok(0),
            Some(g) => u64::try_from(g)
                .ok()
                .filter(|g| Generation::new(*g).is_ok())
                .ok_or_else(|| OwnershipError::InvalidLifecycleState {
                    lifecycle: scope.to_string(),
                    reason: "generation counter is not a positive safe integer".to_owned(),
                }),
        }
    }
}

impl<C: Clock> LeaseStore for SqliteLeaseStore<C> {
    async fn claim_as(
        &self,
        scope: &OwnerScope,
        claimant: Claimant<'_>,
    ) -> Result<ClaimOutcome, OwnershipError> {
        validate_ttl(claimant.ttl_ms)?;
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| begin_error(e, scope))?;
        let now = self.clock.now_ms_u64();
        let unrecorded = Self::check_claim(&tx, scope, claimant.lifecycle)?;
        if let Some(lease) = self.owner(&tx, scope, now)? {
            return Ok(ClaimOutcome::Held(lease));
        }
        let generation = Generation::new(Self::generation(&tx, scope)? + 1)?;
        if unrecorded {
            Self::record_count(&tx, scope)?;
        }
        let record = claimant.record(scope, generation);
        let exp = now.saturating_add(claimant.ttl_ms);
        tx.prepare_cached(
            "INSERT INTO durability_owner_generations (scope, generation) VALUES (?1, ?2)
             ON CONFLICT (scope) DO UPDATE SET generation = excluded.generation",
        )
        .and_then(|mut st| st.execute(params![scope.host_id(), i64_of(generation.get())]))
        .map_err(not_applied)?;
        tx.prepare_cached(
            "INSERT INTO durability_owner_leases (scope, record, expires_at_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (scope) DO UPDATE SET record = excluded.record, expires_at_ms = excluded.expires_at_ms",
        )
        .and_then(|mut st| {
            st.execute(params![scope.host_id(), record.encoded().as_bytes(), i64_of(exp)])
        })
        .map_err(not_applied)?;
        tx.commit().map_err(unknown)?;
        Ok(ClaimOutcome::Claimed(Lease {
            record,
            remaining_ms: claimant.ttl_ms,
        }))
    }

    /// A [`LeaseStore::renew_many`] of one record: the same transaction
    /// and checks.
    async fn renew(&self, record: &OwnerRecord, ttl_ms: u64) -> Result<Lease, OwnershipError> {
        self.renew_many(std::slice::from_ref(record), ttl_ms)
            .await
            .pop()
            .unwrap_or_else(|| {
                Err(OwnershipError::StoreUnavailable {
                    source: "renew answered no result".into(),
                })
            })
    }

    async fn release(&self, record: &OwnerRecord) -> Result<bool, OwnershipError> {
        let conn = self.lock();
        let n = conn
            .prepare_cached("DELETE FROM durability_owner_leases WHERE scope = ?1 AND record = ?2")
            .and_then(|mut st| {
                st.execute(params![
                    record.scope().host_id(),
                    record.encoded().as_bytes()
                ])
            })
            .map_err(unknown)?;
        Ok(n == 1)
    }

    async fn snapshot(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<OwnerSnapshot, OwnershipError> {
        // One statement reads the owner, generation and lifecycle rows: a
        // statement is its own read transaction, so the three are one
        // consistent snapshot, in one step instead of BEGIN, three reads
        // and COMMIT (the admission of every host dispatch reads this).
        type Row = (
            Option<Vec<u8>>,
            Option<i64>,
            Option<i64>,
            Option<String>,
            Option<Vec<u8>>,
            Option<i64>,
        );
        let conn = self.lock();
        let now = self.clock.now_ms_u64();
        // The database state, read before the rows: a cached snapshot of
        // the same state answers without reading them.
        let version: i64 = conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .map_err(not_applied)?;
        let stamp = (version, conn.total_changes());
        let key = (scope.host_id().to_owned(), lifecycle.as_str().to_owned());
        {
            let mut cache = self
                .snapshots
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if cache.stamp != Some(stamp) {
                cache.stamp = Some(stamp);
                cache.rows.clear();
            } else if let Some(hit) = cache.rows.get(&key) {
                return Ok(hit.snapshot(now));
            }
        }
        let (record, expires, generation, active, lock, count): Row = conn
            .prepare_cached(
                "SELECT l.record, l.expires_at_ms,
                   (SELECT generation FROM durability_owner_generations WHERE scope = k.s),
                   c.active_storage, c.delete_lock,
                   (SELECT shard_count FROM durability_storage_shard_count WHERE storage_id = ?3)
                 FROM (SELECT ?1 AS s, ?2 AS lc) AS k
                 LEFT JOIN durability_owner_leases l ON l.scope = k.s
                 LEFT JOIN durability_owner_lifecycle c ON c.lifecycle = k.lc",
            )
            .and_then(|mut st| {
                let storage = scope.storage_id().as_str();
                st.query_row(params![scope.host_id(), lifecycle.as_str(), storage], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                })
            })
            .map_err(not_applied)?;
        drop(conn);
        let row = record.zip(expires);
        // Only a live or absent owner is remembered (an expired record is
        // not decoded, and a clock set back could make it live again).
        let cacheable = row.as_ref().is_none_or(|(_, exp)| u64_of(*exp) > now);
        let owner = self.decode_owner(scope, row, now)?;
        let generation = Self::decode_generation(scope, generation)?;
        let lc = Self::decode_lifecycle(lifecycle, active, lock)?;
        let count = stored_shard_count(count, scope.storage_id())?;
        let rows = SnapshotRows {
            owner: owner
                .as_ref()
                .map(|l| (l.record.clone(), now.saturating_add(l.remaining_ms))),
            generation,
            active: lc.active,
            lock: lc.lock,
            count,
        };
        if cacheable {
            let mut cache = self
                .snapshots
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if cache.stamp == Some(stamp) {
                if cache.rows.len() >= CACHED_SNAPSHOTS {
                    cache.rows.clear();
                }
                cache.rows.insert(key, rows.clone());
            }
        }
        Ok(rows.snapshot(now))
    }

    /// Renews the whole batch in one `BEGIN IMMEDIATE` transaction, each
    /// record with every check of [`LeaseStore::renew`]. A SQLite failure
    /// before the commit rolls the batch back (every record: not applied);
    /// a failed commit leaves the renewed records' outcome unknown.
    async fn renew_many(
        &self,
        records: &[OwnerRecord],
        ttl_ms: u64,
    ) -> Vec<Result<Lease, OwnershipError>> {
        let each = |e: &rusqlite::Error, applied_unknown: bool| {
            let source = BoxError::from(e.to_string());
            if applied_unknown {
                OwnershipError::OwnerUnavailable { source }
            } else {
                OwnershipError::StoreUnavailable { source }
            }
        };
        if let Some(refused) = ttl_refusals(records.len(), ttl_ms) {
            return refused;
        }
        if records.is_empty() {
            return Vec::new();
        }
        let mut conn = self.lock();
        let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => return records.iter().map(|_| Err(each(&e, false))).collect(),
        };
        let now = self.clock.now_ms_u64();
        let mut out = Vec::with_capacity(records.len());
        for record in records {
            match Self::renew_in(&tx, record, ttl_ms, now) {
                Ok(result) => out.push(result),
                Err(e) => {
                    drop(tx);
                    return records.iter().map(|_| Err(each(&e, false))).collect();
                }
            }
        }
        if let Err(e) = tx.commit() {
            return out
                .into_iter()
                .map(|r| r.and_then(|_| Err(each(&e, true))))
                .collect();
        }
        out
    }

    async fn raise_generation_floor(
        &self,
        scope: &OwnerScope,
        floor: Generation,
    ) -> Result<u64, OwnershipError> {
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| begin_error(e, scope))?;
        let counter = Self::generation(&tx, scope)?.max(floor.get());
        tx.execute(
            "INSERT INTO durability_owner_generations (scope, generation) VALUES (?1, ?2)
             ON CONFLICT (scope) DO UPDATE SET generation = max(generation, excluded.generation)",
            params![scope.host_id(), i64_of(counter)],
        )
        .map_err(not_applied)?;
        tx.commit().map_err(unknown)?;
        Ok(counter)
    }

    async fn write_presence(&self, presence: Presence<'_>) -> Result<(), OwnershipError> {
        let exp = i64_of(self.clock.now_ms_u64().saturating_add(presence.ttl_ms()));
        let (key, task) = (presence.group().key(), presence.task().as_str());
        self.lock()
            .prepare_cached(
                "INSERT INTO durability_presence (grp, task, value, expires_at_ms)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (grp, task) DO UPDATE
                 SET value = excluded.value, expires_at_ms = excluded.expires_at_ms",
            )
            .and_then(|mut st| st.execute(params![key, task, presence.value(), exp]))
            .map_err(unknown)?;
        Ok(())
    }

    async fn withdraw(&self, group: &PresenceGroup, task: &TaskId) -> Result<bool, OwnershipError> {
        let n = self
            .lock()
            .prepare_cached("DELETE FROM durability_presence WHERE grp = ?1 AND task = ?2")
            .and_then(|mut st| st.execute(params![group.key(), task.as_str()]))
            .map_err(unknown)?;
        Ok(n == 1)
    }

    async fn live_tasks(
        &self,
        group: &PresenceGroup,
    ) -> Result<Vec<PresenceEntry>, OwnershipError> {
        let now = self.clock.now_ms_u64();
        let conn = self.lock();
        let mut st = conn
            .prepare_cached(
                "SELECT task, value, expires_at_ms FROM durability_presence
                 WHERE grp = ?1 AND expires_at_ms > ?2 ORDER BY task",
            )
            .map_err(not_applied)?;
        let rows = st
            .query_map(params![group.key(), i64_of(now)], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })
            .map_err(not_applied)?;
        let mut out = Vec::new();
        for row in rows {
            let (task, value, exp) = row.map_err(not_applied)?;
            out.extend(PresenceEntry::stored(
                &task,
                value,
                u64_of(exp).saturating_sub(now),
            ));
        }
        Ok(out)
    }

    async fn record_shard_count(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<(), OwnershipError> {
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| begin_error(e, scope))?;
        if Self::check_claim(&tx, scope, lifecycle)? {
            Self::record_count(&tx, scope)?;
            tx.commit().map_err(unknown)?;
        }
        Ok(())
    }
}

impl<C: Clock> SqliteLeaseStore<C> {
    /// The checks and refresh of one record inside the batch's transaction:
    /// the one implementation behind both `renew` and `renew_many`. `Err` of the outer result is a
    /// SQLite failure that ends the batch; the inner result is the record's.
    fn renew_in(
        tx: &Connection,
        record: &OwnerRecord,
        ttl_ms: u64,
        now: u64,
    ) -> Result<Result<Lease, OwnershipError>, rusqlite::Error> {
        let scope = record.scope();
        let row = Self::owner_row(tx, scope)?;
        let live = matches!(&row, Some((raw, exp)) if u64_of(*exp) > now && raw.as_slice() == record.encoded().as_bytes());
        if !live {
            return Ok(Err(OwnershipError::StaleOwner {
                scope: scope.to_string(),
            }));
        }
        let lc = match Self::lifecycle(tx, record.lifecycle()) {
            Ok(lc) => lc,
            // A corrupt lifecycle row fails this record only.
            Err(e) => return Ok(Err(e)),
        };
        if let Err(e) = check_lifecycle(
            scope.storage_id(),
            record.lifecycle(),
            lc.active.as_ref(),
            lc.lock,
        )
        .and_then(|()| Self::recorded_count(tx, scope.storage_id()))
        .and_then(|recorded| check_shard_count(scope, recorded))
        {
            return Ok(Err(e));
        }
        let exp = now.saturating_add(ttl_ms);
        tx.prepare_cached(
            "UPDATE durability_owner_leases SET expires_at_ms = ?2 WHERE scope = ?1",
        )?
        .execute(params![scope.host_id(), i64_of(exp)])?;
        Ok(Ok(Lease {
            record: record.clone(),
            remaining_ms: ttl_ms,
        }))
    }
}

impl<C: Clock> LifecycleAdmin for SqliteLeaseStore<C> {
    async fn set_active_storage(
        &self,
        lifecycle: &LifecycleId,
        storage: Option<&StorageId>,
    ) -> Result<(), OwnershipError> {
        self.lock()
            .execute(
                "INSERT INTO durability_owner_lifecycle (lifecycle, active_storage) VALUES (?1, ?2)
                 ON CONFLICT (lifecycle) DO UPDATE SET active_storage = excluded.active_storage",
                params![lifecycle.as_str(), storage.map(StorageId::as_str)],
            )
            .map_err(unknown)?;
        Ok(())
    }

    async fn set_delete_lock(
        &self,
        lifecycle: &LifecycleId,
        lock: Option<DeleteLock>,
    ) -> Result<(), OwnershipError> {
        self.lock()
            .execute(
                "INSERT INTO durability_owner_lifecycle (lifecycle, delete_lock) VALUES (?1, ?2)
                 ON CONFLICT (lifecycle) DO UPDATE SET delete_lock = excluded.delete_lock",
                params![lifecycle.as_str(), lock.map(|l| l.as_str().as_bytes())],
            )
            .map_err(unknown)?;
        Ok(())
    }
}

/// Creates the fence table in an object database if needed (and adds the
/// `holder` column to a fence table written before holders were recorded:
/// such rows hold no holder, so no claim matches them at their generation).
///
/// # Errors
/// [`OwnershipError::StoreUnavailable`] when the table cannot be created.
pub fn ensure_fence_schema(conn: &Connection) -> Result<(), OwnershipError> {
    conn.execute_batch(FENCE_SCHEMA).map_err(not_applied)?;
    let has_holder: bool = conn
        .query_row(
            "SELECT count(*) FROM pragma_table_info('durability_owner_fence') WHERE name = 'holder'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(not_applied)?
        > 0;
    if !has_holder {
        conn.execute_batch("ALTER TABLE durability_owner_fence ADD COLUMN holder BLOB")
            .map_err(not_applied)?;
    }
    Ok(())
}

fn in_transaction(conn: &Connection) -> Result<(), OwnershipError> {
    if conn.is_autocommit() {
        return Err(OwnershipError::InvalidInput {
            what: "fence call",
            reason: "must run inside the object's transaction".to_owned(),
        });
    }
    Ok(())
}

/// The claim recorded in an object database's fence: its generation and
/// the exact owner record bytes of its holder (`None` for a row written
/// before holders were recorded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedClaim {
    /// The fenced generation.
    pub generation: u64,
    /// The holder's exact owner record bytes.
    pub holder: Option<Vec<u8>>,
}

/// The claim recorded in the object database's fence for `scope`.
///
/// # Errors
/// [`OwnershipError::StoreUnavailable`] on a SQLite error, or
/// [`OwnershipError::InvalidLifecycleState`] for a corrupt fence row.
pub fn fenced_claim(
    conn: &Connection,
    scope: &OwnerScope,
) -> Result<Option<FencedClaim>, OwnershipError> {
    let row: Option<(i64, Option<Vec<u8>>)> = conn
        .prepare_cached("SELECT generation, holder FROM durability_owner_fence WHERE scope = ?1")
        .and_then(|mut st| {
            st.query_row([scope.host_id()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(not_applied)?;
    row.map(|(g, holder)| {
        u64::try_from(g)
            .ok()
            .filter(|g| Generation::new(*g).is_ok())
            .map(|generation| FencedClaim { generation, holder })
            .ok_or_else(|| OwnershipError::InvalidLifecycleState {
                lifecycle: scope.to_string(),
                reason: "fence generation is not a positive safe integer".to_owned(),
            })
    })
    .transpose()
}

/// The generation recorded in the object database's fence for `scope`.
///
/// # Errors
/// As [`fenced_claim`].
pub fn fenced_generation(
    conn: &Connection,
    scope: &OwnerScope,
) -> Result<Option<u64>, OwnershipError> {
    Ok(fenced_claim(conn, scope)?.map(|c| c.generation))
}

fn held_by(claim: &FencedClaim, record: &OwnerRecord) -> bool {
    claim.generation == record.generation().get()
        && claim.holder.as_deref() == Some(record.encoded().as_bytes())
}

fn stale(record: &OwnerRecord, stored: u64) -> OwnershipError {
    OwnershipError::StaleGeneration {
        scope: record.scope().to_string(),
        attempted: record.generation().get(),
        stored,
    }
}

/// Records the claim `record` in the object database's fence, inside the
/// caller's transaction, at the first dispatch after a claim: its
/// generation and its holder (the exact owner record bytes). The fence only
/// rises, and one generation has one holder.
///
/// # Errors
/// [`OwnershipError::StaleGeneration`] (nothing is written) when a higher
/// generation is recorded, or the same generation held by another claim
/// (`stored` is the fenced generation either way);
/// [`OwnershipError::InvalidInput`] outside a transaction; SQLite errors as
/// [`OwnershipError::StoreUnavailable`].
pub fn record_generation(conn: &Connection, record: &OwnerRecord) -> Result<(), OwnershipError> {
    in_transaction(conn)?;
    let scope = record.scope();
    if let Some(stored) = fenced_claim(conn, scope)? {
        if held_by(&stored, record) {
            return Ok(());
        }
        if stored.generation >= record.generation().get() {
            return Err(stale(record, stored.generation));
        }
    }
    conn.execute(
        "INSERT INTO durability_owner_fence (scope, generation, holder) VALUES (?1, ?2, ?3)
         ON CONFLICT (scope) DO UPDATE SET generation = excluded.generation, holder = excluded.holder
         WHERE excluded.generation > durability_owner_fence.generation",
        params![
            scope.host_id(),
            i64_of(record.generation().get()),
            record.encoded().as_bytes()
        ],
    )
    .map_err(not_applied)?;
    Ok(())
}

/// Refuses, inside the caller's transaction, a claim of an object whose
/// fence already recorded another shard of the same storage id and class:
/// an object has one scope, and another shard for it means a host with
/// another shard count (the store refuses such a claim too; this is the
/// object's own last line). Rows of other storage ids or classes are not
/// consulted.
///
/// # Errors
/// [`OwnershipError::ObjectScopeMismatch`] (nothing is written);
/// [`OwnershipError::InvalidInput`] outside a transaction; SQLite errors as
/// [`OwnershipError::StoreUnavailable`].
pub fn check_fenced_scope(conn: &Connection, record: &OwnerRecord) -> Result<(), OwnershipError> {
    in_transaction(conn)?;
    let scope = record.scope();
    let prefix = format!(
        "{}:{}:shard",
        scope.storage_id().as_str(),
        scope.class().as_str()
    );
    let other: Option<String> = conn
        .prepare_cached(
            "SELECT scope FROM durability_owner_fence
             WHERE scope <> ?1 AND substr(scope, 1, length(?2)) = ?2 LIMIT 1",
        )
        .and_then(|mut st| {
            st.query_row(params![scope.host_id(), prefix], |r| r.get(0))
                .optional()
        })
        .map_err(not_applied)?;
    match other {
        Some(recorded) => Err(OwnershipError::ObjectScopeMismatch {
            recorded,
            attempted: scope.to_string(),
        }),
        None => Ok(()),
    }
}

/// Checks, inside the caller's transaction, that the object database's
/// fence holds exactly the claim `record` (its generation and its holder).
/// Run it in every transaction that writes object state: with SQLite's
/// transaction isolation, a transaction that checked an older fence cannot
/// commit over a newer one.
///
/// # Errors
/// [`OwnershipError::StaleGeneration`] when a newer generation, or the same
/// generation from another claim, is recorded;
/// [`OwnershipError::FenceNotRecorded`] when the claim was never recorded;
/// [`OwnershipError::InvalidInput`] outside a transaction.
pub fn check_generation(conn: &Connection, record: &OwnerRecord) -> Result<(), OwnershipError> {
    in_transaction(conn)?;
    match fenced_claim(conn, record.scope())? {
        Some(stored) if held_by(&stored, record) => Ok(()),
        Some(stored) if stored.generation >= record.generation().get() => {
            Err(stale(record, stored.generation))
        }
        _ => Err(OwnershipError::FenceNotRecorded {
            scope: record.scope().to_string(),
            attempted: record.generation().get(),
        }),
    }
}
