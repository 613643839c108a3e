//! Test deployments of PostgreSQL object storage: a deployment schema of
//! its own per test (dropped with every object schema it made), and the
//! "conformance" capability every suite migrates.

use durability_scheduler::conformance::STEPS as CONFORMANCE_STEPS;
use durability_storage_postgres::object::{
    PostgresObjectOptions, PostgresObjectStorage, PostgresObjects, PostgresSchemaStep,
};
use durability_storage_postgres::testkit::url;

static CONFORMANCE_SQL: &[PostgresSchemaStep] = &[
    PostgresSchemaStep {
        step: CONFORMANCE_STEPS[0],
        up: "CREATE TABLE app_conformance (id BIGINT PRIMARY KEY)",
        down: "DROP TABLE app_conformance",
    },
    PostgresSchemaStep {
        step: CONFORMANCE_STEPS[1],
        up: "ALTER TABLE app_conformance ADD COLUMN note TEXT",
        down: "ALTER TABLE app_conformance DROP COLUMN note",
    },
];

/// A deployment of its own on the test server.
pub(crate) struct TestDeployment {
    pub(crate) objects: PostgresObjects,
    pub(crate) name: String,
    pub(crate) url: String,
}

/// Whether the test server answers; `None` (after saying why) when it does
/// not and services are not required.
pub(crate) fn available(url: &str) -> Option<()> {
    match run_sql(url, "SELECT 1") {
        Ok(()) => Some(()),
        Err(e) => {
            if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") {
                panic!("PostgreSQL at {url} is required but unreachable: {e}");
            }
            eprintln!("skipped: PostgreSQL at {url} is unreachable: {e}");
            None
        }
    }
}

/// Runs `sql` on a connection of its own, on a thread of its own (so it
/// works inside or outside any runtime).
pub(crate) fn run_sql(url: &str, sql: &str) -> Result<(), String> {
    let url = url.to_owned();
    let sql = sql.to_owned();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            client.batch_execute(&sql).await.map_err(|e| e.to_string())
        })
    })
    .join()
    .map_err(|_| "the SQL thread panicked".to_owned())?
}

/// A random deployment name.
pub(crate) fn fresh_name() -> String {
    format!("t_{:016x}", rand::random::<u64>())
}

impl TestDeployment {
    /// A fresh deployment with the "conformance" capability registered.
    pub(crate) fn create() -> Option<Self> {
        Self::with_options(PostgresObjectOptions::default())
    }

    /// As [`TestDeployment::create`], with options.
    pub(crate) fn with_options(options: PostgresObjectOptions) -> Option<Self> {
        let url = url();
        available(&url)?;
        let name = fresh_name();
        let mut objects = PostgresObjects::connect(&url, &name, options).expect("install");
        objects
            .register_schema("conformance", CONFORMANCE_STEPS, CONFORMANCE_SQL)
            .expect("register the conformance schema");
        Some(Self { objects, name, url })
    }

    /// A fresh, empty object.
    pub(crate) fn fresh(&self) -> PostgresObjectStorage {
        self.objects
            .open(&format!("obj-{:016x}", rand::random::<u64>()))
            .expect("open a fresh object")
    }
}

/// SQL that drops deployment `name`: its schema and every object schema
/// under it.
pub(crate) fn drop_deployment(name: &str) -> String {
    format!(
        "DO $$ DECLARE n text; BEGIN
           FOR n IN SELECT nspname FROM pg_namespace
             WHERE nspname = '{name}' OR nspname LIKE '{name}\\_o%' LOOP
             EXECUTE format('DROP SCHEMA %I CASCADE', n);
           END LOOP;
         END $$"
    )
}

impl Drop for TestDeployment {
    fn drop(&mut self) {
        if let Err(e) = run_sql(&self.url, &drop_deployment(&self.name)) {
            eprintln!("could not drop test deployment {}: {e}", self.name);
        }
    }
}
