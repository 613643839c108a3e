//! The topology snapshot format and the cached read client.
//!
//! Readers never call the coordinator: they read the snapshot it published
//! to a read store and cache it.
//!
//! - [`Snapshot`] and [`Member`]: one group's published membership: group,
//!   version, coordinator ID, and members sorted by ID.
//! - [`decode`]: the strict decoder of the published format. Anything
//!   malformed, truncated, oversized or of an unknown format version is
//!   refused with a reason. This crate has **no encoder**: only the
//!   coordinator (`durability-topology`) produces the format, through its
//!   crate-private encoder; its `EncodedSnapshot` type cannot be built
//!   anywhere else. The format is pinned by an `insta` snapshot in
//!   `durability-topology` and by round-trip tests here.
//! - [`ReadStore`]: where published snapshots are read from.
//! - [`TopologyClient`]: a per-group cache (TTL with ±20 % jitter), one
//!   store read shared by concurrent callers, version regression guard per
//!   coordinator, negative cache, read timeout, and the opt-in fallbacks
//!   (stale-if-error, seed, fallback) in that order. The cache is
//!   bounded ([`DEFAULT_MAX_GROUPS`] groups, least recently used evicted).
//!   The never-older guard does not live in the cache entry: a version floor
//!   per (group, coordinator), bounded separately
//!   ([`DEFAULT_MAX_VERSION_FLOORS`], 100,000 pairs), outlives eviction,
//!   so a group read again after its entry was evicted is never served
//!   older than before ([`UnavailableReason::Regressed`] instead). The
//!   guarantee is bounded: past 100,000 (group, coordinator) pairs (or the
//!   configured [`ClientConfig::max_version_floors`]) the least recently
//!   used floor is evicted, reported by the event
//!   `durability.topology_client.version_floor_evicted` and counted by
//!   [`TopologyClient::version_floors_evicted`], and that pair may then be
//!   served older than before.
//!
//! # Example
//!
//! A read store with nothing published yet, and a seed that derives one
//! group locally: that group is served from the seed, any other is
//! unavailable (a typed error, never an empty group).
//!
//! ```
//! use std::sync::Arc;
//! use durability_topology_client::{
//!     BoxError, ClientConfig, Member, MemberState, ReadStore, Snapshot, TopologyClient,
//! };
//!
//! struct NothingPublished;
//! impl ReadStore for NothingPublished {
//!     async fn read(&self, _group: &str) -> Result<Option<Vec<u8>>, BoxError> {
//!         Ok(None)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let seed = Arc::new(|group: &str| {
//!     (group == "chat").then(|| Snapshot {
//!         group: group.to_owned(),
//!         version: 1,
//!         coordinator: "coord-1".to_owned(),
//!         members: vec![Member {
//!             id: "node-a".to_owned(),
//!             state: MemberState::Active,
//!             location_hint: None,
//!             meta: None,
//!             joined_at: 0,
//!         }],
//!     })
//! });
//! let client = TopologyClient::new(NothingPublished, ClientConfig::new().seed(seed))?;
//!
//! let chat = client.get("chat").await?;
//! assert_eq!(chat.members[0].id, "node-a");
//! let err = client.get("billing").await.unwrap_err();
//! assert_eq!(err.code(), "TOPOLOGY_UNAVAILABLE");
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! - `conformance`: reserved for backend suites (the publication suites live
//!   in `durability-topology`, which owns the writer side).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

mod client;
mod error;
mod snapshot;
mod store;

pub use client::{
    ClientConfig, DEFAULT_MAX_GROUPS, DEFAULT_MAX_VERSION_FLOORS, DEFAULT_NEGATIVE_TTL_MS,
    DEFAULT_READ_TIMEOUT_MS, DEFAULT_TTL_MS, FallbackFn, FallbackHook, FallbackReport,
    FallbackSource, SeedFn, TopologyClient,
};
pub use error::{TopologyClientError, UnavailableReason};
pub use snapshot::{
    FORMAT_VERSION, MAX_COORDINATOR_BYTES, MAX_GROUP_BYTES, MAX_LOCATION_HINT_BYTES,
    MAX_MEMBER_ID_BYTES, MAX_MEMBERS, MAX_META_BYTES, MAX_SNAPSHOT_BYTES, Member, MemberState,
    Snapshot, check_group, check_location_hint, check_member_id, decode, decode_for,
};
pub use store::{BoxError, ReadStore};

/// The clock and random source [`ClientConfig`] takes.
pub use durability_time::{Clock, ManualClock, Random, SystemClock};

#[cfg(test)]
mod tests;

pub mod docs;
