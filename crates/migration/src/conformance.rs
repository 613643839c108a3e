//! Conformance suites for [`Shard`] and [`MappingStore`] backends, and the
//! fault-injecting wrappers crash tests use.
//!
//! A backend is done when its tests run [`SHARD_CASES`] (for shards, one
//! [`shard_conformance!`](crate::shard_conformance) call) or
//! [`MAPPING_STORE_CASES`] (for mapping stores, one
//! [`mapping_store_conformance!`](crate::mapping_store_conformance) call)
//! and pass. Each suite is one case: its steps build on the state the
//! previous ones left. [`ledger_suite`] is called directly by backends,
//! which check what it leaves behind. The suites panic
//! on a violation, like any test assertion. [`harness`] is the crash/fault
//! harness every backend's migration suite builds its scenarios on.

#![allow(clippy::unwrap_used, missing_docs)]

pub mod harness;
pub mod safety;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::dialect::{Cutover, CutoverTable, Dialect, Ident, row_idents};
use crate::error::BackendError;
use crate::mapping::MappingStore;
use crate::shard::{BackendFuture, BatchSupport, Shard, Statement};
use crate::value::{self, Row, Value, row};

/// The body of this crate's conformance macros (see `durability_time`).
#[doc(hidden)]
pub use durability_time::async_suite;

/// Whether a crash lands before or after the write it interrupts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// The Nth write fails without applying.
    Before,
    /// The Nth write applies, then reports failure (outcome unknown).
    After,
}

/// A shared crash plan: counts writes across wrapped shards and mapping
/// stores, and crashes at the Nth. After the crash every call fails, as if
/// the process had died.
#[derive(Debug)]
pub struct FaultPlan {
    writes: AtomicU64,
    fail_at: AtomicU64,
    mode: Mutex<FaultMode>,
    tripped: AtomicBool,
}

impl FaultPlan {
    /// A disarmed plan.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            writes: AtomicU64::new(0),
            fail_at: AtomicU64::new(0),
            mode: Mutex::new(FaultMode::Before),
            tripped: AtomicBool::new(false),
        })
    }
    /// Crash at the `n`th write from now (1-based).
    pub fn arm(&self, n: u64, mode: FaultMode) {
        self.writes.store(0, Ordering::SeqCst);
        self.tripped.store(false, Ordering::SeqCst);
        *self.mode.lock().unwrap() = mode;
        self.fail_at.store(n, Ordering::SeqCst);
    }
    /// Never crash; reset the count.
    pub fn disarm(&self) {
        self.fail_at.store(0, Ordering::SeqCst);
        self.tripped.store(false, Ordering::SeqCst);
        self.writes.store(0, Ordering::SeqCst);
    }
    /// Writes seen since arming.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }
    /// Crashes now, without a write: every call through the wrappers fails
    /// until [`FaultPlan::disarm`] (a store that is down, then back).
    pub fn crash_now(&self) {
        self.tripped.store(true, Ordering::SeqCst);
    }
    /// Whether the crash happened.
    pub fn tripped(&self) -> bool {
        self.tripped.load(Ordering::SeqCst)
    }
    fn dead(&self) -> Result<(), BackendError> {
        if self.tripped() {
            Err("injected crash: process is dead".into())
        } else {
            Ok(())
        }
    }
    /// Runs `read` unless the process is dead.
    async fn read<'a, T>(
        &self,
        read: impl FnOnce() -> BackendFuture<'a, T>,
    ) -> Result<T, BackendError> {
        self.dead()?;
        read().await
    }
    /// Runs `write` (a `what`) under the plan: refused when the process is
    /// dead; when this write is the crash, lost before it reaches the
    /// backend ([`FaultMode::Before`]) or applied with its reply lost
    /// ([`FaultMode::After`]).
    async fn write<'a, T>(
        &self,
        what: &str,
        write: impl FnOnce() -> BackendFuture<'a, T>,
    ) -> Result<T, BackendError> {
        self.dead()?;
        match self.on_write() {
            Some(FaultMode::Before) => Err(format!("injected crash before {what}").into()),
            Some(FaultMode::After) => {
                let _ = write().await;
                Err(format!("injected crash after {what}").into())
            }
            None => write().await,
        }
    }
    /// Called before a write; `Some(mode)` when this write is the crash.
    fn on_write(&self) -> Option<FaultMode> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        let at = self.fail_at.load(Ordering::SeqCst);
        if at != 0 && n == at {
            self.tripped.store(true, Ordering::SeqCst);
            Some(*self.mode.lock().unwrap())
        } else {
            None
        }
    }
}

