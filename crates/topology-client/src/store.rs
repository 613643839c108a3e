//! Where readers find published snapshots.

use std::future::Future;

/// A boxed error from a store or an application callback.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A read store holding each group's published, encoded snapshot.
///
/// The bytes are exactly what the coordinator's publisher stored; the client
/// validates them with [`crate::decode_for`].
pub trait ReadStore: Send + Sync + 'static {
    /// The stored snapshot of `group`, or `None` when nothing is published.
    fn read<'a>(
        &'a self,
        group: &'a str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, BoxError>> + Send + 'a;
}

impl<T: ReadStore> ReadStore for std::sync::Arc<T> {
    fn read<'a>(
        &'a self,
        group: &'a str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, BoxError>> + Send + 'a {
        T::read(self, group)
    }
}
