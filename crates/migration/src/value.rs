//! Column values, rows, their canonical encoding and digests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{MigrationError, Result};

/// One SQL value, bound as a parameter or read from a row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// A 64-bit integer.
    Integer(i64),
    /// A 64-bit float.
    Real(f64),
    /// UTF-8 text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

impl Value {
    /// The text, when this is a text value.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, when this is an integer value.
    pub fn as_integer(&self) -> Option<i64> {
        match self {
            Self::Integer(i) => Some(*i),
            _ => None,
        }
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Self::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Self::Text(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Self::Integer(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Self::Real(v)
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Self::Blob(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Self::Null, Into::into)
    }
}

/// A row: column name → value, in column-name order (the canonical order).
pub type Row = BTreeMap<String, Value>;

/// Builds a row from `(column, value)` pairs.
pub fn row<I, K, V>(pairs: I) -> Row
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<String>,
    V: Into<Value>,
{
    pairs
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
}

const ROW_FORMAT_VERSION: u8 = 1;

/// Encodes a row canonically: a version byte, then postcard of the sorted map.
pub fn encode_row(row: &Row) -> Vec<u8> {
    let mut out = vec![ROW_FORMAT_VERSION];
    // Serialising a BTreeMap of plain values into a Vec cannot fail.
    match postcard::to_stdvec(row) {
        Ok(bytes) => out.extend_from_slice(&bytes),
        Err(e) => {
            tracing::error!(
                event = "durability.migration.encode_failed",
                error = %e,
                "row encoding failed"
            );
        }
    }
    out
}

/// Decodes a row written by [`encode_row`].
///
/// # Errors
/// `CORRUPT_RECORD` when the bytes are not a row of a known version.
pub fn decode_row(bytes: &[u8]) -> Result<Row> {
    match bytes.split_first() {
        Some((&ROW_FORMAT_VERSION, rest)) => postcard::from_bytes(rest)
            .map_err(|e| MigrationError::Corrupt(format!("archived row: {e}"))),
        Some((v, _)) => Err(MigrationError::Corrupt(format!(
            "archived row has unknown format version {v}"
        ))),
        None => Err(MigrationError::Corrupt("archived row is empty".into())),
    }
}

/// The digest of a row (hex SHA-256 of its canonical encoding); `-` for no row.
pub fn digest(row: Option<&Row>) -> String {
    match row {
        None => "-".to_owned(),
        Some(r) => {
            let hash = Sha256::digest(encode_row(r));
            let mut s = String::with_capacity(64);
            for b in hash {
                s.push_str(&format!("{b:02x}"));
            }
            s
        }
    }
}