/// A backend (`T`: a shard or a mapping store) that crashes per its
/// [`FaultPlan`].
pub struct Faulty<T: ?Sized> {
    inner: Arc<T>,
    plan: Arc<FaultPlan>,
}

impl<T: ?Sized> std::fmt::Debug for Faulty<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faulty").finish_non_exhaustive()
    }
}

impl<T: ?Sized> Faulty<T> {
    /// Wraps a backend.
    pub fn new(inner: Arc<T>, plan: Arc<FaultPlan>) -> Self {
        Self { inner, plan }
    }
}

/// A shard that crashes per its [`FaultPlan`].
pub type FaultShard = Faulty<dyn Shard>;

/// A mapping store that crashes per its [`FaultPlan`].
pub type FaultMappingStore = Faulty<dyn MappingStore>;

impl Shard for FaultShard {
    fn dialect(&self) -> Dialect {
        self.inner.dialect()
    }
    fn batch_support(&self) -> BatchSupport {
        self.inner.batch_support()
    }
    fn execute<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, u64> {
        Box::pin(self.plan.write("write", move || self.inner.execute(stmt)))
    }
    fn query<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, Vec<Row>> {
        Box::pin(self.plan.read(move || self.inner.query(stmt)))
    }
    fn batch<'a>(&'a self, stmts: &'a [Statement]) -> BackendFuture<'a, Vec<u64>> {
        Box::pin(self.plan.write("batch", move || self.inner.batch(stmts)))
    }
}

impl MappingStore for FaultMappingStore {
    fn get<'a>(&'a self, key: &'a str) -> BackendFuture<'a, Option<String>> {
        Box::pin(self.plan.read(move || self.inner.get(key)))
    }
    fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()> {
        Box::pin(
            self.plan
                .write("mapping put", move || self.inner.put(key, shard)),
        )
    }
    fn put_if_absent<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, String> {
        Box::pin(
            self.plan
                .write("mapping put", move || self.inner.put_if_absent(key, shard)),
        )
    }
    fn remove<'a>(&'a self, key: &'a str) -> BackendFuture<'a, bool> {
        Box::pin(
            self.plan
                .write("mapping remove", move || self.inner.remove(key)),
        )
    }
    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BackendFuture<'a, Vec<(String, String)>> {
        Box::pin(self.plan.read(move || self.inner.scan(after, limit)))
    }
}

