//! The source error of every stub.

use std::error::Error as StdError;
use std::fmt;

/// The skeleton backend does not implement `operation`: the source of every
/// error its stubs return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsupported {
    /// The operation that was called (`"outbox_get"`, `"claim"`, ...).
    pub operation: &'static str,
}

impl Unsupported {
    /// The error for `operation`.
    pub fn new(operation: &'static str) -> Self {
        Self { operation }
    }

    /// The error for `operation`, boxed (the `BoxError` / `BackendError` of
    /// the trait crates).
    pub fn boxed(operation: &'static str) -> Box<dyn StdError + Send + Sync + 'static> {
        Box::new(Self::new(operation))
    }
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the skeleton backend does not implement {}",
            self.operation
        )
    }
}

impl StdError for Unsupported {}
