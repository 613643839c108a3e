//! Integration tests of durability-storage-redis against a real Redis: the
//! mapping store and the owner lease store.

#![allow(clippy::unwrap_used)]

mod migration;
mod ownership;
mod renew_round_trips;
