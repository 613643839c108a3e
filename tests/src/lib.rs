//! Cross-crate integration tests live in `tests/`; this library is empty on purpose.

/// The README's Rust blocks, compiled (and, unless marked `no_run`, run) as
/// doctests. They live here because this crate's dependencies and
/// dev-dependencies already reach every library the README uses, with the
/// backend features it needs, and it is never published.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
