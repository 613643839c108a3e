//! Topology coordinator: shard-group membership held by one
//! coordinator object, published to a read store, and pushed to members
//! through state channels.
//!
//! - [`Topology`]: attached to an object's [`durability_scheduler::Scheduler`].
//!   [`Topology::update`] runs a synchronous closure over the current members
//!   and state values inside one storage transaction that commits the
//!   membership, the changed state values, the staged publication and the
//!   staged deliveries together. [`Topology::delete`],
//!   [`Topology::snapshot`] and [`Topology::migrate`] complete the API.
//! - Publication runs on the outbox channel `durability.topology` keyed by
//!   group. Every publisher write is recorded durably before it starts
//!   ([`TopologyTx`]); a record that outlives its write holds back the
//!   acknowledgement of newer writes until its landing deadline (start +
//!   attempt timeout + 5 minutes), when the snapshot is written again.
//! - State channels run on `durability.topology.<name>` keyed by
//!   `["group","member"]` (JSON): `write` channels reach active members,
//!   `read` channels draining ones too.
//! - [`Publisher`]: where snapshots are written. The encoded form
//!   ([`EncodedSnapshot`]) can only be produced by this crate; readers decode
//!   it with `durability-topology-client`.
//!
//! - Typed channel handles ([`ChannelKey<V>`]): [`Draft::set`],
//!   [`Current::get`], [`StateChannel::typed`] and
//!   [`TopologyConfig::channel`] check channel names and value types at
//!   compile time over the same JSON storage.
//! - Typed member metadata ([`MetaKey<M>`]): [`MemberInput::with_meta`]
//!   stores a value of `M` as the member's JSON metadata (one that does not
//!   encode is refused before anything is written) and [`MetaKey::get`]
//!   reads it back (one that does not decode is `TOPOLOGY_CORRUPT`).
//!
//! The storage backend implements [`TopologyTx`] (which extends the outbox's
//! `OutboxTx`) on its transaction type.
//!
//! # Features
//!
//! - `conformance`: the `conformance` module (suites for [`TopologyTx`],
//!   [`Publisher`] + `ReadStore` backends), the in-memory [`TopologyTx`] on
//!   the scheduler's testkit storage, and an in-memory publication store.
//!   It has no encoder either: its suites take their encoded snapshots from
//!   a real coordinator (`conformance::coordinator_snapshots`).
//!
//! # Example
//!
//! A coordinator on the in-memory storage and publication store of the
//! `conformance` feature (production uses SQLite object storage and a
//! SQLite or Redis publication): an update commits the membership and
//! publishes it, and a reader sees it through `durability-topology-client`.
//!
//! ```
//! use std::sync::Arc;
//! use durability_scheduler::{ObjectContext, ObjectId, Scheduler};
//! use durability_topology::conformance::{MemoryPublication, memory_storage};
//! use durability_topology::{Draft, MemberInput, Topology, TopologyConfig};
//! use durability_topology_client::{ClientConfig, TopologyClient};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = ObjectContext::new(ObjectId::new("coord-1")?, Arc::new(memory_storage()));
//! let scheduler = Scheduler::new(ctx)?;
//! let store = MemoryPublication::versioned();
//! let topology = Topology::attach(&scheduler, TopologyConfig::new().publish(store.clone()))?;
//!
//! let outcome = topology
//!     .update("chat", |_current| {
//!         Draft::new().members([MemberInput::active("node-a"), MemberInput::active("node-b")])
//!     })
//!     .await?;
//! assert!(outcome.published);
//!
//! let reader = TopologyClient::new(store, ClientConfig::new())?;
//! let chat = reader.get("chat").await?;
//! assert_eq!(chat.version, outcome.snapshot.version);
//! let ids: Vec<&str> = chat.members.iter().map(|m| m.id.as_str()).collect();
//! assert_eq!(ids, ["node-a", "node-b"]);
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

mod coordinator;
mod encode;
mod error;
mod event;
mod store;
mod typed;

#[cfg(any(test, feature = "conformance"))]
mod memory;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use coordinator::{
    Current, DeleteOutcome, DeliverFn, Draft, LANDING_WINDOW_MS, MemberInput, NoPublisher,
    PUBLICATION_CHANNEL, Role, StateChannel, StateUpdate, Topology, TopologyConfig, UpdateOutcome,
};
pub use durability_topology_client::{BoxError, Member, MemberState, Snapshot};
pub use encode::EncodedSnapshot;
pub use error::TopologyError;
pub use event::{TopologyEvent, TopologyEventHook};
pub use store::{GroupRow, PublishError, PublishOutcome, Publisher, SnapshotDeletion, TopologyTx};
pub use typed::{ChannelKey, MetaKey, TypedUpdate};

/// The schema name the topology tables are registered under.
pub const SCHEMA: &str = "topology";
/// Largest state value accepted, in bytes of JSON: 256 KiB.
pub const MAX_STATE_BYTES: usize = 256 * 1024;

#[cfg(test)]
mod tests;

pub mod docs;
