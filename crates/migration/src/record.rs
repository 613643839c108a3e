//! `migrate_record`: copy one row to another shard and delete the source,
//! without a journal. Not crash-safe: a crash between the two writes leaves
//! the row on both shards. Use [`Router::reassign_shard`](crate::Router::reassign_shard) when that matters.

use crate::config;
use crate::dialect::row_idents;
use crate::error::{MigrationError, Result};
use crate::router::Core;
use crate::value;

/// What to do when the destination already holds a different row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnConflict {
    /// Fail with `DESTINATION_CONFLICT` (an identical row counts as a retried copy).
    #[default]
    Fail,
    /// Overwrite the destination row.
    Replace,
}

/// Options of [`Router::migrate_record`](crate::Router::migrate_record).
#[derive(Debug, Clone, Copy, Default)]
pub struct MigrateOptions {
    /// Conflict handling.
    pub on_conflict: OnConflict,
}

impl Core {
    /// See [`Router::migrate_record`](crate::Router::migrate_record).
    pub(crate) async fn migrate_record(
        &self,
        source: &str,
        target: &str,
        key: &str,
        table: &str,
        opts: MigrateOptions,
    ) -> Result<()> {
        config::validate_key(key)?;
        let spec = self.table(table)?.clone();
        let (sname, src) = self.shard_named(source)?;
        let (tname, dst) = self.shard_named(target)?;
        if sname == tname {
            return Err(MigrationError::SameShard {
                key: key.to_owned(),
                shard: sname.to_owned(),
            });
        }
        self.columns_fresh(sname, &spec).await?;
        self.columns_fresh(tname, &spec).await?;
        let sd = src.dialect();
        let td = dst.dialect();
        let row = self
            .read_row((sname, &spec), key)
            .await?
            .ok_or_else(|| MigrationError::RowNotFound(key.to_owned()))?;
        let existing = self.read_row((tname, &spec), key).await?;
        let cols = row_idents(&row)?;
        match existing {
            Some(e) if value::digest(Some(&e)) == value::digest(Some(&row)) => {}
            Some(_) if opts.on_conflict == OnConflict::Fail => {
                return Err(MigrationError::DestinationConflict(key.to_owned()));
            }
            _ => {
                let stmts = vec![
                    td.delete_key(&spec.name, &spec.key_col, key),
                    td.insert_row(&spec.name, &cols),
                ];
                dst.batch(&stmts)
                    .await
                    .map_err(|e| crate::router::refused_write(tname, key, spec.name.as_str(), e))?;
            }
        }
        src.execute(&sd.delete_matching(&spec.name, &spec.key_col, key, &cols))
            .await
            .map_err(|e| MigrationError::shard(sname, e))?;
        Ok(())
    }
}
