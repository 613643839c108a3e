//! Read-only inspection of an object database, for operators.
//!
//! [`inspect_object`] opens an existing file read-only (it never creates
//! the file, a table or a row, and never changes the journal mode), checks
//! that it is an object database (it holds the scheduler's tables) and
//! reads the scheduler's rows into a [`durability_scheduler::ObjectReport`].

use std::path::{Path, PathBuf};

use durability_scheduler::ObjectReport;
use rusqlite::{Connection, OpenFlags, OptionalExtension};

/// The tables every object database holds (created by [`crate::SqliteStorage::open`]).
const SCHEDULER_TABLES: [&str; 3] = [
    "durability_schema",
    "durability_scheduler_due",
    "durability_scheduler_alarm",
];

/// Why an object database could not be inspected. Nothing was written in
/// any case.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    /// No file exists at the path.
    #[error("{}: no such file", path.display())]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The file is not a SQLite database, or lacks the scheduler's tables.
    #[error("{}: not an object database ({reason})", path.display())]
    NotObjectDatabase {
        /// The path given.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// The file is not a SQLite database, or lacks the lease store's table.
    #[error("{}: not a lease store database ({reason})", path.display())]
    NotLeaseStore {
        /// The path given.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// A stored row could not be decoded.
    #[error("{}: corrupt row: {detail}", path.display())]
    Corrupt {
        /// The path given.
        path: PathBuf,
        /// Which row, and what is wrong with it.
        detail: String,
    },
    /// SQLite failed to open or read the file.
    #[error("{}: {context}: {source}", path.display())]
    Sqlite {
        /// The path given.
        path: PathBuf,
        /// What was being done.
        context: &'static str,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
}

impl InspectError {
    /// A stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "SQLITE_INSPECT_NOT_FOUND",
            Self::NotObjectDatabase { .. } => "SQLITE_INSPECT_NOT_OBJECT_DATABASE",
            Self::NotLeaseStore { .. } => "SQLITE_INSPECT_NOT_LEASE_STORE",
            Self::Corrupt { .. } => "SQLITE_INSPECT_CORRUPT",
            Self::Sqlite { .. } => "SQLITE_INSPECT_SQLITE",
        }
    }
}

/// Opens the object database at `path` read-only: the file must exist and
/// hold the scheduler's tables. Nothing is created or changed (SQLite may
/// read, but not write, the database's WAL).
///
/// # Errors
/// [`InspectError::NotFound`] for a missing file,
/// [`InspectError::NotObjectDatabase`] for a file that is not a SQLite
/// database or has no scheduler tables, [`InspectError::Sqlite`] when SQLite
/// fails.
pub fn open_object_read_only(path: &Path) -> Result<Connection, InspectError> {
    open_with_tables(path, &SCHEDULER_TABLES, |reason| {
        InspectError::NotObjectDatabase {
            path: path.to_owned(),
            reason,
        }
    })
}

/// The error of SQLite failing at `context` on the file at `path`.
fn sqlite_at(path: &Path, context: &'static str) -> impl FnOnce(rusqlite::Error) -> InspectError {
    let path = path.to_owned();
    move |source| InspectError::Sqlite {
        path,
        context,
        source,
    }
}

/// Opens the file at `path` read-only and checks that it holds every table
/// of `tables`; `not_kind(reason)` is the error for a file that is not a
/// SQLite database or lacks one of them.
fn open_with_tables(
    path: &Path,
    tables: &[&str],
    not_kind: impl Fn(String) -> InspectError,
) -> Result<Connection, InspectError> {
    if !path.is_file() {
        return Err(InspectError::NotFound {
            path: path.to_owned(),
        });
    }
    let sqlite = |context| sqlite_at(path, context);
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite("open read-only"))?;
    for table in tables {
        let found: Option<String> = conn
            .query_row(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .optional()
            .map_err(|source| match source.sqlite_error_code() {
                Some(rusqlite::ErrorCode::NotADatabase) => {
                    not_kind("not a SQLite database".to_owned())
                }
                _ => sqlite("list tables")(source),
            })?;
        if found.is_none() {
            return Err(not_kind(format!("no table {table}")));
        }
    }
    Ok(conn)
}

