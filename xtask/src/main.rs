//! Project automation: `cargo xtask <command>`.
//!
//! - `test`: every test of the workspace (nextest), the tests of
//!   storage-postgres' feature `sqlx` (one more build of that crate), and
//!   the doctests. This is the README's test command and what `.ci/run`
//!   calls.
//! - `ci`: formatting, clippy, `test`, and docs, as CI runs them.
//! - `demo [--redis] [--postgres] [--mariadb]`: the main job, a readable run
//!   on embedded SQLite. `--redis` publishes, leases and indexes alarms
//!   through Redis; `--postgres` and `--mariadb` run the migration scene on
//!   PostgreSQL or MariaDB shards instead of SQLite files (a schema or
//!   database per shard and one for the mapping store, created for the run
//!   and dropped at the end; an unreachable server fails the command), and
//!   `--postgres` runs the cluster scene's hosts on PostgreSQL alone
//!   (objects, leases and alarm jobs in a schema made for the run; each
//!   host in its own working directory, none shared).
//! - `bench [AREA]`: benchmarks printing one JSON line per figure with its
//!   ratio to a baseline measured in the same run (release build). The
//!   migration area measures SQLite files, PostgreSQL and MariaDB shards.
//! - `bench peers [--quick] [--reps N]`: our outbox, Redis leases and alarms
//!   against apalis-sqlite, a hand-written rusqlite queue, rslock and raw
//!   redis-rs, and our PostgreSQL outbox against apalis-postgres, side by side in one run. The two benchmark binaries live in
//!   `bench/peers/` (two cargo workspaces of their own, outside the main
//!   lock); xtask builds them in release, runs them interleaved and prints
//!   the medians and ratios. Not part of CI.
//! - `verify`: the crash-point and simulation suites, with what they tried.
//!
//! `bench` and `verify` also write what they measured to results files
//! under `results/` (module `results`): the figures live there, dated and
//! with their commit, not in the docs.
//!
//! xtask only orchestrates: the demo scenes, the benchmarks and the alarm
//! soak live in the `durability-demo` package (`demo/`), which `demo`,
//! `bench` and `verify` run through `cargo run`. xtask itself depends on no
//! crate of the workspace (a tidy test checks it), so `cargo xtask` builds
//! in seconds.

mod results;
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
                "usage: cargo xtask <test | ci | demo [--redis] [--postgres] [--mariadb] | bench [AREA] | bench peers [--quick] [--reps N] | verify>\n  \
                 demo --postgres / --mariadb: the migration scene on PostgreSQL / MariaDB shards\n  \
                 demo --postgres: also the cluster scene's hosts on PostgreSQL alone (no shared directory)\n  \
                 (DURABILITY_POSTGRES_URL, DURABILITY_MYSQL_URL; schemas/databases dropped after)\n  \
                 bench areas: {}\n  \
                 bench peers: against apalis-sqlite, apalis-postgres, rusqlite, rslock, redis-rs (bench/peers/; DURABILITY_REDIS_URL, DURABILITY_POSTGRES_URL)",
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
    "semaphore",
];

/// The demo package's binary, run by `demo`, `bench` and `verify`.
const DEMO: [&str; 4] = ["--package", "durability-demo", "--bin", "durability-demo"];

