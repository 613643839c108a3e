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

    /// A `mysql://` URL of this database: the test server's URL with its
    /// database replaced (its query parameters kept), the form
    /// [`MysqlShard::connect`] and the operator CLI accept.
    ///
    /// # Panics
    /// When the test server's URL has no `scheme://authority`.
    pub fn url(&self) -> String {
        let base = url();
        let (base, query) = base
            .split_once('?')
            .map_or((base.as_str(), None), |(b, q)| (b, Some(q)));
        let authority_at = base.find("://").expect("the test url has a scheme") + 3;
        let end = base[authority_at..]
            .find('/')
            .map_or(base.len(), |i| authority_at + i);
        let mut out = format!("{}/{}", &base[..end], self.name);
        if let Some(q) = query {
            out.push('?');
            out.push_str(q);
        }
        out
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
