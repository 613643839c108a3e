//! Write probes: where a key's rows are among the owners of every epoch,
//! and so where a routed write of the key goes.

use super::Manifest;
use crate::config::TableSpec;
use crate::error::{MigrationError, Result};
use crate::router::Core;

impl Core {
    /// Finds the shard that holds any row of `key` (in `spec` first, then in
    /// every other configured table) among the owners of every epoch, newest
    /// first (`None`: no shard holds one). A key's rows live together, so a
    /// write of one table goes where the key's other rows are.
    ///
    /// # Errors
    /// `WRITE_UNRESOLVED` when a probe cannot run.
    pub(crate) async fn probe_key(
        &self,
        m: &Manifest,
        key: &str,
        spec: &TableSpec,
    ) -> Result<Option<String>> {
        let others: Vec<TableSpec> = self
            .tables
            .values()
            .filter(|t| *t != spec)
            .cloned()
            .collect();
        for (_, shard_name) in m.candidates(key) {
            // The written table's probe must run (a shard without the table
            // cannot be told apart from one that fails); the key's other
            // tables hold no row on a shard that does not have them.
            if self
                .holds_row(&shard_name, key, std::slice::from_ref(spec), false)
                .await?
                || self.holds_row(&shard_name, key, &others, true).await?
            {
                return Ok(Some(shard_name));
            }
        }
        Ok(None)
    }

    /// Whether `shard_name` holds a row of `key` in any of `specs` (with
    /// `skip_missing`, a table the shard does not have holds none).
    ///
    /// # Errors
    /// `WRITE_UNRESOLVED` when a probe cannot run.
    async fn holds_row(
        &self,
        shard_name: &str,
        key: &str,
        specs: &[TableSpec],
        skip_missing: bool,
    ) -> Result<bool> {
        let unresolved = |e: MigrationError| MigrationError::WriteUnresolved {
            key: key.to_owned(),
            shard: shard_name.to_owned(),
            source: Box::new(e),
        };
        let (_, shard) = self.shard_named(shard_name)?;
        let d = shard.dialect();
        for spec in specs {
            if skip_missing && d.is_proven() {
                match self.columns(shard_name, spec).await {
                    Ok(_) => {}
                    Err(
                        MigrationError::UnknownTable(_) | MigrationError::UnknownKeyColumn { .. },
                    ) => {
                        continue;
                    }
                    Err(e) => return Err(unresolved(e)),
                }
            }
            // A move's destination copy (under its in-flight marker) is not
            // the key's row until the move publishes it.
            let probe = if d.is_proven() {
                d.key_probe_unmarked(&spec.name, &spec.key_col, key)
            } else {
                d.key_probe(&spec.name, &spec.key_col, key)
            };
            let rows = shard
                .query(&probe)
                .await
                .map_err(|e| unresolved(MigrationError::shard(shard_name, e)))?;
            if !rows.is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether a shard other than `shard` among `key`'s candidates holds a
    /// row of the key in any configured table (its rows are split: no one
    /// shard may be recorded as the key's).
    pub(super) async fn held_elsewhere(
        &self,
        m: &Manifest,
        key: &str,
        shard: &str,
    ) -> Result<bool> {
        let specs: Vec<TableSpec> = self.tables.values().cloned().collect();
        for (_, other) in m.candidates(key) {
            if other != shard && self.holds_row(&other, key, &specs, true).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Where a routed write of `key` goes under computed placement: its
    /// mapping, else the shard holding its row, else the newest owner.
    pub(crate) async fn locate_for_write(
        &self,
        m: &Manifest,
        key: &str,
        spec: &TableSpec,
    ) -> Result<String> {
        if let Some(s) = self.route(key).await? {
            return Ok(s);
        }
        let newest = m
            .owner(key)
            .ok_or_else(|| MigrationError::InvalidConfig("empty manifest".into()))?
            .to_owned();
        if m.epochs.len() == 1 {
            return Ok(newest);
        }
        Ok(self.probe_key(m, key, spec).await?.unwrap_or(newest))
    }
}
