//! Idempotency keys: how a caller retries an RPC safely after an unknown
//! outcome.
//!
//! An RPC whose outcome is unknown (`owner_unavailable` after it was sent,
//! `do_rpc_result_unknown`) may have run; the router never replays it. A
//! caller that must retry gives the call an [`IdempotencyKey`], and the
//! method makes the key effective where it is enforced, in the object's
//! own transaction:
//!
//! - the caller ([`crate::FailoverClient::call_idempotent`], or anyone
//!   with [`wrap`]) sends `{ "idempotencyKey": key, "args": args }` as the
//!   call's arguments (plain JSON on the wire, nothing new in the
//!   protocol);
//! - the method takes the key and its own arguments back with [`split`]
//!   and runs its writes under [`once`]: inside one storage transaction
//!   `once` looks the key up in the object's `idempotency_keys` table and
//!   returns the recorded result if it is there, else runs the body and
//!   records the key with the body's result in the same transaction.
//!
//! The transaction commits through the object's storage fence, so the key
//! and the effects commit together or not at all: a call sent any number
//! of times with one key changes the object at most once, and every
//! answer after the first commit is the recorded result. A body that
//! fails rolls back and records nothing (a later send runs it again).
//!
//! Limits: a key is scoped to one object and one method; keys are kept
//! until [`prune`] removes them (the caller's retry horizon decides how
//! long); the table ([`TABLE`]) lives in the object's own storage, on
//! every object store (the SQL is the storage crate's: the store's
//! transaction implements [`IdempotencyRows`]), so it goes with the
//! object's other tables in [`crate::Host::delete_all`] and moves with
//! the object's image. Reusing a key for other arguments returns the first
//! call's result: a key names one intended call.

use durability_scheduler::{Storage, StorageError, Transaction};
use serde_json::Value;

use crate::error::HostError;
use crate::rpc::MethodError;

/// The field of the wrapped arguments that carries the key.
pub const KEY_FIELD: &str = "idempotencyKey";
/// The field of the wrapped arguments that carries the method's own.
pub const ARGS_FIELD: &str = "args";
/// The longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 128;
/// The table of recorded keys in each object's storage (the storage
/// crates' `IDEMPOTENCY_TABLE`).
pub const TABLE: &str = "idempotency_keys";

pub use crate::store::IdempotencyRows;

/// A caller's key for one intended call: 1..=[`MAX_KEY_BYTES`] bytes of
/// visible ASCII (a UUID is a good one).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// A key.
    ///
    /// # Errors
    /// [`HostError::InvalidArgs`] when it is empty, too long or not
    /// visible ASCII.
    pub fn new(key: &str) -> Result<Self, HostError> {
        if key.is_empty() || key.len() > MAX_KEY_BYTES || !key.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(HostError::InvalidArgs {
                reason: format!("an idempotency key is 1..={MAX_KEY_BYTES} bytes of visible ASCII"),
            });
        }
        Ok(Self(key.to_owned()))
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The arguments of a call carrying `key`: `{ "idempotencyKey": key,
/// "args": args }`.
pub fn wrap(key: &IdempotencyKey, args: Value) -> Value {
    let mut map = serde_json::Map::new();
    map.insert(KEY_FIELD.to_owned(), Value::String(key.0.clone()));
    map.insert(ARGS_FIELD.to_owned(), args);
    Value::Object(map)
}

/// A method's arguments split into the key (when the call carries one:
/// an object of exactly [`KEY_FIELD`] and [`ARGS_FIELD`]) and its own
/// arguments; any other value is returned as it is, without a key.
///
/// # Errors
/// A [`MethodError`] `invalid_idempotency_key` when the wrapped key is
/// not a valid key.
pub fn split(args: Value) -> Result<(Option<IdempotencyKey>, Value), MethodError> {
    let wrapped = args
        .as_object()
        .is_some_and(|m| m.len() == 2 && m.contains_key(KEY_FIELD) && m.contains_key(ARGS_FIELD));
    if !wrapped {
        return Ok((None, args));
    }
    let Value::Object(mut map) = args else {
        return Ok((None, args));
    };
    let key = map
        .remove(KEY_FIELD)
        .and_then(|k| k.as_str().and_then(|k| IdempotencyKey::new(k).ok()))
        .ok_or_else(|| {
            MethodError::new(
                "invalid_idempotency_key",
                "the idempotency key is not 1..=128 bytes of visible ASCII",
            )
        })?;
    Ok((Some(key), map.remove(ARGS_FIELD).unwrap_or(Value::Null)))
}

/// Runs `body` at most once for (`method`, `key`) on this object, in the
/// caller's transaction `tx` (module docs): the recorded result if the key
/// is already there, else the body's result, recorded with the key in the
/// same transaction.
///
/// # Errors
/// The body's error (nothing recorded); a storage failure; a recorded
/// result that is not JSON (a corrupt row) as a `Corrupt` storage error
/// naming the key (other keys are unaffected).
pub fn once<D, F>(
    tx: &mut Transaction<'_, '_, D>,
    method: &str,
    key: &IdempotencyKey,
    body: F,
) -> Result<Value, StorageError>
where
    D: Storage,
    for<'t> D::Tx<'t>: IdempotencyRows,
    F: FnOnce(&mut Transaction<'_, '_, D>) -> Result<Value, StorageError>,
{
    let key = key.as_str();
    if let Some(recorded) = tx.idempotency_result(method, key)? {
        return serde_json::from_str(&recorded).map_err(|e| {
            StorageError::corrupt(format!(
                "idempotency keys: the recorded result of key {key} is not JSON: {e}"
            ))
        });
    }
    let result = body(tx)?;
    tx.record_idempotency_result(method, key, &result.to_string())?;
    Ok(result)
}

/// Removes up to `limit` recorded keys of this object (oldest first), in
/// the caller's transaction; returns how many. Call it when the callers'
/// retry horizon has passed.
///
/// # Errors
/// A storage failure.
pub fn prune<D>(tx: &mut Transaction<'_, '_, D>, limit: u32) -> Result<usize, StorageError>
where
    D: Storage,
    for<'t> D::Tx<'t>: IdempotencyRows,
{
    tx.prune_idempotency_results(limit)
}
