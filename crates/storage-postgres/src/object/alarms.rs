//! The object side of alarms (`AlarmTx`): the object's alarm row in the
//! shared `durability_object_alarm_row` table, decoded strictly.

use durability_alarms::{AlarmRow, AlarmTx, Token, validate_time};
use durability_scheduler::StorageError;

use super::rows::get;
use super::tx::PostgresObjectTx;

fn corrupt(what: &str, e: impl std::fmt::Display) -> StorageError {
    StorageError::corrupt(format!("alarm row {what}: {e}"))
}

fn token(what: &str, raw: String) -> Result<Token, StorageError> {
    Token::new(raw).map_err(|e| corrupt(what, e))
}

impl AlarmTx for PostgresObjectTx<'_> {
    fn alarm_row(&mut self) -> Result<Option<AlarmRow>, StorageError> {
        let Some(row) = self.row(
            "read alarm row",
            "SELECT at, token, fence FROM {s}.durability_object_alarm_row WHERE object_id = $1",
            &[],
        )?
        else {
            return Ok(None);
        };
        let at: i64 = get(&row, 0, "alarm row time")?;
        let fence: Option<String> = get(&row, 2, "alarm row fence")?;
        Ok(Some(AlarmRow {
            at: validate_time(at).map_err(|e| corrupt("time", e))?,
            token: token("token", get(&row, 1, "alarm row token")?)?,
            fence: fence.map(|f| token("fence", f)).transpose()?,
        }))
    }

    fn put_alarm_row(&mut self, row: &AlarmRow) -> Result<(), StorageError> {
        self.exec(
            "write alarm row",
            "INSERT INTO {s}.durability_object_alarm_row (object_id, at, token, fence)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (object_id) DO UPDATE SET
               at = EXCLUDED.at, token = EXCLUDED.token, fence = EXCLUDED.fence",
            &[
                &row.at,
                &row.token.as_str(),
                &row.fence.as_ref().map(Token::as_str),
            ],
        )
        .map(|_| ())
    }

    fn delete_alarm_row(&mut self) -> Result<bool, StorageError> {
        self.exec(
            "delete alarm row",
            "DELETE FROM {s}.durability_object_alarm_row WHERE object_id = $1",
            &[],
        )
        .map(|n| n > 0)
    }

    fn alarm_row_token(&mut self) -> Result<Option<(Token, Option<Token>)>, StorageError> {
        // Only token and fence are read, so a corrupt time cannot fail it.
        let Some(row) = self.row(
            "read alarm row token",
            "SELECT token, fence FROM {s}.durability_object_alarm_row WHERE object_id = $1",
            &[],
        )?
        else {
            return Ok(None);
        };
        let fence: Option<String> = get(&row, 1, "alarm row fence")?;
        Ok(Some((
            token("token", get(&row, 0, "alarm row token")?)?,
            fence.map(|f| token("fence", f)).transpose()?,
        )))
    }

    fn set_alarm_fence(
        &mut self,
        token: &Token,
        fence: Option<&Token>,
    ) -> Result<bool, StorageError> {
        self.exec(
            "fence alarm row",
            "UPDATE {s}.durability_object_alarm_row SET fence = $3
             WHERE object_id = $1 AND token = $2",
            &[&token.as_str(), &fence.map(Token::as_str)],
        )
        .map(|n| n > 0)
    }
}
