//! Migration's metrics through the `metrics` facade (names in
//! ARCHITECTURE.md, "Metrics"): every move started through
//! [`Router::reassign_keys_with`](crate::Router::reassign_keys_with) (and
//! the `reassign_*` calls built on it, a resume of this router's own
//! interrupted move included) counts once by outcome, with its duration on
//! the router's injected clock. Moves that recovery finishes or aborts are
//! not counted here. Handles are looked up when a move ends, with the
//! recorder installed then.

use metrics::{counter, histogram};

use crate::error::MigrationError;

/// The outcome label of a finished `reassign_*` call.
///
/// - `committed`: the key moved (`Ok`);
/// - `aborted`: the move was aborted and the key stayed on its source
///   (`MIGRATION_ABORTED`, `MIGRATION_COPY_REJECTED`);
/// - `conflict`: another operation holds the key (`MIGRATION_ALREADY_ACTIVE`);
/// - `taken_over`: recovery took the operation over
///   (`MIGRATION_TAKEN_OVER`, `RECOVERY_FENCED`);
/// - `unavailable`: a retryable failure (`SHARD_UNAVAILABLE`,
///   `MAPPING_UNAVAILABLE`, …): after the claim the outcome is unknown and
///   the operation stays active for a resume or recovery;
/// - `refused`: any other error, refused before a write (bad key, unknown
///   table or shard, same shard, no row, partial move, …) or a corrupt
///   record.
pub(crate) fn outcome<T>(result: &Result<T, MigrationError>) -> &'static str {
    match result {
        Ok(_) => "committed",
        Err(MigrationError::Aborted { .. } | MigrationError::CopyRejected { .. }) => "aborted",
        Err(MigrationError::AlreadyActive(_)) => "conflict",
        Err(MigrationError::TakenOver(_) | MigrationError::RecoveryFenced(_)) => "taken_over",
        Err(e) if e.is_retryable() => "unavailable",
        Err(_) => "refused",
    }
}

/// Counts one finished move (`durability_migration_moves_total`) and
/// records its duration (`durability_migration_move_duration_ms`), both
/// labelled `outcome`.
pub(crate) fn record_move(outcome: &'static str, duration_ms: i64) {
    counter!("durability_migration_moves_total", "outcome" => outcome).increment(1);
    #[allow(clippy::cast_precision_loss)] // milliseconds well below 2^52
    histogram!("durability_migration_move_duration_ms", "outcome" => outcome)
        .record(duration_ms.max(0) as f64);
}
