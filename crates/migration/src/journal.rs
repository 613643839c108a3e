//! The journal: operation rows (each active one holding its key's claim)
//! and the recovery lease, on the journal shard. Their statements are
//! generated per dialect by `dialect::JournalSql`.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{MigrationError, Result};
use crate::value::{Row, Value};

/// How long a live move's claim on its operation lasts without a step (ms).
/// Recovery skips an operation whose mover stepped more recently: by the
/// recorded deadline when the mover reads its clock (its clock domain),
/// otherwise by seeing the row unchanged for this long on its own clock.
pub const MOVE_LIVENESS_MS: u64 = 30_000;
/// How long a recovery lease lasts without renewal (ms).
pub const RECOVERY_LEASE_MS: u64 = 60_000;
/// How many times a missed cutover copies again before the move aborts.
pub const MAX_RECOPIES: i64 = 3;
/// Default retention of archived source rows (seven days, ms).
pub const DEFAULT_RETENTION_MS: u64 = 7 * 24 * 60 * 60 * 1000;

/// A state of a move operation (serialized as its stored name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveState {
    /// Claimed, snapshot digested; the copy follows.
    Prepared,
    /// Copied to the destination.
    Copied,
    /// Destination digest matched.
    Verified,
    /// The source cutover is about to run (or ran).
    CutoverPending,
    /// The source cutover archived and deleted the rows.
    Committed,
    /// The mapping points at the destination.
    Published,
    /// Finished; the archive is kept until its retention deadline.
    Retired,
    /// Ended without moving the key.
    Aborted,
}

impl MoveState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prepared => "prepared",
            Self::Copied => "copied",
            Self::Verified => "verified",
            Self::CutoverPending => "cutover_pending",
            Self::Committed => "committed",
            Self::Published => "published",
            Self::Retired => "retired",
            Self::Aborted => "aborted",
        }
    }

    /// Parses a stored name.
    ///
    /// # Errors
    /// `CORRUPT_RECORD` for an unknown name.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "prepared" => Self::Prepared,
            "copied" => Self::Copied,
            "verified" => Self::Verified,
            "cutover_pending" => Self::CutoverPending,
            "committed" => Self::Committed,
            "published" => Self::Published,
            "retired" => Self::Retired,
            "aborted" => Self::Aborted,
            other => return Err(MigrationError::Corrupt(format!("unknown state {other:?}"))),
        })
    }

    /// Whether the operation has ended.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Retired | Self::Aborted)
    }
}

impl fmt::Display for MoveState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One journaled operation, as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpRecord {
    /// Operation id (UUID v7).
    pub op_id: String,
    /// Journal scope.
    pub scope: String,
    /// The key.
    pub key: String,
    /// The tables moved together.
    pub tables: Vec<String>,
    /// Source shard.
    pub source: String,
    /// Destination shard.
    pub target: String,
    /// Latest recorded state.
    pub state: MoveState,
    /// Missed cutovers so far.
    pub attempts: i64,
    /// Snapshot digest per table (`-` when the key had no row there).
    pub digests: BTreeMap<String, String>,
    /// The mover (or recovery) that owns the operation.
    pub owner: String,
    /// Until when the owner is considered live (Unix ms).
    pub live_until_ms: i64,
    /// Retention period of the archive (ms).
    pub retain_ms: i64,
    /// Retention deadline, set when retired.
    pub retire_at_ms: Option<i64>,
    /// Created (Unix ms).
    pub created_ms: i64,
    /// Last step (Unix ms).
    pub updated_ms: i64,
    /// Finished (Unix ms), set when retired or aborted.
    pub finished_ms: Option<i64>,
    /// Whether the archive payload was purged.
    pub purged: bool,
    /// Whether a verification pass examined the finished operation (its
    /// tombstones, copy and mapping) and found nothing on its key: later
    /// passes skip it unless they are full, and purge requires it.
    pub verified: bool,
    /// Why it aborted, if it did.
    pub error: Option<String>,
}

pub(crate) fn encode_digests(d: &BTreeMap<String, String>) -> String {
    d.iter()
        .map(|(t, h)| format!("{t}={h}"))
        .collect::<Vec<_>>()
        .join(";")
}

