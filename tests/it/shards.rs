//! Shard factories for the dialect tests: SQLite files, PostgreSQL schemas
//! and MariaDB databases, each with the test tables, and an environment of
//! named shards of mixed dialects sharing one clock, mapping store and crash
//! plan.

use std::sync::Arc;

use durability_migration::conformance::{FaultMappingStore, FaultPlan, FaultShard};
use durability_migration::{
    Dialect, Ident, ManualClock, MappingStore, MemoryMappingStore, MigrationConfig, Router, Row,
    Shard, VerifyOptions,
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
    "CREATE TABLE users (id VARCHAR(255) PRIMARY KEY, name LONGTEXT, n BIGINT)",
    "CREATE TABLE orgs (org_id VARCHAR(255) PRIMARY KEY, title LONGTEXT)",
    "CREATE TABLE docs (id VARCHAR(255) PRIMARY KEY, w0 BIGINT, w1 BIGINT, w2 BIGINT, w3 BIGINT)",
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

/// Named shards `s0`, `s1`, … of the given kinds, one mapping store, one
/// clock and one crash plan.
pub(crate) struct Env {
    pub(crate) clock: ManualClock,
    pub(crate) shards: Vec<(String, Arc<dyn Shard>)>,
    pub(crate) mapping: Arc<MemoryMappingStore>,
    pub(crate) plan: Arc<FaultPlan>,
    pub(crate) journal: &'static str,
    _guards: Vec<Guard>,
}

/// An environment, or `None` when a server it needs is unreachable.
pub(crate) async fn env(kinds: &[Kind]) -> Option<Env> {
    let mut shards = Vec::new();
    let mut guards = Vec::new();
    for (i, k) in kinds.iter().enumerate() {
        let (s, g) = make(*k).await?;
        shards.push((format!("s{i}"), s));
        guards.push(g);
    }
    Some(Env {
        clock: ManualClock::new(1_700_000_000_000),
        shards,
        mapping: Arc::new(MemoryMappingStore::new()),
        plan: FaultPlan::new(),
        journal: "s0",
        _guards: guards,
    })
}

impl Env {
    pub(crate) fn config(&self, faulty: bool, ttl: u64) -> MigrationConfig {
        let mapping: Arc<dyn MappingStore> = if faulty {
            Arc::new(FaultMappingStore::new(
                self.mapping.clone(),
                Arc::clone(&self.plan),
            ))
        } else {
            self.mapping.clone()
        };
        let mut c = MigrationConfig::new(mapping)
            .journal_shard(self.journal)
            .mapping_cache_ttl_ms(ttl)
            .clock(Arc::new(self.clock.clone()))
            .table("users")
            .table("docs")
            .table("bkeys")
            .table_with_key_column("orgs", "org_id");
        for (name, s) in &self.shards {
            let shard: Arc<dyn Shard> = if faulty {
                Arc::new(FaultShard::new(Arc::clone(s), Arc::clone(&self.plan)))
            } else {
                Arc::clone(s)
            };
            c = c.shard(name.clone(), shard);
        }
        c
    }

    // Shared by several test binaries; not all use every helper.
    #[allow(dead_code)]
    pub(crate) async fn router_with(&self, faulty: bool, ttl: u64) -> Router {
        let r = Router::new(self.config(faulty, ttl)).unwrap();
        r.init().await.unwrap();
        r
    }

    #[allow(dead_code)]
    pub(crate) async fn router(&self) -> Router {
        self.router_with(false, 30_000).await
    }

    pub(crate) fn shard(&self, name: &str) -> &Arc<dyn Shard> {
        &self.shards.iter().find(|(n, _)| n == name).unwrap().1
    }

    /// Live rows of (table, key column, key) on every shard.
    pub(crate) async fn live(&self, table: &str, col: &str, key: &str) -> Vec<(String, Row)> {
        let mut out = Vec::new();
        for (name, s) in &self.shards {
            let d: Dialect = s.dialect();
            let st = d.select_row(&Ident::new(table).unwrap(), &Ident::new(col).unwrap(), key);
            for r in s.query(&st).await.unwrap() {
                out.push((name.clone(), r));
            }
        }
        out
    }
}

/// A repairing verification is clean, and a second one repairs nothing.
pub(crate) async fn clean_verify(r: &Router) {
    let rep = r
        .verify_migrations(VerifyOptions {
            repair: true,
            ..VerifyOptions::default()
        })
        .await
        .unwrap();
    assert!(rep.clean, "repairing verification is clean: {rep:?}");
    let rep = r.verify_migrations(VerifyOptions::default()).await.unwrap();
    assert!(
        rep.clean && rep.repaired.is_empty(),
        "second verification is clean: {rep:?}"
    );
}
