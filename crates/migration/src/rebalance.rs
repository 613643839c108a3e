//! `rebalance`: plan moves from the current mapping to a target shard set
//! under the hash strategy, and run them through the journal. Streams the
//! mapping in pages.

use crate::config;
use crate::error::{MigrationError, Result};
use crate::moves::MoveOptions;
use crate::router::Core;
use crate::status::Progress;
use crate::verify::MAX_REPORT_ENTRIES;

/// Options of [`Router::rebalance`](crate::Router::rebalance).
#[derive(Debug, Clone)]
pub struct RebalanceOptions {
    /// The shard set keys should be placed on (default: every configured shard).
    pub target_shards: Option<Vec<String>>,
    /// The tables whose rows move with each key (empty: every configured table).
    pub tables: Vec<String>,
    /// Plan only; change nothing.
    pub dry_run: bool,
    /// Mappings read per page.
    pub page_size: usize,
    /// Options of each move.
    pub move_options: MoveOptions,
}

impl Default for RebalanceOptions {
    fn default() -> Self {
        Self {
            target_shards: None,
            tables: Vec::new(),
            dry_run: false,
            page_size: 500,
            move_options: MoveOptions::default(),
        }
    }
}

/// One planned move.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlannedMove {
    /// The key.
    pub key: String,
    /// Its current shard.
    pub from: String,
    /// Its shard under the target set.
    pub to: String,
}

/// What a rebalance planned and did (`failed` serializes as `[key, code]`
/// pairs).
#[derive(Debug, Default, serde::Serialize)]
pub struct RebalanceReport {
    /// Mappings examined.
    pub examined: u64,
    /// Moves planned (exact count).
    pub planned: u64,
    /// The first planned moves (at most 1000).
    pub plan: Vec<PlannedMove>,
    /// Moves that committed.
    pub moved: u64,
    /// Keys skipped (no row to move, or a move already active).
    pub skipped: u64,
    /// Moves that failed or aborted: (key, code).
    pub failed: Vec<(String, &'static str)>,
}

impl Core {
    /// See [`Router::rebalance`](crate::Router::rebalance).
    pub(crate) async fn rebalance(&self, opts: RebalanceOptions) -> Result<RebalanceReport> {
        let quiet = |_: Progress| {};
        self.rebalance_observed(opts, &quiet).await
    }

    /// See [`Router::rebalance_observed`](crate::Router::rebalance_observed).
    pub(crate) async fn rebalance_observed(
        &self,
        opts: RebalanceOptions,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<RebalanceReport> {
        let targets: Vec<String> = match &opts.target_shards {
            Some(t) => t.clone(),
            None => self.shards.keys().cloned().collect(),
        };
        if targets.is_empty() {
            return Err(MigrationError::InvalidConfig(
                "empty target shard set".into(),
            ));
        }
        for t in &targets {
            self.shard_named(t)?;
        }
        let tables: Vec<String> = if opts.tables.is_empty() {
            self.tables.keys().cloned().collect()
        } else {
            opts.tables.clone()
        };
        for t in &tables {
            self.table(t)?;
        }
        if !opts.dry_run {
            self.journal_shard()?;
        }
        let target_refs: Vec<&str> = targets.iter().map(String::as_str).collect();
        let table_refs: Vec<&str> = tables.iter().map(String::as_str).collect();
        let mut report = RebalanceReport::default();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .mapping
                .scan(after.as_deref(), opts.page_size.clamp(1, 10_000))
                .await
                .map_err(MigrationError::MappingUnavailable)?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            for (key, from) in page {
                if key.starts_with(config::RESERVED_KEY_PREFIX) {
                    continue;
                }
                report.examined += 1;
                let Some(to) = config::hash_owner(&key, &target_refs) else {
                    continue;
                };
                if to == from {
                    progress(Progress {
                        phase: "keys",
                        done: report.examined,
                        changed: report.moved,
                    });
                    continue;
                }
                report.planned += 1;
                if report.plan.len() < MAX_REPORT_ENTRIES {
                    report.plan.push(PlannedMove {
                        key: key.clone(),
                        from: from.clone(),
                        to: to.to_owned(),
                    });
                }
                if opts.dry_run {
                    progress(Progress {
                        phase: "keys",
                        done: report.examined,
                        changed: report.moved,
                    });
                    continue;
                }
                match self
                    .reassign_keys_with(&key, to, &table_refs, opts.move_options)
                    .await
                {
                    Ok(_) => report.moved += 1,
                    Err(MigrationError::RowNotFound(_) | MigrationError::AlreadyActive(_)) => {
                        report.skipped += 1
                    }
                    Err(e) => {
                        tracing::warn!(
                            event = "durability.migration.rebalance_move_failed",
                            key = %key,
                            code = e.code(),
                            error = %e,
                            "rebalance move failed"
                        );
                        if report.failed.len() < MAX_REPORT_ENTRIES {
                            report.failed.push((key.clone(), e.code()));
                        }
                    }
                }
                progress(Progress {
                    phase: "keys",
                    done: report.examined,
                    changed: report.moved,
                });
            }
        }
        Ok(report)
    }
}