/// The mapping store contract. `prefix` isolates this run's keys (stores
/// shared between tests, like Redis, hold other keys too; the store itself
/// must be empty of keys starting with `prefix`).
pub async fn mapping_store_suite(store: &dyn MappingStore, prefix: &str) {
    let k = |s: &str| format!("{prefix}{s}");
    assert_eq!(
        store.get(&k("a")).await.unwrap(),
        None,
        "unknown key reads as none"
    );
    store.put(&k("a"), "s1").await.unwrap();
    assert_eq!(store.get(&k("a")).await.unwrap().as_deref(), Some("s1"));
    store.put(&k("a"), "s2").await.unwrap();
    assert_eq!(
        store.get(&k("a")).await.unwrap().as_deref(),
        Some("s2"),
        "put replaces"
    );
    assert_eq!(
        store.put_if_absent(&k("a"), "s3").await.unwrap(),
        "s2",
        "put_if_absent keeps the holder"
    );
    assert_eq!(store.put_if_absent(&k("b"), "s3").await.unwrap(), "s3");
    assert_eq!(store.get(&k("b")).await.unwrap().as_deref(), Some("s3"));
    for i in 0..25 {
        store.put(&k(&format!("p{i:03}")), "s1").await.unwrap();
    }
    // Scan in pages: every key after the prefix start, in order, no repeats.
    let mut seen = Vec::new();
    let mut after = Some(prefix.to_owned());
    loop {
        let page = store.scan(after.as_deref(), 7).await.unwrap();
        assert!(page.len() <= 7, "scan honours the limit");
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        let mut stop = false;
        for (key, shard) in page {
            if !key.starts_with(prefix) {
                stop = true;
                break;
            }
            assert!(!shard.is_empty());
            seen.push(key);
        }
        if stop {
            break;
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seen, sorted, "scan is ordered without repeats");
    assert_eq!(seen.len(), 27, "scan sees every key");
    assert!(store.remove(&k("a")).await.unwrap());
    assert!(
        !store.remove(&k("a")).await.unwrap(),
        "second remove finds nothing"
    );
    assert_eq!(store.get(&k("a")).await.unwrap(), None);
    // Hostile keys are data.
    let hostile = k("'; DROP TABLE x; -- \u{1F600}");
    store.put(&hostile, "s1").await.unwrap();
    assert_eq!(store.get(&hostile).await.unwrap().as_deref(), Some("s1"));
}

fn ddl(d: &Dialect, table: &str) -> Statement {
    let (key, txt, int, real, blob) = match d {
        Dialect::Postgres => ("TEXT", "TEXT", "BIGINT", "DOUBLE PRECISION", "BYTEA"),
        Dialect::MySql => ("VARCHAR(255)", "LONGTEXT", "BIGINT", "DOUBLE", "LONGBLOB"),
        _ => ("TEXT", "TEXT", "INTEGER", "REAL", "BLOB"),
    };
    Statement::new(format!(
        "CREATE TABLE {table} (id {key} PRIMARY KEY, n {int}, r {real}, s {txt}, b {blob})"
    ))
}

/// The shard contract: bound values round-trip, batches are atomic when
/// declared so and isolated from concurrent statements, and the generated cutover archives and deletes a row only
/// when it is unchanged. `table` must not exist yet.
pub async fn shard_suite(shard: &dyn Shard, table: &str) {
    let d = shard.dialect();
    let t = Ident::new(table).unwrap();
    let id = Ident::new("id").unwrap();
    shard.execute(&ddl(&d, table)).await.unwrap();
    for st in d.retired_schema() {
        shard.execute(&st).await.unwrap();
    }
    let cols = shard.query(&d.columns_query(&t)).await.unwrap();
    let names: Vec<_> = cols
        .iter()
        .filter_map(|r| r.get("name").and_then(Value::as_text))
        .collect();
    for c in ["id", "n", "r", "s", "b"] {
        assert!(names.contains(&c), "columns query lists {c}: {names:?}");
    }
    let r1 = row([
        ("id", Value::from("k1")),
        ("n", Value::Integer(i64::MIN)),
        ("r", Value::Real(1.5)),
        ("s", Value::from("'; DROP TABLE x; --")),
        ("b", Value::Blob(vec![0, 1, 255])),
    ]);
    let n = shard
        .execute(&d.insert_row(&t, &row_idents(&r1).unwrap()))
        .await
        .unwrap();
    assert_eq!(n, 1, "insert changes one row");
    let got = shard.query(&d.select_row(&t, &id, "k1")).await.unwrap();
    assert_eq!(
        got,
        vec![r1.clone()],
        "values round-trip through bound parameters"
    );
    let r2 = row([
        ("id", Value::from("k2")),
        ("n", Value::Null),
        ("r", Value::Null),
        ("s", Value::Null),
        ("b", Value::Null),
    ]);
    match shard.batch_support() {
        BatchSupport::Atomic => {
            let bad = vec![
                d.insert_row(&t, &row_idents(&r2).unwrap()),
                d.insert_row(&t, &row_idents(&r1).unwrap()),
            ];
            assert!(
                shard.batch(&bad).await.is_err(),
                "duplicate key fails the batch"
            );
            let got = shard.query(&d.select_row(&t, &id, "k2")).await.unwrap();
            assert!(
                got.is_empty(),
                "a failed atomic batch rolls back every statement"
            );
            // A batch is isolated: a statement issued while it runs is not
            // part of it, so the failing batch does not roll it back (in
            // whatever order the adapter runs the two).
            let r4 = row([("id", Value::from("k4"))]);
            let insert_r4 = d.insert_row(&t, &row_idents(&r4).unwrap());
            let (failed, alone) = futures::join!(shard.batch(&bad), shard.execute(&insert_r4));
            assert!(failed.is_err(), "duplicate key fails the batch");
            assert_eq!(alone.unwrap(), 1, "the concurrent insert lands");
            let got = shard.query(&d.select_row(&t, &id, "k4")).await.unwrap();
            assert_eq!(
                got.len(),
                1,
                "a failing batch does not roll back a concurrent statement"
            );
            let got = shard.query(&d.select_row(&t, &id, "k2")).await.unwrap();
            assert!(got.is_empty(), "the failed batch left nothing");
            shard.execute(&d.delete_key(&t, &id, "k4")).await.unwrap();
            let ok = vec![
                d.insert_row(&t, &row_idents(&r2).unwrap()),
                d.delete_key(&t, &id, "nope"),
            ];
            assert_eq!(
                shard.batch(&ok).await.unwrap(),
                vec![1, 0],
                "batch reports per-statement counts"
            );
        }
        BatchSupport::NonAtomic | BatchSupport::None => {
            shard
                .execute(&d.insert_row(&t, &row_idents(&r2).unwrap()))
                .await
                .unwrap();
        }
    }
    // Null-safe match deletes exactly the matching row.
    let n = shard
        .execute(&d.delete_matching(&t, &id, "k2", &row_idents(&r2).unwrap()))
        .await
        .unwrap();
    assert_eq!(n, 1, "null-safe equality matches NULL columns");
    if shard.batch_support() != BatchSupport::Atomic {
        return;
    }
    // Cutover: a changed row makes the whole batch write nothing.
    let mut changed = r1.clone();
    changed.insert("n".into(), Value::Integer(7));
    let mk = |snapshot: &Row| CutoverTable {
        table: t.clone(),
        key_col: id.clone(),
        row: Some(row_idents(snapshot).unwrap()),
        payload: Some(value::encode_row(snapshot)),
        digest: value::digest(Some(snapshot)),
    };
    /// The cutover of `k1` to `x` by the operation `op_id`.
    fn cutover<'a>(op_id: &'a str, tables: &'a [CutoverTable]) -> Cutover<'a> {
        Cutover {
            op_id,
            scope: "s",
            key: "k1",
            moved_to: "x",
            now_ms: 1,
            tables,
            journal_owner: None,
        }
    }
    let stale = [mk(&changed)];
    let counts = shard
        .batch(&d.cutover_batch(&cutover("op-stale", &stale)))
        .await
        .unwrap();
    assert!(
        counts.iter().all(|n| *n == 0),
        "stale snapshot: cutover writes nothing"
    );
    assert_eq!(
        shard
            .query(&d.select_row(&t, &id, "k1"))
            .await
            .unwrap()
            .len(),
        1
    );
    let fresh = [mk(&r1)];
    let counts = shard
        .batch(&d.cutover_batch(&cutover("op-1", &fresh)))
        .await
        .unwrap();
    assert_eq!(counts, vec![1, 1], "cutover archives and deletes");
    assert!(
        shard
            .query(&d.select_row(&t, &id, "k1"))
            .await
            .unwrap()
            .is_empty()
    );
    let tomb = shard.query(&d.tombstone_query(&t, "k1")).await.unwrap();
    assert_eq!(tomb.len(), 1, "tombstone recorded");
    // The fence refuses routed writes to the moved key.
    let n = shard
        .execute(&d.fenced_insert(&t, "k1", &row_idents(&r1).unwrap(), None))
        .await
        .unwrap();
    assert_eq!(n, 0, "fenced insert writes nothing behind a tombstone");
    // Keys compare byte-wise: the tombstone of `k1` does not fence `K1`.
    let n = shard
        .execute(&d.fenced_insert(&t, "K1", &row_idents(&row([("id", "K1")])).unwrap(), None))
        .await
        .unwrap();
    assert_eq!(n, 1, "a tombstone fences its exact key only");
    let n = shard
        .execute(&d.fenced_insert(
            &t,
            "k3",
            &row_idents(&row([("id", "k3")])).unwrap(),
            Some(&id),
        ))
        .await
        .unwrap();
    assert_eq!(n, 1, "fenced upsert lands without a tombstone");
}

/// The allocation ledger contract. `ledger` must start empty.
///
/// Checks that `record` inserts and replaces, that `scan` pages in strictly
/// increasing byte order of keys (no repeats, limit honoured, `after`
/// exclusive, `None` from the start) and that `remove_if` removes a row only
/// while it still names the given shard. Keys and shard names are bound
/// data, never SQL.
pub async fn ledger_suite(ledger: &dyn crate::ledger::AllocationLedger) {
    assert!(
        ledger.scan(None, 10).await.unwrap().is_empty(),
        "the ledger starts empty"
    );
    ledger.record("k-a", "s1").await.unwrap();
    assert_eq!(
        ledger.scan(None, 10).await.unwrap(),
        vec![("k-a".to_owned(), "s1".to_owned())]
    );
    ledger.record("k-a", "s2").await.unwrap();
    assert_eq!(
        ledger.scan(None, 10).await.unwrap(),
        vec![("k-a".to_owned(), "s2".to_owned())],
        "record replaces"
    );
    assert!(
        !ledger.remove_if("k-a", "s1").await.unwrap(),
        "remove_if keeps a row naming another shard"
    );
    assert!(
        !ledger.remove_if("k-missing", "s2").await.unwrap(),
        "remove_if of an unknown key removes nothing"
    );
    assert_eq!(ledger.scan(None, 10).await.unwrap().len(), 1);
    assert!(ledger.remove_if("k-a", "s2").await.unwrap());
    assert!(
        !ledger.remove_if("k-a", "s2").await.unwrap(),
        "second remove_if finds nothing"
    );
    assert!(ledger.scan(None, 10).await.unwrap().is_empty());

    // Pages: every row once, in byte order, limit honoured.
    let mut keys: Vec<String> = (0..25).map(|i| format!("p{i:03}")).collect();
    // Byte order: upper case before lower case, multi-byte UTF-8 after ASCII.
    keys.extend([
        "B".to_owned(),
        "a".to_owned(),
        "z\u{e9}".to_owned(),
        "zz".to_owned(),
    ]);
    let hostile = "'; DROP TABLE durability_allocations; -- \u{1F600}".to_owned();
    keys.push(hostile.clone());
    for (i, k) in keys.iter().enumerate() {
        ledger.record(k, &format!("s{}", i % 3)).await.unwrap();
    }
    let mut expected = keys.clone();
    expected.sort();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = ledger.scan(after.as_deref(), 7).await.unwrap();
        assert!(page.len() <= 7, "scan honours the limit");
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        for (k, s) in page {
            assert!(s.starts_with('s'), "shard round-trips: {s:?}");
            seen.push(k);
        }
    }
    assert_eq!(seen, expected, "scan pages every row once, in byte order");
    let from_b = ledger.scan(Some("B"), 1).await.unwrap();
    assert_eq!(from_b[0].0, expected[2], "`after` is exclusive");
    let between = ledger.scan(Some("p0105"), 2).await.unwrap();
    assert_eq!(
        between.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        vec!["p011", "p012"],
        "`after` need not be a stored key"
    );
    assert!(
        ledger
            .scan(Some(expected.last().unwrap()), 10)
            .await
            .unwrap()
            .is_empty(),
        "nothing after the last key"
    );
    let idx = keys.iter().position(|k| *k == hostile).unwrap();
    let shard = format!("s{}", idx % 3);
    assert!(ledger.remove_if(&hostile, &shard).await.unwrap());
    assert_eq!(
        ledger.scan(None, 100).await.unwrap().len(),
        keys.len() - 1,
        "a hostile key is data"
    );
}

