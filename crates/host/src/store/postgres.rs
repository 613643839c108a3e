//! Objects on PostgreSQL (feature `postgres`): every object of every host
//! of the deployment in one database, through
//! `durability_storage_postgres::object` (shared tables keyed by object
//! id, each object's own tables in a schema of its own, the owner fence
//! checked inside every commit, a paused stale holder's transaction ended
//! by the new owner's fence). No host needs a directory shared with
//! another. The only module of the host that knows PostgreSQL.
//!
//! An object's id in the database is the scheduler's object id,
//! `<storage id>:<class>:<name>` (neither a storage id nor a class name
//! holds a `:`), so listing a storage id, a class or a name prefix is a
//! range of ids in byte order. A storage id's tombstone is a row of the
//! deployment's `durability_tombstones` table; it stays when the storage
//! id's objects are deleted.

use std::sync::Arc;

use durability_ownership::{LifecycleId, StorageId};
use durability_scheduler::StorageError;
/// The PostgreSQL object deployment and its options.
pub use durability_storage_postgres::object::{
    PostgresObjectOptions, PostgresObjectStorage, PostgresObjects,
};

use durability_ownership::ShardCount;
/// The lease store and alarm index on PostgreSQL.
pub use durability_storage_postgres::alarms::PostgresAlarmIndex;
pub use durability_storage_postgres::ownership::PostgresLeaseStore;

use durability_scheduler::image::{ImageError, ObjectImage};

use super::{ObjectKey, ObjectPage, ObjectQuery, ObjectStore, StoreTx, TombstoneState};
use crate::error::HostError;
use crate::settings::DatabaseSettings;

/// How many ids [`ObjectStore::delete_rest`] lists per page.
const REST_PAGE: usize = 128;

/// Leases, alarm jobs and objects in one PostgreSQL database, each set up
/// (idempotently) in the schema [`DatabaseSettings`] names: what
/// `HostConfig::postgres` builds a host from.
#[derive(Debug, Clone)]
pub struct PostgresBackends {
    /// The owner lease store (lease time from the server's clock).
    pub lease_store: Arc<PostgresLeaseStore>,
    /// The alarm job index (claim leases on the server's clock).
    pub alarm_index: Arc<PostgresAlarmIndex>,
    /// The objects.
    pub objects: PostgresObjectStore,
}

impl PostgresBackends {
    /// Connects the three stores to `database` and creates their tables
    /// when missing (safe from several hosts at once), with default object
    /// options; `shard_count` is the deployment's (the host settings').
    ///
    /// # Errors
    /// [`HostError::InvalidSetting`] `DO_DATABASE_URL` / `DO_DATABASE_SCHEMA`
    /// for a malformed URL or schema (nothing is written); the store's
    /// own error when the database cannot be reached or set up.
    pub async fn connect(
        database: &DatabaseSettings,
        shard_count: ShardCount,
    ) -> Result<Self, HostError> {
        let mut options = PostgresObjectOptions::default();
        if let Some(ms) = database.commit_timeout_ms() {
            options.commit_timeout = std::time::Duration::from_millis(ms);
        }
        Self::connect_with(database, shard_count, options).await
    }

    /// As [`PostgresBackends::connect`], with the objects' options (their
    /// commit deadline wins over the settings').
    ///
    /// # Errors
    /// As [`PostgresBackends::connect`].
    pub async fn connect_with(
        database: &DatabaseSettings,
        shard_count: ShardCount,
        options: PostgresObjectOptions,
    ) -> Result<Self, HostError> {
        use crate::settings::{ENV_DATABASE_SCHEMA, ENV_DATABASE_URL};
        let (url, schema) = (database.url(), database.schema());
        // Both checked before anything connects.
        PostgresObjects::install_sql(schema)
            .map_err(|e| HostError::setting(ENV_DATABASE_SCHEMA, e.to_string()))?;
        let lease_store =
            PostgresLeaseStore::connect(url, schema, shard_count).map_err(|e| match e {
                durability_ownership::OwnershipError::InvalidInput { reason, .. } => {
                    HostError::setting(ENV_DATABASE_URL, reason)
                }
                other => HostError::Ownership(other),
            })?;
        lease_store.setup().await?;
        let alarm_index = PostgresAlarmIndex::connect(url, schema, Default::default())
            .map_err(HostError::Alarm)?;
        alarm_index.setup().await.map_err(HostError::Alarm)?;
        let objects = PostgresObjectStore::connect(url, schema, options)?;
        Ok(Self {
            lease_store: Arc::new(lease_store),
            alarm_index: Arc::new(alarm_index),
            objects,
        })
    }
}

/// Every object of a deployment in one PostgreSQL database (see the
/// module docs).
#[derive(Debug, Clone)]
pub struct PostgresObjectStore {
    objects: PostgresObjects,
    deployment: String,
}

/// The object id of `object` of `storage` (the scheduler's).
fn object_id(storage: &StorageId, object: &ObjectKey) -> String {
    object.object_id(storage)
}

