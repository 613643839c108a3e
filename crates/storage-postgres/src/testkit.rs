//! Throwaway schemas on a real server for tests (feature `testkit`).
//!
//! [`TestSchema::create`] makes a schema `t_<random>` on the server named by
//! `DURABILITY_POSTGRES_URL` (default [`DEFAULT_URL`]) and drops it, with
//! everything in it, when dropped. When the server cannot be reached it
//! returns `None` after saying why on stderr, unless
//! `DURABILITY_REQUIRE_SERVICES=1`, in which case it panics.
//!
//! [`cluster::Cluster`] is a private server of a test's own (`initdb` on a
//! free port), for tests that crash, restart or fail over the server.

use crate::{PostgresShard, config_for};

pub mod cluster;

/// The server tests use when `DURABILITY_POSTGRES_URL` is unset.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The URL of the test server.
pub fn url() -> String {
    std::env::var("DURABILITY_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A schema of its own for one test (dropped on drop).
#[derive(Debug)]
pub struct TestSchema {
    url: String,
    name: String,
}

impl TestSchema {
    /// Creates a fresh schema, or returns `None` (after printing why) when
    /// the server is unreachable and services are not required.
    ///
    /// # Panics
    /// When the server is unreachable and `DURABILITY_REQUIRE_SERVICES=1`,
    /// or when the schema cannot be created.
    pub async fn create() -> Option<Self> {
        let url = url();
        let admin = match PostgresShard::connect(&url, None).await {
            Ok(a) => a,
            Err(e) => {
                if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") {
                    panic!("PostgreSQL at {url} is required but unreachable: {e}");
                }
                eprintln!("skipped: PostgreSQL at {url} is unreachable: {e}");
                return None;
            }
        };
        let name = format!("t_{:016x}", rand::random::<u64>());
        admin
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .await
            .expect("create test schema");
        Some(Self { url, name })
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new shard whose connections use this schema.
    ///
    /// # Panics
    /// When the shard cannot connect.
    pub async fn shard(&self) -> PostgresShard {
        PostgresShard::connect(&self.url, Some(&self.name))
            .await
            .expect("connect test shard")
    }

    /// A shard with its own pool of `size` connections in this schema.
    ///
    /// # Panics
    /// When the pool cannot be built.
    pub fn shard_with_pool(&self, size: usize) -> PostgresShard {
        let config = config_for(&self.url, Some(&self.name)).expect("test url parses");
        PostgresShard::new(config, size).expect("build test pool")
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let url = self.url.clone();
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        // Dropping runs outside any runtime the test may be in.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                // A pool of its own: the test's runtime is blocked on this thread.
                if let Err(e) = rt.block_on(async move {
                    PostgresShard::connect(&url, None)
                        .await?
                        .batch_execute(&sql)
                        .await
                }) {
                    eprintln!("could not drop test schema: {e}");
                }
            }
        })
        .join();
        if done.is_err() {
            eprintln!("dropping the test schema panicked");
        }
    }
}
