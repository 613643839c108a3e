//! The scheduler's rows (`SchedulerTx`): capability due times, the one
//! stored alarm and capability schema versions, in the deployment's
//! shared tables keyed by object id.

use durability_scheduler::{SchedulerTx, StorageError};
use tokio_postgres::Row;

use super::tx::PostgresObjectTx;

/// Column `i` of `row`, or a backend error naming `what`.
pub(super) fn get<'r, T: tokio_postgres::types::FromSql<'r>>(
    row: &'r Row,
    i: usize,
    what: &str,
) -> Result<T, StorageError> {
    row.try_get(i)
        .map_err(|e| StorageError::backend(format!("read {what}"), e))
}

impl SchedulerTx for PostgresObjectTx<'_> {
    fn capability_due(&mut self, capability: &str) -> Result<Option<i64>, StorageError> {
        self.row(
            "read capability due",
            "SELECT due FROM {s}.durability_object_due WHERE object_id = $1 AND capability = $2",
            &[&capability],
        )?
        .map(|r| get(&r, 0, "capability due"))
        .transpose()
    }

    fn set_capability_due(
        &mut self,
        capability: &str,
        due: Option<i64>,
    ) -> Result<(), StorageError> {
        match due {
            Some(due) => self.exec(
                "write capability due",
                "INSERT INTO {s}.durability_object_due (object_id, capability, due)
                 VALUES ($1, $2, $3)
                 ON CONFLICT (object_id, capability) DO UPDATE SET due = EXCLUDED.due",
                &[&capability, &due],
            ),
            None => self.exec(
                "clear capability due",
                "DELETE FROM {s}.durability_object_due WHERE object_id = $1 AND capability = $2",
                &[&capability],
            ),
        }
        .map(|_| ())
    }

    fn earliest_capability_due(&mut self) -> Result<Option<i64>, StorageError> {
        self.row(
            "read earliest due",
            "SELECT MIN(due) FROM {s}.durability_object_due WHERE object_id = $1",
            &[],
        )?
        .map_or(Ok(None), |r| get(&r, 0, "earliest due"))
    }

    fn alarm(&mut self) -> Result<Option<i64>, StorageError> {
        Ok(self
            .row(
                "read alarm",
                "SELECT at FROM {s}.durability_object_alarm WHERE object_id = $1",
                &[],
            )?
            .map(|r| get::<Option<i64>>(&r, 0, "alarm"))
            .transpose()?
            .flatten())
    }

    fn set_alarm(&mut self, at: Option<i64>) -> Result<(), StorageError> {
        self.exec(
            "write alarm",
            "INSERT INTO {s}.durability_object_alarm (object_id, at) VALUES ($1, $2)
             ON CONFLICT (object_id) DO UPDATE SET at = EXCLUDED.at",
            &[&at],
        )
        .map(|_| ())
    }

    fn schema_version(&mut self, capability: &str) -> Result<Option<u32>, StorageError> {
        let Some(row) = self.row(
            "read schema version",
            "SELECT version FROM {s}.durability_object_schema
             WHERE object_id = $1 AND capability = $2",
            &[&capability],
        )?
        else {
            return Ok(None);
        };
        let v: i64 = get(&row, 0, "schema version")?;
        u32::try_from(v).map(Some).map_err(|_| {
            StorageError::corrupt(format!(
                "schema version {v} of {capability} is out of range"
            ))
        })
    }

    fn set_schema_version(
        &mut self,
        capability: &str,
        version: Option<u32>,
    ) -> Result<(), StorageError> {
        match version {
            Some(v) => self.exec(
                "write schema version",
                "INSERT INTO {s}.durability_object_schema (object_id, capability, version)
                 VALUES ($1, $2, $3)
                 ON CONFLICT (object_id, capability) DO UPDATE SET version = EXCLUDED.version",
                &[&capability, &i64::from(v)],
            ),
            None => self.exec(
                "clear schema version",
                "DELETE FROM {s}.durability_object_schema WHERE object_id = $1 AND capability = $2",
                &[&capability],
            ),
        }
        .map(|_| ())
    }
}
