//! What the lease store and the alarm index share: the caller-chosen schema
//! their tables live in ([`SchemaName`]), the expression that reads the
//! server's clock, and one way to run a statement under a deadline that
//! tells a definite failure from an unknown outcome. Every error of a
//! store call starts with the store and the servers its URL names
//! (`the PostgreSQL lease store at 10.0.0.5:5432,10.0.0.6:5432: ...`),
//! never the user or the password.
//!
//! Both stores schema-qualify every table and function they name with the
//! quoted [`SchemaName`], so they never depend on a connection's
//! `search_path`. Their connections run at `READ COMMITTED` (forced in the
//! connection options): every statement takes the row locks it needs
//! (`FOR UPDATE`, `FOR SHARE`, `FOR UPDATE SKIP LOCKED`, transaction-scoped
//! advisory locks) and then reads the latest committed rows.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Config, NoTls, Row};

/// A boxed error kept as a source.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The server's clock in Unix milliseconds, read when the expression is
/// evaluated (`clock_timestamp()`, not the transaction start).
pub(crate) const SERVER_NOW_MS: &str =
    "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// How long one store call may take (getting a connection and one statement)
/// unless configured otherwise: the seed's 5-second alarm mutation deadline.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Default connection pool size of the lease store and the alarm index.
pub const DEFAULT_STORE_POOL_SIZE: usize = 4;

/// The longest schema name accepted (PostgreSQL's identifier limit).
pub const MAX_SCHEMA_NAME_BYTES: usize = 63;

/// A schema name the stores create their tables in: 1 to 63 bytes of
/// `[a-z0-9_]`, starting with a letter or `_`, and not `pg_…` (reserved by
/// PostgreSQL). The grammar needs no escaping; the stores quote it anyway.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SchemaName(String);

/// A schema name that breaks [`SchemaName`]'s grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid schema name {name:?}: {reason}")]
pub struct InvalidSchemaName {
    /// The refused name (at most its first 64 characters).
    pub name: String,
    /// Why it was refused.
    pub reason: &'static str,
}

impl SchemaName {
    /// Validates a schema name.
    ///
    /// # Errors
    /// [`InvalidSchemaName`] when it is empty, longer than
    /// [`MAX_SCHEMA_NAME_BYTES`], has a byte outside `[a-z0-9_]`, starts
    /// with a digit, or starts with `pg_`.
    pub fn new(raw: &str) -> Result<Self, InvalidSchemaName> {
        let reason = if raw.is_empty() {
            Some("must not be empty")
        } else if raw.len() > MAX_SCHEMA_NAME_BYTES {
            Some("must be at most 63 bytes")
        } else if !raw
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            Some("allowed characters are [a-z0-9_]")
        } else if raw.as_bytes()[0].is_ascii_digit() {
            Some("must not start with a digit")
        } else if raw.starts_with("pg_") {
            Some("names starting with pg_ are reserved")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(InvalidSchemaName {
                name: raw.chars().take(64).collect(),
                reason,
            }),
            None => Ok(Self(raw.to_owned())),
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a quoted identifier.
    pub(crate) fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

impl std::fmt::Display for SchemaName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A store's target: a `postgres://` URL and the schema its tables live
/// in, both checked before anything is sent; `Err` says what is wrong.
pub(crate) fn target(url: &str, schema: &str) -> Result<(Config, SchemaName), String> {
    let schema = SchemaName::new(schema).map_err(|e| e.to_string())?;
    let config: Config = url.parse().map_err(|e| format!("postgres url: {e}"))?;
    Ok((config, schema))
}

/// Why a store call failed, by what it proves about the store.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No connection could be had, or nothing was sent, or a read lost its
    /// reply: nothing was applied.
    NotApplied(BoxError),
    /// The server refused the statement (it rolled back): nothing was applied.
    Rejected(BoxError),
    /// The statement may have been applied: the connection was lost or the
    /// deadline passed after it was sent.
    Unknown(BoxError),
}

/// Whether a statement writes: a lost reply to a write is an unknown
/// outcome; a lost reply to a read changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

/// The servers a connection `config` names, as `host:port` (several
/// comma-separated, in the order tried; a Unix socket directory as its
/// path): what an error says about where the store is. Never the user or
/// the password.
pub(crate) fn servers(config: &Config) -> String {
    use tokio_postgres::config::Host;
    let ports = config.get_ports();
    let port = |i: usize| match ports {
        [] => 5432,
        [one] => *one,
        many => many.get(i).copied().unwrap_or(5432),
    };
    let hosts = config.get_hosts();
    if hosts.is_empty() {
        return format!("localhost:{}", port(0));
    }
    let named: Vec<String> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| match h {
            Host::Tcp(name) if name.contains(':') => format!("[{name}]:{}", port(i)),
            Host::Tcp(name) => format!("{name}:{}", port(i)),
            #[cfg(unix)]
            Host::Unix(dir) => format!("{}/.s.PGSQL.{}", dir.display(), port(i)),
        })
        .collect();
    named.join(",")
}

