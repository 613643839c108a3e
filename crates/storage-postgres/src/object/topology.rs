//! The topology coordinator's tables (`TopologyTx`) in the deployment's
//! shared tables, keyed by object id, decoded strictly.

use durability_scheduler::StorageError;
use durability_topology::{GroupRow, TopologyTx};

use super::rows::get;
use super::tx::PostgresObjectTx;

fn i64_of(v: u64) -> Result<i64, StorageError> {
    i64::try_from(v).map_err(|_| StorageError::corrupt(format!("version {v} out of range")))
}

impl TopologyTx for PostgresObjectTx<'_> {
    fn topology_group(&mut self, group: &str) -> Result<Option<GroupRow>, StorageError> {
        let Some(row) = self.row(
            "read topology group",
            "SELECT version, members, deleted FROM {s}.durability_object_topology_groups
             WHERE object_id = $1 AND group_id = $2",
            &[&group],
        )?
        else {
            return Ok(None);
        };
        let version: i64 = get(&row, 0, "topology group version")?;
        let version = u64::try_from(version)
            .ok()
            .filter(|v| *v >= 1)
            .ok_or_else(|| {
                StorageError::corrupt(format!(
                    "topology group {group:?}: version {version} is not a positive integer"
                ))
            })?;
        Ok(Some(GroupRow {
            version,
            members: get(&row, 1, "topology group members")?,
            deleted: get(&row, 2, "topology group deleted")?,
        }))
    }

    fn topology_put_group(
        &mut self,
        group: &str,
        row: &GroupRow,
        updated_at: i64,
    ) -> Result<(), StorageError> {
        self.exec(
            "write topology group",
            "INSERT INTO {s}.durability_object_topology_groups
               (object_id, group_id, version, members, deleted, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (object_id, group_id) DO UPDATE SET
               version = EXCLUDED.version, members = EXCLUDED.members,
               deleted = EXCLUDED.deleted, updated_at = EXCLUDED.updated_at",
            &[
                &group,
                &i64_of(row.version)?,
                &row.members,
                &row.deleted,
                &updated_at,
            ],
        )
        .map(|_| ())
    }

    fn topology_states(&mut self, group: &str) -> Result<Vec<(String, String)>, StorageError> {
        self.rows(
            "read topology states",
            "SELECT channel, value FROM {s}.durability_object_topology_states
             WHERE object_id = $1 AND group_id = $2 ORDER BY channel",
            &[&group],
        )?
        .iter()
        .map(|r| Ok((get(r, 0, "state channel")?, get(r, 1, "state value")?)))
        .collect()
    }

    fn topology_put_state(
        &mut self,
        group: &str,
        channel: &str,
        value: &str,
    ) -> Result<(), StorageError> {
        self.exec(
            "write topology state",
            "INSERT INTO {s}.durability_object_topology_states (object_id, group_id, channel, value)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (object_id, group_id, channel) DO UPDATE SET value = EXCLUDED.value",
            &[&group, &channel, &value],
        )
        .map(|_| ())
    }

    fn topology_delete_states(&mut self, group: &str) -> Result<(), StorageError> {
        self.exec(
            "delete topology states",
            "DELETE FROM {s}.durability_object_topology_states
             WHERE object_id = $1 AND group_id = $2",
            &[&group],
        )
        .map(|_| ())
    }

    fn topology_record_write(&mut self, group: &str, land_by: i64) -> Result<u64, StorageError> {
        let row = self.row(
            "record topology write",
            "INSERT INTO {s}.durability_object_topology_writes (object_id, group_id, land_by)
             VALUES ($1, $2, $3) RETURNING id",
            &[&group, &land_by],
        )?;
        let id: i64 = match row {
            Some(r) => get(&r, 0, "topology write id")?,
            None => return Err(StorageError::corrupt("a recorded write returned no id")),
        };
        u64::try_from(id).map_err(|_| StorageError::corrupt("negative topology write id"))
    }

    fn topology_forget_write(&mut self, id: u64) -> Result<(), StorageError> {
        self.exec(
            "forget topology write",
            "DELETE FROM {s}.durability_object_topology_writes WHERE object_id = $1 AND id = $2",
            &[&i64_of(id)?],
        )
        .map(|_| ())
    }

    fn topology_outstanding_until(
        &mut self,
        group: &str,
        now: i64,
    ) -> Result<Option<i64>, StorageError> {
        self.exec(
            "drop expired topology writes",
            "DELETE FROM {s}.durability_object_topology_writes
             WHERE object_id = $1 AND group_id = $2 AND land_by <= $3",
            &[&group, &now],
        )?;
        self.row(
            "read outstanding topology writes",
            "SELECT MAX(land_by) FROM {s}.durability_object_topology_writes
             WHERE object_id = $1 AND group_id = $2",
            &[&group],
        )?
        .map_or(Ok(None), |r| get(&r, 0, "outstanding writes"))
    }
}
