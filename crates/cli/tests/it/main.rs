//! Integration tests of the `durability` binary: each test builds its state
//! with the crates' own APIs in a temporary directory, runs the built binary
//! and checks its exit code, its output (human output as insta snapshots)
//! and that nothing was written where nothing may be.

#![allow(clippy::unwrap_used)]

mod alarms;
mod leases;
mod migrations;
mod object;
mod objects;
mod outbox;
mod support;
