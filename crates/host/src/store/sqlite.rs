//! The SQLite directory: one SQLite file per object under a root every
//! host of the deployment shares (`<root>/<storage id>/<class dir>/<file>.sqlite`),
//! and the storage id's tombstone and admission lock files beside them.
//! The only module of the host that knows SQLite.
//!
//! File names (module `names`): a short plain name is its own file name,
//! every other object a fixed-length SHA-256 file name with a sidecar
//! holding its real class and name, so any valid class and object name
//! fits SQLite's path limit; files of the earlier mapping (hex-encoded
//! names) are still found and listed (a second lookup, no migration).
//!
//! Admission (module `admission`): every admitted call holds the storage
//! id's `ADMISSION` file locked shared, a deletion holds it exclusively.
//!
//! The directory is for processes on ONE machine: SQLite's WAL and the
//! admission lock need shared memory and reliable locks, which a network file system does not
//! give processes on different machines. At start the host refuses a root
//! on a network, cluster or FUSE file system
//! ([`crate::HostError::NetworkFileSystem`]; the decision is
//! `durability_storage_sqlite::local_fs`), unless
//! [`SqliteObjectStore::allow_network_file_system`] overrides it. Hosts on
//! several machines keep their objects in PostgreSQL instead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use durability_ownership::{LifecycleId, StorageId};
use durability_scheduler::StorageError;
/// Options of every object database (the SQLite backend's).
pub use durability_storage_sqlite::SqliteOptions;
use durability_storage_sqlite::SqliteStorage;

use durability_scheduler::image::{ImageError, ObjectImage};

use super::{ObjectKey, ObjectPage, ObjectQuery, ObjectStore, StoreTx, TombstoneState};
use crate::error::HostError;

mod admission;
mod names;
#[cfg(test)]
mod tests;

pub use admission::{ADMISSION_FILE, AdmissionLock};
pub use names::MAX_ROOT_BYTES;
use names::{EXTENSION, Files, NAME_EXTENSION};

/// The tombstone file a deleted storage id leaves under the object root
/// (`<root>/<storage id>/TOMBSTONE`).
pub const TOMBSTONE_FILE: &str = "TOMBSTONE";

/// The SQLite files that belong to one object database besides itself.
const COMPANIONS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// One SQLite file per object under `root` (see the module docs).
/// Clones share the process's admission locks.
#[derive(Debug, Clone)]
pub struct SqliteObjectStore {
    root: PathBuf,
    options: SqliteOptions,
    allow_network_fs: bool,
    /// The shared admission lock of each storage id admitted through this
    /// store (module `admission`).
    admissions: Arc<Mutex<HashMap<StorageId, Arc<admission::Shared>>>>,
}

impl SqliteObjectStore {
    /// The directory at `root`, with default options.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            options: SqliteOptions::default(),
            allow_network_fs: false,
            admissions: Arc::default(),
        }
    }

    /// The documented override of the start check (default `false`): with
    /// `true` the host starts even when the root is on a network, cluster
    /// or FUSE file system. Only for processes of ONE machine over a file
    /// system known to give them working locks and shared memory (a local
    /// FUSE mount, say); never for hosts on several machines, whose commits
    /// the fence could then not order.
    #[must_use]
    pub fn allow_network_file_system(mut self, allow: bool) -> Self {
        self.allow_network_fs = allow;
        self
    }

    /// Options of every object database.
    #[must_use]
    pub fn options(mut self, options: SqliteOptions) -> Self {
        self.options = options;
        self
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn storage_dir(&self, storage: &StorageId) -> PathBuf {
        self.root.join(storage.as_str())
    }

    /// The process's shared admission lock of `storage` (made on first
    /// use).
    fn admission(&self, storage: &StorageId) -> Arc<admission::Shared> {
        let mut admissions = self
            .admissions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(shared) = admissions.get(storage) {
            return Arc::clone(shared);
        }
        let dir = self.storage_dir(storage);
        let shared = Arc::new(admission::Shared::new(
            dir.clone(),
            dir.join(TOMBSTONE_FILE),
        ));
        admissions.insert(storage.clone(), Arc::clone(&shared));
        shared
    }

    /// The files of an object under the current mapping.
    fn files(&self, storage: &StorageId, object: &ObjectKey) -> Files {
        names::files(&self.root, storage.as_str(), &object.class, &object.name)
    }

    /// The database of an object: its legacy file when one exists, else
    /// its current one.
    fn existing_db(&self, storage: &StorageId, object: &ObjectKey) -> (PathBuf, Option<Files>) {
        let files = self.files(storage, object);
        let legacy = names::legacy_path(&self.root, storage.as_str(), &object.class, &object.name);
        if legacy != files.db && legacy.is_file() {
            (legacy, None)
        } else {
            (files.db.clone(), Some(files))
        }
    }
}

