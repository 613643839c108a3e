//! Cross-crate integration tests, one module per suite, with the support
//! modules they share.

#![allow(clippy::unwrap_used)]

mod alarms;
mod alarms_corrupt;
mod alarms_owner_routing;
mod alarms_ownership;
mod balance;
mod error_codes;
mod fence_processes;
mod host_processes;
mod host_routing;
mod metrics;
mod migration_computed_fence;
mod migration_dialects;
mod migration_history;
mod migration_hotkey;
mod migration_model;
mod migration_placement;
mod migration_refusals;
mod migration_review;
mod migration_scopes;
mod migration_seed_branches;
mod migration_smaller;
mod migration_stuck;
mod outbox;
mod outbox_codec;
mod outbox_corrupt;
mod reconcile_postgres;
mod semaphore_processes;
mod shards;
mod support;
mod topology;
mod topology_redis;
