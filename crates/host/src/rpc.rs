//! RPC on objects: named methods an object class registers, and the
//! limits on what a call may carry.
//!
//! A class registers methods with [`crate::HostConfig::method`]: a method
//! name (the identifier grammar, at most [`MAX_METHOD_BYTES`] ASCII bytes)
//! and an async handler taking the object's [`crate::Handle`] and the JSON
//! arguments, returning JSON. Arguments are structural JSON
//! ([`RpcArgs`]): finite numbers, strings, booleans, null, dense arrays and
//! plain objects, at most [`MAX_ARGS_BYTES`] encoded. `serde_json::Value`
//! cannot hold a non-finite number, a sparse array or a non-plain object,
//! and the wire reader refuses `NaN`/`Infinity` tokens, so the grammar is
//! enforced by the type; the size is checked on the canonical encoding
//! before dispatch. Everything is refused before dispatch with a typed
//! [`HostError`].
//!
//! A handler's error is the tenant's own: a [`MethodError`] keeps its code,
//! message and details across hosts, and is the same
//! [`HostError::Method`] on both paths; any other error is downgraded to
//! `internal_error`, so internal failures never leak details. Typed
//! methods over serde types: [`crate::typed`].

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::error::HostError;
pub use crate::error::{MAX_METHOD_MESSAGE_BYTES, METHOD_ERROR_STATUS, MethodError};
use crate::object::MethodInput;

/// The longest method name, in ASCII bytes.
pub const MAX_METHOD_BYTES: usize = 256;
/// The largest encoded arguments (and responses): 1 MiB.
pub const MAX_ARGS_BYTES: usize = 1024 * 1024;
/// The deepest nesting of arguments (serde_json's own reader limit).
pub const MAX_ARGS_DEPTH: usize = 128;

/// Checks a method name: the identifier grammar (`[A-Za-z_$][A-Za-z0-9_$]*`,
/// ASCII only), 1..=[`MAX_METHOD_BYTES`] bytes.
///
/// # Errors
/// [`HostError::InvalidMethod`] naming what is wrong.
pub fn validate_method(method: &str) -> Result<(), HostError> {
    let bad = |reason: &str| HostError::InvalidMethod {
        reason: reason.to_owned(),
    };
    if method.is_empty() {
        return Err(bad("the method name is empty"));
    }
    if method.len() > MAX_METHOD_BYTES {
        return Err(bad("the method name is longer than 256 bytes"));
    }
    let mut bytes = method.bytes();
    let first = bytes.next().unwrap_or(b'0');
    if !(first.is_ascii_alphabetic() || first == b'_' || first == b'$') {
        return Err(bad(
            "the method name must start with an ASCII letter, `_` or `$`",
        ));
    }
    if !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$') {
        return Err(bad(
            "the method name may hold only ASCII letters, digits, `_` and `$`",
        ));
    }
    Ok(())
}

/// Validated RPC arguments: structural JSON whose canonical encoding is at
/// most [`MAX_ARGS_BYTES`]. Cloning shares them (a routed call clones its
/// request once per attempt to set the route fence).
#[derive(Debug, Clone, PartialEq)]
pub struct RpcArgs {
    value: Arc<Value>,
}

impl RpcArgs {
    /// Validates `value`. The size is checked without encoding it: an
    /// upper bound of its canonical encoding, taken on the depth check's
    /// walk, settles every argument well under the cap; only one whose
    /// bound is over it is encoded (into a byte counter) to measure it.
    ///
    /// # Errors
    /// [`HostError::InvalidArgs`] when it is nested deeper than
    /// [`MAX_ARGS_DEPTH`] or its encoding exceeds [`MAX_ARGS_BYTES`].
    pub fn new(value: Value) -> Result<Self, HostError> {
        if encoded_len_bound(&value, 0)? > MAX_ARGS_BYTES {
            let len = encoded_len(&value)?;
            if len > MAX_ARGS_BYTES {
                return Err(HostError::InvalidArgs {
                    reason: format!(
                        "arguments are {len} bytes encoded, more than {MAX_ARGS_BYTES}"
                    ),
                });
            }
        }
        Ok(Self {
            value: Arc::new(value),
        })
    }

