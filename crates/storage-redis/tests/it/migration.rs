//! The Redis mapping store against a real Redis: the mapping store
//! conformance suite and a router that routes through it.

#![cfg(feature = "migration")]
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::sync::Arc;

use durability_migration::{MappingStore, MemoryMappingStore};
use durability_storage_redis::migration::RedisMappingStore;

async fn store(test: &str) -> Option<RedisMappingStore> {
    let url =
        std::env::var("DURABILITY_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("durability-test:migration:{}:{test}", std::process::id());
    let connect = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        RedisMappingStore::connect(&url, &prefix),
    )
    .await;
    match connect {
        Ok(Ok(s)) => {
            s.clear().await.unwrap();
            Some(s)
        }
        Ok(Err(e)) => skip(&url, &e.to_string()),
        Err(_) => skip(&url, "connect timed out"),
    }
}

fn skip(url: &str, why: &str) -> Option<RedisMappingStore> {
    if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") {
        panic!("Redis at {url} is required (DURABILITY_REQUIRE_SERVICES=1): {why}");
    }
    println!("skipped: Redis at {url} is unreachable: {why}");
    None
}

/// Removes the keys a test stored.
async fn clear(s: &RedisMappingStore) {
    s.clear().await.unwrap();
}

durability_migration::mapping_store_conformance!(
    redis_mapping_store_conforms,
    "",
    async { store("conform").await.map(|s| (s, ())) },
    finish = clear
);

#[tokio::test]
async fn redis_mapping_store_agrees_with_memory_model() {
    let Some(s) = store("model").await else {
        return;
    };
    let model = MemoryMappingStore::new();
    // A deterministic mixed sequence of operations, checked step by step.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..300 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = format!("k{}", x % 23);
        let shard = format!("s{}", (x >> 8) % 3);
        match (x >> 16) % 4 {
            0 => {
                s.put(&key, &shard).await.unwrap();
                model.put(&key, &shard).await.unwrap();
            }
            1 => assert_eq!(
                s.put_if_absent(&key, &shard).await.unwrap(),
                model.put_if_absent(&key, &shard).await.unwrap()
            ),
            2 => assert_eq!(
                s.remove(&key).await.unwrap(),
                model.remove(&key).await.unwrap()
            ),
            _ => assert_eq!(s.get(&key).await.unwrap(), model.get(&key).await.unwrap()),
        }
    }
    assert_eq!(
        s.scan(None, 1000).await.unwrap(),
        model.scan(None, 1000).await.unwrap()
    );
    let page = s.scan(Some("k1"), 3).await.unwrap();
    assert_eq!(page, model.scan(Some("k1"), 3).await.unwrap());
    let shared: Arc<dyn MappingStore> = Arc::new(s.clone());
    assert!(shared.get("absent").await.unwrap().is_none());
    s.clear().await.unwrap();
}
