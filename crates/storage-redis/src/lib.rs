//! Redis implementations of the durability storage traits.
//!
//! Feature flags select which capability's traits are implemented
//! (`default` enables all of them):
//!
//! - `ownership`: the `ownership` module, the owner lease store of `durability-ownership`.
//! - `migration`: the `migration` module, the key → shard mapping store of `durability-migration`.
//! - `topology`: the `topology` module, the snapshot publishers (plain and
//!   version-aware) and read store of `durability-topology`.
//! - `alarms`: the `alarms` module, the alarm job index of `durability-alarms`.
//!
//! The `testkit` module (always built) holds what the Redis suites share.
//!
//! # Example
//!
//! The lease store and alarm index a host shares with its peers, under one
//! key prefix (compiled, not run: it needs a Redis server):
//!
//! ```no_run
//! use durability_ownership::ShardCount;
//! use durability_storage_redis::alarms::{IndexTime, RedisAlarmIndex};
//! use durability_storage_redis::ownership::RedisLeaseStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "redis://127.0.0.1:6379";
//! let leases = RedisLeaseStore::connect(url, "shop:", ShardCount::default()).await?;
//! let index = RedisAlarmIndex::connect(url, "shop:", IndexTime::Server).await?;
//! # let _ = (leases, index);
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

/// The Redis client this crate is built on: the stores take a
/// [`redis::aio::ConnectionManager`], so applications use the same version.
pub use redis;

#[cfg(feature = "ownership")]
pub mod ownership;

#[cfg(feature = "migration")]
pub mod migration;

#[cfg(feature = "topology")]
pub mod topology;

#[cfg(feature = "alarms")]
pub mod alarms;

#[cfg(any(feature = "ownership", feature = "alarms"))]
mod scan;

pub mod testkit;

pub mod docs;
