//! Where one run of the cluster's host processes keeps its leases, alarm
//! jobs and objects, what each child is told, and the parent's read of the
//! lease store (the owners it prints and routes the paused phase by).
//!
//! - SQLite: one temporary directory every host shares (lease store, alarm
//!   index, the objects' files, the peer files), each host's working
//!   directory; the embedded default, for processes of one machine.
//! - Redis: leases and alarm jobs under a key prefix made for the run
//!   (deleted at the end); objects and peer files in the shared directory.
//! - PostgreSQL alone: leases, alarm jobs and objects in a schema made for
//!   the run (`HostConfig::postgres`); each host runs in a working
//!   directory of its own and none reads another's; a host finds its
//!   peers' endpoints in the owner records. The schema and the objects'
//!   schemas are dropped at the end.

use std::path::PathBuf;

use durability_host::store::postgres::PostgresLeaseStore;
use durability_ownership::{
    LeaseStore as _, LifecycleAdmin as _, LifecycleId, OwnerScope, ShardCount, StorageId,
    SystemClock,
};
use durability_storage_redis::ownership::RedisLeaseStore;
use durability_storage_sqlite::ownership::SqliteLeaseStore;

use super::{GUARD_MS, INTERVAL_MS, TTL_MS};
use crate::Result;

/// The stores of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Backing {
    /// SQLite files in a directory the processes share.
    Sqlite,
    /// Leases and alarm jobs in Redis at this URL; objects in SQLite files.
    Redis(String),
    /// Everything in PostgreSQL at this URL; no shared directory.
    Postgres(String),
}

/// The parent's handle on the run's lease store.
enum Leases {
    Sqlite(SqliteLeaseStore<SystemClock>),
    Redis(RedisLeaseStore),
    Postgres(PostgresLeaseStore),
}

/// One run: its stores, its directory and its shard count.
pub(super) struct Run {
    dir: tempfile::TempDir,
    backing: Backing,
    /// The run's Redis key prefix or PostgreSQL schema.
    name: String,
    count: ShardCount,
    leases: Leases,
    /// Whether the hosts balance the class's shards (`HostSettings::balance`).
    balance: bool,
}

