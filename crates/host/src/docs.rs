//! Design notes kept next to the code: how the host keeps its guarantees,
//! in prose (each page is a Markdown file under `docs/`; ARCHITECTURE.md
//! keeps the map and the one-line invariants).

#[doc = include_str!("../docs/runtime.md")]
pub mod runtime {}

#[doc = include_str!("../docs/routing.md")]
pub mod routing {}

#[doc = include_str!("../docs/fetch.md")]
pub mod fetch {}

#[doc = include_str!("../docs/connect.md")]
pub mod connect {}

#[doc = include_str!("../docs/storage-lifecycle.md")]
pub mod storage_lifecycle {}

#[doc = include_str!("../docs/edge-and-client.md")]
pub mod edge_and_client {}

#[doc = include_str!("../docs/postgres-failover.md")]
pub mod postgres_failover {}
