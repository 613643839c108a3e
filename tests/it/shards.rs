//! Shard factories for the dialect tests: SQLite files, PostgreSQL schemas
//! and MariaDB databases, each with the test tables, and an environment of
//! named shards of mixed dialects on the migration crate's crash harness
//! (`durability_migration::conformance::harness`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) use durability_migration::conformance::harness::clean_verify;
use durability_migration::conformance::harness::{BeforeWrite, Harness, HookedShard};
use durability_migration::{
    BackendError, BackendFuture, ManualClock, MappingStore, MemoryMappingStore, OpRecord, Router,
    Row, Shard, Statement,
};
use durability_storage_mysql::MysqlShard;
use durability_storage_mysql::testkit::TestDatabase;
use durability_storage_postgres::testkit::TestSchema;
use durability_storage_sqlite::migration::SqliteShard;
use tempfile::TempDir;

/// The backend of one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sqlite,
    Postgres,
    MySql,
}

/// Keeps a shard's database alive (dropped: the schema or database goes).
#[allow(dead_code)]
enum Guard {
    Dir(TempDir),
    Schema(TestSchema),
    Database(TestDatabase),
}

const SQLITE_SCHEMA: &str = "
CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT, n INTEGER);
CREATE TABLE orgs (org_id TEXT PRIMARY KEY, title TEXT);
CREATE TABLE docs (id TEXT PRIMARY KEY, w0 INTEGER, w1 INTEGER, w2 INTEGER, w3 INTEGER);
CREATE TABLE bkeys (id TEXT PRIMARY KEY, n INTEGER);
";

const POSTGRES_SCHEMA: &str = "
CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT, n BIGINT);
CREATE TABLE orgs (org_id TEXT PRIMARY KEY, title TEXT);
CREATE TABLE docs (id TEXT PRIMARY KEY, w0 BIGINT, w1 BIGINT, w2 BIGINT, w3 BIGINT);
CREATE TABLE bkeys (id TEXT PRIMARY KEY, n BIGINT);
";

const MYSQL_SCHEMA: [&str; 4] = [
    "CREATE TABLE users (id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin PRIMARY KEY, name LONGTEXT, n BIGINT)",
    "CREATE TABLE orgs (org_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin PRIMARY KEY, title LONGTEXT)",
    "CREATE TABLE docs (id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin PRIMARY KEY, w0 BIGINT, w1 BIGINT, w2 BIGINT, w3 BIGINT)",
    // Byte-wise keys of up to MAX_KEY_BYTES, with no PAD SPACE.
    "CREATE TABLE bkeys (id VARBINARY(512) PRIMARY KEY, n BIGINT)",
];

/// Makes one shard of `kind` holding the test tables, or `None` when its
/// server is unreachable (and not required).
async fn make(kind: Kind) -> Option<(Arc<dyn Shard>, Guard)> {
    match kind {
        Kind::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let s = SqliteShard::open(dir.path().join("shard.db")).unwrap();
            s.execute_sync(SQLITE_SCHEMA).unwrap();
            Some((Arc::new(s), Guard::Dir(dir)))
        }
        Kind::Postgres => {
            let schema = TestSchema::create().await?;
            let s = schema.shard().await;
            s.batch_execute(POSTGRES_SCHEMA).await.unwrap();
            Some((Arc::new(s), Guard::Schema(schema)))
        }
        Kind::MySql => {
            let db = TestDatabase::create().await?;
            let s: MysqlShard = db.shard();
            for ddl in MYSQL_SCHEMA {
                s.query_drop(ddl).await.unwrap();
            }
            Some((Arc::new(s), Guard::Database(db)))
        }
    }
}

/// The [`MappingStore`] methods a wrapper passes to its `inner` store
/// unchanged (`put_if_absent`, `remove`, `scan`), for a wrapper that
/// changes only `get` and `put`.
macro_rules! mapping_passthrough {
    () => {
        fn put_if_absent<'a>(
            &'a self,
            key: &'a str,
            shard: &'a str,
        ) -> durability_migration::BackendFuture<'a, String> {
            self.inner.put_if_absent(key, shard)
        }
        fn remove<'a>(&'a self, key: &'a str) -> durability_migration::BackendFuture<'a, bool> {
            self.inner.remove(key)
        }
        fn scan<'a>(
            &'a self,
            after: Option<&'a str>,
            limit: usize,
        ) -> durability_migration::BackendFuture<'a, Vec<(String, String)>> {
            self.inner.scan(after, limit)
        }
    };
}
pub(crate) use mapping_passthrough;

/// The [`Shard`] methods a wrapper answers from its `inner` shard
/// unchanged (`dialect`, `batch_support`).
macro_rules! shard_passthrough {
    () => {
        fn dialect(&self) -> durability_migration::Dialect {
            self.inner.dialect()
        }
        fn batch_support(&self) -> durability_migration::BatchSupport {
            self.inner.batch_support()
        }
    };
}
pub(crate) use shard_passthrough;

/// Named shards `s0`, `s1`, … of the given kinds on the migration crate's
/// crash harness (one mapping store, one clock and one crash plan), which
/// holds the shards' databases.
pub(crate) type Env = Harness;

/// An environment, or `None` when a server it needs is unreachable.
pub(crate) async fn env(kinds: &[Kind]) -> Option<Env> {
    env_with(kinds, Arc::new(MemoryMappingStore::new())).await
}

