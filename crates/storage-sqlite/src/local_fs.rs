//! Where a SQLite database is safe: a file system of this machine.
//!
//! The object databases, the lease store and the alarm index run in WAL
//! mode, whose readers and writers coordinate through a shared-memory
//! file (`-shm`) mapped by every process. Processes on different machines
//! that open one database over a network file system do not share that
//! memory, and network file systems' byte-range locks are unreliable:
//! SQLite documents WAL as unsupported there, and the fence a commit
//! checks would not stop a second machine's writer. So the SQLite
//! directory is for processes on ONE machine; hosts on several machines
//! keep their objects, leases and alarm jobs in PostgreSQL.
//!
//! [`network_file_system`] decides from a file system's type
//! (`statfs(2)`'s `f_type`) and is a pure function; [`check_local`] asks
//! the kernel about a path (its nearest existing ancestor when it does not
//! exist yet). FUSE is refused too: its type does not say what is behind
//! it, and the FUSE file systems servers mount are mostly remote (sshfs,
//! s3fs, gcsfuse, GlusterFS); a local FUSE mount needs the caller's
//! explicit override. Cluster file systems on a shared disk (GFS2,
//! OCFS2) are refused for the same reason as network ones: several
//! machines see the files.

use std::path::{Path, PathBuf};

/// The network, cluster and FUSE file systems [`network_file_system`]
/// knows, by `statfs` type (`linux/magic.h` and the file systems' own
/// sources).
pub const NETWORK_FILE_SYSTEMS: &[(u32, &str)] = &[
    (0x6969, "NFS"),
    (0x517B, "SMB"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x0102_1997, "9P"),
    (0x00C3_6400, "CephFS"),
    (0x6573_5546, "FUSE"),
    (0x5346_414F, "AFS"),
    (0x6B41_4653, "kAFS"),
    (0x0BD0_0BD0, "Lustre"),
    (0x4750_4653, "GPFS"),
    (0x0116_1970, "GFS2"),
    (0x7461_636F, "OCFS2"),
    (0x7375_7245, "Coda"),
    (0x564C, "NCP"),
    (0x1983_0326, "BeeGFS"),
    (0x2003_0528, "OrangeFS"),
];

/// The name of the network (or cluster, or FUSE) file system of type
/// `f_type`, or `None` for a local one. Only the low 32 bits count (the
/// kernel's magic numbers are 32-bit; some platforms sign-extend them).
pub fn network_file_system(f_type: u64) -> Option<&'static str> {
    let low = u32::try_from(f_type & 0xFFFF_FFFF).ok()?;
    NETWORK_FILE_SYSTEMS
        .iter()
        .find(|(magic, _)| *magic == low)
        .map(|(_, name)| *name)
}

/// A path on a file system SQLite's WAL is not safe on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} is on a {file_system} file system: SQLite's WAL needs shared memory and \
     reliable locks that a network file system does not give processes on different \
     machines, so a SQLite directory is for processes on one machine; use a local disk, \
     or PostgreSQL for hosts on several machines",
    path.display()
)]
pub struct NetworkFileSystem {
    /// The path checked.
    pub path: PathBuf,
    /// The file system's name ([`NETWORK_FILE_SYSTEMS`]).
    pub file_system: &'static str,
}

/// The `statfs` type of the file system holding `path`, or its nearest
/// existing ancestor.
///
/// # Errors
/// The kernel's error for the nearest existing ancestor.
pub fn file_system_type(path: &Path) -> std::io::Result<u64> {
    let mut probe = path;
    while !probe.as_os_str().is_empty() && !probe.exists() {
        probe = probe.parent().unwrap_or(Path::new(""));
    }
    let probe = if probe.as_os_str().is_empty() {
        Path::new(".")
    } else {
        probe
    };
    let stat = rustix::fs::statfs(probe)?;
    // `f_type`'s width and sign differ between platforms: its bits are the
    // magic number.
    #[allow(clippy::cast_sign_loss, clippy::unnecessary_cast)]
    Ok(stat.f_type as u64)
}

/// Refuses `path` when it is on a network file system.
///
/// # Errors
/// [`CheckError::Network`] for a network file system; [`CheckError::Io`]
/// when the kernel cannot say.
pub fn check_local(path: &Path) -> Result<(), CheckError> {
    let f_type = file_system_type(path).map_err(|source| CheckError::Io {
        path: path.to_owned(),
        source,
    })?;
    match network_file_system(f_type) {
        None => Ok(()),
        Some(file_system) => Err(CheckError::Network(NetworkFileSystem {
            path: path.to_owned(),
            file_system,
        })),
    }
}

/// Why [`check_local`] refused a path.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The path is on a network file system.
    #[error(transparent)]
    Network(NetworkFileSystem),
    /// The file system could not be asked.
    #[error("cannot tell the file system of {}: {source}", path.display())]
    Io {
        /// The path checked.
        path: PathBuf,
        /// The kernel's error.
        source: std::io::Error,
    },
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn network_types_are_named_and_local_ones_pass() {
        for (magic, name) in NETWORK_FILE_SYSTEMS {
            assert_eq!(network_file_system(u64::from(*magic)), Some(*name));
        }
        // Sign-extended on a platform with a signed 64-bit f_type.
        assert_eq!(network_file_system(0xFFFF_FFFF_FF53_4D42), Some("CIFS"));
        // ext4, xfs, btrfs, tmpfs, overlayfs, zfs.
        for local in [
            0xEF53_u64,
            0x5846_5342,
            0x9123_683E,
            0x0102_1994,
            0x794C_7630,
            0x2FC1_2FC1,
        ] {
            assert_eq!(network_file_system(local), None, "{local:#x}");
        }
    }

    #[test]
    fn a_temporary_directory_and_a_missing_path_below_it_are_local() {
        let dir = tempfile::tempdir().unwrap();
        check_local(dir.path()).unwrap();
        check_local(&dir.path().join("not/yet/made")).unwrap();
    }

    #[test]
    fn the_refusal_names_the_path_the_file_system_why_and_what_instead() {
        let e = NetworkFileSystem {
            path: PathBuf::from("/mnt/shared/objects"),
            file_system: "NFS",
        }
        .to_string();
        for part in [
            "/mnt/shared/objects",
            "NFS",
            "WAL",
            "one machine",
            "PostgreSQL",
        ] {
            assert!(e.contains(part), "{part} in {e}");
        }
    }
}
