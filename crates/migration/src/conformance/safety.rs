//! Named safety checks the model checker turns off one at a time, to show
//! that its workload and checks notice their absence (issue 13, "Proof").
//!
//! Only builds with the `conformance` feature can turn a check off; a
//! router built any other way runs every check.

use crate::config::{Check, MigrationConfig};

/// A safety check of the router, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SafetyCheck {
    /// A routed write that matched no row is classified: a real zero-row
    /// result, a fence of a finished move (the write goes where the key
    /// went) or a move in flight (`MIGRATION_CUTOVER_PENDING`). Without it,
    /// a write a fence refused is reported as `Ok(0)`: an insert or update
    /// through a router whose mapping cache is stale silently does nothing.
    ZeroRowsClassified,
    /// A mapping that lost an acknowledged publish is published again from
    /// the journal (by a write that meets the fence, a lookup of an
    /// unmapped key and a repairing verify). Without it, the key stays
    /// unwritable (`MIGRATION_CUTOVER_PENDING`) for good.
    Republish,
}

impl SafetyCheck {
    /// Every named check.
    pub const ALL: [SafetyCheck; 2] = [SafetyCheck::ZeroRowsClassified, SafetyCheck::Republish];

    /// The check's name, as the model checker prints it.
    pub fn name(self) -> &'static str {
        match self {
            SafetyCheck::ZeroRowsClassified => "zero_rows_classified",
            SafetyCheck::Republish => "republish",
        }
    }

    fn check(self) -> Check {
        match self {
            SafetyCheck::ZeroRowsClassified => Check::ZeroRowsClassified,
            SafetyCheck::Republish => Check::Republish,
        }
    }
}

impl MigrationConfig {
    /// A router built from this configuration skips `check` (feature
    /// `conformance` only). It is unsafe by construction: for the model
    /// checker's proof that it reports a violation without the check.
    pub fn without_safety_check(mut self, check: SafetyCheck) -> Self {
        self.disabled = Some(check.check());
        self
    }
}
