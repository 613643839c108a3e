//! Demo scenes, benchmarks and the alarm soak: `durability-demo <command>`.
//! `cargo xtask demo | bench | verify` run this binary.
//!
//! - `demo [--redis] [--postgres] [--mariadb]`: the main job, a readable run
//!   on embedded SQLite, ending with the table of the figures the scenes
//!   recorded through the `metrics` facade. `--redis` publishes, leases and indexes alarms
//!   through Redis; `--postgres` and `--mariadb` run the migration scene on
//!   PostgreSQL or MariaDB shards instead of SQLite files (a schema or
//!   database per shard and one for the mapping store, created for the run
//!   and dropped at the end; an unreachable server fails the command).
//! - `demo-cluster [--redis]`: the cluster scene of `demo` alone: three
//!   host processes over a shared lease store and alarm index (SQLite
//!   files, or Redis), one killed, one paused past its lease, one drained.
//! - `bench [AREA]`: benchmarks printing one JSON line per figure with its
//!   ratio to a baseline measured in the same run (release build: a debug
//!   build runs itself again as `bench-inner` in release). The migration
//!   area measures SQLite files, PostgreSQL and MariaDB shards.
//! - `soak N SEED`: the alarm soak `cargo xtask verify` runs (`N` alarms,
//!   random dispatch failures and dispatcher crashes, seeded by `SEED`).
//! - `bench-inner`, `rss`, `alarms-rss`: child-process entry points of the
//!   benchmarks; `cluster-host`: a host process of the cluster scene and
//!   the host bench's failover figures.
#![allow(clippy::print_stdout)]

mod alarms;
mod bench;
mod cluster;
mod demo;
mod figures;
mod host;
mod lease_peers;
mod migration;
mod ownership;
mod pg_leases;
mod pg_outbox;
mod rss;
mod semaphore;
mod topology;

use std::process::ExitCode;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The one step of the schemas the scenes and benches give their own
/// tables: version 1, `initial`.
const INITIAL_STEP: durability_scheduler::SchemaStep = durability_scheduler::SchemaStep {
    version: 1,
    name: "initial",
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo::run(&args[1..]),
        Some("demo-cluster") => cluster::run(&args[1..]),
        Some("cluster-host") => cluster::child(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
        Some("bench-inner") => bench::inner(&args[1..]),
        Some("rss") => rss::inner(&args[1..]),
        Some("alarms-rss") => alarms::rss_child(&args[1..]),
        Some("soak") => soak(&args[1..]),
        _ => {
            eprintln!(
                "usage: durability-demo <demo [--redis] [--postgres] [--mariadb] | demo-cluster [--redis | --postgres] | bench [AREA] | soak N SEED>\n  \
                 demo --postgres / --mariadb: the migration scene on PostgreSQL / MariaDB shards\n  \
                 demo --postgres: also the cluster scene's hosts on PostgreSQL alone (no shared directory)\n  \
                 (DURABILITY_POSTGRES_URL, DURABILITY_MYSQL_URL; schemas/databases dropped after)\n  \
                 bench areas: {}",
                bench::AREAS.join(" | ")
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("durability-demo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The Redis server benches and `--redis` demos use.
pub(crate) fn redis_url() -> String {
    std::env::var("DURABILITY_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// The PostgreSQL server of `demo --postgres` and the migration bench.
pub(crate) fn postgres_url() -> String {
    std::env::var("DURABILITY_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The MariaDB server of `demo --mariadb` and the migration bench.
pub(crate) fn mysql_url() -> String {
    std::env::var("DURABILITY_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// The `cargo` that runs this binary (for the release re-run of `bench`).
pub(crate) fn env_cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// `soak N SEED`: the full-size alarm soak of `cargo xtask verify`.
fn soak(args: &[String]) -> Result {
    let (Some(n), Some(seed)) = (args.first(), args.get(1)) else {
        return Err("usage: durability-demo soak <n> <seed>".into());
    };
    let (n, seed): (usize, u64) = (n.parse()?, seed.parse()?);
    tokio::runtime::Runtime::new()?.block_on(alarms::soak(n, seed))
}
