//! Cross-crate integration tests live in `tests/`; this library holds what
//! the process tests share: their host binaries' (`src/bin`) common part,
//! [`host_proc`] (also used by the demo's cluster host), and the test side's
//! handle on such a process, [`process`].

pub mod host_proc;
pub mod process;

/// The README's Rust blocks, compiled (and, unless marked `no_run`, run) as
/// doctests. They live here because this crate's dependencies and
/// dev-dependencies already reach every library the README uses, with the
/// backend features it needs, and it is never published.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