/// The names of the [`Shard`] suite's cases ([`shard_suite`] is one case).
pub const SHARD_CASES: &[&str] = crate::shard_conformance!(@cases names);

/// Runs the [`Shard`] case `name` on `shard` (`table` must not exist yet).
///
/// # Panics
/// When the case fails, or when `name` is not in [`SHARD_CASES`].
pub async fn run_shard_case(name: &str, shard: &dyn Shard, table: &str) {
    match name {
        "shard_contract" => shard_suite(shard, table).await,
        other => panic!("no shard conformance case {other:?}"),
    }
}

/// The names of the [`MappingStore`] suite's cases ([`mapping_store_suite`]
/// is one case).
pub const MAPPING_STORE_CASES: &[&str] = crate::mapping_store_conformance!(@cases names);

/// Runs the [`MappingStore`] case `name` on `store`, under the key prefix
/// `prefix`.
///
/// # Panics
/// When the case fails, or when `name` is not in [`MAPPING_STORE_CASES`].
pub async fn run_mapping_store_case(name: &str, store: &dyn MappingStore, prefix: &str) {
    match name {
        "mapping_store_contract" => mapping_store_suite(store, prefix).await,
        other => panic!("no mapping store conformance case {other:?}"),
    }
}

/// Emits one `#[tokio::test]` per case of the [`Shard`](crate::Shard) suite
/// ([`conformance::SHARD_CASES`](crate::conformance::SHARD_CASES)), in a
/// module named `$module`. Each test awaits `$make` (an expression evaluated
/// in the test, inside the new module, which sees the caller's items through
/// `use super::*`) for an `Option` of a shard and a guard kept alive for the
/// case (`()` when there is none), returns when that is `None` (a server
/// that is not there), and otherwise runs the case with the table name
/// `$table`.
///
/// ```text
/// durability_migration::shard_conformance!(shard_conforms, "conf_t", async { Some((open_shard(), ())) });
/// ```
#[macro_export]
macro_rules! shard_conformance {
    (@cases $($then:tt)*) => {
        $crate::shard_conformance! { @$($then)* [shard_contract] }
    };
    (@names [$($case:ident)*]) => { &[$(stringify!($case)),*] };
    (@tests $module:ident ($table:expr, $make:expr) [$($case:ident)*]) => {
        $crate::conformance::async_suite! {
            $module, $crate::conformance::run_shard_case, ($table), $make, |_| async {}, [$($case)*]
        }
    };
    ($module:ident, $table:expr, $make:expr $(,)?) => {
        $crate::shard_conformance! { @cases tests $module ($table, $make) }
    };
}