impl Run {
    /// Makes the run's stores (a PostgreSQL schema is set up here, before
    /// any host starts, so the parent can write the lifecycle's record).
    pub(super) async fn open(backing: Backing, shards: u32) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let count = ShardCount::new(shards)?;
        let token = durability_alarms::Token::random().to_string();
        let (name, leases) = match &backing {
            Backing::Sqlite => {
                let path = dir.path().join("leases.db");
                let store = SqliteLeaseStore::open(path, SystemClock::new(), count)?;
                (String::new(), Leases::Sqlite(store))
            }
            Backing::Redis(url) => {
                let prefix = format!("durability:demo:cluster:{token}:");
                let store =
                    RedisLeaseStore::connect(url, &format!("{prefix}leases:"), count).await?;
                (prefix, Leases::Redis(store))
            }
            Backing::Postgres(url) => {
                let schema = format!("cluster_{}", schema_suffix(&token));
                let store = PostgresLeaseStore::connect(url, &schema, count)?;
                store.setup().await?;
                (schema, Leases::Postgres(store))
            }
        };
        Ok(Self {
            dir,
            backing,
            name,
            count,
            leases,
            balance: true,
        })
    }

    /// The run with balancing on (the default) or off.
    #[must_use]
    pub(super) fn balance(mut self, on: bool) -> Self {
        self.balance = on;
        self
    }

    /// The shard count of the class.
    pub(super) fn count(&self) -> ShardCount {
        self.count
    }

    /// Host `task`'s working directory: the shared one, or on PostgreSQL
    /// one of its own.
    pub(super) fn cwd(&self, task: &str) -> PathBuf {
        match self.backing {
            Backing::Postgres(_) => self.dir.path().join("hosts").join(task),
            _ => self.dir.path().to_owned(),
        }
    }

    /// The arguments of host `task`'s `cluster-host` command.
    pub(super) fn args(&self, task: &str) -> Vec<String> {
        let mut args = vec![
            format!("dir={}", self.cwd(task).display()),
            format!("ttl={TTL_MS}"),
            format!("interval={INTERVAL_MS}"),
            format!("guard={GUARD_MS}"),
            format!("shards={}", self.count.get()),
            format!("balance={}", self.balance),
        ];
        match &self.backing {
            Backing::Sqlite => {}
            Backing::Redis(url) => {
                args.push(format!("redis={url}"));
                args.push(format!("prefix={}", self.name));
            }
            Backing::Postgres(url) => {
                args.push(format!("postgres={url}"));
                args.push(format!("schema={}", self.name));
            }
        }
        args
    }

    /// One line saying where the run keeps what.
    pub(super) fn describe(&self) -> String {
        let dir = self.dir.path().display();
        match &self.backing {
            Backing::Sqlite => {
                format!(
                    "leases, alarm jobs and objects: SQLite files in {dir} shared by the processes"
                )
            }
            Backing::Redis(url) => format!(
                "leases and alarm jobs: Redis at {url} (prefix {}, leases on server TIME); objects: SQLite files in {dir}",
                self.name
            ),
            Backing::Postgres(_) => format!(
                "leases, alarm jobs and objects: PostgreSQL alone (schema {}, leases on the server's clock); each host in its own directory under {dir}/hosts, none shared",
                self.name
            ),
        }
    }

    /// What the lease store records as the storage of the lifecycle.
    pub(super) async fn set_active(&self, lifecycle: &LifecycleId, storage: &StorageId) -> Result {
        match &self.leases {
            Leases::Sqlite(s) => s.set_active_storage(lifecycle, Some(storage)).await?,
            Leases::Redis(s) => s.set_active_storage(lifecycle, Some(storage)).await?,
            Leases::Postgres(s) => s.set_active_storage(lifecycle, Some(storage)).await?,
        }
        Ok(())
    }

    /// The task of `scope`'s live owner in the lease store, if any.
    pub(super) async fn owner(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<Option<String>> {
        let snapshot = match &self.leases {
            Leases::Sqlite(s) => s.snapshot(scope, lifecycle).await?,
            Leases::Redis(s) => s.snapshot(scope, lifecycle).await?,
            Leases::Postgres(s) => s.snapshot(scope, lifecycle).await?,
        };
        Ok(snapshot.owner.map(|l| l.record.task().as_str().to_owned()))
    }

    /// Deletes what the run made outside its directory (the Redis keys
    /// under its prefix; its PostgreSQL schema and its objects' schemas),
    /// after every host has stopped; says what it deleted.
    pub(super) async fn clean_up(&self) -> Result<Option<String>> {
        match &self.backing {
            Backing::Sqlite => Ok(None),
            Backing::Redis(url) => {
                let client = redis::Client::open(url.as_str())?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{}*", self.name))
                    .query_async(&mut conn)
                    .await?;
                if !keys.is_empty() {
                    let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
                }
                Ok(Some(format!("deleted the run's {} Redis keys", keys.len())))
            }
            Backing::Postgres(url) => {
                let dropped = drop_schemas(url, &self.name).await?;
                Ok(Some(format!(
                    "dropped the run's {dropped} PostgreSQL schemas"
                )))
            }
        }
    }
}

/// Drops the object deployment `schema` of the server at `url` and its
/// objects' schemas (`<schema>_o<n>`); returns how many it dropped.
pub(crate) async fn drop_schemas(url: &str, schema: &str) -> Result<usize> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let rows = client
        .query(
            "SELECT nspname FROM pg_namespace
             WHERE nspname = $1 OR nspname LIKE replace($1, '_', '\\_') || '\\_o%'",
            &[&schema],
        )
        .await?;
    for row in &rows {
        let name: String = row.try_get(0)?;
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
            .await?;
    }
    Ok(rows.len())
}

/// A schema-safe suffix of a random token: lowercase ASCII letters and
/// digits, at most 16.
fn schema_suffix(token: &str) -> String {
    token
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .take(16)
        .collect()
}
