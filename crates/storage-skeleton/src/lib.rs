//! The skeleton backend: the template to copy when adding a storage backend.
//!
//! Every storage trait of the capability crates is implemented here with a
//! stub that returns the trait's typed "backend unavailable" error (never a
//! panic), next to a one-line comment stating the contract a real
//! implementation must keep. Because this crate is a workspace member,
//! `cargo xtask test` compiles it, and a change to any storage trait breaks
//! it visibly.
//!
//! To add a backend: copy this crate to `crates/storage-<name>`, rename the
//! types after the backend (`SkeletonStorage` → `FooStorage`), delete the
//! traits the backend will not offer, replace each stub by the real thing,
//! and run the conformance suite of every trait it implements (each
//! capability crate's `conformance` feature; see [`docs::adding_a_backend`]).
//!
//! Feature flags select which capability's traits are implemented
//! (`default` enables all of them), as in `durability-storage-sqlite`:
//!
//! - `scheduler`: [`SkeletonStorage`] (`Storage`) and [`SkeletonTx`]
//!   (`SchedulerTx`), the object's transactional storage.
//! - `outbox`: `OutboxTx` on [`SkeletonTx`].
//! - `topology`: `TopologyTx` on [`SkeletonTx`], and the `topology` module
//!   (`Publisher` and `ReadStore`).
//! - `alarms`: `AlarmTx` on [`SkeletonTx`], and the `alarms` module
//!   (`AlarmIndex`).
//! - `ownership`: the `ownership` module (`LeaseStore`, `LifecycleAdmin`), and
//!   `ObjectFence` on [`SkeletonStorage`] with `scheduler`.
//! - `migration`: the `migration` module (`Shard`, `MappingStore`,
//!   `AllocationLedger`).
//!
//! Every stub error carries an [`Unsupported`] source naming the operation.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

mod unsupported;

pub use unsupported::Unsupported;

#[cfg(feature = "scheduler")]
mod object;
#[cfg(feature = "scheduler")]
pub use object::{SkeletonStorage, SkeletonTx};

#[cfg(feature = "outbox")]
mod outbox;

#[cfg(feature = "topology")]
pub mod topology;

#[cfg(feature = "alarms")]
pub mod alarms;

#[cfg(feature = "ownership")]
pub mod ownership;

#[cfg(feature = "migration")]
pub mod migration;

#[cfg(all(
    test,
    feature = "topology",
    feature = "alarms",
    feature = "ownership",
    feature = "migration"
))]
mod tests;

pub mod docs;
