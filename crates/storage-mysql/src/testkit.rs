//! Throwaway databases on a real server for tests (feature `testkit`).
//!
//! [`TestDatabase::create`] makes a database `t_<random>` on the server
//! named by `DURABILITY_MYSQL_URL` (default [`DEFAULT_URL`]) and drops it
//! when dropped. When the server cannot be reached it returns `None` after
//! saying why on stderr, unless `DURABILITY_REQUIRE_SERVICES=1`, in which
//! case it panics.

use mysql_async::{Opts, OptsBuilder};

use crate::MysqlShard;

/// The server tests use when `DURABILITY_MYSQL_URL` is unset.
pub const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// The URL of the test server.
pub fn url() -> String {
    std::env::var("DURABILITY_MYSQL_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A database of its own for one test (dropped on drop).
#[derive(Debug)]
pub struct TestDatabase {
    opts: Opts,
    name: String,
}

impl TestDatabase {
    /// Creates a fresh database, or returns `None` (after printing why) when
    /// the server is unreachable and services are not required.
    ///
    /// # Panics
    /// When the server is unreachable and `DURABILITY_REQUIRE_SERVICES=1`,
    /// or when the database cannot be created.
    pub async fn create() -> Option<Self> {
        let url = url();
        let admin = match MysqlShard::connect(&url).await {
            Ok(a) => a,
            Err(e) => {
                if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") {
                    panic!("MariaDB at {url} is required but unreachable: {e}");
                }
                eprintln!("skipped: MariaDB at {url} is unreachable: {e}");
                return None;
            }
        };
        let opts = Opts::from_url(&url).expect("test url parses");
        let name = format!("t_{:016x}", rand::random::<u64>());
        admin
            .query_drop(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create test database");
        if let Err(e) = admin.disconnect().await {
            eprintln!("could not close the admin pool: {e}");
        }
        Some(Self { opts, name })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new shard on this database.
    pub fn shard(&self) -> MysqlShard {
        MysqlShard::new(
            OptsBuilder::from_opts(self.opts.clone())
                .db_name(Some(&self.name))
                .into(),
        )
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let url = url();
        let sql = format!("DROP DATABASE IF EXISTS {}", self.name);
        // Dropping runs outside any runtime the test may be in.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                // A pool of its own: the test's runtime is blocked on this thread.
                if let Err(e) = rt.block_on(async move {
                    let admin = MysqlShard::connect(&url).await?;
                    admin.query_drop(&sql).await?;
                    admin.disconnect().await
                }) {
                    eprintln!("could not drop test database: {e}");
                }
            }
        })
        .join();
        if done.is_err() {
            eprintln!("dropping the test database panicked");
        }
    }
}
