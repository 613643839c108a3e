//! The one connection opener of this crate: every SQLite file it opens gets
//! its pragmas (WAL, `synchronous`, busy timeout) here, as parameters.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

/// SQLite's `synchronous` setting for a WAL database.
///
/// `Full` (the default) syncs the WAL on every commit: a committed
/// transaction survives power loss. `Normal` syncs only at checkpoints: a
/// commit survives a process crash but the last transactions before a power
/// loss or OS crash can roll back, which for an outbox means staged entries
/// (and the application rows staged with them) vanish together, never one
/// without the other. `Off` leaves syncing to the OS and is for tests only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// Survives power loss: fsync on every commit.
    #[default]
    Full,
    /// Survives process crashes; may lose the last commits on power loss.
    Normal,
    /// No syncing: tests and throwaway data only.
    Off,
}

impl Synchronous {
    /// The pragma value.
    pub fn pragma(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
            Self::Off => "OFF",
        }
    }
}

/// The pragmas [`open_connection`] sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionOptions {
    /// Put the database in WAL mode (and fail if it refuses).
    pub wal: bool,
    /// Durability of commits.
    pub synchronous: Synchronous,
    /// How long a statement waits for another connection's lock.
    pub busy_timeout: Duration,
}

/// Opening or configuring a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A SQLite call failed.
    #[error("{step}: {source}")]
    Sqlite {
        /// What was being done.
        step: &'static str,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// The database did not switch to WAL mode.
    #[error("database refused WAL mode (got {0})")]
    NotWal(String),
}

durability_time::error_codes! {
    OpenError {
        Self::Sqlite { .. } => "SQLITE_OPEN_FAILED",
        Self::NotWal(_) => "SQLITE_NOT_WAL",
    }
}

fn step(step: &'static str) -> impl FnOnce(rusqlite::Error) -> OpenError {
    move |source| OpenError::Sqlite { step, source }
}

/// Prepared statements cached per connection.
const STATEMENT_CACHE: usize = 64;

/// Opens (creating if needed) the SQLite file at `path` with `options`.
///
/// # Errors
/// [`OpenError`] when the file cannot be opened or a pragma cannot be set.
pub fn open_connection(
    path: impl AsRef<Path>,
    options: &ConnectionOptions,
) -> Result<Connection, OpenError> {
    let conn = Connection::open(path).map_err(step("open database"))?;
    configure(&conn, options)?;
    Ok(conn)
}

/// Sets `options` on an open connection.
///
/// # Errors
/// [`OpenError`] when a pragma cannot be set.
pub fn configure(conn: &Connection, options: &ConnectionOptions) -> Result<(), OpenError> {
    // Every hot statement of the crate is prepared once per connection; an
    // object database serves the scheduler, the fence, alarms and the
    // outbox, more than rusqlite's default of 16.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(options.busy_timeout)
        .map_err(step("set busy timeout"))?;
    if options.wal {
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(step("enable WAL"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(OpenError::NotWal(mode));
        }
    }
    conn.pragma_update(None, "synchronous", options.synchronous.pragma())
        .map_err(step("set synchronous"))
}
