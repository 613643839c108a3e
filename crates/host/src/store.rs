//! Object storage behind one trait: [`ObjectStore`].
//!
//! The host reaches every object's storage through an [`ObjectStore`]: it
//! opens an object's storage (which the host then fences at the scope's
//! claim through [`ObjectFence`]), clears one object's own data page by
//! page, lists a storage id's objects (and a class's by name prefix:
//! [`ObjectStore::list_class`]), exports and imports one object as a
//! portable image (module [`moving`]), deletes one object, deletes what a
//! storage id leaves, and keeps the storage id's tombstone and its
//! admission ([`ObjectStore::admit`], [`ObjectStore::exclude`]): the lock
//! every admitted call holds shared and a storage deletion exclusively, so
//! a deletion waits out every call admitted before it and nothing is
//! admitted, opened or created after its tombstone. The store is
//! the only part of the host that knows the backend: the SQLite directory
//! ([`sqlite::SqliteObjectStore`], the default, one file per object) is
//! one module, and PostgreSQL (`postgres::PostgresObjectStore`, feature
//! `postgres`: every object in one database, for hosts on several machines)
//! another; a further backend is one more module implementing this trait.
//!
//! Which to pick: the SQLite directory is for processes on ONE machine
//! (its WAL needs shared memory, which a network file system does not
//! give; [`sqlite::SqliteObjectStore`] refuses a root on one at start).
//! Hosts on several machines keep objects, leases and alarm jobs in
//! PostgreSQL (`HostConfig::postgres`, or `DO_DATABASE_URL`).

use std::future::Future;
use std::sync::Arc;

use durability_alarms::AlarmTx;
use durability_ownership::{LifecycleId, ObjectFence, StorageId};
use durability_scheduler::image::{ImageError, ObjectImage};
use durability_scheduler::{Storage, StorageError};

use crate::error::HostError;

pub mod moving;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
pub mod sqlite;

pub use moving::{MoveError, ObjectQuery};

/// The object store a host uses when none is named: the SQLite directory.
pub type DefaultObjectStore = sqlite::SqliteObjectStore;

/// The storage type of [`DefaultObjectStore`]'s objects (what
/// [`crate::Handle`] and [`crate::ObjectCtx`] default to).
pub type DefaultStorage = <DefaultObjectStore as ObjectStore>::Storage;

/// The transaction type of an object store's storage.
pub type StoreTx<'t, O> = <<O as ObjectStore>::Storage as Storage>::Tx<'t>;

/// One object of a storage id, as a store lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The object's class.
    pub class: String,
    /// The object's name within its class.
    pub name: String,
}

impl ObjectKey {
    /// The object's id under `storage`, as the scheduler names it:
    /// `<storage id>:<class>:<name>`.
    pub fn object_id(&self, storage: &StorageId) -> String {
        format!("{}:{}:{}", storage.as_str(), self.class, self.name)
    }

    /// The object an id of `storage` names (the name back from an id), or
    /// `None` for an id of another storage id or not of the form
    /// `<storage id>:<class>:<name>` (neither a storage id nor a class
    /// holds a `:`; a name may).
    pub fn from_object_id(storage: &StorageId, id: &str) -> Option<Self> {
        let rest = id.strip_prefix(storage.as_str())?.strip_prefix(':')?;
        let (class, name) = rest.split_once(':')?;
        (!class.is_empty() && !name.is_empty()).then(|| Self {
            class: class.to_owned(),
            name: name.to_owned(),
        })
    }
}

/// One page of [`ObjectStore::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectPage {
    /// The objects of the page, in the store's order.
    pub objects: Vec<ObjectKey>,
    /// Where the next page starts; `None` after the last page.
    pub cursor: Option<String>,
}

/// The state a tombstone records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TombstoneState {
    /// A deletion started (and may not have finished).
    Deleting,
    /// The deletion finished with nothing left behind.
    Deleted,
}

impl TombstoneState {
    /// The state's stored word (`deleting` or `deleted`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deleting => "deleting",
            Self::Deleted => "deleted",
        }
    }
}

