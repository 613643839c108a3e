//! Owner scopes `<storage id>:<class>:shard<N>` and the names they are built from.
//!
//! Every name type validates its grammar and limit on construction, so a
//! value of these types is always well formed.

use std::fmt;

use crate::error::OwnershipError;

/// Maximum bytes of a host id (the canonical scope string).
pub const MAX_HOST_ID_BYTES: usize = 512;
/// Maximum bytes of a class name.
pub const MAX_CLASS_NAME_BYTES: usize = 468;
/// Maximum bytes of a storage id.
pub const MAX_STORAGE_ID_BYTES: usize = 128;
/// Maximum bytes of a task id.
pub const MAX_TASK_ID_BYTES: usize = 512;
/// Maximum bytes of a lifecycle id.
pub const MAX_LIFECYCLE_ID_BYTES: usize = 256;
/// Default number of shards per class.
pub const DEFAULT_SHARD_COUNT: u32 = 16;
/// Largest accepted shard count.
pub const MAX_SHARD_COUNT: u32 = 1024;
/// Largest JavaScript-safe integer (2^53 - 1), the bound of generations and
/// settings, unsigned: the workspace's one limit from `durability-time`.
pub use durability_time::MAX_SAFE_UNSIGNED as MAX_SAFE_INTEGER;

const RESERVED_WORDS: &[&str] = &[
    "await",
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "default",
    "delete",
    "do",
    "else",
    "enum",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "implements",
    "import",
    "in",
    "instanceof",
    "interface",
    "let",
    "new",
    "null",
    "package",
    "private",
    "protected",
    "public",
    "return",
    "static",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "yield",
];

fn is_opaque_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// Refuses `s` unless every byte is `allowed`, with `grammar` as the reason.
fn only(s: &str, allowed: impl Fn(u8) -> bool, grammar: &str) -> Result<(), String> {
    if s.bytes().all(allowed) {
        Ok(())
    } else {
        Err(grammar.to_owned())
    }
}

/// The ASCII JavaScript class-name grammar (`[A-Za-z_$][A-Za-z0-9_$]*`, not
/// a reserved word) of a non-empty `s`.
fn class_name_grammar(s: &str) -> Result<(), String> {
    let bytes = s.as_bytes();
    let first_ok = bytes[0].is_ascii_alphabetic() || matches!(bytes[0], b'_' | b'$');
    let rest_ok = bytes[1..]
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$'));
    if !first_ok || !rest_ok {
        return Err("not an ASCII JavaScript class name".to_owned());
    }
    if RESERVED_WORDS.contains(&s) {
        return Err(format!("`{s}` is a reserved word"));
    }
    Ok(())
}

/// Declares a validated name type: a string of 1..=`$max` bytes that
/// `$grammar` (a `fn(&str) -> Result<(), String>` over a non-empty string,
/// the reason on refusal) accepts; `$what` names it in refusals.
macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:expr, $grammar:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            #[doc = concat!("Validates a ", $what, ".")]
            ///
            /// # Errors
            /// [`OwnershipError::InvalidInput`] when empty, too long or outside the grammar.
            pub fn new(s: &str) -> Result<Self, OwnershipError> {
                if s.is_empty() || s.len() > $max {
                    return Err(OwnershipError::invalid(
                        $what,
                        format!("length {} not in 1..={}", s.len(), $max),
                    ));
                }
                let grammar: fn(&str) -> Result<(), String> = $grammar;
                grammar(s).map_err(|reason| OwnershipError::invalid($what, reason))?;
                Ok(Self(s.to_owned()))
            }

            #[doc = concat!("The ", $what, " as a string.")]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
    };
}

name_type!(
    /// An opaque storage id: 1..=128 bytes of `[A-Za-z0-9._-]`.
    StorageId,
    "storage id",
    MAX_STORAGE_ID_BYTES,
    |s| only(s, is_opaque_id_byte, "allowed characters are [A-Za-z0-9._-]")
);

name_type!(
    /// A class name: the ASCII JavaScript class-name grammar
    /// (`[A-Za-z_$][A-Za-z0-9_$]*`, not a reserved word), at most 468 bytes.
    ClassName,
    "class name",
    MAX_CLASS_NAME_BYTES,
    class_name_grammar
);

name_type!(
    /// A task identity (for example an ECS task ARN): 1..=512 printable ASCII
    /// bytes without spaces, quotes or backslashes.
    TaskId,
    "task id",
    MAX_TASK_ID_BYTES,
    |s| {
        only(
            s,
            |b| b.is_ascii_graphic() && b != b'"' && b != b'\\',
            "allowed characters are printable ASCII except quote and backslash",
        )
    }
);

name_type!(
    /// The logical worker a storage id belongs to (for example `<namespace>:<worker>`):
    /// it names the active storage pointer and the delete lock that claims watch.
    /// 1..=256 bytes of `[A-Za-z0-9._:-]`.
    LifecycleId,
    "lifecycle id",
    MAX_LIFECYCLE_ID_BYTES,
    |s| only(s, |b| is_opaque_id_byte(b) || b == b':', "allowed characters are [A-Za-z0-9._:-]")
);

/// A well-formed Unicode object name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectName(String);

impl ObjectName {
    /// An object name from a Rust string (always well-formed Unicode).
    pub fn new(s: &str) -> Self {
        Self(s.to_owned())
    }

