//! Ownership's metrics through the `metrics` facade (names in
//! ARCHITECTURE.md, "Metrics"), labelled with the task; handles are bound
//! to the recorder installed when the `Ownership` is built.

use metrics::{Counter, Gauge, counter, gauge};

/// One task's metric handles.
#[derive(Debug, Clone)]
pub(crate) struct OwnershipMetrics {
    pub(crate) claimed: Counter,
    pub(crate) held_here: Counter,
    pub(crate) held_elsewhere: Counter,
    pub(crate) claim_failed: Counter,
    pub(crate) renewed: Counter,
    pub(crate) renew_lost: Counter,
    pub(crate) renew_unknown: Counter,
    pub(crate) admitted: Counter,
    pub(crate) refused: Counter,
    pub(crate) in_flight: Gauge,
}

impl OwnershipMetrics {
    pub(crate) fn new(task: &str) -> Self {
        let claims = |outcome: &'static str| counter!("durability_ownership_claims_total", "task" => task.to_owned(), "outcome" => outcome);
        let renews = |outcome: &'static str| counter!("durability_ownership_renews_total", "task" => task.to_owned(), "outcome" => outcome);
        let admissions = |outcome: &'static str| counter!("durability_ownership_admissions_total", "task" => task.to_owned(), "outcome" => outcome);
        Self {
            claimed: claims("claimed"),
            held_here: claims("held_here"),
            held_elsewhere: claims("held_elsewhere"),
            claim_failed: claims("failed"),
            renewed: renews("renewed"),
            renew_lost: renews("lost"),
            renew_unknown: renews("kept"),
            admitted: admissions("admitted"),
            refused: admissions("refused"),
            in_flight: gauge!("durability_ownership_in_flight", "task" => task.to_owned()),
        }
    }
}
