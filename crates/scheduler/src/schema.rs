//! Versioned schema migrations per capability.
//!
//! The backend registers each capability's steps ([`Storage::schema`]); this
//! module decides which steps to apply. A migration runs in one transaction:
//! it reaches its target or changes nothing.

use crate::error::SchedulerError;
use crate::storage::SchedulerTx as _;
use crate::storage::{Direction, SchemaStep, Storage, StorageError, StorageErrorKind};

/// Checks the schema steps a backend is asked to register for
/// `capability`: `steps` are versions 1, 2, … in order, and `with_sql` (the
/// steps its SQL list declares) names exactly the same steps.
///
/// # Errors
/// A `Backend` [`StorageError`] naming the capability when they disagree.
pub fn check_schema_steps(
    capability: &str,
    steps: &[SchemaStep],
    with_sql: impl ExactSizeIterator<Item = SchemaStep>,
) -> Result<(), StorageError> {
    let same = steps.len() == with_sql.len()
        && steps.iter().zip(with_sql).all(|(a, b)| *a == b)
        && steps
            .iter()
            .enumerate()
            .all(|(i, s)| usize::try_from(s.version).ok() == Some(i + 1));
    if same {
        Ok(())
    } else {
        Err(StorageError::new(
            StorageErrorKind::Backend,
            format!("schema steps of {capability} must be versions 1.. matching their SQL"),
        ))
    }
}

/// Where [`migrate`] takes a capability's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaTarget {
    /// The newest registered version.
    Latest,
    /// The version with this step name.
    Named(String),
    /// No schema at all: every step reverted, the capability's tables gone.
    Nothing,
}

/// Brings `capability`'s schema to `target` in one transaction.
///
/// Returns the version reached (`None` for [`SchemaTarget::Nothing`]).
///
/// # Errors
/// [`SchedulerError::UnknownSchema`] when the backend registers no schema for
/// the capability, [`SchedulerError::UnknownSchemaTarget`] for a name it does
/// not have, [`SchedulerError::SchemaAhead`] when the stored schema is newer
/// than this code; nothing is changed in each case. A storage failure rolls
/// the whole migration back.
pub fn migrate<S: Storage>(
    storage: &S,
    capability: &str,
    target: &SchemaTarget,
) -> Result<Option<u32>, SchedulerError> {
    storage.transaction(|tx| migrate_within(storage, tx, capability, target))
}

/// [`migrate`] inside a transaction the caller already holds.
///
/// # Errors
/// As [`migrate`].
pub fn migrate_within<S: Storage>(
    storage: &S,
    tx: &mut S::Tx<'_>,
    capability: &str,
    target: &SchemaTarget,
) -> Result<Option<u32>, SchedulerError> {
    let steps = storage.schema(capability);
    let latest = steps
        .last()
        .map(|s| s.version)
        .ok_or_else(|| SchedulerError::UnknownSchema {
            capability: capability.to_owned(),
        })?;
    let wanted = resolve(steps, capability, target)?;
    let stored = tx.schema_version(capability)?;
    if let Some(stored) = stored
        && stored > latest
    {
        return Err(SchedulerError::SchemaAhead {
            capability: capability.to_owned(),
            stored,
            latest,
        });
    }
    let from = stored.unwrap_or(0);
    let to = wanted.unwrap_or(0);
    if to > from {
        for step in steps.iter().filter(|s| s.version > from && s.version <= to) {
            storage.apply_schema_step(tx, capability, step.version, Direction::Up)?;
        }
    } else {
        for step in steps
            .iter()
            .rev()
            .filter(|s| s.version <= from && s.version > to)
        {
            storage.apply_schema_step(tx, capability, step.version, Direction::Down)?;
        }
    }
    if stored != wanted {
        tx.set_schema_version(capability, wanted)?;
    }
    Ok(wanted)
}

fn resolve(
    steps: &[SchemaStep],
    capability: &str,
    target: &SchemaTarget,
) -> Result<Option<u32>, SchedulerError> {
    match target {
        SchemaTarget::Latest => Ok(steps.last().map(|s| s.version)),
        SchemaTarget::Nothing => Ok(None),
        SchemaTarget::Named(name) => steps
            .iter()
            .find(|s| s.name == name)
            .map(|s| Some(s.version))
            .ok_or_else(|| SchedulerError::UnknownSchemaTarget {
                capability: capability.to_owned(),
                target: name.clone(),
            }),
    }
}