/// Every object database file under `dir`, as paths relative to `base`.
fn object_files(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            object_files(base, &path, out)?;
        } else if path.extension().is_some_and(|e| e == EXTENSION)
            && let Ok(relative) = path.strip_prefix(base)
        {
            out.push(relative.to_path_buf());
        }
    }
    Ok(())
}

fn io_error(what: String) -> impl FnOnce(std::io::Error) -> StorageError {
    move |e| StorageError::backend(what, e)
}

/// Writes a hashed object's name sidecar durably (a temporary file,
/// fsynced, renamed, the directory fsynced) unless it is there; an
/// existing sidecar must name the same object.
fn ensure_sidecar(path: &Path, text: &str) -> Result<(), StorageError> {
    use std::io::Write as _;
    match std::fs::read(path) {
        Ok(found) if found == text.as_bytes() => return Ok(()),
        Ok(_) => {
            return Err(StorageError::corrupt(format!(
                "{} names another object (a corrupt name file or a hash collision)",
                path.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StorageError::backend(format!("read {}", path.display()), e)),
    }
    let tmp = path.with_extension(format!("{NAME_EXTENSION}.tmp"));
    let write = || -> std::io::Result<()> {
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        match path.parent() {
            Some(dir) => std::fs::File::open(dir)?.sync_all(),
            None => Ok(()),
        }
    };
    write().map_err(io_error(format!("write {}", path.display())))
}

impl ObjectStore for SqliteObjectStore {
    const KIND: &'static str = "sqlite";

    type Storage = SqliteStorage;
    type Admission = AdmissionLock;
    type Exclusion = AdmissionLock;

    /// The root must not be empty, and (absolute) at most
    /// [`MAX_ROOT_BYTES`] bytes, so every object path fits SQLite's path
    /// limit.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.root.as_os_str().is_empty() {
            return Err(("root", "the object storage root is empty".to_owned()));
        }
        let absolute = std::path::absolute(&self.root)
            .map_err(|e| ("root", format!("{}: {e}", self.root.display())))?;
        if absolute.as_os_str().len() > MAX_ROOT_BYTES {
            return Err((
                "root",
                format!(
                    "{} is longer than {MAX_ROOT_BYTES} bytes (object paths would pass SQLite's path limit)",
                    absolute.display()
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a root on a network file system (`statfs` of the root, or
    /// its nearest existing ancestor), unless overridden.
    fn check_placement(&self) -> Result<(), HostError> {
        if self.allow_network_fs {
            return Ok(());
        }
        placement(
            ("the object root", "root"),
            check_local(&self.root),
            "SqliteObjectStore::allow_network_file_system(true)",
        )
    }

    /// The storage id's `ADMISSION` file locked shared (the process's
    /// admitted calls share one lock, module `admission`), then the
    /// tombstone checked.
    fn admit(
        &self,
        storage: &StorageId,
    ) -> impl Future<Output = Result<Option<AdmissionLock>, StorageError>> + Send {
        let shared = self.admission(storage);
        async move {
            let lock = admission::admit(&shared).await?;
            Ok((!shared.tombstoned()).then_some(lock))
        }
    }

    /// The storage id's `ADMISSION` file locked exclusively.
    fn exclude(
        &self,
        storage: &StorageId,
    ) -> impl Future<Output = Result<AdmissionLock, StorageError>> + Send {
        admission::lock(self.storage_dir(storage), true)
    }

    fn prepare(&self, storage: &StorageId) -> Result<(), (&'static str, String)> {
        std::fs::create_dir_all(self.storage_dir(storage)).map_err(|e| {
            (
                "root",
                format!("cannot create {}: {e}", self.root.display()),
            )
        })
    }

    fn tombstone(&self, storage: &StorageId) -> Option<String> {
        let path = self.storage_dir(storage).join(TOMBSTONE_FILE);
        path.exists().then(|| path.display().to_string())
    }

    /// A temporary file, fsynced, renamed over the tombstone, and the
    /// directory fsynced.
    fn write_tombstone(
        &self,
        storage: &StorageId,
        lifecycle: &LifecycleId,
        state: TombstoneState,
    ) -> Result<(), StorageError> {
        use std::io::Write as _;
        let dir = self.storage_dir(storage);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            let tmp = dir.join(format!("{TOMBSTONE_FILE}.tmp"));
            {
                let mut f = std::fs::File::create(&tmp)?;
                writeln!(
                    f,
                    "storage_id={}\nlifecycle={}\nstate={}",
                    storage.as_str(),
                    lifecycle.as_str(),
                    state.as_str()
                )?;
                f.sync_all()?;
            }
            std::fs::rename(&tmp, dir.join(TOMBSTONE_FILE))?;
            std::fs::File::open(&dir)?.sync_all()
        };
        write().map_err(io_error(format!(
            "write the tombstone of storage {}",
            storage.as_str()
        )))
    }

    fn open(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
    ) -> impl Future<Output = Result<Arc<SqliteStorage>, StorageError>> + Send {
        let (path, files) = self.existing_db(storage, object);
        let open = || {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(io_error(format!("create {}", dir.display())))?;
            }
            // The real name is durable before the database exists.
            if let Some((sidecar, text)) = files.as_ref().and_then(|f| f.sidecar.as_ref()) {
                ensure_sidecar(sidecar, text)?;
            }
            SqliteStorage::open(&path, self.options).map(Arc::new)
        };
        std::future::ready(open())
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

    /// Sorted by relative path; the cursor is the last path listed. A
    /// database file that does not decode to its object (a hashed file
    /// without a readable sidecar, a file where no object's mapping puts
    /// it) fails the listing with a `Corrupt` error naming it.
    fn list(
        &self,
        storage: &StorageId,
        cursor: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<ObjectPage, StorageError>> + Send {
        let base = self.storage_dir(storage);
        let list = || {
            let mut files = Vec::new();
            object_files(&base, &base, &mut files)
                .map_err(io_error(format!("list {}", base.display())))?;
            let mut listed: Vec<(String, &Path)> = files
                .iter()
                .map(|f| (f.to_string_lossy().into_owned(), f.as_path()))
                .filter(|(f, _)| cursor.is_none_or(|c| f.as_str() > c))
                .collect();
            listed.sort();
            let mut files = Vec::with_capacity(listed.len().min(limit + 1));
            for (shown, relative) in listed.into_iter().take(limit.saturating_add(1)) {
                let object = names::object_of(&base, relative).map_err(|reason| {
                    StorageError::corrupt(format!("storage {}: {reason}", storage.as_str()))
                })?;
                files.push((shown, object));
            }
            files.sort();
            let more = files.len() > limit;
            files.truncate(limit);
            Ok(ObjectPage {
                cursor: more.then(|| files.last().map(|(f, _)| f.clone())).flatten(),
                objects: files.into_iter().map(|(_, o)| o).collect(),
            })
        };
        std::future::ready(list())
    }

    /// Reads the class's directories (its current one and its legacy
    /// one), decodes every file strictly (as [`ObjectStore::list`]), and
    /// sorts the class's names: each page costs a scan of the class (the
    /// file names of hashed objects carry no order).
    fn list_class(
        &self,
        storage: &StorageId,
        query: &ObjectQuery,
    ) -> impl Future<Output = Result<ObjectPage, StorageError>> + Send {
        let base = self.storage_dir(storage);
        let list = || {
            let current = names::files(Path::new(""), "", query.class(), "x").db;
            let mut dirs: Vec<PathBuf> = current
                .parent()
                .map(Path::to_path_buf)
                .into_iter()
                .collect();
            dirs.push(PathBuf::from(query.class()));
            dirs.dedup();
            let mut files = Vec::new();
            for dir in &dirs {
                object_files(&base, &base.join(dir), &mut files)
                    .map_err(io_error(format!("list {}", base.join(dir).display())))?;
            }
            let mut names = Vec::new();
            for relative in &files {
                let object = names::object_of(&base, relative).map_err(|reason| {
                    StorageError::corrupt(format!("storage {}: {reason}", storage.as_str()))
                })?;
                if object.class == query.class() && query.admits(&object.name) {
                    names.push(object.name);
                }
            }
            names.sort();
            names.dedup();
            let more = names.len() > query.limit();
            names.truncate(query.limit());
            Ok(ObjectPage {
                cursor: more.then(|| names.last().cloned()).flatten(),
                objects: names
                    .into_iter()
                    .map(|name| ObjectKey {
                        class: query.class().to_owned(),
                        name,
                    })
                    .collect(),
            })
        };
        std::future::ready(list())
    }

    fn find(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
    ) -> impl Future<Output = Result<Option<Arc<SqliteStorage>>, StorageError>> + Send {
        let (path, _) = self.existing_db(storage, object);
        let found = if path.is_file() {
            SqliteStorage::open(&path, self.options).map(|s| Some(Arc::new(s)))
        } else {
            Ok(None)
        };
        std::future::ready(found)
    }

    fn fences(found: &SqliteStorage) -> Result<Vec<(String, u64)>, StorageError> {
        durability_scheduler::Storage::transaction(found, |tx| tx.fences())
    }

    fn export_tx(tx: &mut StoreTx<'_, Self>) -> Result<ObjectImage, ImageError> {
        tx.export_image()
    }

    /// The image installed crash-safely over the object's file (a new
    /// file renamed into place: `durability_storage_sqlite::image::install_image`),
    /// after a hashed object's name file.
    fn import(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
        image: &ObjectImage,
        replace: bool,
    ) -> impl Future<Output = Result<(), ImageError>> + Send {
        let (path, files) = self.existing_db(storage, object);
        let import = || {
            if path.is_file() && !replace {
                return Err(ImageError::TargetNotEmpty(format!(
                    "{} exists",
                    path.display()
                )));
            }
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(io_error(format!("create {}", dir.display())))?;
            }
            if let Some((sidecar, text)) = files.as_ref().and_then(|f| f.sidecar.as_ref()) {
                ensure_sidecar(sidecar, text)?;
            }
            durability_storage_sqlite::image::install_image(&path, image, replace, self.options)
        };
        std::future::ready(import())
    }

    fn delete_object(
        &self,
        storage: &StorageId,
        object: &ObjectKey,
    ) -> impl Future<Output = Result<bool, StorageError>> + Send {
        let files = self.files(storage, object);
        let legacy = names::legacy_path(&self.root, storage.as_str(), &object.class, &object.name);
        let delete = || {
            let mut deleted = false;
            for path in [&legacy, &files.db] {
                for companion in COMPANIONS {
                    let mut file = path.clone().into_os_string();
                    file.push(companion);
                    remove(Path::new(&file))?;
                }
                deleted |= remove(path)?;
            }
            // The name goes last: a database never outlives it.
            if let Some((sidecar, _)) = &files.sidecar {
                remove(sidecar)?;
            }
            Ok(deleted)
        };
        std::future::ready(delete())
    }

    fn delete_rest(
        &self,
        storage: &StorageId,
    ) -> impl Future<Output = Vec<(String, String)>> + Send {
        let mut failures = Vec::new();
        delete_files(&self.storage_dir(storage), &mut failures);
        std::future::ready(failures)
    }
}

/// Why the start check refused a path (a network file system, or the
/// kernel could not say).
pub(crate) use durability_storage_sqlite::local_fs::CheckError as PlacementError;
/// The start check of one path: its file system (`statfs`).
pub(crate) use durability_storage_sqlite::local_fs::check_local;

/// The files of the SQLite stores among a host's lease store (a
/// `SqliteLeaseStore` on the system clock) and alarm index (a
/// `SqliteAlarmIndex`), each with what it is and its setting name;
/// in-memory stores and other backends have none.
pub(crate) fn store_files(
    leases: &dyn std::any::Any,
    index: &dyn std::any::Any,
) -> Vec<(&'static str, &'static str, PathBuf)> {
    use durability_storage_sqlite::{alarms::SqliteAlarmIndex, ownership::SqliteLeaseStore};
    let lease_file = leases
        .downcast_ref::<SqliteLeaseStore<durability_ownership::SystemClock>>()
        .and_then(|s| s.with_connection(|c| c.path().map(PathBuf::from)));
    let index_file = index
        .downcast_ref::<SqliteAlarmIndex>()
        .and_then(SqliteAlarmIndex::path);
    [
        ("the SQLite lease store", "lease_store", lease_file),
        ("the SQLite alarm index", "alarm_index", index_file),
    ]
    .into_iter()
    .filter_map(|(what, setting, file)| {
        Some((what, setting, file.filter(|f| !f.as_os_str().is_empty())?))
    })
    .collect()
}

/// The start check's verdict on `what` (`the object root`, `the SQLite
/// lease store`), whose setting is `setting`, as the host's error, naming
/// the override.
pub(crate) fn placement(
    (what, setting): (&str, &'static str),
    checked: Result<(), durability_storage_sqlite::local_fs::CheckError>,
    override_with: &'static str,
) -> Result<(), HostError> {
    use durability_storage_sqlite::local_fs::CheckError;
    match checked {
        Ok(()) => Ok(()),
        Err(CheckError::Network(n)) => Err(HostError::NetworkFileSystem {
            path: format!("{what} {}", n.path.display()),
            override_with,
            file_system: n.file_system,
            why: "SQLite's WAL needs shared memory and reliable locks, which a network \
                  file system does not give processes on different machines, so the \
                  SQLite directory is for processes on one machine"
                .to_owned(),
        }),
        Err(e @ CheckError::Io { .. }) => Err(HostError::setting(setting, e.to_string())),
    }
}

/// Removes a file; `false` when it was not there.
fn remove(path: &Path) -> Result<bool, StorageError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StorageError::backend(path.display().to_string(), e)),
    }
}

/// Deletes every file under `dir` except the tombstone and the admission
/// lock (another process may hold it open: a new file would not share its
/// lock), then the empty
/// directories; failures go to `failures`.
fn delete_files(dir: &Path, failures: &mut Vec<(String, String)>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            failures.push((dir.display().to_string(), e.to_string()));
            return;
        }
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                failures.push((dir.display().to_string(), e.to_string()));
                continue;
            }
        };
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            delete_files(&path, failures);
            // Not empty when something inside failed: that is reported.
            let _ = std::fs::remove_dir(&path);
            continue;
        }
        if entry.file_name() == TOMBSTONE_FILE || entry.file_name() == ADMISSION_FILE {
            continue;
        }
        if let Err(e) = remove(&path) {
            failures.push((path.display().to_string(), e.to_string()));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod placement_tests {
    use durability_storage_sqlite::local_fs::{CheckError, NetworkFileSystem, network_file_system};

    use super::*;

    /// The refusal for each network type the decision names, by injected
    /// `statfs` type (no network mount is needed).
    #[test]
    fn a_root_on_a_network_file_system_is_refused_with_what_to_use_instead() {
        for (f_type, expected) in [
            (0x6969_u64, "NFS"),
            (0xFF53_4D42, "CIFS"),
            (0x6573_5546, "FUSE"),
        ] {
            let file_system = network_file_system(f_type).unwrap();
            assert_eq!(file_system, expected);
            let e = placement(
                ("the object root", "root"),
                Err(CheckError::Network(NetworkFileSystem {
                    path: PathBuf::from("/mnt/shared/objects"),
                    file_system,
                })),
                "SqliteObjectStore::allow_network_file_system(true)",
            )
            .unwrap_err();
            assert_eq!(e.code(), "host_network_file_system");
            let text = e.to_string();
            for part in [
                "/mnt/shared/objects",
                expected,
                "WAL",
                "one machine",
                "PostgreSQL",
                "allow_network_file_system",
            ] {
                assert!(text.contains(part), "{part} in {text}");
            }
        }
        assert!(network_file_system(0xEF53).is_none(), "ext4 is local");
    }

    #[test]
    fn a_local_root_passes() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteObjectStore::new(dir.path().join("objects"));
        store.check_placement().unwrap();
        // /dev/shm is a tmpfs where it exists.
        if Path::new("/dev/shm").is_dir() {
            SqliteObjectStore::new("/dev/shm/durability-not-created")
                .check_placement()
                .unwrap();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod store_placement_tests {
    use durability_ownership::ShardCount;
    use durability_storage_sqlite::alarms::SqliteAlarmIndex;
    use durability_storage_sqlite::local_fs::{CheckError, NetworkFileSystem, network_file_system};
    use durability_storage_sqlite::ownership::SqliteLeaseStore;

    use super::*;
    use crate::HostConfig;
    use durability_ownership::SystemClock;

    type Config = HostConfig<SqliteLeaseStore<SystemClock>, SqliteAlarmIndex, SqliteObjectStore>;

    fn config(dir: &Path, index: SqliteAlarmIndex) -> Config {
        let leases = SqliteLeaseStore::open(
            dir.join("leases.db"),
            SystemClock::new(),
            ShardCount::default(),
        )
        .unwrap();
        HostConfig::new(
            Arc::new(leases),
            Arc::new(index),
            dir.join("objects"),
            crate::HostIds::new(
                StorageId::new("st1").unwrap(),
                LifecycleId::new("ns:app").unwrap(),
                crate::TaskId::new("a").unwrap(),
            ),
        )
    }

    /// A checker that puts `file` on NFS and everything else on a local disk.
    fn nfs_at(file: PathBuf) -> impl Fn(&Path) -> Result<(), CheckError> {
        move |p| {
            if p == file {
                Err(CheckError::Network(NetworkFileSystem {
                    path: p.to_owned(),
                    file_system: network_file_system(0x6969).unwrap(),
                }))
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn the_sqlite_lease_store_and_alarm_index_files_are_found_and_checked_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let index =
            SqliteAlarmIndex::open(dir.path().join("alarms.db"), Default::default()).unwrap();
        let config = config(dir.path(), index);
        let files: Vec<(&str, PathBuf)> =
            store_files(config.lease_store.as_ref(), config.alarm_index.as_ref())
                .into_iter()
                .map(|(what, _, f)| (what, f))
                .collect();
        assert_eq!(
            files,
            [
                ("the SQLite lease store", dir.path().join("leases.db")),
                ("the SQLite alarm index", dir.path().join("alarms.db")),
            ]
        );
        // Local (a temporary directory): the real check passes.
        config.check_placement_with(check_local).unwrap();
        for (what, file) in files {
            let e = config
                .check_placement_with(nfs_at(file.clone()))
                .unwrap_err();
            assert_eq!(e.code(), "host_network_file_system");
            let text = e.to_string();
            for part in [
                what,
                file.to_str().unwrap(),
                "NFS",
                "one machine",
                "PostgreSQL",
                "allow_sqlite_stores_on_network_file_system",
            ] {
                assert!(text.contains(part), "{part} in {text}");
            }
        }
        // The documented override.
        let config = config.allow_sqlite_stores_on_network_file_system(true);
        config
            .check_placement_with(nfs_at(dir.path().join("alarms.db")))
            .unwrap();
    }

    #[test]
    fn an_in_memory_alarm_index_has_no_file_to_check() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), SqliteAlarmIndex::open_in_memory().unwrap());
        let files: Vec<&str> =
            store_files(config.lease_store.as_ref(), config.alarm_index.as_ref())
                .into_iter()
                .map(|(what, _, _)| what)
                .collect();
        assert_eq!(files, ["the SQLite lease store"]);
    }
}

impl crate::store::IdempotencyRows for durability_storage_sqlite::SqliteTx<'_> {
    fn idempotency_result(&self, method: &str, key: &str) -> Result<Option<String>, StorageError> {
        durability_storage_sqlite::SqliteTx::idempotency_result(self, method, key)
    }

    fn record_idempotency_result(
        &self,
        method: &str,
        key: &str,
        result: &str,
    ) -> Result<(), StorageError> {
        durability_storage_sqlite::SqliteTx::record_idempotency_result(self, method, key, result)
    }

    fn prune_idempotency_results(&self, limit: u32) -> Result<usize, StorageError> {
        durability_storage_sqlite::SqliteTx::prune_idempotency_results(self, limit)
    }
}
