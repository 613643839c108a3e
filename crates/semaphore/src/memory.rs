//! [`SemaphoreTx`] on the scheduler's in-memory test storage.

use std::collections::BTreeMap;

use durability_scheduler::StorageError;
use durability_scheduler::testkit::MemoryTx;

use crate::store::{CorruptRequest, PoolRow, RequestRow, RequestState, SemaphoreTx};

/// The semaphore rows of a `MemoryStorage`.
#[derive(Debug, Clone, Default)]
struct MemSemaphore {
    last_id: u64,
    pools: BTreeMap<String, PoolRow>,
    requests: BTreeMap<(String, String), RequestRow>,
}

fn rows<'a>(tx: &'a mut MemoryTx<'_>) -> &'a mut MemSemaphore {
    tx.ext::<MemSemaphore>()
}

fn k(pool: &str, key: &str) -> (String, String) {
    (pool.to_owned(), key.to_owned())
}

impl SemaphoreTx for MemoryTx<'_> {
    fn semaphore_next_id(&mut self) -> Result<u64, StorageError> {
        let r = rows(self);
        r.last_id += 1;
        Ok(r.last_id)
    }

    fn semaphore_pool(&mut self, pool: &str) -> Result<Option<PoolRow>, StorageError> {
        Ok(rows(self).pools.get(pool).cloned())
    }

    fn semaphore_put_pool(&mut self, row: &PoolRow) -> Result<(), StorageError> {
        rows(self).pools.insert(row.name.clone(), row.clone());
        Ok(())
    }

    fn semaphore_request(
        &mut self,
        pool: &str,
        key: &str,
    ) -> Result<Option<RequestRow>, StorageError> {
        Ok(rows(self).requests.get(&k(pool, key)).cloned())
    }

    fn semaphore_request_by_id(&mut self, id: u64) -> Result<Option<RequestRow>, StorageError> {
        Ok(rows(self).requests.values().find(|r| r.id == id).cloned())
    }

    fn semaphore_put_request(&mut self, row: &RequestRow) -> Result<(), StorageError> {
        rows(self)
            .requests
            .insert(k(&row.pool, &row.key), row.clone());
        Ok(())
    }

    fn semaphore_delete_request(&mut self, pool: &str, key: &str) -> Result<bool, StorageError> {
        Ok(rows(self).requests.remove(&k(pool, key)).is_some())
    }

    fn semaphore_due(
        &mut self,
        pool: &str,
        now: i64,
        limit: usize,
    ) -> Result<Vec<RequestRow>, StorageError> {
        let mut due: Vec<RequestRow> = rows(self)
            .requests
            .values()
            .filter(|r| r.pool == pool && r.due_at() <= now)
            .cloned()
            .collect();
        due.sort_by_key(|r| (r.due_at(), r.id));
        due.truncate(limit);
        Ok(due)
    }

    fn semaphore_queue(
        &mut self,
        pool: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RequestRow>, StorageError> {
        let mut queue: Vec<RequestRow> = rows(self)
            .requests
            .values()
            .filter(|r| {
                r.pool == pool && r.id > after && matches!(r.state, RequestState::Queued { .. })
            })
            .cloned()
            .collect();
        queue.sort_by_key(|r| r.id);
        queue.truncate(limit);
        Ok(queue)
    }

    fn semaphore_queued_before(&mut self, pool: &str, id: u64) -> Result<u64, StorageError> {
        Ok(rows(self)
            .requests
            .values()
            .filter(|r| {
                r.pool == pool && r.id < id && matches!(r.state, RequestState::Queued { .. })
            })
            .count() as u64)
    }

    fn semaphore_due_pools(&mut self, now: i64, limit: usize) -> Result<Vec<String>, StorageError> {
        let mut pools: Vec<String> = rows(self)
            .requests
            .values()
            .filter(|r| r.due_at() <= now)
            .map(|r| r.pool.clone())
            .collect();
        pools.sort();
        pools.dedup();
        pools.truncate(limit);
        Ok(pools)
    }

    fn semaphore_quarantine(
        &mut self,
        _pool: &str,
        _at: i64,
    ) -> Result<Vec<CorruptRequest>, StorageError> {
        // Rows here are typed: none is ever corrupt.
        Ok(Vec::new())
    }

    fn semaphore_delete_pool(&mut self, pool: &str) -> Result<bool, StorageError> {
        let r = rows(self);
        r.requests.retain(|(p, _), _| p != pool);
        Ok(r.pools.remove(pool).is_some())
    }

    fn semaphore_next_due(&mut self) -> Result<Option<i64>, StorageError> {
        Ok(rows(self).requests.values().map(RequestRow::due_at).min())
    }
}
