//! Project automation: `cargo xtask <command>`.
//!
//! - `test`: every test of the workspace (nextest) and the doctests. This is
//!   the README's test command and what `.ci/run` calls.
//! - `ci`: formatting, clippy, `test`, and docs, as CI runs them.
//! - `demo [--redis] [--postgres] [--mariadb]`: the main job, a readable run
//!   on embedded SQLite. `--redis` publishes, leases and indexes alarms
//!   through Redis; `--postgres` and `--mariadb` run the migration scene on
//!   PostgreSQL or MariaDB shards instead of SQLite files (a schema or
//!   database per shard and one for the mapping store, created for the run
//!   and dropped at the end; an unreachable server fails the command).
//! - `bench [AREA]`: benchmarks printing one JSON line per figure with its
//!   ratio to a baseline measured in the same run (release build). The
//!   migration area measures SQLite files, PostgreSQL and MariaDB shards.
//! - `verify`: the crash-point and simulation suites, with what they tried.
#![allow(clippy::print_stdout)]

mod alarms;
mod bench;
mod demo;
mod migration;
mod ownership;
mod rss;
#[cfg(test)]
mod tidy;
mod topology;

use std::process::{Command, ExitCode};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(),
        Some("ci") => ci(),
        Some("demo") => demo::run(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
        Some("bench-inner") => bench::inner(&args[1..]),
        Some("rss") => rss::inner(&args[1..]),
        Some("alarms-rss") => alarms::rss_child(&args[1..]),
        Some("verify") => verify(),
        _ => {
            eprintln!(
                "usage: cargo xtask <test | ci | demo [--redis] [--postgres] [--mariadb] | bench [AREA] | verify>\n  \
                 demo --postgres / --mariadb: the migration scene on PostgreSQL / MariaDB shards\n  \
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
            eprintln!("xtask: {e}");
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

fn cargo(args: &[&str]) -> Result {
    run_cmd(Command::new(env_cargo()).args(args))
}

fn env_cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn run_cmd(cmd: &mut Command) -> Result {
    eprintln!("$ {cmd:?}");
    let status = cmd.status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("command failed with {status}").into())
    }
}

/// The README's test command: all tests, then the doctests (nextest does not
/// run doctests).
fn test() -> Result {
    // Every package in Cargo.lock, for every platform: the dependency tidy
    // tests run `cargo metadata --offline`, which reads manifests of
    // packages no build on this platform downloads.
    cargo(&["fetch", "--locked"])?;
    cargo(&[
        "nextest",
        "run",
        "--workspace",
        "--all-targets",
        "--locked",
        "--no-fail-fast",
    ])?;
    cargo(&["test", "--workspace", "--doc", "--locked"])
}

fn ci() -> Result {
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ])?;
    test()?;
    run_cmd(
        Command::new(env_cargo())
            .args(["doc", "--workspace", "--no-deps", "--locked"])
            .env("RUSTDOCFLAGS", "-Dwarnings"),
    )
}

/// The crash-point and model suites, with their counts printed, then the
/// full-size alarm soak (100k alarms with dispatch failures and crashes).
fn verify() -> Result {
    cargo(&[
        "nextest",
        "run",
        "--workspace",
        "--all-targets",
        "--locked",
        "--no-capture",
        "-E",
        "test(/crash|model|lock_set|recover/)",
    ])?;
    eprintln!("alarm soak: 100,000 alarms, random dispatch failures and dispatcher crashes");
    tokio::runtime::Runtime::new()?.block_on(alarms::soak(100_000, 7))
}