/// The workspace root (xtask's parent directory).
fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
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
    // Staging in a sqlx transaction is behind storage-postgres' feature
    // `sqlx`, which no workspace build enables: its tests run here, in one
    // more build of that crate only.
    cargo(&[
        "nextest",
        "run",
        "--package",
        "durability-storage-postgres",
        "--features",
        "sqlx",
        "--locked",
        "--no-fail-fast",
        "-E",
        "test(sqlx)",
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

/// Seeds of the migration model campaign `verify` runs.
const MODEL_SEEDS: &str = "20";
/// Operations per seed of that campaign.
const MODEL_OPS: &str = "2000";
/// Iterations of the storage-deletion race between host processes
/// (`host_processes::storage_deletion_race_*`; 20 in the normal test run).
const DELETE_RACE_ITERATIONS: &str = "60";

/// The crash-point and model suites, with their counts printed, then the
/// full-size alarm soak (100k alarms with dispatch failures and crashes).
/// The migration model runs a larger campaign here than in the normal test
/// run: `MODEL_SEEDS` seeds of `MODEL_OPS` operations per shard set, and
/// the storage-deletion race between host processes runs
/// `DELETE_RACE_ITERATIONS` times (an environment that sets the variables
/// itself keeps its values).
fn verify() -> Result {
    let stamp = results::Stamp::now();
    let mut cmd = Command::new(env_cargo());
    cmd.args([
        "nextest",
        "run",
        "--profile",
        "verify",
        "--workspace",
        "--all-targets",
        "--locked",
        "--no-capture",
        "-E",
        "test(/crash|model|lock_set|recover|storage_deletion_race/)",
    ]);
    let mut settings = Vec::new();
    for (var, value) in [
        ("DURABILITY_MIGRATION_MODEL_SEEDS", MODEL_SEEDS),
        ("DURABILITY_MIGRATION_MODEL_OPS", MODEL_OPS),
        ("DURABILITY_DELETE_RACE_ITERATIONS", DELETE_RACE_ITERATIONS),
    ] {
        match std::env::var(var) {
            Ok(set) => settings.push(format!("{var}={set}")),
            Err(_) => {
                cmd.env(var, value);
                settings.push(format!("{var}={value}"));
            }
        }
    }
    eprintln!("$ {cmd:?}");
    let mut steps = vec![verify_step(
        "nextest (crash, model, lock_set, recover, storage_deletion_race)",
        &mut cmd,
    )?];
    if steps[0].status == "passed" {
        eprintln!("alarm soak: 100,000 alarms, random dispatch failures and dispatcher crashes");
        build_demo(false)?;
        let mut soak = Command::new(env_cargo());
        soak.args(["run", "--quiet"])
            .args(DEMO)
            .args(["--", "soak", "100000", "7"]);
        steps.push(verify_step(
            "alarm soak (100000 alarms, seed 7)",
            &mut soak,
        )?);
    }
    let path = results::append(
        "verify.txt",
        &results::verify_section(&stamp, &settings.join(", "), &steps),
    )?;
    eprintln!("recorded in {}", results::shown(&path));
    match steps.iter().find(|s| s.status != "passed") {
        Some(failed) => Err(format!("{}: {}", failed.what, failed.status).into()),
        None => Ok(()),
    }
}

/// Runs one `verify` step, shown as usual, and keeps what the results file
/// records of it.
fn verify_step(what: &str, cmd: &mut Command) -> Result<results::VerifyStep> {
    let teed = results::run_teed(cmd)?;
    let status = if teed.status.success() {
        "passed".to_owned()
    } else {
        format!("failed ({})", teed.status)
    };
    let kept = teed
        .stderr
        .iter()
        .chain(&teed.stdout)
        .filter(|l| results::verify_line_kept(l))
        .cloned()
        .collect();
    Ok(results::VerifyStep {
        what: what.to_owned(),
        status,
        kept,
    })
}

/// Builds the demo package's binary with cargo's progress shown (a first
/// build takes minutes on a small machine; the `cargo run --quiet` that
/// follows then starts at once and prints only the demo's own output).
fn build_demo(release: bool) -> Result {
    let profile = if release { "release" } else { "debug" };
    eprintln!("building durability-demo ({profile}); a first build takes several minutes …");
    let mut cmd = Command::new(env_cargo());
    cmd.arg("build").args(DEMO);
    if release {
        cmd.arg("--release");
    }
    run_cmd(&mut cmd)
}

/// `cargo run` of the demo package's binary with `args`, in a debug build.
/// Prints no command line, so the demo's output reads as before; a failure
/// of the binary (which has already said why on stderr) is reported with
/// its exit status.
fn demo_bin(args: &[&str]) -> Result {
    build_demo(false)?;
    let status = Command::new(env_cargo())
        .args(["run", "--quiet"])
        .args(DEMO)
        .arg("--")
        .args(args)
        .status()?;
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
    demo_bin(&all)
}

/// `bench [AREA]...`: the demo package built in release, then its
/// `bench-inner` (the benchmarks measure optimised code). Unknown areas are
/// refused before the release build.
fn bench(args: &[String]) -> Result {
    if args.first().map(String::as_str) == Some("peers") {
        return peers(&args[1..]);
    }
    if let Some(other) = args.iter().find(|a| !BENCH_AREAS.contains(&a.as_str())) {
        return Err(format!("unknown bench area {other:?}; known: {BENCH_AREAS:?}").into());
    }
    build_demo(true)?;
    let stamp = results::Stamp::now();
    let mut cmd = Command::new(env_cargo());
    cmd.args(["run", "--release", "--quiet"])
        .args(DEMO)
        .arg("--")
        .arg("bench-inner")
        .args(args);
    let teed = results::run_teed(&mut cmd)?;
    if !teed.status.success() {
        return Err(format!(
            "benchmarks failed with {} (nothing recorded in results/)",
            teed.status
        )
        .into());
    }
    for path in results::record_figures(&teed.stdout, &stamp)? {
        eprintln!("recorded in {}", results::shown(&path));
    }
    Ok(())
}

// ------------------------------------------------------------ bench peers

/// The two benchmark packages of `bench peers`, each its own cargo
/// workspace under `bench/peers/` (apalis-sqlite links another SQLite than
/// rusqlite, so they cannot share a resolve): directory and binary name.
const PEER_BINARIES: [(&str, &str); 2] = [
    ("ours", "durability-bench-peers-ours"),
    ("apalis", "durability-bench-peers-apalis"),
];

/// Sizes of one `bench peers` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PeerSizes {
    /// Entries enqueued, one per transaction and 100 per transaction.
    enqueue: u64,
    /// The two backlogs drained.
    drain: [u64; 2],
    /// Entries of the end-to-end run (produced while a consumer delivers).
    e2e: u64,
    /// Operations per contender of the lease figures.
    lease_ops: u64,
    /// Alarms (scheduled jobs) of the lateness figures.
    alarms: u64,
    /// The largest backlog apalis drains: its drain time grows faster than
    /// the backlog (on this machine 1k in 0.4 s, 4k in 4.3 s, 10k in 28 s),
    /// so a 100k drain would take hours; larger backlogs are compared with
    /// the rusqlite queue only.
    apalis_drain_max: u64,
    /// PostgreSQL (ours against apalis-postgres): entries enqueued one
    /// and 100 per transaction, the backlog drained, and idle stage →
    /// handler latency samples.
    pg: [u64; 3],
}

impl PeerSizes {
    const FULL: PeerSizes = PeerSizes {
        enqueue: 100_000,
        drain: [10_000, 100_000],
        e2e: 10_000,
        lease_ops: 10_000,
        alarms: 1_000,
        apalis_drain_max: 10_000,
        pg: [20_000, 10_000, 200],
    };
    const QUICK: PeerSizes = PeerSizes {
        enqueue: 10_000,
        drain: [1_000, 10_000],
        e2e: 1_000,
        lease_ops: 2_000,
        alarms: 300,
        apalis_drain_max: 1_000,
        pg: [2_000, 10_000, 100],
    };
}

/// The options of `bench peers`.
#[derive(Debug, PartialEq, Eq)]
struct PeerOptions {
    quick: bool,
    reps: u32,
}

fn peer_options(args: &[String]) -> Result<PeerOptions> {
    let mut options = PeerOptions {
        quick: false,
        reps: 3,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--reps" => {
                let raw = it.next().ok_or("--reps needs a count")?;
                options.reps = match raw.parse::<u32>() {
                    Ok(n) if n > 0 => n,
                    _ => return Err(format!("--reps: {raw:?} is not a positive count").into()),
                };
            }
            other => {
                return Err(
                    format!("bench peers: unknown option {other:?} (--quick, --reps N)").into(),
                );
            }
        }
    }
    Ok(options)
}

