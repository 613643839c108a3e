//! Design notes kept next to the code: how this crate keeps its
//! guarantees, in prose (each page is a Markdown file under `docs/`;
//! ARCHITECTURE.md keeps the map and the one-line invariants).

#[doc = include_str!("../docs/moves.md")]
pub mod moves {}

#[doc = include_str!("../docs/placement.md")]
pub mod placement {}

#[doc = include_str!("../docs/hot-keys.md")]
pub mod hot_keys {}

#[doc = include_str!("../docs/clocks.md")]
pub mod clocks {}

#[doc = include_str!("../docs/verify.md")]
pub mod verify {}

#[doc = include_str!("../docs/collation.md")]
pub mod collation {}

#[doc = include_str!("../docs/reconcile.md")]
pub mod reconcile {}

#[doc = include_str!("../docs/model.md")]
pub mod model {}

#[doc = include_str!("../docs/modules.md")]
pub mod modules {}