/// Reads the scheduler's rows of the object database at `path` (opened with
/// [`open_object_read_only`]) into a report taken at `now_ms`.
///
/// # Errors
/// The errors of [`open_object_read_only`], and
/// [`InspectError::Corrupt`] for a row whose values are out of range or of
/// the wrong type.
pub fn inspect_object(path: &Path, now_ms: i64) -> Result<ObjectReport, InspectError> {
    let conn = open_object_read_only(path)?;
    let tx = conn
        .unchecked_transaction()
        .map_err(|source| InspectError::Sqlite {
            path: path.to_owned(),
            context: "begin read",
            source,
        })?;
    let versions = read_rows::<u32>(
        &tx,
        path,
        "SELECT capability, version FROM durability_schema ORDER BY capability",
        "schema version",
    )?;
    let dues = read_rows::<i64>(
        &tx,
        path,
        "SELECT capability, due FROM durability_scheduler_due ORDER BY capability",
        "due time",
    )?;
    let alarm: Option<i64> = tx
        .query_row(
            "SELECT at FROM durability_scheduler_alarm WHERE id = 0",
            [],
            |r| r.get::<_, Option<i64>>(0),
        )
        .optional()
        .map(Option::flatten)
        .map_err(|e| corrupt_or_sqlite(path, "read alarm", "alarm", e))?;
    Ok(ObjectReport::new(now_ms, alarm, versions, dues))
}

fn read_rows<T: rusqlite::types::FromSql>(
    conn: &Connection,
    path: &Path,
    sql: &str,
    what: &'static str,
) -> Result<Vec<(String, T)>, InspectError> {
    let mut st = conn.prepare(sql).map_err(|source| InspectError::Sqlite {
        path: path.to_owned(),
        context: what,
        source,
    })?;
    let mut rows = st.query([]).map_err(|source| InspectError::Sqlite {
        path: path.to_owned(),
        context: what,
        source,
    })?;
    let mut out = Vec::new();
    while let Some(row) = rows
        .next()
        .map_err(|e| corrupt_or_sqlite(path, what, what, e))?
    {
        let name: String = row
            .get(0)
            .map_err(|e| corrupt_or_sqlite(path, what, what, e))?;
        let value: T = row.get(1).map_err(|e| {
            corrupt_or_sqlite(path, what, &format!("{what} of capability {name:?}"), e)
        })?;
        out.push((name, value));
    }
    Ok(out)
}

/// A value that does not decode is a corrupt row; anything else is SQLite.
fn corrupt_or_sqlite(
    path: &Path,
    context: &'static str,
    row: &str,
    e: rusqlite::Error,
) -> InspectError {
    match e {
        rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::FromSqlConversionFailure(..) => InspectError::Corrupt {
            path: path.to_owned(),
            detail: format!("{row}: {e}"),
        },
        source => InspectError::Sqlite {
            path: path.to_owned(),
            context,
            source,
        },
    }
}

/// Lists up to `limit` stored outbox rows of the object database at `path`
/// (opened with [`open_object_read_only`]), of one channel or of all, by
/// channel then key, with their state at `now_ms` and the quarantine counts.
/// Each row is decoded strictly and on its own: a corrupt row is listed as
/// corrupt among the healthy ones. An object without outbox tables lists
/// nothing.
///
/// # Errors
/// The errors of [`open_object_read_only`]; [`InspectError::Sqlite`] when a
/// read fails.
#[cfg(feature = "outbox")]
pub fn outbox_entries(
    path: &Path,
    channel: Option<&str>,
    now_ms: i64,
    limit: usize,
) -> Result<durability_outbox::admin::OutboxListing, InspectError> {
    use durability_outbox::admin::{EntryReport, OutboxListing, QuarantineCount};
    let conn = open_object_read_only(path)?;
    let sqlite = |context| sqlite_at(path, context);
    let tx = conn.unchecked_transaction().map_err(sqlite("begin read"))?;
    let has_outbox: bool = tx
        .query_row(
            "SELECT COUNT(*) = 2 FROM sqlite_master WHERE type = 'table'
             AND name IN ('durability_outbox', 'durability_outbox_quarantine')",
            [],
            |r| r.get(0),
        )
        .map_err(sqlite("list tables"))?;
    let mut listing = OutboxListing {
        now_ms,
        entries: Vec::new(),
        quarantined: Vec::new(),
        truncated: false,
    };
    if !has_outbox {
        return Ok(listing);
    }
    // One more than asked, to tell whether the listing is complete.
    let fetch = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
    let columns = crate::outbox::COLUMNS;
    let mut st = tx
        .prepare(&format!(
            "SELECT {columns} FROM durability_outbox
             WHERE ?1 IS NULL OR channel = ?1 ORDER BY channel, key LIMIT ?2"
        ))
        .map_err(sqlite("list outbox entries"))?;
    let rows = st
        .query_map(rusqlite::params![channel, fetch], crate::outbox::row)
        .and_then(Iterator::collect::<rusqlite::Result<Vec<_>>>)
        .map_err(sqlite("list outbox entries"))?;
    listing.truncated = rows.len() > limit;
    listing.entries = rows
        .iter()
        .take(limit)
        .map(|row| EntryReport::from_row(row, now_ms))
        .collect();
    let mut st = tx
        .prepare(
            "SELECT channel, COUNT(*) FROM durability_outbox_quarantine
             WHERE ?1 IS NULL OR channel = ?1 GROUP BY channel ORDER BY channel",
        )
        .map_err(sqlite("count quarantined rows"))?;
    listing.quarantined = st
        .query_map([channel], |r| {
            Ok(QuarantineCount {
                channel: r.get(0)?,
                rows: r.get::<_, i64>(1)?.unsigned_abs(),
            })
        })
        .and_then(Iterator::collect::<rusqlite::Result<Vec<_>>>)
        .map_err(sqlite("count quarantined rows"))?;
    Ok(listing)
}

