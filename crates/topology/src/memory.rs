//! [`TopologyTx`] on the scheduler's in-memory test storage.

use std::collections::BTreeMap;

use durability_scheduler::StorageError;
use durability_scheduler::testkit::MemoryTx;

use crate::store::{GroupRow, TopologyTx};

/// The topology rows of a `MemoryStorage`.
#[derive(Debug, Clone, Default)]
struct MemTopology {
    groups: BTreeMap<String, GroupRow>,
    states: BTreeMap<(String, String), String>,
    writes: BTreeMap<u64, (String, i64)>,
    next_write: u64,
}

impl TopologyTx for MemoryTx<'_> {
    fn topology_group(&mut self, group: &str) -> Result<Option<GroupRow>, StorageError> {
        Ok(self.ext::<MemTopology>().groups.get(group).cloned())
    }

    fn topology_put_group(
        &mut self,
        group: &str,
        row: &GroupRow,
        _updated_at: i64,
    ) -> Result<(), StorageError> {
        self.ext::<MemTopology>()
            .groups
            .insert(group.to_owned(), row.clone());
        Ok(())
    }

    fn topology_states(&mut self, group: &str) -> Result<Vec<(String, String)>, StorageError> {
        Ok(self
            .ext::<MemTopology>()
            .states
            .iter()
            .filter(|((g, _), _)| g == group)
            .map(|((_, c), v)| (c.clone(), v.clone()))
            .collect())
    }

    fn topology_put_state(
        &mut self,
        group: &str,
        channel: &str,
        value: &str,
    ) -> Result<(), StorageError> {
        self.ext::<MemTopology>()
            .states
            .insert((group.to_owned(), channel.to_owned()), value.to_owned());
        Ok(())
    }

    fn topology_delete_states(&mut self, group: &str) -> Result<(), StorageError> {
        self.ext::<MemTopology>()
            .states
            .retain(|(g, _), _| g != group);
        Ok(())
    }

    fn topology_record_write(&mut self, group: &str, land_by: i64) -> Result<u64, StorageError> {
        let rows = self.ext::<MemTopology>();
        rows.next_write += 1;
        let id = rows.next_write;
        rows.writes.insert(id, (group.to_owned(), land_by));
        Ok(id)
    }

    fn topology_forget_write(&mut self, id: u64) -> Result<(), StorageError> {
        self.ext::<MemTopology>().writes.remove(&id);
        Ok(())
    }

    fn topology_outstanding_until(
        &mut self,
        group: &str,
        now: i64,
    ) -> Result<Option<i64>, StorageError> {
        let rows = self.ext::<MemTopology>();
        rows.writes
            .retain(|_, (g, land_by)| g != group || *land_by > now);
        Ok(rows
            .writes
            .values()
            .filter(|(g, _)| g == group)
            .map(|(_, l)| *l)
            .max())
    }
}
