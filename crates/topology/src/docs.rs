//! Design notes kept next to the code: how this crate keeps its
//! guarantees, in prose (each page is a Markdown file under `docs/`;
//! ARCHITECTURE.md keeps the map and the one-line invariants).

#[doc = include_str!("../docs/coordinator.md")]
pub mod coordinator {}
