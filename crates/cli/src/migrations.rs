//! `durability migrations ...`: the migration journal's operator commands.
//!
//! A JSON config file names the shards, the mapping store, the journal
//! shard and scope, the keyed tables and the placement; [`open`] builds a
//! [`Router`] from it without writing anything (SQLite files must exist;
//! PostgreSQL and MariaDB/MySQL shards are checked by one round trip). The
//! commands call the migration crate's own methods; the CLI holds no SQL.
//!
//! ```json
//! {
//!   "shards": {
//!     "east": "east.db",
//!     "west": { "url": "postgres://postgres@127.0.0.1:5432/test", "schema": "west" },
//!     "north": "mysql://root@127.0.0.1:3306/test"
//!   },
//!   "mapping": "mapping.db",
//!   "journal_shard": "east",
//!   "journal_scope": "default",
//!   "tables": { "users": "id" },
//!   "placement": "mapped"
//! }
//! ```
//!
//! A shard (and the mapping store) is a SQLite path (`sqlite:` prefix
//! optional, relative to the config file's directory), a `postgres://` or
//! `postgresql://` URL, or a `mysql://` URL; the object form adds a
//! PostgreSQL schema. The mapping store's `durability_mapping` table and
//! the journal tables must exist (the service's `Router::init` creates
//! them): the CLI never creates them.
//!
//! `clock_domain` (optional) names the clock domain of the routers whose
//! deadlines the CLI may judge on its own clock (run on their host). Without
//! it, every run is a domain of its own and remembers nothing, yet
//! `migrations recover` still takes a crashed recovery's lease over (and
//! settles a dead mover's operation): each run persists in the journal when
//! it first saw the lease or operation as it is, on the journal database's
//! own clock, and a run after that sighting is a period old (60 s for the
//! lease, 30 s for an operation) takes it over at a higher generation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use durability_migration::{
    Clock, MappingStore, MigrationConfig, Placement, Router, Shard, ShardMappingStore,
};
use durability_storage_mysql::MysqlShard;
use durability_storage_postgres::PostgresShard;
use durability_storage_sqlite::migration::SqliteShard;
use serde::Deserialize;

/// A config file's failure: its one line.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("{}: {source}", file.display())]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: invalid config: {source}", file.display())]
    Parse {
        file: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: {what}", file.display())]
    Invalid { file: PathBuf, what: String },
    #[error("{}: {what} {url:?}: {source}", file.display())]
    Backend {
        file: PathBuf,
        what: String,
        url: String,
        source: durability_migration::BackendError,
    },
    #[error("{}: {source}", file.display())]
    Router {
        file: PathBuf,
        source: Box<durability_migration::MigrationError>,
    },
}

/// The config file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    shards: BTreeMap<String, Backend>,
    mapping: Backend,
    #[serde(default)]
    journal_shard: Option<String>,
    #[serde(default)]
    journal_scope: Option<String>,
    #[serde(default)]
    tables: BTreeMap<String, String>,
    #[serde(default)]
    placement: PlacementName,
    #[serde(default)]
    clock_domain: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum PlacementName {
    #[default]
    Mapped,
    Computed,
}

/// Where a shard or the mapping store is.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Backend {
    Url(String),
    Full(FullBackend),
}

/// The object form of a backend: a URL and a PostgreSQL schema.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FullBackend {
    url: String,
    #[serde(default)]
    schema: Option<String>,
}

impl Backend {
    fn parts(&self) -> (&str, Option<&str>) {
        match self {
            Self::Url(u) => (u, None),
            Self::Full(f) => (&f.url, f.schema.as_deref()),
        }
    }
}

/// A backend's opened database: a shard (the mapping store is a mapping
/// table on one).
enum Opened {
    Sqlite(SqliteShard),
    Postgres(PostgresShard),
    Mysql(MysqlShard),
}

impl Opened {
    fn shard(self) -> Arc<dyn Shard> {
        match self {
            Self::Sqlite(s) => Arc::new(s),
            Self::Postgres(s) => Arc::new(s),
            Self::Mysql(s) => Arc::new(s),
        }
    }
    fn mapping(self) -> Arc<dyn MappingStore> {
        match self {
            Self::Sqlite(s) => Arc::new(ShardMappingStore::with_table(s)),
            Self::Postgres(s) => Arc::new(ShardMappingStore::with_table(s)),
            Self::Mysql(s) => Arc::new(ShardMappingStore::with_table(s)),
        }
    }
}

/// Opens one backend named in `file` (`what`: "shard east", "mapping").
async fn open_backend(file: &Path, what: &str, b: &Backend) -> Result<Opened, ConfigError> {
    let (url, schema) = b.parts();
    let invalid = |w: String| ConfigError::Invalid {
        file: file.to_owned(),
        what: w,
    };
    let backend = |source| ConfigError::Backend {
        file: file.to_owned(),
        what: what.to_owned(),
        url: url.to_owned(),
        source,
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Opened::Postgres(
            PostgresShard::connect(url, schema).await.map_err(backend)?,
        ));
    }
    if schema.is_some() {
        return Err(invalid(format!(
            "{what}: a schema is only for a postgres:// URL"
        )));
    }
    if url.starts_with("mysql://") {
        return Ok(Opened::Mysql(
            MysqlShard::connect(url).await.map_err(backend)?,
        ));
    }
    if url.contains("://") {
        return Err(invalid(format!(
            "{what}: unsupported URL {url:?} (a SQLite path, postgres:// or mysql://)"
        )));
    }
    let path = url.strip_prefix("sqlite:").unwrap_or(url);
    if path.is_empty() {
        return Err(invalid(format!("{what}: empty SQLite path")));
    }
    let path = file
        .parent()
        .map_or_else(|| PathBuf::from(path), |dir| dir.join(path));
    // SQLite would create a missing file: refuse it before opening.
    if !path.is_file() {
        return Err(invalid(format!("{what}: {}: no such file", path.display())));
    }
    SqliteShard::open(&path)
        .map(Opened::Sqlite)
        .map_err(|e| backend(Box::new(e)))
}

/// The router the config file `file` describes, on `clock`. Writes
/// nothing.
///
/// # Errors
/// A missing or malformed file, an unknown field, a backend that cannot be
/// opened or reached, a configuration the router refuses.
pub(crate) async fn open(file: &Path, clock: Arc<dyn Clock>) -> Result<Router, ConfigError> {
    let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
        file: file.to_owned(),
        source,
    })?;
    let c: ConfigFile = serde_json::from_str(&text).map_err(|source| ConfigError::Parse {
        file: file.to_owned(),
        source,
    })?;
    let mapping = open_backend(file, "mapping", &c.mapping).await?.mapping();
    let mut config = MigrationConfig::new(mapping)
        .clock(clock)
        // An operator tool reads the mapping fresh on every call.
        .mapping_cache_ttl_ms(0)
        .placement(match c.placement {
            PlacementName::Mapped => Placement::Mapped,
            PlacementName::Computed => Placement::Computed,
        });
    for (name, b) in &c.shards {
        let shard = open_backend(file, &format!("shard {name}"), b).await?;
        config = config.shard(name.clone(), shard.shard());
    }
    if let Some(j) = c.journal_shard {
        config = config.journal_shard(j);
    }
    if let Some(s) = c.journal_scope {
        config = config.journal_scope(s);
    }
    if let Some(d) = c.clock_domain {
        config = config.clock_domain(d);
    }
    for (table, key_column) in c.tables {
        config = config.table_with_key_column(table, key_column);
    }
    Router::new(config).map_err(|source| ConfigError::Router {
        file: file.to_owned(),
        source: Box::new(source),
    })
}
