//! Integration tests of durability-ownership: the conformance suite on the
//! in-memory store and the dependency tidy check.

#![allow(clippy::unwrap_used)]

mod conformance;
mod model;
mod tidy;