/// A store call's error with the store and its server address in front
/// (`the PostgreSQL lease store at 10.0.0.5:5432: ...`); the cause stays
/// its source.
#[derive(Debug)]
pub(crate) struct AtServer {
    at: std::sync::Arc<str>,
    source: BoxError,
}

impl std::fmt::Display for AtServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.at, self.source)
    }
}

impl std::error::Error for AtServer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// A pool of `READ COMMITTED` connections and a deadline per call.
#[derive(Clone)]
pub(crate) struct StoreClient {
    pool: Pool,
    timeout: Duration,
    /// `the PostgreSQL <store> at <servers>`, in front of every error.
    at: std::sync::Arc<str>,
}

durability_time::debug_fields!(StoreClient { timeout, at });

impl StoreClient {
    /// A pool of at most `size` connections made from `config`, each forced
    /// to `READ COMMITTED`, for `store` (`lease store`, `alarm index`: named
    /// with the servers' addresses in every error). Connections open lazily.
    pub(crate) fn new(mut config: Config, size: usize, store: &str) -> Result<Self, BoxError> {
        let at: std::sync::Arc<str> =
            format!("the PostgreSQL {store} at {}", servers(&config)).into();
        let opts = r"-c default_transaction_isolation=read\ committed";
        let opts = match config.get_options() {
            Some(o) if !o.is_empty() => format!("{o} {opts}"),
            _ => opts.to_owned(),
        };
        config.options(opts);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CALL_TIMEOUT);
        }
        let mgr = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr).max_size(size.max(1)).build()?;
        Ok(Self {
            pool,
            timeout: DEFAULT_CALL_TIMEOUT,
            at,
        })
    }

    /// `f` with the store and its servers in front of its message.
    fn named(&self, f: Failure) -> Failure {
        let at = |source| -> BoxError {
            Box::new(AtServer {
                at: std::sync::Arc::clone(&self.at),
                source,
            })
        };
        match f {
            Failure::NotApplied(e) => Failure::NotApplied(at(e)),
            Failure::Rejected(e) => Failure::Rejected(at(e)),
            Failure::Unknown(e) => Failure::Unknown(at(e)),
        }
    }

    pub(crate) fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A pooled connection, within the deadline; a failure here sent nothing.
    pub(crate) async fn connection(&self) -> Result<Object, Failure> {
        self.pooled().await.map_err(|f| self.named(f))
    }

    async fn pooled(&self) -> Result<Object, Failure> {
        match tokio::time::timeout(self.timeout, self.pool.get()).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(Failure::NotApplied(Box::new(e))),
            Err(_) => Err(Failure::NotApplied(
                "timed out waiting for a connection".into(),
            )),
        }
    }

    /// Runs one statement (prepared once per connection) within the
    /// deadline and returns its rows. A server error is [`Failure::Rejected`]
    /// (the statement rolled back); a lost connection or the deadline after
    /// a write was sent is [`Failure::Unknown`]. A connection that missed
    /// its deadline, or whose call was dropped (cancelled by the caller's
    /// own deadline) before its reply came, is closed, never handed out
    /// again: its statement may still be running, and the next call on it
    /// would queue behind it.
    pub(crate) async fn query(
        &self,
        access: Access,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Failure> {
        let mut held = Unfinished(Some(self.connection().await?));
        self.call(&mut held, access, sql, params)
            .await
            .map_err(|f| self.named(f))
    }

    /// [`Self::query`]'s statement on `held`.
    async fn call(
        &self,
        held: &mut Unfinished,
        access: Access,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Failure> {
        let outcome = {
            let client = held.client();
            let call = async {
                let st = client
                    .prepare_cached(sql)
                    .await
                    .map_err(|e| classify(Access::Read, e))?;
                client
                    .query(&st, params)
                    .await
                    .map_err(|e| classify(access, e))
            };
            tokio::time::timeout(self.timeout, call).await
        };
        match outcome {
            Ok(r) => {
                held.finished();
                r
            }
            Err(_) => {
                // `held` stays unfinished: the caller's drop closes it.
                let e: BoxError = format!(
                    "no reply within {} ms: the connection was closed",
                    self.timeout.as_millis()
                )
                .into();
                Err(match access {
                    Access::Write => Failure::Unknown(e),
                    Access::Read => Failure::NotApplied(e),
                })
            }
        }
    }

    /// Runs semicolon-separated statements without parameters in one
    /// transaction (schema setup), within the deadline (past it the
    /// outcome is unknown: the connection is closed).
    pub(crate) async fn batch(&self, sql: &str) -> Result<(), Failure> {
        let mut held = Unfinished(Some(self.connection().await?));
        let done = tokio::time::timeout(self.timeout, held.client().batch_execute(sql)).await;
        let done = match done {
            Ok(Ok(())) => {
                held.finished();
                Ok(())
            }
            // The connection may be left inside the failed transaction:
            // `held` closes it.
            Ok(Err(e)) => Err(classify(Access::Write, e)),
            Err(_) => Err(Failure::Unknown(
                format!(
                    "no reply within {} ms: the connection was closed",
                    self.timeout.as_millis()
                )
                .into(),
            )),
        };
        done.map_err(|f| self.named(f))
    }
}

/// A pooled connection with a call on it: dropped before
/// [`Unfinished::finished`] (the deadline passed, or the caller dropped the
/// call), the connection is closed rather than returned to the pool.
struct Unfinished(Option<Object>);

impl Unfinished {
    fn client(&self) -> &Object {
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("taken only by finished or drop"))
    }

    /// The call ended with a reply: the connection goes back to the pool.
    fn finished(&mut self) {
        self.0.take();
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(Object::take(client));
        }
    }
}

/// A server error rolled its statement back; anything else after the
/// statement was handed to the connection leaves a write unknown.
fn classify(access: Access, e: tokio_postgres::Error) -> Failure {
    if e.as_db_error().is_some() {
        Failure::Rejected(Box::new(e))
    } else if access == Access::Read {
        Failure::NotApplied(Box::new(e))
    } else {
        Failure::Unknown(Box::new(e))
    }
}

/// The statements that create a schema's objects in one transaction, under
/// a transaction-scoped advisory lock per schema, so concurrent setups of
/// one schema (lease store and alarm index alike) wait for each other
/// instead of failing.
pub(crate) fn in_setup_transaction(schema: &SchemaName, body: &str) -> String {
    format!(
        "BEGIN;\nSELECT pg_advisory_xact_lock(hashtextextended('durability-setup:{name}', 0));\n\
         CREATE SCHEMA IF NOT EXISTS {quoted};\n{body}\nCOMMIT;\n",
        name = schema.as_str(),
        quoted = schema.quoted(),
    )
}

#[cfg(test)]
mod tests;
