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
//!
//! xtask only orchestrates: the demo scenes, the benchmarks and the alarm
//! soak live in the `durability-demo` package (`demo/`), which `demo`,
//! `bench` and `verify` run through `cargo run`. xtask itself depends on no
//! crate of the workspace (a tidy test checks it), so `cargo xtask` builds
//! in seconds.

#[cfg(test)]
mod tidy;

use std::process::{Command, ExitCode};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(),
        Some("ci") => ci(),
        Some("demo") => demo(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("verify") => verify(),
        _ => {
            eprintln!(
                "usage: cargo xtask <test | ci | demo [--redis] [--postgres] [--mariadb] | bench [AREA] | verify>\n  \
                 demo --postgres / --mariadb: the migration scene on PostgreSQL / MariaDB shards\n  \
                 (DURABILITY_POSTGRES_URL, DURABILITY_MYSQL_URL; schemas/databases dropped after)\n  \
                 bench areas: {}",
                BENCH_AREAS.join(" | ")
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

/// The benchmark areas of `durability-demo` (`demo/src/bench.rs`, `AREAS`;
/// a test keeps the two lists equal).
const BENCH_AREAS: &[&str] = &[
    "outbox",
    "topology",
    "ownership",
    "alarms",
    "migration",
    "host",
];

/// The demo package's binary, run by `demo`, `bench` and `verify`.
const DEMO: [&str; 4] = ["--package", "durability-demo", "--bin", "durability-demo"];

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
    demo_bin(false, &["soak", "100000", "7"])
}

/// `cargo run` of the demo package's binary with `args`: a debug build, or
/// a release build with `release`. Prints no command line, so the demo's
/// output reads as before; a failure of the binary (which has already said
/// why on stderr) is reported with its exit status.
fn demo_bin(release: bool, args: &[&str]) -> Result {
    let mut cmd = Command::new(env_cargo());
    cmd.arg("run");
    if release {
        cmd.arg("--release");
    }
    cmd.arg("--quiet").args(DEMO).arg("--").args(args);
    let status = cmd.status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("durability-demo {} failed with {status}", args.join(" ")).into())
    }
}

/// `demo [--redis] [--postgres] [--mariadb]`: the demo scenes, in a debug
/// build of the demo package (the flags are checked there).
fn demo(args: &[String]) -> Result {
    let mut all = vec!["demo"];
    all.extend(args.iter().map(String::as_str));
    demo_bin(false, &all)
}

/// `bench [AREA]...`: the demo package built in release, then its
/// `bench-inner` (the benchmarks measure optimised code). Unknown areas are
/// refused before the release build.
fn bench(args: &[String]) -> Result {
    if let Some(other) = args.iter().find(|a| !BENCH_AREAS.contains(&a.as_str())) {
        return Err(format!("unknown bench area {other:?}; known: {BENCH_AREAS:?}").into());
    }
    eprintln!("building durability-demo in release for benchmarks …");
    let mut all = vec!["bench-inner"];
    all.extend(args.iter().map(String::as_str));
    demo_bin(true, &all).map_err(|e| format!("benchmarks failed: {e}").into())
}
