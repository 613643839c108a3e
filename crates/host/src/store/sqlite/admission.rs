//! The storage id's admission lock: one file, `<root>/<storage id>/ADMISSION`,
//! locked shared by every admitted call of every host process on the
//! machine (for as long as the call runs) and exclusively by a storage
//! deletion (for as long as it deletes files). Advisory file locks
//! (`flock`) work across processes and between open files of one process,
//! and the kernel releases them when a process dies.
//!
//! Within one process the admitted calls of a storage id share one open
//! file and one shared lock on it ([`Shared`]): the first call to be
//! admitted while none is takes the lock, the last to end releases it, and
//! a call admitted while another runs only counts itself. The kernel sees
//! the same thing as before (the file locked shared exactly while some
//! admitted call of the process runs), so a deletion, which locks its own
//! open file exclusively, still waits out every admitted call and admits
//! none while it holds the lock; a call costs one `flock` to take and one
//! to release when it runs alone, and none when others run, instead of
//! opening, locking and closing the file every time. When the lock is
//! held exclusively (a deletion runs), the waiting call locks a file of
//! its own, as every call did before.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use durability_scheduler::StorageError;

/// The lock file of a storage id (kept by a deletion, like the tombstone).
pub const ADMISSION_FILE: &str = "ADMISSION";

/// A held lock on a storage id's admission file (shared for admitted work,
/// exclusive for a deletion); released when dropped.
#[derive(Debug)]
pub struct AdmissionLock {
    hold: Hold,
}

#[derive(Debug)]
enum Hold {
    /// One of the admitted calls counted on the process's shared lock.
    Counted(Arc<Shared>),
    /// A lock on a file of its own (a deletion, or a call that waited for
    /// one).
    Own {
        /// Locked; closing it releases the lock.
        _file: File,
    },
}

impl Drop for AdmissionLock {
    fn drop(&mut self) {
        if let Hold::Counted(shared) = &self.hold {
            shared.leave();
        }
    }
}

/// The process's shared lock on one storage id's admission file: the open
/// file (opened on first use, kept) and how many admitted calls hold it.
#[derive(Debug)]
pub(super) struct Shared {
    dir: PathBuf,
    /// The storage id's tombstone file.
    tombstone: PathBuf,
    state: Mutex<SharedState>,
}

#[derive(Debug, Default)]
struct SharedState {
    file: Option<File>,
    /// Admitted calls counted on the lock; the file is locked shared
    /// exactly while this is above zero.
    holders: usize,
}

impl Shared {
    /// The shared lock of the storage directory `dir`, whose tombstone is
    /// `tombstone` (nothing is opened yet).
    pub(super) fn new(dir: PathBuf, tombstone: PathBuf) -> Self {
        Self {
            dir,
            tombstone,
            state: Mutex::new(SharedState::default()),
        }
    }

    /// Whether the storage id's tombstone exists (checked by every
    /// admission while it holds the lock).
    pub(super) fn tombstoned(&self) -> bool {
        self.tombstone.exists()
    }

    fn state(&self) -> MutexGuard<'_, SharedState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts one admitted call on the shared lock when it is held or can
    /// be taken at once; `Ok(false)` when it is held exclusively elsewhere
    /// (the caller then waits on a file of its own).
    fn try_enter(&self) -> Result<bool, StorageError> {
        let mut state = self.state();
        if state.holders > 0 {
            state.holders += 1;
            return Ok(true);
        }
        let file = match state.file.take() {
            Some(file) => file,
            None => open(&self.dir)?,
        };
        let tried = file.try_lock_shared();
        state.file = Some(file);
        match tried {
            Ok(()) => {
                state.holders = 1;
                Ok(true)
            }
            Err(TryLockError::WouldBlock) => Ok(false),
            Err(TryLockError::Error(e)) => Err(failed(&self.dir, e)),
        }
    }

    /// Ends one admitted call: the last one releases the lock.
    fn leave(&self) {
        let mut state = self.state();
        state.holders = state.holders.saturating_sub(1);
        if state.holders == 0
            && let Some(file) = &state.file
            && let Err(e) = file.unlock()
        {
            // The kernel keeps a lock it failed to release; dropping the
            // file (its only description) releases it for sure.
            tracing::warn!(
                event = "durability.host.admission_unlock_failed",
                dir = %self.dir.display(),
                error = %e,
                "the admission lock was not released; its file is closed"
            );
            state.file = None;
        }
    }
}

fn failed(dir: &Path, e: std::io::Error) -> StorageError {
    StorageError::backend(format!("lock {}", dir.display()), e)
}

fn open(dir: &Path) -> Result<File, StorageError> {
    let path = dir.join(ADMISSION_FILE);
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
    };
    let file = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).and_then(|()| open())
        }
        other => other,
    };
    file.map_err(|e| StorageError::backend(format!("open {}", path.display()), e))
}

/// Admits one call under `shared`: counted on the process's shared lock
/// when no deletion holds the file, else (a deletion runs) a shared lock
/// on a file of its own, taken on a blocking thread once the deletion
/// ends.
pub(super) async fn admit(shared: &Arc<Shared>) -> Result<AdmissionLock, StorageError> {
    if shared.try_enter()? {
        return Ok(AdmissionLock {
            hold: Hold::Counted(Arc::clone(shared)),
        });
    }
    lock(shared.dir.clone(), false).await
}

/// Takes the lock of the storage directory `dir` on a file of its own,
/// shared or exclusive: at once when free, else on a blocking thread until
/// it is (a deletion waits for admitted calls to end; a call waits for a
/// deletion to end).
pub(super) async fn lock(dir: PathBuf, exclusive: bool) -> Result<AdmissionLock, StorageError> {
    let file = open(&dir)?;
    let tried = if exclusive {
        file.try_lock()
    } else {
        file.try_lock_shared()
    };
    let own = |file| AdmissionLock {
        hold: Hold::Own { _file: file },
    };
    match tried {
        Ok(()) => Ok(own(file)),
        Err(TryLockError::Error(e)) => Err(failed(&dir, e)),
        Err(TryLockError::WouldBlock) => {
            let waited = tokio::task::spawn_blocking(move || {
                if exclusive {
                    file.lock()
                } else {
                    file.lock_shared()
                }
                .map(|()| file)
            })
            .await
            .map_err(|e| StorageError::backend(format!("lock {}", dir.display()), e))?;
            waited.map(own).map_err(|e| failed(&dir, e))
        }
    }
}
