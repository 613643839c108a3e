//! The PostgreSQL outbox's error type.

use durability_outbox::OutboxError;
use tokio_postgres::error::SqlState;

/// Everything that can go wrong with the PostgreSQL outbox.
///
/// Definite failures ([`Self::InvalidName`], [`Self::Outbox`],
/// [`Self::Rejected`], [`Self::Unavailable`]) applied nothing.
/// [`Self::OutcomeUnknown`] is a commit whose reply was lost: it may or may
/// not have landed, and is never reported as a failure (an unsettled entry
/// is delivered again after its claim's deadline).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgOutboxError {
    /// A schema or table name outside the accepted grammar; nothing was
    /// sent to the server.
    #[error("invalid {what} name {name:?}: {reason}")]
    InvalidName {
        /// `schema` or `table`.
        what: &'static str,
        /// The refused name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The outbox refused the input (a bad channel, key, value or policy)
    /// or found a corrupt version; nothing was written.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// The server refused a statement; the transaction rolled back (or, in
    /// the caller's own transaction, must be rolled back).
    #[error("the server refused the statement ({}): {source}", sqlstate.as_deref().unwrap_or("no SQLSTATE"))]
    Rejected {
        /// The server's SQLSTATE, when it sent one.
        sqlstate: Option<String>,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The server could not be reached, or the connection was lost before
    /// a commit was sent: nothing was applied.
    #[error("the server is unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The connection was lost while a commit was in flight: it may or may
    /// not have landed.
    #[error("the outcome of the commit is unknown: {0}")]
    OutcomeUnknown(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A stored row failed strict decoding (it is quarantined when next
    /// due).
    #[error("corrupt outbox row: {0}")]
    Corrupt(String),
}

impl PgOutboxError {
    /// Whether retrying the same call can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Outbox(e) => e.is_retryable(),
            Self::Rejected { sqlstate, .. } => {
                let retry = [
                    SqlState::T_R_SERIALIZATION_FAILURE,
                    SqlState::T_R_DEADLOCK_DETECTED,
                ];
                retry.iter().any(|c| sqlstate.as_deref() == Some(c.code()))
            }
            Self::Unavailable(_) | Self::OutcomeUnknown(_) => true,
            Self::InvalidName { .. } | Self::Corrupt(_) => false,
        }
    }

    /// Whether the outcome is unknown (the commit may have landed).
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, Self::OutcomeUnknown(_))
    }

    /// A failed statement (not a commit): the server's refusal is definite;
    /// a lost connection applied nothing either, since nothing committed.
    pub(crate) fn statement(e: tokio_postgres::Error) -> Self {
        let sqlstate = e.code().map(|c| c.code().to_owned());
        Self::classify(sqlstate, e.as_db_error().is_some(), false, Box::new(e))
    }

    /// A failed commit: a refusal is definite; a lost reply, or the
    /// connection ended by the server (classes `08` connection exception
    /// and `57` operator intervention), is unknown.
    pub(crate) fn commit(e: tokio_postgres::Error) -> Self {
        let sqlstate = e.code().map(|c| c.code().to_owned());
        Self::classify(sqlstate, e.as_db_error().is_some(), true, Box::new(e))
    }

    /// A failed sqlx statement in the caller's transaction.
    #[cfg(feature = "sqlx")]
    pub(crate) fn sqlx(e: sqlx::Error) -> Self {
        let sqlstate = match &e {
            sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
            _ => None,
        };
        let from_server = matches!(e, sqlx::Error::Database(_));
        Self::classify(sqlstate, from_server, false, Box::new(e))
    }

    fn classify(
        sqlstate: Option<String>,
        from_server: bool,
        commit: bool,
        source: Box<dyn std::error::Error + Send + Sync>,
    ) -> Self {
        let code = sqlstate.as_deref().unwrap_or("");
        if code == SqlState::SEQUENCE_GENERATOR_LIMIT_EXCEEDED.code() {
            return Self::Outbox(OutboxError::VersionsExhausted);
        }
        let ended = code.starts_with("08") || code.starts_with("57");
        match (from_server && !ended, commit) {
            (true, _) => Self::Rejected { sqlstate, source },
            (false, true) => Self::OutcomeUnknown(source),
            (false, false) => Self::Unavailable(source),
        }
    }
}

durability_time::error_codes! {
    PgOutboxError {
        Self::InvalidName { .. } => "PG_OUTBOX_INVALID_NAME",
        Self::Outbox(e) => e.code(),
        Self::Rejected { .. } => "PG_OUTBOX_REJECTED",
        Self::Unavailable(_) => "PG_OUTBOX_UNAVAILABLE",
        Self::OutcomeUnknown(_) => "PG_OUTBOX_OUTCOME_UNKNOWN",
        Self::Corrupt(_) => "OUTBOX_CORRUPT",
    }
}

impl From<deadpool_postgres::PoolError> for PgOutboxError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Self::Unavailable(Box::new(e))
    }
}
