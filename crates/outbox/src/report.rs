//! What a delivery run or a `publish_now` did: the result types that make
//! undeliverable and corrupt entries visible at the call site.

/// What became of an entry that will not be delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fate {
    /// Handed to the dead-letter sink and removed.
    DeadLettered,
    /// Removed with a `Dropped` event (the channel has no dead-letter sink).
    Dropped,
    /// The dead-letter sink failed: the entry is kept and dead-lettering is
    /// tried again after the retry delay.
    Kept,
}

/// An entry that gave up or could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undelivered {
    /// The entry's key.
    pub key: String,
    /// Its version.
    pub version: u64,
    /// The last failure, or why its value could not be decoded.
    pub error: String,
    /// Where it went.
    pub fate: Fate,
}

/// A corrupt row moved to the quarantine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The row's key as read.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

use durability_scheduler::PermitError;

/// What one [`Outbox::deliver_due`](crate::Outbox::deliver_due) run (or a
/// [`Outbox::publish_now`](crate::Outbox::publish_now)) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryReport {
    /// Entries the sink acknowledged.
    pub delivered: u64,
    /// Entries whose attempt failed and that are due again later.
    pub retried: u64,
    /// Entries that reached the channel's maximum attempts.
    pub gave_up: Vec<Undelivered>,
    /// Entries whose stored value the channel's codec could not decode:
    /// never published, never retried.
    pub undecodable: Vec<Undelivered>,
    /// Corrupt rows moved to the quarantine.
    pub quarantined: Vec<Quarantined>,
    /// The run stopped because the channel's permit source
    /// ([`ChannelConfig::permits`](crate::ChannelConfig::permits)) had no
    /// permit: what was due stays pending, unclaimed, and the channel's
    /// alarm is due again after [`PermitError::retry_in_ms`].
    pub waiting_for_permit: Option<PermitError>,
}

impl DeliveryReport {
    /// Whether every entry tried was delivered or retried: nothing gave up,
    /// failed to decode or was quarantined.
    pub fn is_clean(&self) -> bool {
        self.gave_up.is_empty() && self.undecodable.is_empty() && self.quarantined.is_empty()
    }
}

/// What [`Outbox::publish_now`](crate::Outbox::publish_now) did for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishOutcome {
    /// Whether a value is still pending for the key afterwards (the attempt
    /// failed and is retried, or a newer value was staged meanwhile).
    pub pending: bool,
    /// What the attempt did.
    pub report: DeliveryReport,
}

impl PublishOutcome {
    /// Whether nothing is pending for the key and nothing went wrong with
    /// it: delivered now, or nothing was pending.
    pub fn is_done(&self) -> bool {
        !self.pending && self.report.is_clean()
    }
}
