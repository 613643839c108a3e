//! What the object side keeps in the object's own storage: the
//! [`AlarmTx`] trait a backend implements on its transaction type, and the
//! one alarm row.

use durability_scheduler::{SchedulerTx, StorageError};

use crate::token::Token;

/// The object's alarm row.
///
/// `token` is the row token the backend job carries. A pending delete keeps
/// the row with `fence` set: deliveries of `token` are then refused (a stale
/// delivery can never run a deleted alarm) until the backend delete settles
/// and the row is removed, or fails and the fence is cleared again (token-
/// fenced compensation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlarmRow {
    /// When the alarm is scheduled (Unix ms, safe integer).
    pub at: i64,
    /// The row token.
    pub token: Token,
    /// The fence token of a pending delete (stored as `in_flight = 1`).
    pub fence: Option<Token>,
}

impl AlarmRow {
    /// Whether the row is a live alarm (not a pending delete).
    pub fn is_pending(&self) -> bool {
        self.fence.is_none()
    }
}

/// The alarm row in an object's storage.
///
/// Every method runs inside the caller's transaction; compare-and-set rules
/// are applied by the alarms crate reading and writing in one transaction.
pub trait AlarmTx: SchedulerTx {
    /// The object's alarm row, if any.
    ///
    /// # Errors
    /// A backend failure, or a stored row that fails validation
    /// (`StorageErrorKind::Corrupt`).
    fn alarm_row(&mut self) -> Result<Option<AlarmRow>, StorageError>;

    /// Writes the object's alarm row, replacing any.
    ///
    /// # Errors
    /// A backend failure.
    fn put_alarm_row(&mut self, row: &AlarmRow) -> Result<(), StorageError>;

    /// Removes the object's alarm row; whether there was one.
    ///
    /// # Errors
    /// A backend failure.
    fn delete_alarm_row(&mut self) -> Result<bool, StorageError>;

    /// The row's token and fence only, validated; the scheduled time (and
    /// any other field) is not read, so a row whose time is corrupt or
    /// legacy still answers. The default reads the whole row: sound for a
    /// backend that can only hold valid rows.
    ///
    /// # Errors
    /// A backend failure, or a token or fence that fails validation
    /// (`StorageErrorKind::Corrupt`).
    fn alarm_row_token(&mut self) -> Result<Option<(Token, Option<Token>)>, StorageError> {
        Ok(self.alarm_row()?.map(|r| (r.token, r.fence)))
    }

    /// Sets (or with `None` clears) the pending-delete fence of the row if it
    /// still carries `token`, writing nothing else (creating the fence updates only the token and
    /// `in_flight`, under the current token), so
    /// a row with a corrupt time stays deletable. Whether the row matched.
    /// The default reads and rewrites the whole row: sound for a backend
    /// that can only hold valid rows.
    ///
    /// # Errors
    /// A backend failure.
    fn set_alarm_fence(
        &mut self,
        token: &Token,
        fence: Option<&Token>,
    ) -> Result<bool, StorageError> {
        match self.alarm_row()? {
            Some(mut row) if &row.token == token => {
                row.fence = fence.cloned();
                self.put_alarm_row(&row)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}