/// The object an id of `storage` names.
fn key_of(storage: &StorageId, id: &str) -> Option<ObjectKey> {
    ObjectKey::from_object_id(storage, id)
}

impl PostgresObjectStore {
    /// Connects to `url` and installs (idempotently) the deployment schema
    /// `deployment` (`[a-z_][a-z0-9_]*`, at most 40 bytes).
    ///
    /// # Errors
    /// An invalid URL or schema name (nothing is written), or a backend
    /// failure.
    pub fn connect(
        url: &str,
        deployment: &str,
        options: PostgresObjectOptions,
    ) -> Result<Self, StorageError> {
        Ok(Self {
            objects: PostgresObjects::connect(url, deployment, options)?,
            deployment: deployment.to_owned(),
        })
    }

    /// The deployment (for tools that read the objects' rows directly).
    pub fn objects(&self) -> &PostgresObjects {
        &self.objects
    }

    /// At most `limit` objects of `storage` whose class is `class` and
    /// whose name starts with `name_prefix` (every class when `class` is
    /// `None`, then `name_prefix` is ignored), after `cursor`, in byte
    /// order of their ids; the page's cursor continues it.
    ///
    /// # Errors
    /// A backend failure.
    pub fn list_prefix(
        &self,
        storage: &StorageId,
        class: Option<&str>,
        name_prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ObjectPage, StorageError> {
        let prefix = match class {
            Some(class) => format!("{}:{class}:{name_prefix}", storage.as_str()),
            None => format!("{}:", storage.as_str()),
        };
        let (ids, more) = self.objects.list_objects(&prefix, cursor, limit)?;
        Ok(ObjectPage {
            cursor: more.then(|| ids.last().cloned()).flatten(),
            objects: ids.iter().filter_map(|id| key_of(storage, id)).collect(),
        })
    }
}

impl ObjectStore for PostgresObjectStore {
    const KIND: &'static str = "postgres";

    type Storage = PostgresObjectStorage;
    type Admission = ();
    type Exclusion = ();

    /// Admits at once, with no round trip: on PostgreSQL nothing needs to
    /// be held for the call. A commit and its object's deletion are
    /// ordered by the object's row lock (`delete_object` takes it; a
    /// transaction's fence needs the row, so after the deletion it is
    /// refused), and a first record of an object is inserted only under
    /// the storage id's tombstone lock, shared, after finding no tombstone
    /// (`PostgresObjects::open_unless_tombstoned`; the tombstone write
    /// takes the lock exclusively). So no object is recorded under a
    /// storage id after its tombstone, and a call commits before the
    /// deletion removes its object or is refused (with the default
    /// snapshot admission, already before it starts: the deletion removed
    /// the storage pointer first).
    fn admit(
        &self,
        _storage: &StorageId,
    ) -> impl Future<Output = Result<Option<()>, StorageError>> + Send {
        std::future::ready(Ok(Some(())))
    }

    /// Nothing to wait for (see [`ObjectStore::admit`] above).
    fn exclude(
        &self,
        _storage: &StorageId,
    ) -> impl Future<Output = Result<(), StorageError>> + Send {
        std::future::ready(Ok(()))
    }

    /// The URL and schema were checked when the store connected.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        Ok(())
    }

    /// Nothing to make per storage id: the deployment's tables hold them all.
    fn prepare(&self, _storage: &StorageId) -> Result<(), (&'static str, String)> {
        Ok(())
    }

    /// Fails closed: a tombstone that cannot be read is reported as one
    /// (the host refuses to start, or to open an object, until it can be
    /// read), never as its absence.
    fn tombstone(&self, storage: &StorageId) -> Option<String> {
        match self.objects.tombstone(storage.as_str()) {
            Ok(None) => None,
            Ok(Some(t)) => Some(format!(
                "row {:?} of {}.durability_tombstones, state {}, lifecycle {}",
                storage.as_str(),
                self.deployment,
                t.state,
                t.lifecycle
            )),
            Err(e) => Some(format!(
                "the tombstone table {}.durability_tombstones could not be read ({e}); \
                 treated as deleted until it can be",
                self.deployment
            )),
        }
    }

    fn write_tombstone(
        &self,
        storage: &StorageId,
        lifecycle: &LifecycleId,
        state: TombstoneState,
    ) -> Result<(), StorageError> {
        self.objects
            .write_tombstone(storage.as_str(), lifecycle.as_str(), state.as_str())
    }

    fn open(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
    ) -> impl Future<Output = Result<Arc<PostgresObjectStorage>, StorageError>> + Send {
        let opened = self
            .objects
            .open_unless_tombstoned(&object_id(storage, object), storage.as_str())
            .and_then(|found| {
                found.map(Arc::new).ok_or_else(|| {
                    StorageError::backend(
                        "open the object",
                        format!(
                            "storage id {:?} is deleted (its tombstone exists)",
                            storage.as_str()
                        ),
                    )
                })
            });
        std::future::ready(opened)
    }

    fn drop_own_page(
        tx: &mut StoreTx<'_, Self>,
        limit: usize,
    ) -> Result<(Vec<String>, bool), StorageError> {
        tx.drop_own_schema_objects(limit)
    }