/// [`env`] over the given mapping store (which must be empty).
pub(crate) async fn env_with(kinds: &[Kind], mapping: Arc<dyn MappingStore>) -> Option<Env> {
    let mut shards = Vec::new();
    let mut guards = Vec::new();
    for (i, k) in kinds.iter().enumerate() {
        let (s, g) = make(*k).await?;
        shards.push((format!("s{i}"), s));
        guards.push(g);
    }
    let h = Harness::new(shards, mapping)
        .table("users")
        .table("docs")
        .table("bkeys")
        .table_with_key_column("orgs", "org_id")
        .holding(guards);
    Some(h)
}

/// A router over `e` on `clock`, in clock domain `domain` (a host of its
/// own), through the crash plan when `faulty`.
pub(crate) async fn router_on(e: &Env, clock: &ManualClock, domain: &str, faulty: bool) -> Router {
    let r = Router::new(
        e.config(faulty, 30_000)
            .clock(Arc::new(clock.clone()))
            .clock_domain(domain),
    )
    .unwrap();
    r.init().await.unwrap();
    r
}

/// Two shards of one dialect, for each dialect.
pub(crate) const SAME: [[Kind; 2]; 3] = [
    [Kind::Sqlite, Kind::Sqlite],
    [Kind::Postgres, Kind::Postgres],
    [Kind::MySql, Kind::MySql],
];

/// A router over `e` whose shard `name` is `shard` instead.
pub(crate) async fn router_replacing(e: &Env, name: &str, shard: Arc<dyn Shard>) -> Router {
    let r = Router::new(e.config(false, 30_000).shard(name, shard)).unwrap();
    r.init().await.unwrap();
    r
}

/// A move's cutover batch on its source: it archives into
/// `durability_retired` (the copy batch, which writes the in-flight
/// markers, runs on the destination).
pub(crate) fn is_cutover(stmts: &[Statement]) -> bool {
    stmts
        .iter()
        .any(|s| s.sql.starts_with("INSERT INTO durability_retired"))
}

/// A router over `e` that has put `key` on `shard` and inserted `row` into
/// `users` under it (an acknowledged routed insert).
pub(crate) async fn router_with_user(e: &Env, key: &str, shard: &str, row: Row) -> Router {
    let r = e.router().await;
    e.mapping.put(key, shard).await.unwrap();
    r.insert(key, "users", row).await.unwrap();
    r
}

/// The operation of `key`'s newest move of `table`, as `r` reads it (it
/// must exist).
pub(crate) async fn op_of(r: &Router, key: &str, table: &str) -> OpRecord {
    r.get_migration_status(key, table).await.unwrap().unwrap()
}

/// One write that a [`Hook`] sees before it reaches the shard: the shard
/// itself (a hook may write to it directly) and the write's statements.
pub(crate) struct Write<'a> {
    pub(crate) inner: &'a Arc<dyn Shard>,
    pub(crate) stmts: &'a [Statement],
}

impl Write<'_> {
    /// Whether one of the write's statements starts with `prefix`.
    pub(crate) fn has(&self, prefix: &str) -> bool {
        self.stmts.iter().any(|s| s.sql.starts_with(prefix))
    }

    /// Whether a hook fires on this write: `matched` and not `fired` before
    /// (it marks `fired`, so a hook fires at most once).
    pub(crate) fn once(&self, matched: bool, fired: &AtomicBool) -> bool {
        matched && !fired.swap(true, Ordering::SeqCst)
    }

    /// Whether this is a move's cutover batch ([`is_cutover`]).
    pub(crate) fn is_cutover(&self) -> bool {
        is_cutover(self.stmts)
    }
}

/// What a test runs before each write of a shard, written as an `async fn`
/// (the harness's [`BeforeWrite`] wants a boxed future; [`OnWrite`] adapts).
pub(crate) trait Hook: Send + Sync {
    /// Runs before `w` reaches the shard; an error is the write's error.
    fn before(&self, w: Write<'_>) -> impl Future<Output = Result<(), BackendError>> + Send;
}

/// A [`Hook`] as the harness's [`BeforeWrite`]; derefs to the hook, so a
/// test reads its state as `hooked.hook.field`.
pub(crate) struct OnWrite<H>(pub(crate) H);

impl<H> std::ops::Deref for OnWrite<H> {
    type Target = H;
    fn deref(&self) -> &H {
        &self.0
    }
}

impl<H: Hook> BeforeWrite for OnWrite<H> {
    fn before_write<'a>(
        &'a self,
        inner: &'a Arc<dyn Shard>,
        stmts: &'a [Statement],
    ) -> BackendFuture<'a, ()> {
        Box::pin(self.0.before(Write { inner, stmts }))
    }
}

/// Shard `name` of `e` running `hook` before each of its writes.
pub(crate) fn hooked<H: Hook>(e: &Env, name: &str, hook: H) -> Arc<HookedShard<OnWrite<H>>> {
    Arc::new(HookedShard::new(Arc::clone(e.shard(name)), OnWrite(hook)))
}

/// DDL of a table `ckeys` whose key column's equality is coarser than bytes
/// on `kind` (SQLite `NOCASE`, a PostgreSQL nondeterministic collation,
/// MariaDB's `utf8mb4_general_ci`).
pub(crate) fn coarse_key_ddl(kind: Kind) -> Vec<&'static str> {
    match kind {
        Kind::Sqlite => vec!["CREATE TABLE ckeys (id TEXT COLLATE NOCASE PRIMARY KEY, n INTEGER)"],
        Kind::Postgres => vec![
            "CREATE COLLATION ci_level2 (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
            "CREATE TABLE ckeys (id TEXT COLLATE ci_level2 PRIMARY KEY, n BIGINT)",
        ],
        Kind::MySql => vec![
            "CREATE TABLE ckeys (id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci PRIMARY KEY, n BIGINT)",
        ],
    }
}
