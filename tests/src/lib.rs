//! Cross-crate integration tests live in `tests/`; this library holds only
//! what the process tests' host binaries (`src/bin`) share: [`host_proc`].

pub mod host_proc;

/// The README's Rust blocks, compiled (and, unless marked `no_run`, run) as
/// doctests. They live here because this crate's dependencies and
/// dev-dependencies already reach every library the README uses, with the
/// backend features it needs, and it is never published.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
