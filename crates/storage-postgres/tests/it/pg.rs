//! What the lease store and alarm index tests share: a store's schema on
//! the test server, and a raw client into it for planting state.

use durability_ownership::{ClassName, OwnerScope, ShardCount, StorageId};
use durability_storage_postgres::testkit::{TestSchema, url};

/// A raw connection to the test server (planting corrupt rows, reading
/// stored state, expiring leases), its connection task spawned.
pub(crate) async fn raw_client() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .expect("raw connection to the test server");
    tokio::spawn(conn);
    client
}

/// A fresh schema, or `None` when the server is not there (the testkit says why).
pub(crate) async fn schema() -> Option<TestSchema> {
    TestSchema::create().await
}

/// The sixteen scopes (shards) of `class` under `storage`.
pub(crate) fn class_scopes(storage: &StorageId, class: &str) -> Vec<OwnerScope> {
    (0..16)
        .map(|shard| {
            OwnerScope::new(
                storage.clone(),
                ClassName::new(class).expect("class name"),
                shard,
                ShardCount::default(),
            )
            .expect("scope")
        })
        .collect()
}