    /// An object name from UTF-16 code units, as JavaScript callers hold them.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidInput`] when the units contain a lone surrogate.
    pub fn from_utf16(units: &[u16]) -> Result<Self, OwnershipError> {
        String::from_utf16(units)
            .map(Self)
            .map_err(|_| OwnershipError::invalid("object name", "contains a lone UTF-16 surrogate"))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The stable hash of an object name: 64-bit FNV-1a over its UTF-8 bytes.
///
/// This function is part of the stored contract (it decides which scope owns
/// an object); test vectors pin it.
pub fn stable_hash(name: &ObjectName) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    name.0
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The fixed number of shards of a class (1..=1024, 16 by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardCount(u32);

impl Default for ShardCount {
    fn default() -> Self {
        Self(DEFAULT_SHARD_COUNT)
    }
}

impl ShardCount {
    /// Validates a shard count.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidInput`] when not in 1..=1024.
    pub fn new(n: u32) -> Result<Self, OwnershipError> {
        if n == 0 || n > MAX_SHARD_COUNT {
            return Err(OwnershipError::invalid(
                "shard count",
                format!("{n} not in 1..={MAX_SHARD_COUNT}"),
            ));
        }
        Ok(Self(n))
    }

    /// The count.
    pub fn get(self) -> u32 {
        self.0
    }

    /// The shard that owns `name`: `stable_hash(name) % count`.
    pub fn shard_of(self, name: &ObjectName) -> u32 {
        // The remainder is below `self.0`, a u32, so the conversion is lossless.
        u32::try_from(stable_hash(name) % u64::from(self.0)).unwrap_or(0)
    }
}

/// Parses a canonical `shard<N>` suffix (no leading zeros, `N < count`).
///
/// # Errors
/// [`OwnershipError::InvalidInput`] when not canonical or out of range.
pub fn parse_shard(s: &str, count: ShardCount) -> Result<u32, OwnershipError> {
    let digits = s
        .strip_prefix("shard")
        .ok_or_else(|| OwnershipError::invalid("shard", "must be shard<N>"))?;
    let canonical = !digits.is_empty()
        && digits.len() <= 4
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if !canonical {
        return Err(OwnershipError::invalid(
            "shard",
            format!("`{s}` is not canonical shard<N>"),
        ));
    }
    let n: u32 = digits.parse().map_err(|_| {
        OwnershipError::invalid("shard", format!("`{s}` is not canonical shard<N>"))
    })?;
    if n >= count.get() {
        return Err(OwnershipError::invalid(
            "shard",
            format!("{n} not below shard count {}", count.get()),
        ));
    }
    Ok(n)
}

/// An owner scope: one class shard of one storage id. Its canonical string
/// `<storage id>:<class>:shard<N>` is the host id, at most 512 bytes.
///
/// A scope also knows the shard count it was built under: the count is a
/// property of the storage id (recorded once in the lifecycle record, see
/// [`crate::check_shard_count`]), and the same host id under two counts
/// names two different scopes (an object hashes to different shards).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerScope {
    storage_id: StorageId,
    class: ClassName,
    shard: u32,
    host_id: String,
    count: ShardCount,
}

impl OwnerScope {
    /// Builds the scope of shard `shard` of `class` under `storage_id`.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidInput`] when the shard is out of range or the
    /// host id would exceed 512 bytes.
    pub fn new(
        storage_id: StorageId,
        class: ClassName,
        shard: u32,
        count: ShardCount,
    ) -> Result<Self, OwnershipError> {
        if shard >= count.get() {
            return Err(OwnershipError::invalid(
                "shard",
                format!("{shard} not below shard count {}", count.get()),
            ));
        }
        let host_id = format!("{}:{}:shard{shard}", storage_id.as_str(), class.as_str());
        if host_id.len() > MAX_HOST_ID_BYTES {
            return Err(OwnershipError::invalid(
                "host id",
                format!("{} bytes exceed {MAX_HOST_ID_BYTES}", host_id.len()),
            ));
        }
        Ok(Self {
            storage_id,
            class,
            shard,
            host_id,
            count,
        })
    }

    /// The scope owning object `name` of `class` under `storage_id`.
    ///
    /// # Errors
    /// As [`OwnerScope::new`].
    pub fn for_object(
        storage_id: StorageId,
        class: ClassName,
        name: &ObjectName,
        count: ShardCount,
    ) -> Result<Self, OwnershipError> {
        let shard = count.shard_of(name);
        Self::new(storage_id, class, shard, count)
    }

    /// Parses a canonical host id `<storage id>:<class>:shard<N>`.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidInput`] when any part breaks its grammar.
    pub fn parse(host_id: &str, count: ShardCount) -> Result<Self, OwnershipError> {
        if host_id.len() > MAX_HOST_ID_BYTES {
            return Err(OwnershipError::invalid(
                "host id",
                format!("{} bytes exceed {MAX_HOST_ID_BYTES}", host_id.len()),
            ));
        }
        let mut parts = host_id.split(':');
        let (Some(storage), Some(class), Some(shard), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(OwnershipError::invalid(
                "host id",
                "must be <storage id>:<class>:shard<N>",
            ));
        };
        let shard = parse_shard(shard, count)?;
        Self::new(
            StorageId::new(storage)?,
            ClassName::new(class)?,
            shard,
            count,
        )
    }

    /// The storage id.
    pub fn storage_id(&self) -> &StorageId {
        &self.storage_id
    }

    /// The class name.
    pub fn class(&self) -> &ClassName {
        &self.class
    }

    /// The shard index.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The canonical host id string.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    /// The shard count the scope was built under.
    pub fn shard_count(&self) -> ShardCount {
        self.count
    }
}

impl fmt::Display for OwnerScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.host_id)
    }
}

#[cfg(test)]
mod tests;
