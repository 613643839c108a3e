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

/// A file's bytes and modification time, to prove it was not changed.
pub(crate) fn fingerprint(path: &Path) -> (Vec<u8>, std::time::SystemTime) {
    (
        std::fs::read(path).unwrap(),
        std::fs::metadata(path).unwrap().modified().unwrap(),
    )
}