fn decode_digests(s: &str) -> Result<BTreeMap<String, String>> {
    s.split(';')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| MigrationError::Corrupt(format!("digest entry {p:?}")))
        })
        .collect()
}

/// A text column; byte columns holding UTF-8 (MySQL `VARBINARY` keys) read
/// as text.
pub(crate) fn text(row: &Row, col: &str) -> Result<String> {
    match row.get(col) {
        Some(Value::Text(s)) => Ok(s.clone()),
        Some(Value::Blob(b)) if std::str::from_utf8(b).is_ok() => {
            Ok(String::from_utf8_lossy(b).into_owned())
        }
        other => Err(MigrationError::Corrupt(format!("column {col}: {other:?}"))),
    }
}

/// A text column that may be NULL (or absent).
pub(crate) fn opt_text(row: &Row, col: &str) -> Result<Option<String>> {
    match row.get(col) {
        Some(Value::Null) | None => Ok(None),
        Some(_) => text(row, col).map(Some),
    }
}

pub(crate) fn int(row: &Row, col: &str) -> Result<i64> {
    match row.get(col) {
        Some(Value::Integer(i)) => Ok(*i),
        other => Err(MigrationError::Corrupt(format!("column {col}: {other:?}"))),
    }
}

pub(crate) fn opt_int(row: &Row, col: &str) -> Result<Option<i64>> {
    match row.get(col) {
        Some(Value::Null) | None => Ok(None),
        Some(Value::Integer(i)) => Ok(Some(*i)),
        other => Err(MigrationError::Corrupt(format!("column {col}: {other:?}"))),
    }
}

impl OpRecord {
    pub(crate) fn from_row(row: &Row) -> Result<Self> {
        Ok(Self {
            op_id: text(row, "op_id")?,
            scope: text(row, "scope")?,
            key: text(row, "mkey")?,
            tables: text(row, "tables")?.split(',').map(str::to_owned).collect(),
            source: text(row, "source")?,
            target: text(row, "target")?,
            state: MoveState::parse(&text(row, "state")?)?,
            attempts: int(row, "attempts")?,
            digests: decode_digests(&text(row, "digests")?)?,
            owner: text(row, "owner")?,
            live_until_ms: int(row, "live_until_ms")?,
            retain_ms: int(row, "retain_ms")?,
            retire_at_ms: opt_int(row, "retire_at_ms")?,
            created_ms: int(row, "created_ms")?,
            updated_ms: int(row, "updated_ms")?,
            finished_ms: opt_int(row, "finished_ms")?,
            purged: int(row, "purged")? != 0,
            verified: int(row, "verified")? != 0,
            error: match row.get("error") {
                Some(Value::Text(s)) => Some(s.clone()),
                _ => None,
            },
        })
    }
}

/// Who may write an operation's journal rows: its owner, and for a recovery
/// also the holder of the scope's lease at a generation.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub(crate) owner: String,
    pub(crate) lease: Option<(String, i64)>,
}

/// A state change of one operation.
#[derive(Debug, Clone, Default)]
pub(crate) struct Change {
    pub(crate) attempts: Option<i64>,
    pub(crate) digests: Option<String>,
    pub(crate) finished: bool,
    pub(crate) retire_at_ms: Option<i64>,
    pub(crate) error: Option<String>,
    /// The state becomes `committed` instead when this operation's archive
    /// row of this key exists in the same database: the cutover and its
    /// journal write share one batch, and this write is the batch's last.
    pub(crate) committed_if_archived: Option<String>,
}

/// Which operations a page selects.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OpFilter {
    Active,
    State(MoveState),
    /// Retired operations not purged, with the `verified` mark as given
    /// (one range of the history index).
    Unpurged {
        verified: bool,
    },
    /// Finished operations no verification pass has examined, with the
    /// `purged` mark as given (one range of the history index; only a
    /// journal purged before verification marks existed has purged ones).
    Unverified {
        purged: bool,
    },
    /// Every finished operation.
    Finished,
    /// Every operation of the scope (read-only listings).
    All,
}