    fn due_capabilities(tx: &mut StoreTx<'_, Self>) -> Result<Vec<String>, StorageError> {
        tx.due_capabilities()
    }

    /// In byte order of the object ids; the cursor is the last id listed.
    fn list(
        &self,
        storage: &StorageId,
        cursor: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<ObjectPage, StorageError>> + Send {
        std::future::ready(self.list_prefix(storage, None, "", cursor, limit))
    }

    /// A range of object ids (`<storage>:<class>:<prefix>`, after
    /// `<storage>:<class>:<after>`), in their byte order, which is the
    /// names' byte order.
    fn list_class(
        &self,
        storage: &StorageId,
        query: &ObjectQuery,
    ) -> impl Future<Output = Result<ObjectPage, StorageError>> + Send {
        let after = query.after().map(|a| {
            object_id(
                storage,
                &ObjectKey {
                    class: query.class().to_owned(),
                    name: a.to_owned(),
                },
            )
        });
        let page = self
            .list_prefix(
                storage,
                Some(query.class()),
                query.prefix(),
                after.as_deref(),
                query.limit(),
            )
            .map(|page| ObjectPage {
                cursor: page
                    .cursor
                    .and_then(|_| page.objects.last().map(|o| o.name.clone())),
                objects: page.objects,
            });
        std::future::ready(page)
    }

    fn find(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
    ) -> impl Future<Output = Result<Option<Arc<PostgresObjectStorage>>, StorageError>> + Send {
        let id = object_id(storage, object);
        let found = self.objects.is_recorded(&id).and_then(|recorded| {
            if !recorded {
                return Ok(None);
            }
            self.objects
                .open_unless_tombstoned(&id, storage.as_str())
                .map(|s| s.map(Arc::new))
        });
        std::future::ready(found)
    }

    fn fences(found: &PostgresObjectStorage) -> Result<Vec<(String, u64)>, StorageError> {
        found.fences_unlocked()
    }

    fn export_tx(tx: &mut StoreTx<'_, Self>) -> Result<ObjectImage, ImageError> {
        tx.export_image()
    }

    fn import(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
        image: &ObjectImage,
        replace: bool,
    ) -> impl Future<Output = Result<(), ImageError>> + Send {
        std::future::ready(self.objects.import_image(
            &object_id(storage, object),
            storage.as_str(),
            image,
            replace,
        ))
    }

    fn delete_object(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
    ) -> impl Future<Output = Result<bool, StorageError>> + Send {
        std::future::ready(self.objects.delete_object(&object_id(storage, object)))
    }

    /// Objects recorded under the storage id after it was listed (an
    /// open racing the deletion), deleted one by one; the tombstone row
    /// stays.
    fn delete_rest(
        &self,
        storage: &StorageId,
    ) -> impl Future<Output = Vec<(String, String)>> + Send {
        let mut failures = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let prefix = format!("{}:", storage.as_str());
            let (ids, more) = match self
                .objects
                .list_objects(&prefix, cursor.as_deref(), REST_PAGE)
            {
                Ok(page) => page,
                Err(e) => {
                    failures.push((format!("objects {prefix}*"), e.to_string()));
                    break;
                }
            };
            for id in &ids {
                if let Err(e) = self.objects.delete_object(id) {
                    failures.push((format!("object {id}"), e.to_string()));
                }
            }
            cursor = ids.last().cloned();
            if !more {
                break;
            }
        }
        std::future::ready(failures)
    }
}

impl crate::store::IdempotencyRows for durability_storage_postgres::object::PostgresObjectTx<'_> {
    fn idempotency_result(&self, method: &str, key: &str) -> Result<Option<String>, StorageError> {
        durability_storage_postgres::object::PostgresObjectTx::idempotency_result(self, method, key)
    }

    fn record_idempotency_result(
        &self,
        method: &str,
        key: &str,
        result: &str,
    ) -> Result<(), StorageError> {
        durability_storage_postgres::object::PostgresObjectTx::record_idempotency_result(
            self, method, key, result,
        )
    }

    fn prune_idempotency_results(&self, limit: u32) -> Result<usize, StorageError> {
        durability_storage_postgres::object::PostgresObjectTx::prune_idempotency_results(
            self, limit,
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn object_ids_map_back_to_their_keys() {
        let storage = StorageId::new("st1").unwrap();
        let key = ObjectKey {
            class: "Counter".to_owned(),
            name: "a:b c/é".to_owned(),
        };
        let id = object_id(&storage, &key);
        assert_eq!(id, "st1:Counter:a:b c/é");
        assert_eq!(key_of(&storage, &id), Some(key));
        // Another storage id, a prefix of it, or a malformed id: not ours.
        assert_eq!(key_of(&storage, "st10:Counter:x"), None);
        assert_eq!(
            key_of(&StorageId::new("st").unwrap(), "st1:Counter:x"),
            None
        );
        assert_eq!(key_of(&storage, "st1:Counter"), None);
        assert_eq!(key_of(&storage, "st1::x"), None);
    }
}