/// One figure of one contender, as a benchmark binary prints it.
#[derive(Debug, Clone, PartialEq)]
struct Measurement {
    figure: String,
    who: String,
    value: f64,
    unit: String,
    higher_is_better: bool,
    n: u64,
}

/// A JSON value of a flat object: the binaries print nothing nested.
#[derive(Debug, Clone, PartialEq)]
enum Flat {
    Str(String),
    Num(f64),
    Bool(bool),
    Null,
}

/// Parses one flat JSON object (`{"k": "s" | number | bool | null, ...}`);
/// xtask stays std-only, so this is the whole parser it needs.
fn parse_flat(line: &str) -> Result<Vec<(String, Flat)>> {
    fn string(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Result<String> {
        if chars.next() != Some('"') {
            return Err("expected a string".into());
        }
        let mut out = String::new();
        loop {
            match chars.next().ok_or("unterminated string")? {
                '"' => return Ok(out),
                '\\' => match chars.next().ok_or("unterminated escape")? {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'u' => {
                        let hex: String = chars.by_ref().take(4).collect();
                        let code = u32::from_str_radix(&hex, 16)
                            .ok()
                            .and_then(char::from_u32)
                            .ok_or("bad \\u escape")?;
                        out.push(code);
                    }
                    c => out.push(c),
                },
                c => out.push(c),
            }
        }
    }
    let mut chars = line.trim().chars().peekable();
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
    };
    if chars.next() != Some('{') {
        return Err(format!("not a JSON object: {line:?}").into());
    }
    let mut fields = Vec::new();
    skip_ws(&mut chars);
    if chars.peek() == Some(&'}') {
        chars.next();
    } else {
        loop {
            skip_ws(&mut chars);
            let key = string(&mut chars)?;
            skip_ws(&mut chars);
            if chars.next() != Some(':') {
                return Err(format!("expected ':' after {key:?} in {line:?}").into());
            }
            skip_ws(&mut chars);
            let value = match chars.peek() {
                Some('"') => Flat::Str(string(&mut chars)?),
                Some(_) => {
                    let mut word = String::new();
                    while let Some(&c) = chars.peek() {
                        if c == ',' || c == '}' || c.is_whitespace() {
                            break;
                        }
                        word.push(c);
                        chars.next();
                    }
                    match word.as_str() {
                        "true" => Flat::Bool(true),
                        "false" => Flat::Bool(false),
                        "null" => Flat::Null,
                        num => Flat::Num(num.parse().map_err(|_| {
                            format!("value of {key:?} is not flat JSON: {num:?} in {line:?}")
                        })?),
                    }
                }
                None => return Err(format!("truncated object: {line:?}").into()),
            };
            fields.push((key, value));
            skip_ws(&mut chars);
            match chars.next() {
                Some(',') => continue,
                Some('}') => break,
                _ => return Err(format!("expected ',' or '}}' in {line:?}").into()),
            }
        }
    }
    skip_ws(&mut chars);
    if chars.next().is_some() {
        return Err(format!("text after the object: {line:?}").into());
    }
    Ok(fields)
}

