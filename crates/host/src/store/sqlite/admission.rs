//! The storage id's admission lock: one file, `<root>/<storage id>/ADMISSION`,
//! locked shared by every admitted call of every host process on the
//! machine (for as long as the call runs) and exclusively by a storage
//! deletion (for as long as it deletes files). Advisory file locks
//! (`flock`) work across processes and between open files of one process,
//! and the kernel releases them when a process dies.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use durability_scheduler::StorageError;

/// The lock file of a storage id (kept by a deletion, like the tombstone).
pub const ADMISSION_FILE: &str = "ADMISSION";

/// A held lock on a storage id's admission file (shared for admitted work,
/// exclusive for a deletion); released when dropped.
#[derive(Debug)]
pub struct AdmissionLock {
    _file: File,
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

/// Takes the lock of the storage directory `dir`, shared or exclusive:
/// at once when free, else on a blocking thread until it is (a deletion
/// waits for admitted calls to end; a call waits for a deletion to end).
pub(super) async fn lock(dir: PathBuf, exclusive: bool) -> Result<AdmissionLock, StorageError> {
    let file = open(&dir)?;
    let tried = if exclusive {
        file.try_lock()
    } else {
        file.try_lock_shared()
    };
    let failed = |e: std::io::Error| StorageError::backend(format!("lock {}", dir.display()), e);
    match tried {
        Ok(()) => Ok(AdmissionLock { _file: file }),
        Err(TryLockError::Error(e)) => Err(failed(e)),
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
            waited
                .map(|file| AdmissionLock { _file: file })
                .map_err(failed)
        }
    }
}