    /// Parses and validates arguments received as JSON text (the wire).
    /// `NaN`, `Infinity` and other non-JSON tokens are refused by the reader.
    ///
    /// # Errors
    /// [`HostError::InvalidArgs`] when the text is larger than
    /// [`MAX_ARGS_BYTES`], is not JSON, or breaks [`RpcArgs::new`].
    pub fn from_json(text: &str) -> Result<Self, HostError> {
        if text.len() > MAX_ARGS_BYTES {
            return Err(HostError::InvalidArgs {
                reason: format!(
                    "arguments are {} bytes, more than {MAX_ARGS_BYTES}",
                    text.len()
                ),
            });
        }
        let value: Value = serde_json::from_str(text).map_err(|e| HostError::InvalidArgs {
            reason: format!("arguments are not structural JSON: {e}"),
        })?;
        Self::new(value)
    }

    /// The arguments.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// Their canonical encoding (what crosses the wire), encoded on each
    /// call (the wire encodes them straight into the request body).
    pub fn encoded(&self) -> String {
        self.value.to_string()
    }

    /// The arguments, owned (copied only when a clone still shares them).
    pub fn into_value(self) -> Value {
        Arc::unwrap_or_clone(self.value)
    }
}

/// The most bytes serde_json writes for one number: a finite `f64` takes
/// at most 24 (`-1.7976931348623157e308` is 23), a 64-bit integer at most
/// 20; kept with room to spare, as it only bounds.
const MAX_NUMBER_BYTES: usize = 40;

/// An upper bound of `value`'s canonical (compact) encoding, in bytes,
/// refusing nesting deeper than [`MAX_ARGS_DEPTH`] on the way: every
/// string byte counts as a six-byte `\u00XX` escape, every number as
/// [`MAX_NUMBER_BYTES`], every array and object as its brackets, commas
/// and colons.
fn encoded_len_bound(value: &Value, depth: usize) -> Result<usize, HostError> {
    if depth > MAX_ARGS_DEPTH {
        return Err(HostError::InvalidArgs {
            reason: format!("arguments are nested deeper than {MAX_ARGS_DEPTH}"),
        });
    }
    let string = |s: &str| s.len().saturating_mul(6).saturating_add(2);
    Ok(match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => MAX_NUMBER_BYTES,
        Value::String(s) => string(s),
        Value::Array(items) => items.iter().try_fold(items.len() + 2, |n, v| {
            Ok::<_, HostError>(n.saturating_add(encoded_len_bound(v, depth + 1)?))
        })?,
        Value::Object(map) => map.iter().try_fold(map.len() * 2 + 2, |n, (k, v)| {
            let entry = string(k).saturating_add(encoded_len_bound(v, depth + 1)?);
            Ok::<_, HostError>(n.saturating_add(entry))
        })?,
    })
}

/// `value`'s exact canonical encoding length, counted as it is written
/// (nothing is kept).
fn encoded_len(value: &Value) -> Result<usize, HostError> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_err(|e| HostError::InvalidArgs {
        reason: format!("arguments are not JSON: {e}"),
    })?;
    Ok(count.0)
}

/// A registered method: the object's input and the JSON arguments in,
/// JSON out; a handler's own error is [`HostError::Handler`] (classified by
/// the dispatch), a typed method's refusal of its arguments
/// [`HostError::InvalidArgs`].
pub(crate) type Method<I, D> = Arc<
    dyn Fn(MethodInput<I, D>, Value) -> BoxFuture<'static, Result<Value, HostError>> + Send + Sync,
>;

/// The methods of every class: class → method name → handler.
pub(crate) type Methods<I, D> = BTreeMap<String, BTreeMap<String, Method<I, D>>>;

#[cfg(test)]
mod tests;