/// One line of a benchmark binary's stdout as a [`Measurement`].
fn parse_measurement(line: &str) -> Result<Measurement> {
    let fields = parse_flat(line)?;
    let get = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("{key:?} missing in {line:?}"))
    };
    let text = |key: &str| -> Result<String> {
        match get(key)? {
            Flat::Str(s) if !s.is_empty() => Ok(s.clone()),
            other => Err(format!("{key:?} is not a name: {other:?} in {line:?}").into()),
        }
    };
    let value = match get("value")? {
        Flat::Num(v) if v.is_finite() => *v,
        other => return Err(format!("\"value\" is not a finite number: {other:?}").into()),
    };
    let higher_is_better = match get("higher_is_better")? {
        Flat::Bool(b) => *b,
        other => return Err(format!("\"higher_is_better\" is not a bool: {other:?}").into()),
    };
    let n = match get("n")? {
        Flat::Num(v) if *v >= 1.0 && v.fract() == 0.0 => *v as u64,
        other => return Err(format!("\"n\" is not a positive count: {other:?}").into()),
    };
    Ok(Measurement {
        figure: text("figure")?,
        who: text("who")?,
        value,
        unit: text("unit")?,
        higher_is_better,
        n,
    })
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One comparison of `bench peers`: our median against one peer's, both
/// from the measurements of the same run.
#[derive(Debug, Clone, PartialEq)]
struct Comparison {
    figure: String,
    peer: String,
    unit: String,
    higher_is_better: bool,
    n: u64,
    ours: Vec<f64>,
    theirs: Vec<f64>,
}

