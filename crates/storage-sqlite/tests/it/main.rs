//! Integration tests of durability-storage-sqlite, one module per concern:
//! migration on file shards, the object storage, its owner fence, the owner
//! lease store, and allocation reconciliation.

#![allow(clippy::unwrap_used)]

mod inspect;
mod lease_durability;
mod migration;
mod object;
mod object_fence;
mod object_floor;
mod ownership;
mod reconcile;
mod semaphore;
