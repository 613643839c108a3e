//! Where an object's file is in the SQLite directory, and which object a
//! file holds: the current mapping, and the legacy one files created by
//! earlier versions still use (found by a second lookup, never written).
//!
//! Current mapping, under `<root>/<storage id>/`:
//!
//! - the class directory is the class name when it is at most
//!   [`PLAIN_MAX`] bytes, else `~` and the SHA-256 of the class in hex
//!   (a class name never starts with `~`);
//! - in a plain class directory, a name of at most [`PLAIN_MAX`] bytes of
//!   `[A-Za-z0-9_-]` is its own file name (`<name>.sqlite`); every other
//!   object is `@<hex>.sqlite`, where `<hex>` is the SHA-256 of
//!   `<class> NUL <name>`, with a sidecar `@<hex>.name` holding
//!   `<class>\n<name>` (written durably before the database is created),
//!   from which listing reads the real names. `@` is not a plain
//!   character and `~` is the legacy encoding's mark, so no two forms
//!   collide.
//!
//! Every path is then at most [`MAX_ROOT_BYTES`] + 276 bytes, inside
//! SQLite's 512-byte path limit, for any valid storage id (≤ 128 bytes),
//! class (≤ 468 bytes) and name.
//!
//! Legacy mapping (read only): `<class>/<name>.sqlite` for a plain name of
//! at most 200 bytes, else `~` and the name's UTF-8 in hex, split into
//! directories of at most 200 characters.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::store::ObjectKey;

/// The extension of an object database.
pub(super) const EXTENSION: &str = "sqlite";

/// The extension of a hashed object's name sidecar.
pub(super) const NAME_EXTENSION: &str = "name";

/// Longest class or object name used as its own file name, in bytes.
pub(super) const PLAIN_MAX: usize = 64;

/// Longest object root accepted (absolute, in bytes): with it, every
/// object path fits SQLite's 512-byte path limit.
pub const MAX_ROOT_BYTES: usize = 200;

/// Longest plain name of the legacy mapping.
const LEGACY_PLAIN_MAX: usize = 200;

/// Where one object's files are under the current mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Files {
    /// The database.
    pub(super) db: PathBuf,
    /// The name sidecar and what it holds, for a hashed file name.
    pub(super) sidecar: Option<(PathBuf, String)>,
}

fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn plain(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The class directory's name.
fn class_dir(class: &str) -> String {
    if class.len() <= PLAIN_MAX {
        class.to_owned()
    } else {
        format!("~{}", sha256_hex(&[class.as_bytes()]))
    }
}

/// What a hashed object's sidecar holds.
fn sidecar_text(class: &str, name: &str) -> String {
    format!("{class}\n{name}")
}

/// The files of object `name` of `class` under the current mapping.
pub(super) fn files(root: &Path, storage: &str, class: &str, name: &str) -> Files {
    let dir = root.join(storage).join(class_dir(class));
    if class.len() <= PLAIN_MAX && plain(name, PLAIN_MAX) {
        return Files {
            db: dir.join(format!("{name}.{EXTENSION}")),
            sidecar: None,
        };
    }
    let hash = sha256_hex(&[class.as_bytes(), &[0], name.as_bytes()]);
    Files {
        db: dir.join(format!("@{hash}.{EXTENSION}")),
        sidecar: Some((
            dir.join(format!("@{hash}.{NAME_EXTENSION}")),
            sidecar_text(class, name),
        )),
    }
}

/// The file of object `name` of `class` under the legacy mapping.
pub(super) fn legacy_path(root: &Path, storage: &str, class: &str, name: &str) -> PathBuf {
    let mut path = root.join(storage).join(class);
    if plain(name, LEGACY_PLAIN_MAX) {
        return path.join(format!("{name}.{EXTENSION}"));
    }
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    let mut encoded = format!("~{hex}");
    while encoded.len() > LEGACY_PLAIN_MAX {
        let rest = encoded.split_off(LEGACY_PLAIN_MAX);
        path = path.join(&encoded);
        encoded = format!("~{rest}");
    }
    path.join(format!("{encoded}.{EXTENSION}"))
}

/// Parses a sidecar's text into the object it names.
pub(super) fn parse_sidecar(text: &str) -> Option<ObjectKey> {
    let (class, name) = text.split_once('\n')?;
    Some(ObjectKey {
        class: class.to_owned(),
        name: name.to_owned(),
    })
}

/// The object the database file at `relative` (under the storage
/// directory `base`, `<class dir>/<parts…>.sqlite`) holds. Strict: a file
/// that is not exactly where its object's current or legacy mapping puts
/// it, or a hashed file whose sidecar is missing or does not decode, is an
/// error (the reason), never skipped.
pub(super) fn object_of(base: &Path, relative: &Path) -> Result<ObjectKey, String> {
    let shown = relative.display();
    let parts: Vec<&str> = relative
        .iter()
        .map(|p| p.to_str())
        .collect::<Option<_>>()
        .ok_or_else(|| format!("{shown}: the path is not UTF-8"))?;
    let (last, dirs) = parts
        .split_last()
        .ok_or_else(|| format!("{shown}: empty path"))?;
    let stem = last
        .strip_suffix(&format!(".{EXTENSION}"))
        .ok_or_else(|| format!("{shown}: not a database file"))?;
    let (class_dir, inner) = dirs
        .split_first()
        .ok_or_else(|| format!("{shown}: not under a class directory"))?;
    let check = |key: ObjectKey, canonical: PathBuf| {
        (canonical == Path::new("").join(relative))
            .then_some(key)
            .ok_or_else(|| format!("{shown}: not where its object's file is"))
    };
    if stem.starts_with('@') && inner.is_empty() {
        let sidecar = base.join(relative).with_extension(NAME_EXTENSION);
        let text = std::fs::read(&sidecar)
            .map_err(|e| format!("{shown}: its name file cannot be read: {e}"))?;
        let key = String::from_utf8(text)
            .ok()
            .as_deref()
            .and_then(parse_sidecar)
            .ok_or_else(|| format!("{shown}: its name file does not decode"))?;
        let canonical = files(Path::new(""), "", &key.class, &key.name).db;
        return check(key, canonical);
    }
    if class_dir.starts_with('~') {
        return Err(format!("{shown}: a hashed class holds only hashed files"));
    }
    if durability_ownership::ClassName::new(class_dir).is_err() {
        return Err(format!("{shown}: {class_dir} is not a class name"));
    }
    let class = (*class_dir).to_owned();
    if inner.is_empty() && !stem.starts_with('~') {
        let key = ObjectKey {
            class,
            name: stem.to_owned(),
        };
        let canonical = legacy_path(Path::new(""), "", &key.class, &key.name);
        return check(key, canonical);
    }
    let mut hex = String::new();
    for part in inner.iter().chain(std::iter::once(&stem)) {
        hex.push_str(
            part.strip_prefix('~')
                .ok_or_else(|| format!("{shown}: not an encoded name"))?,
        );
    }
    let name = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| format!("{shown}: the encoded name does not decode"))?;
    let canonical = legacy_path(Path::new(""), "", &class, &name);
    check(ObjectKey { class, name }, canonical)
}