impl Comparison {
    fn ours_median(&self) -> f64 {
        median(&self.ours)
    }

    fn theirs_median(&self) -> f64 {
        median(&self.theirs)
    }

    /// Ours over theirs (above 1 is better for us when higher is better,
    /// below 1 when lower is); `None` when their median is zero.
    fn ratio(&self) -> Option<f64> {
        let theirs = self.theirs_median();
        (theirs != 0.0).then(|| self.ours_median() / theirs)
    }

    fn json(&self, reps: u32, mode: &str) -> String {
        let list = |xs: &[f64]| {
            xs.iter()
                .map(|x| json_num(*x))
                .collect::<Vec<_>>()
                .join(",")
        };
        let ratio = self.ratio().map_or_else(
            || "null".to_owned(),
            |r| json_num((r * 1000.0).round() / 1000.0),
        );
        format!(
            "{{\"name\":\"peers.{}.vs_{}\",\"value\":{},\"baseline\":{},\"unit\":\"{}\",\"ratio\":{ratio},\"higher_is_better\":{},\"statistic\":\"median\",\"reps\":{reps},\"values\":[{}],\"baseline_values\":[{}],\"n\":{},\"mode\":\"{mode}\"}}",
            self.figure,
            self.peer,
            json_num(self.ours_median()),
            json_num(self.theirs_median()),
            self.unit,
            self.higher_is_better,
            list(&self.ours),
            list(&self.theirs),
            self.n,
        )
    }
}

/// A number for JSON, to one decimal (figures are rates and milliseconds),
/// three for ratios; non-finite numbers are `null`.
fn json_num(x: f64) -> String {
    if !x.is_finite() {
        "null".to_owned()
    } else if x.fract() == 0.0 {
        format!("{x:.0}")
    } else if x.abs() < 10.0 {
        format!("{}", (x * 1000.0).round() / 1000.0)
    } else {
        format!("{}", (x * 10.0).round() / 10.0)
    }
}

/// Pairs every peer's figures with ours. A figure whose contenders disagree
/// on its unit, direction or size, or that lacks a side, is an error: the
/// binaries must measure the same thing.
fn compare(measurements: &[Measurement]) -> Result<Vec<Comparison>> {
    let mut out: Vec<Comparison> = Vec::new();
    let mut figures: Vec<&str> = Vec::new();
    for m in measurements {
        if !figures.contains(&m.figure.as_str()) {
            figures.push(&m.figure);
        }
    }
    for figure in figures {
        let of: Vec<&Measurement> = measurements.iter().filter(|m| m.figure == figure).collect();
        let first = of[0];
        if let Some(odd) = of.iter().find(|m| {
            m.unit != first.unit || m.higher_is_better != first.higher_is_better || m.n != first.n
        }) {
            return Err(format!(
                "{figure}: {} measured {} {} (n {}), {} measured {} (n {})",
                first.who, first.unit, first.higher_is_better, first.n, odd.who, odd.unit, odd.n
            )
            .into());
        }
        let values = |who: &str| -> Vec<f64> {
            of.iter()
                .filter(|m| m.who == who)
                .map(|m| m.value)
                .collect()
        };
        let ours = values("ours");
        if ours.is_empty() {
            return Err(format!("{figure}: no figure of ours").into());
        }
        let mut peers: Vec<&str> = Vec::new();
        for m in &of {
            if m.who != "ours" && !peers.contains(&m.who.as_str()) {
                peers.push(&m.who);
            }
        }
        if peers.is_empty() {
            return Err(format!("{figure}: no peer measured").into());
        }
        for peer in peers {
            let theirs = values(peer);
            if theirs.len() != ours.len() {
                return Err(format!(
                    "{figure}: {} figures of ours, {} of {peer}",
                    ours.len(),
                    theirs.len()
                )
                .into());
            }
            out.push(Comparison {
                figure: figure.to_owned(),
                peer: peer.to_owned(),
                unit: first.unit.clone(),
                higher_is_better: first.higher_is_better,
                n: first.n,
                ours: ours.clone(),
                theirs,
            });
        }
    }
    Ok(out)
}