/// Lists up to `limit` live owner leases of the lease store file at `path`
/// (a `SqliteLeaseStore` database), opened read-only, by scope, starting
/// after the scope `after` (a previous page's cursor). `now_ms` is the
/// store's time: the SQLite store runs its leases on the clock of the
/// processes that use it, so pass that clock's reading. Leases expired at
/// `now_ms` are not listed. Each record is decoded strictly with `count`
/// shards; an invalid one is listed with its problem.
///
/// # Errors
/// [`InspectError::NotFound`] for a missing file,
/// [`InspectError::NotLeaseStore`] for a file that is not SQLite or has no
/// lease table, [`InspectError::Corrupt`] for a row whose columns have the
/// wrong type, [`InspectError::Sqlite`] when a read fails.
#[cfg(feature = "ownership")]
pub fn leases(
    path: &Path,
    now_ms: i64,
    count: durability_ownership::ShardCount,
    after: Option<&str>,
    limit: usize,
) -> Result<durability_ownership::listing::LeaseListing, InspectError> {
    use durability_ownership::listing::{LeaseListing, LeaseReport};
    let conn = open_with_tables(path, &["durability_owner_leases"], |reason| {
        InspectError::NotLeaseStore {
            path: path.to_owned(),
            reason,
        }
    })?;
    let sqlite = |context| sqlite_at(path, context);
    let fetch = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
    let mut st = conn
        .prepare(
            "SELECT scope, record, expires_at_ms FROM durability_owner_leases
             WHERE (?1 IS NULL OR scope > ?1) AND expires_at_ms > ?2
             ORDER BY scope LIMIT ?3",
        )
        .map_err(sqlite("list leases"))?;
    let mut rows = st
        .query(rusqlite::params![after, now_ms, fetch])
        .map_err(sqlite("list leases"))?;
    let mut leases = Vec::new();
    let mut more = false;
    while let Some(row) = rows
        .next()
        .map_err(|e| corrupt_or_sqlite(path, "list leases", "lease", e))?
    {
        if leases.len() == limit {
            more = true;
            break;
        }
        let scope: String = row
            .get(0)
            .map_err(|e| corrupt_or_sqlite(path, "list leases", "lease scope", e))?;
        let what = format!("lease of {scope}");
        let record: Vec<u8> = row
            .get(1)
            .map_err(|e| corrupt_or_sqlite(path, "list leases", &what, e))?;
        let expires: i64 = row
            .get(2)
            .map_err(|e| corrupt_or_sqlite(path, "list leases", &what, e))?;
        let left = u64::try_from(expires.saturating_sub(now_ms)).unwrap_or(0);
        leases.push(LeaseReport::from_stored(&scope, &record, left, count));
    }
    let cursor = if more {
        leases.last().map(|l| l.scope.clone())
    } else {
        None
    };
    Ok(LeaseListing { leases, cursor })
}