/// Where a host's objects are stored.
///
/// Every method is fenced to one storage id. Implementations must make
/// [`ObjectStore::open`] idempotent (the same object opens the same data
/// every time, from any host of the deployment), must refuse a commit
/// that the fence refuses (see [`ObjectFence`]), and must write the
/// tombstone durably before [`ObjectStore::write_tombstone`] returns.
pub trait ObjectStore: Send + Sync + 'static {
    /// The store's kind, as an export file names its source (`sqlite`,
    /// `postgres`).
    const KIND: &'static str;

    /// One object's transactional storage: the scheduler's storage, with
    /// the alarm rows, fenced at the owner's claim.
    type Storage: for<'t> Storage<Tx<'t>: AlarmTx> + ObjectFence + Sync;

    /// Admitted work's hold on a storage id (see [`ObjectStore::admit`]);
    /// dropping it ends the work's admission.
    type Admission: Send + Sync + 'static;

    /// A deletion's exclusive hold on a storage id (see
    /// [`ObjectStore::exclude`]); dropping it lets admission resume (and
    /// find the tombstone).
    type Exclusion: Send + 'static;

    /// Admits work on `storage`, from any host of the deployment: waits
    /// while a deletion holds the storage id exclusively, then, holding the
    /// admission, checks the tombstone. `None` when the storage id is
    /// tombstoned (nothing may be opened, created or written under it).
    /// The host holds the admission for the whole call (opening and
    /// creating the object included), so a deletion that wrote its
    /// tombstone and then took [`ObjectStore::exclude`] has waited out every
    /// call admitted before it, and every later call finds the tombstone.
    ///
    /// # Errors
    /// A backend failure (nothing was admitted).
    fn admit(
        &self,
        storage: &StorageId,
    ) -> impl Future<Output = Result<Option<Self::Admission>, StorageError>> + Send;

    /// Takes `storage` exclusively for a deletion (after its tombstone was
    /// written): waits until no admitted work holds it, from any host.
    ///
    /// # Errors
    /// A backend failure (nothing is excluded: delete nothing).
    fn exclude(
        &self,
        storage: &StorageId,
    ) -> impl Future<Output = Result<Self::Exclusion, StorageError>> + Send;

    /// Checks the store's own settings (before a host writes anything).
    ///
    /// # Errors
    /// The setting's name and what is wrong with it.
    fn validate(&self) -> Result<(), (&'static str, String)>;

    /// Checks that the store is safe where it is (called at start, right
    /// after [`ObjectStore::validate`], before anything is written): the
    /// SQLite directory refuses a root on a network file system. Default:
    /// nothing to check.
    ///
    /// # Errors
    /// [`HostError::NetworkFileSystem`], or [`HostError::InvalidSetting`]
    /// when the check itself cannot be made.
    fn check_placement(&self) -> Result<(), HostError> {
        Ok(())
    }

    /// Makes the store ready to hold `storage`'s objects (called at start,
    /// after the lifecycle records were checked).
    ///
    /// # Errors
    /// The setting's name and why the store cannot hold the storage id.
    fn prepare(&self, storage: &StorageId) -> Result<(), (&'static str, String)>;

    /// Where `storage`'s tombstone is, when it was deleted.
    fn tombstone(&self, storage: &StorageId) -> Option<String>;

    /// Writes `storage`'s tombstone durably, in `state`.
    ///
    /// # Errors
    /// A backend failure (nothing is known to be written).
    fn write_tombstone(
        &self,
        storage: &StorageId,
        lifecycle: &LifecycleId,
        state: TombstoneState,
    ) -> Result<(), StorageError>;

    /// Opens one object's storage, creating it when absent. The host
    /// fences it (through [`ObjectFence`]) before the first dispatch.
    ///
    /// # Errors
    /// A backend failure.
    fn open(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
    ) -> impl Future<Output = Result<Arc<Self::Storage>, StorageError>> + Send;

    /// Drops at most `limit` of the object's own schema objects (never the
    /// capabilities' reserved ones) inside `tx`: the names dropped and
    /// whether more may be left. One page of a paged delete-all.
    ///
    /// # Errors
    /// A backend failure; the transaction rolls back.
    fn drop_own_page(
        tx: &mut StoreTx<'_, Self>,
        limit: usize,
    ) -> Result<(Vec<String>, bool), StorageError>;

    /// The capabilities with a stored due time, by name.
    ///
    /// # Errors
    /// A backend failure.
    fn due_capabilities(tx: &mut StoreTx<'_, Self>) -> Result<Vec<String>, StorageError>;

    /// Lists at most `limit` objects of `storage` after `cursor`.
    ///
    /// # Errors
    /// A backend failure.
    fn list(
        &self,
        storage: &StorageId,
        cursor: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<ObjectPage, StorageError>> + Send;

    /// At most `query.limit()` objects of `query.class()` under `storage`
    /// whose names start with `query.prefix()`, after `query.after()`, in
    /// bytewise name order; the page's cursor is the last name listed.
    ///
    /// # Errors
    /// A backend failure, or a `Corrupt` error naming a stored object that
    /// does not decode.
    fn list_class(
        &self,
        storage: &StorageId,
        query: &ObjectQuery,
    ) -> impl Future<Output = Result<ObjectPage, StorageError>> + Send;

    /// Opens one object's storage when the object is stored; `None` (and
    /// nothing created) when it is not.
    ///
    /// # Errors
    /// A backend failure.
    fn find(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
    ) -> impl Future<Output = Result<Option<Arc<Self::Storage>>, StorageError>> + Send;

    /// The object's owner fence: each scope (canonical host id) and its
    /// fenced generation. A store that can read it without the object's
    /// write lock does so (PostgreSQL), so a holder paused inside a
    /// transaction does not block a mover, whose fence round then ends it.
    ///
    /// # Errors
    /// A backend failure, or a `Corrupt` generation.
    fn fences(found: &Self::Storage) -> Result<Vec<(String, u64)>, StorageError>;

    /// The object's state as a portable image, read inside `tx`.
    ///
    /// # Errors
    /// [`ImageError::NotPortable`], or a backend failure.
    fn export_tx(tx: &mut StoreTx<'_, Self>) -> Result<ObjectImage, ImageError>;

    /// Stores `image` as `object` of `storage`, all or nothing (one
    /// transaction, or a new file renamed into place). An object already
    /// stored is refused ([`ImageError::TargetNotEmpty`]) unless
    /// `replace`. Run it on an object no host serves.
    ///
    /// # Errors
    /// [`ImageError`]; the target is untouched on every error but a commit
    /// of unknown outcome.
    fn import(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
        image: &ObjectImage,
        replace: bool,
    ) -> impl Future<Output = Result<(), ImageError>> + Send;

    /// Deletes one object's storage; `false` when it was already gone.
    ///
    /// # Errors
    /// A backend failure (the object may be partly deleted; run again).
    fn delete_object(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
    ) -> impl Future<Output = Result<bool, StorageError>> + Send;

    /// Deletes whatever `storage` still holds besides its tombstone (after
    /// its objects were deleted one by one): what could not be deleted, by
    /// name, with the reason.
    fn delete_rest(
        &self,
        storage: &StorageId,
    ) -> impl Future<Output = Vec<(String, String)>> + Send;
}

/// The recorded results of one object's idempotency keys, in its
/// storage's transaction: what an object store's transaction implements
/// for [`crate::idempotency::once`] and [`crate::idempotency::prune`]
/// (SQLite's and PostgreSQL's do; the SQL is their storage crate's).
pub trait IdempotencyRows {
    /// The result recorded for (`method`, `key`), as it was stored.
    ///
    /// # Errors
    /// A storage failure.
    fn idempotency_result(&self, method: &str, key: &str) -> Result<Option<String>, StorageError>;

    /// Records `result` for (`method`, `key`), which has none.
    ///
    /// # Errors
    /// A storage failure.
    fn record_idempotency_result(
        &self,
        method: &str,
        key: &str,
        result: &str,
    ) -> Result<(), StorageError>;

    /// Removes up to `limit` recorded keys, oldest first; how many.
    ///
    /// # Errors
    /// A storage failure.
    fn prune_idempotency_results(&self, limit: u32) -> Result<usize, StorageError>;
}