/// Emits one `#[tokio::test]` per case of the
/// [`MappingStore`](crate::MappingStore) suite
/// ([`conformance::MAPPING_STORE_CASES`](crate::conformance::MAPPING_STORE_CASES)),
/// in a module named `$module`. Each test awaits `$make` (an expression
/// evaluated in the test, inside the new module, which sees the caller's
/// items through `use super::*`) for an `Option` of a store and a guard kept
/// alive for the case (`()` when there is none), returns when that is
/// `None`, and otherwise runs the case under the key prefix `$prefix`, then
/// awaits `$finish(&store)` when given (cleanup on a shared server).
///
/// ```text
/// durability_migration::mapping_store_conformance!(mapping_conforms, "c:", async { Some((open_store(), ())) });
/// ```
#[macro_export]
macro_rules! mapping_store_conformance {
    (@cases $($then:tt)*) => {
        $crate::mapping_store_conformance! { @$($then)* [mapping_store_contract] }
    };
    (@names [$($case:ident)*]) => { &[$(stringify!($case)),*] };
    (@tests $module:ident ($prefix:expr, $make:expr, $finish:expr) [$($case:ident)*]) => {
        $crate::conformance::async_suite! {
            $module, $crate::conformance::run_mapping_store_case, ($prefix), $make, $finish, [$($case)*]
        }
    };
    ($module:ident, $prefix:expr, $make:expr, finish = $finish:expr $(,)?) => {
        $crate::mapping_store_conformance! { @cases tests $module ($prefix, $make, $finish) }
    };
    ($module:ident, $prefix:expr, $make:expr $(,)?) => {
        $crate::mapping_store_conformance! { @cases tests $module ($prefix, $make, |_| async {}) }
    };
}