/// Runs one benchmark binary; returns its measurements (stderr passes
/// through).
fn run_peer_binary(binary: &std::path::Path, args: &[String]) -> Result<Vec<Measurement>> {
    let name = binary.file_name().map_or_else(
        || binary.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    eprintln!("$ {name} {}", args.join(" "));
    let out = Command::new(binary)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("{name} {} failed with {}", args.join(" "), out.status).into());
    }
    String::from_utf8(out.stdout)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(parse_measurement)
        .collect()
}

/// `bench peers [--quick] [--reps N]`.
fn peers(args: &[String]) -> Result {
    let options = peer_options(args)?;
    let stamp = results::Stamp::now();
    let sizes = if options.quick {
        PeerSizes::QUICK
    } else {
        PeerSizes::FULL
    };
    let root = workspace_root();
    let mut binaries = Vec::new();
    for (dir, bin) in PEER_BINARIES {
        let dir = root.join("bench/peers").join(dir);
        eprintln!("building {bin} in release …");
        run_cmd(
            Command::new(env_cargo())
                .args([
                    "build",
                    "--release",
                    "--locked",
                    "--quiet",
                    "--manifest-path",
                ])
                .arg(dir.join("Cargo.toml")),
        )?;
        binaries.push(dir.join("target/release").join(bin));
    }
    let (ours, apalis) = (&binaries[0], &binaries[1]);
    let redis =
        std::env::var("DURABILITY_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let n = |x: u64| x.to_string();
    let outbox_args = |max: u64| {
        let mut args = vec!["outbox".to_owned(), n(sizes.enqueue), n(sizes.e2e)];
        args.extend(sizes.drain.iter().filter(|d| **d <= max).map(|d| n(*d)));
        args
    };
    let (outbox_ours, outbox_apalis) = (outbox_args(u64::MAX), outbox_args(sizes.apalis_drain_max));
    let leases = vec!["leases".to_owned(), n(sizes.lease_ops), redis];
    let alarms = vec!["alarms".to_owned(), n(sizes.alarms)];
    let postgres = std::env::var("DURABILITY_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let mut pg = vec!["pg".to_owned()];
    pg.extend(sizes.pg.iter().map(|x| n(*x)));
    pg.push(postgres);
    let mode = if options.quick { "quick" } else { "full" };
    eprintln!(
        "bench peers ({mode}): {sizes:?}, {} repetitions",
        options.reps
    );
    let mut all = Vec::new();
    for rep in 0..options.reps {
        eprintln!("repetition {} of {}", rep + 1, options.reps);
        // Ours and apalis take turns, the first alternating between
        // repetitions, so that load from elsewhere falls on both alike.
        for (mine, theirs) in [
            (&outbox_ours, &outbox_apalis),
            (&alarms, &alarms),
            (&pg, &pg),
        ] {
            let order = if rep % 2 == 0 {
                [(ours, mine), (apalis, theirs)]
            } else {
                [(apalis, theirs), (ours, mine)]
            };
            for (binary, args) in order {
                all.extend(run_peer_binary(binary, args)?);
            }
        }
        // Leases: ours, rslock and redis-rs in one process, in rotating
        // blocks.
        all.extend(run_peer_binary(ours, &leases)?);
    }
    let comparisons = compare(&all)?;
    let lines: Vec<String> = comparisons
        .iter()
        .map(|c| c.json(options.reps, mode))
        .collect();
    #[allow(clippy::print_stdout, reason = "the bench prints its JSON lines")]
    for line in &lines {
        println!("{line}");
    }
    for path in results::record_figures(&lines, &stamp)? {
        eprintln!("recorded in {}", results::shown(&path));
    }
    eprintln!(
        "\n| figure | unit | ours | peer | peer's | ours / peer's |\n|---|---|---:|---:|---:|---:|"
    );
    for c in &comparisons {
        eprintln!(
            "| {} (n {}) | {} | {} | {} | {} | {} |",
            c.figure,
            c.n,
            c.unit,
            json_num(c.ours_median()),
            c.peer,
            json_num(c.theirs_median()),
            c.ratio()
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}")),
        );
    }
    Ok(())
}

#[cfg(test)]
mod peers_tests {
    use super::*;

    fn m(figure: &str, who: &str, value: f64) -> Measurement {
        Measurement {
            figure: figure.to_owned(),
            who: who.to_owned(),
            value,
            unit: "entries/s".to_owned(),
            higher_is_better: true,
            n: 10,
        }
    }

    #[test]
    fn a_binary_line_parses_into_a_measurement() {
        let line = r#"{"figure":"outbox.drain_10k","higher_is_better":false,"n":10000,"unit":"ms","value":12.5,"who":"apalis"}"#;
        let got = parse_measurement(line).expect("parses");
        assert_eq!(
            got,
            Measurement {
                figure: "outbox.drain_10k".to_owned(),
                who: "apalis".to_owned(),
                value: 12.5,
                unit: "ms".to_owned(),
                higher_is_better: false,
                n: 10_000,
            }
        );
        // Whitespace and escapes as serde_json or a person may write them.
        let spaced = "{ \"figure\" : \"a\\\"b\", \"who\": \"ours\", \"value\": -1e3, \"unit\": \"ms\", \"higher_is_better\": true, \"n\": 3 }";
        let got = parse_measurement(spaced).expect("parses");
        assert_eq!((got.figure.as_str(), got.value), ("a\"b", -1000.0));
    }

    #[test]
    fn malformed_or_incomplete_lines_are_refused() {
        for bad in [
            "",
            "not json",
            r#"{"figure":"f","who":"ours","value":1,"unit":"u","higher_is_better":true}"#,
            r#"{"figure":"f","who":"ours","value":"1","unit":"u","higher_is_better":true,"n":1}"#,
            r#"{"figure":"f","who":"ours","value":1,"unit":"u","higher_is_better":1,"n":1}"#,
            r#"{"figure":"f","who":"ours","value":1,"unit":"u","higher_is_better":true,"n":0}"#,
            r#"{"figure":"","who":"ours","value":1,"unit":"u","higher_is_better":true,"n":1}"#,
            r#"{"figure":"f","who":"ours","value":1,"unit":"u","higher_is_better":true,"n":1} x"#,
            r#"{"figure":"f","who":"ours","value":{"x":1},"unit":"u","higher_is_better":true,"n":1}"#,
            r#"{"figure":"f" "who":"ours"}"#,
        ] {
            assert!(parse_measurement(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn comparisons_pair_each_peer_with_our_figures_of_the_same_run() {
        let run = [
            m("outbox.enqueue_single", "ours", 100.0),
            m("outbox.enqueue_single", "rusqlite", 200.0),
            m("outbox.enqueue_single", "apalis", 50.0),
            m("outbox.enqueue_single", "apalis", 10.0),
            m("outbox.enqueue_single", "ours", 300.0),
            m("outbox.enqueue_single", "rusqlite", 100.0),
            m("outbox.enqueue_single", "ours", 200.0),
            m("outbox.enqueue_single", "apalis", 30.0),
            m("outbox.enqueue_single", "rusqlite", 400.0),
        ];
        let got = compare(&run).expect("compares");
        let summary: Vec<(&str, f64, f64, Option<f64>)> = got
            .iter()
            .map(|c| {
                (
                    c.peer.as_str(),
                    c.ours_median(),
                    c.theirs_median(),
                    c.ratio(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("rusqlite", 200.0, 200.0, Some(1.0)),
                ("apalis", 200.0, 30.0, Some(200.0 / 30.0)),
            ]
        );
        let line = got[1].json(3, "quick");
        assert!(
            line.starts_with(r#"{"name":"peers.outbox.enqueue_single.vs_apalis","value":200,"baseline":30,"unit":"entries/s","ratio":6.667,"#),
            "{line}"
        );
        assert!(
            line.contains(r#""values":[100,300,200],"baseline_values":[50,10,30]"#),
            "{line}"
        );
        // The printed line is JSON the parser (and so any JSON reader) takes.
        let fields = parse_flat(&line.replace(
            &line[line.find(",\"values\"").expect("values")..line.find(",\"n\"").expect("n")],
            "",
        ))
        .expect("flat part parses");
        assert!(
            fields
                .iter()
                .any(|(k, v)| k == "ratio" && *v == Flat::Num(6.667))
        );
    }

    #[test]
    fn a_figure_missing_a_side_or_measured_differently_is_an_error() {
        assert!(compare(&[m("f", "ours", 1.0)]).is_err(), "no peer");
        assert!(
            compare(&[m("f", "apalis", 1.0)]).is_err(),
            "no figure of ours"
        );
        assert!(
            compare(&[
                m("f", "ours", 1.0),
                m("f", "ours", 2.0),
                m("f", "apalis", 1.0)
            ])
            .is_err(),
            "unequal repetitions"
        );
        let mut other_n = m("f", "apalis", 1.0);
        other_n.n = 11;
        assert!(
            compare(&[m("f", "ours", 1.0), other_n]).is_err(),
            "other size"
        );
        let mut other_unit = m("f", "apalis", 1.0);
        other_unit.unit = "ms".to_owned();
        assert!(
            compare(&[m("f", "ours", 1.0), other_unit]).is_err(),
            "other unit"
        );
    }

    #[test]
    fn a_zero_peer_median_has_no_ratio() {
        let got = compare(&[m("f", "ours", 1.0), m("f", "apalis", 0.0)]).expect("compares");
        assert_eq!(got[0].ratio(), None);
        assert!(got[0].json(1, "full").contains("\"ratio\":null"));
    }

    #[test]
    fn peer_options_parse_and_refuse() {
        let args = |xs: &[&str]| xs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            peer_options(&args(&[])).expect("defaults"),
            PeerOptions {
                quick: false,
                reps: 3
            }
        );
        assert_eq!(
            peer_options(&args(&["--reps", "5", "--quick"])).expect("parses"),
            PeerOptions {
                quick: true,
                reps: 5
            }
        );
        for bad in [
            &["--reps"][..],
            &["--reps", "0"],
            &["--reps", "x"],
            &["--fast"],
        ] {
            assert!(peer_options(&args(bad)).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn quick_sizes_are_smaller_than_full_ones() {
        let (q, f) = (PeerSizes::QUICK, PeerSizes::FULL);
        assert!(q.enqueue < f.enqueue && q.e2e < f.e2e && q.alarms < f.alarms);
        assert!(q.drain[0] < q.drain[1] && f.drain[0] < f.drain[1]);
        assert_eq!(f.drain, [10_000, 100_000], "the issue's backlogs");
        assert_eq!(f.enqueue, 100_000, "the issue's enqueue size");
        assert!(q.apalis_drain_max >= q.drain[0] && f.apalis_drain_max >= f.drain[0]);
    }
}
