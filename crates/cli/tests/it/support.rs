//! Fixtures: object databases made with the crates' APIs, and a runner for
//! the built binary.

use std::path::Path;
use std::sync::Arc;

use assert_cmd::Command;
use durability_outbox::{ChannelConfig, Entry, Outbox, Sink, SinkError};
use durability_scheduler::{ManualClock, ObjectContext, ObjectId, Scheduler};
use durability_storage_sqlite::{SqliteOptions, SqliteStorage};

/// The fixtures' time: every stored time is relative to it.
pub(crate) const START: i64 = 1_800_000_000_000;

/// A sink that accepts every batch.
pub(crate) struct Accept;

impl Sink<String> for Accept {
    async fn publish(&self, _batch: &[Entry<String>]) -> Result<(), SinkError> {
        Ok(())
    }
}

/// A sink that asks for every entry to be retried after [`RETRY_MS`].
pub(crate) struct RetryLater;

/// The delay [`RetryLater`] asks for.
pub(crate) const RETRY_MS: i64 = 30_000;

impl Sink<String> for RetryLater {
    async fn publish(&self, batch: &[Entry<String>]) -> Result<(), SinkError> {
        for e in batch {
            #[allow(clippy::cast_precision_loss)] // 30 000 is exact.
            e.retry_after(RETRY_MS as f64);
        }
        Ok(())
    }
}

/// One object on a SQLite file, with an outbox channel `orders`.
pub(crate) struct Object<K: Sink<String> = Accept> {
    pub(crate) sched: Scheduler<SqliteStorage>,
    pub(crate) outbox: Outbox<SqliteStorage, String, K>,
}

/// Opens (creating) the object database at `path` at time [`START`].
pub(crate) fn object(path: &Path) -> Object {
    object_at(path, START, "orders", Accept)
}

/// Opens (creating) the object database at `path` at time `now`, with the
/// channel `channel` publishing to `sink`.
pub(crate) fn object_at<K: Sink<String>>(
    path: &Path,
    now: i64,
    channel: &str,
    sink: K,
) -> Object<K> {
    let storage = Arc::new(SqliteStorage::open(path, SqliteOptions::default()).unwrap());
    let clock = Arc::new(ManualClock::new(now));
    let ctx = ObjectContext::with_clock(ObjectId::new("object-1").unwrap(), storage, clock);
    let sched = Scheduler::new(ctx).unwrap();
    let outbox = Outbox::attach(&sched, ChannelConfig::new(channel), sink).unwrap();
    Object { sched, outbox }
}

/// The built `durability` binary.
pub(crate) fn cli() -> Command {
    let mut cmd = Command::cargo_bin("durability").unwrap();
    cmd.env_remove("RUST_LOG");
    cmd
}

/// Runs the binary with `args`, expecting success; returns stdout.
pub(crate) fn ok(args: &[&str]) -> String {
    let out = cli().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs the binary with `args`, expecting failure with one line on stderr
/// and nothing on stdout; returns that line.
pub(crate) fn fails(args: &[&str]) -> String {
    let out = cli().args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "one line on stderr: {err:?}");
    err.trim_end().to_owned()
}

/// [`ok`], its stdout parsed as JSON.
pub(crate) fn ok_json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).unwrap()
}

/// The string field `field` of every item of the JSON array `list`.
pub(crate) fn strings<'v>(list: &'v serde_json::Value, field: &str) -> Vec<&'v str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|item| item[field].as_str().unwrap())
        .collect()
}

/// A fresh temporary directory and the path of file `name` in it (not
/// created).
pub(crate) fn temp_file(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

/// Runs `args` with `--sqlite` naming a file that does not exist: asserts
/// the one-line refusal says so and the file was not created. Returns the
/// (empty) directory the file would have been in.
pub(crate) fn assert_missing_file_refused(args: &[&str]) -> tempfile::TempDir {
    let (dir, missing) = temp_file("missing.db");
    let mut args = args.to_vec();
    args.extend(["--sqlite", s(&missing)]);
    let line = fails(&args);
    assert!(line.contains("no such file"), "{line}");
    assert!(!missing.exists());
    dir
}

/// A path as an argument.
pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The test Redis (`DURABILITY_REDIS_URL`, else the local one) and a key
/// prefix of the test's own, `durability:test:<random>:<what>:`.
pub(crate) fn redis_and_prefix(what: &str) -> (String, String) {
    use std::hash::{BuildHasher as _, Hasher as _};
    let url = std::env::var("DURABILITY_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let unique = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (url, format!("durability:test:{unique:016x}:{what}:"))
}

/// What connecting to the Redis at `url` gave, or `None` (said on stderr)
/// when it is unreachable and not required (`DURABILITY_REQUIRE_SERVICES`).
pub(crate) fn connected_or_skip<T, E: std::fmt::Display>(url: &str, r: Result<T, E>) -> Option<T> {
    match r {
        Ok(c) => Some(c),
        Err(e) if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("Redis at {url} is required (DURABILITY_REQUIRE_SERVICES=1): {e}")
        }
        Err(e) => {
            eprintln!("skipped: Redis at {url} unreachable: {e}");
            None
        }
    }
}

/// A file's bytes and modification time, to prove it was not changed.
pub(crate) fn fingerprint(path: &Path) -> (Vec<u8>, std::time::SystemTime) {
    (
        std::fs::read(path).unwrap(),
        std::fs::metadata(path).unwrap().modified().unwrap(),
    )
}
