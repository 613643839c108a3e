//! The host's integration tests: hosts over a SQLite lease store, a SQLite
//! alarm index and object files in a temporary directory, on a manual
//! clock (so leases expire, alarms fall due and drains time out only when
//! a test moves the clock).
#![allow(clippy::unwrap_used)]

mod alarm;
mod balance;
mod connect;
mod dispatch;
mod edge;
mod failover;
mod lifecycle;
mod metrics;
mod moving;
mod postgres;
mod rolling;
mod rpc;
mod semaphore;
mod storage;
mod support;
mod sweep;
mod transport;
mod typed;
