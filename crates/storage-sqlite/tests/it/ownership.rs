//! Integration tests of the SQLite owner lease store and the object storage
//! fence: the conformance suite, bad persisted state, cross-connection claims,
//! the fence, and a Jepsen-style lock-set test with and without fencing.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use durability_ownership::conformance::{self, Harness, RawState};
use durability_ownership::{
    ClaimOutcome, Clock, Generation, Lease, LeaseStore, LifecycleAdmin, LifecycleId, ManualClock,
    OwnerRecord, OwnerScope, Ownership, OwnershipSettings, PresenceGroup, Resolution, ShardCount,
    StorageId, TaskId,
};
use durability_storage_sqlite::ownership::{
    SqliteLeaseStore, check_generation, ensure_fence_schema, fenced_generation, record_generation,
};
use rusqlite::{Connection, params};

/// The store under test and the directory its file lives in.
struct Sqlite(
    SqliteLeaseStore<ManualClock>,
    #[allow(dead_code)] tempfile::TempDir,
);

impl Harness for Sqlite {
    type Store = SqliteLeaseStore<ManualClock>;

    fn store(&self) -> &Self::Store {
        &self.0
    }

    async fn expire_owner(&self, scope: &OwnerScope) {
        let now = self.0.clock().now_ms();
        self.0.with_connection(|c| {
            c.execute(
                "UPDATE durability_owner_leases SET expires_at_ms = ?2 WHERE scope = ?1",
                params![scope.host_id(), now],
            )
            .unwrap();
        });
    }

    async fn expire_presence(&self, group: &PresenceGroup, task: &TaskId) {
        let now = self.0.clock().now_ms();
        self.0.with_connection(|c| {
            c.execute(
                "UPDATE durability_presence SET expires_at_ms = ?3 WHERE grp = ?1 AND task = ?2",
                params![group.key(), task.as_str(), now],
            )
            .unwrap();
        });
    }

    async fn put_raw_owner(&self, scope: &OwnerScope, raw: &[u8]) {
        let exp = i64::try_from(self.0.clock().now_ms_u64() + conformance::TTL_MS).unwrap();
        self.0.with_connection(|c| {
            c.execute(
                "INSERT OR REPLACE INTO durability_owner_leases (scope, record, expires_at_ms) VALUES (?1, ?2, ?3)",
                params![scope.host_id(), raw, exp],
            )
            .unwrap();
        });
    }

    async fn raw_state(&self, scope: &OwnerScope) -> RawState {
        self.0.with_connection(|c| raw_state(c, scope))
    }
}

fn raw_state(c: &Connection, scope: &OwnerScope) -> RawState {
    let owner = c
        .query_row(
            "SELECT record FROM durability_owner_leases WHERE scope = ?1",
            [scope.host_id()],
            |r| r.get(0),
        )
        .ok();
    let generation = c
        .query_row(
            "SELECT generation FROM durability_owner_generations WHERE scope = ?1",
            [scope.host_id()],
            |r| r.get::<_, i64>(0),
        )
        .ok()
        .map(i64::cast_unsigned);
    RawState { owner, generation }
}

fn open(path: &Path, clock: &ManualClock) -> SqliteLeaseStore<ManualClock> {
    SqliteLeaseStore::open(path, clock.clone(), ShardCount::default()).unwrap()
}

fn scope(s: &str) -> OwnerScope {
    OwnerScope::parse(s, ShardCount::default()).unwrap()
}

type Store = SqliteLeaseStore<ManualClock>;

/// A lease store in a directory of its own (kept while the returned
/// directory lives) on a manual clock at 1,000 ms.
fn fresh() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("leases.db"), &ManualClock::new(1_000));
    (dir, store)
}

/// The lifecycle `lifecycle`, pointed at the storage id of the scope `sc`.
async fn pointed(store: &Store, lifecycle: &str, sc: &str) -> (LifecycleId, OwnerScope) {
    let (l, sc) = (LifecycleId::new(lifecycle).unwrap(), scope(sc));
    store
        .set_active_storage(&l, Some(sc.storage_id()))
        .await
        .unwrap();
    (l, sc)
}

/// The lease of a claim of `sc` by `t` for 10 s that must succeed.
async fn claimed(store: &Store, sc: &OwnerScope, l: &LifecycleId, t: &str) -> Lease {
    match store.claim(sc, l, &TaskId::new(t).unwrap(), 10_000).await {
        Ok(ClaimOutcome::Claimed(lease)) => lease,
        other => panic!("{t} does not claim {sc}: {other:?}"),
    }
}

fn gen_(g: u64) -> Generation {
    Generation::new(g).unwrap()
}

durability_ownership::ownership_conformance!(
    sqlite_store_passes_the_conformance_suite,
    "sqlite",
    async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir.path().join("leases.db"), &ManualClock::new(1_000));
        Some(Sqlite(store, dir))
    }
);

/// Snapshots remember decoded owner records by their bytes; a record's
/// bytes copied under another scope's row still fail closed there, and the
/// remembered record keeps serving its own scope.
#[tokio::test]
async fn a_remembered_owner_record_is_never_served_under_another_scope() {
    let (_dir, store) = fresh();
    let (l, a) = pointed(&store, "ns:w", "st1:Room:shard0").await;
    let b = scope("st1:Room:shard1");
    let lease = claimed(&store, &a, &l, "t").await;
    // Read twice: the second read is served from the remembered record.
    for _ in 0..2 {
        let snap = store.snapshot(&a, &l).await.unwrap();
        assert_eq!(snap.owner.unwrap().record, lease.record);
    }
    let raw = lease.record.encoded().as_bytes().to_vec();
    store.with_connection(|c| {
        c.execute(
            "INSERT INTO durability_owner_leases (scope, record, expires_at_ms) VALUES (?1, ?2, ?3)",
            params![b.host_id(), raw, 1_000_000_i64],
        )
        .unwrap();
    });
    let err = store.snapshot(&b, &l).await.unwrap_err();
    eprintln!("a record of shard0 read under shard1: {err}");
    assert!(
        !err.is_retryable(),
        "a misplaced record is corrupt, not busy: {err}"
    );
    let snap = store.snapshot(&a, &l).await.unwrap();
    assert_eq!(snap.owner.unwrap().record, lease.record);
}

#[tokio::test]
async fn two_connections_claim_one_scope_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000);
    let a = open(&dir.path().join("leases.db"), &clock);
    let b = open(&dir.path().join("leases.db"), &clock);
    let l = LifecycleId::new("ns:w").unwrap();
    let s = scope("st1:Room:shard0");
    a.set_active_storage(&l, Some(s.storage_id()))
        .await
        .unwrap();
    let ra = a
        .claim(&s, &l, &TaskId::new("a").unwrap(), 1000)
        .await
        .unwrap();
    let rb = b
        .claim(&s, &l, &TaskId::new("b").unwrap(), 1000)
        .await
        .unwrap();
    assert!(matches!(ra, ClaimOutcome::Claimed(_)));
    match rb {
        ClaimOutcome::Held(lease) => assert_eq!(lease.record.task().as_str(), "a"),
        ClaimOutcome::Claimed(_) => panic!("second connection claimed a held scope"),
    }
    clock.advance(1000);
    let rb = b
        .claim(&s, &l, &TaskId::new("b").unwrap(), 1000)
        .await
        .unwrap();
    match rb {
        ClaimOutcome::Claimed(lease) => assert_eq!(lease.record.generation().get(), 2),
        ClaimOutcome::Held(_) => panic!("expired lease must be claimable"),
    }
}

#[tokio::test]
async fn corrupt_persisted_state_fails_closed_and_writes_nothing() {
    let (_dir, store) = fresh();
    let (l, s) = pointed(&store, "ns:w", "st1:Room:shard0").await;
    let t = TaskId::new("a").unwrap();
    // A corrupt generation counter.
    store.with_connection(|c| {
        c.execute(
            "INSERT INTO durability_owner_generations VALUES (?1, -4)",
            [s.host_id()],
        )
        .unwrap();
    });
    let before = store.with_connection(|c| raw_state(c, &s));
    let e = store.claim(&s, &l, &t, 1000).await.unwrap_err();
    assert_eq!(e.code(), "invalid_lifecycle_state");
    assert_eq!(store.with_connection(|c| raw_state(c, &s)), before);
    // A corrupt storage pointer, then a corrupt delete lock.
    for (lifecycle, row, sc) in [
        ("ns:w2", "(?1, 'bad id!', NULL)", "st2:Room:shard0"),
        ("ns:w3", "(?1, 'st3', X'00')", "st3:Room:shard0"),
    ] {
        let l = LifecycleId::new(lifecycle).unwrap();
        store.with_connection(|c| {
            c.execute(
                &format!("INSERT INTO durability_owner_lifecycle VALUES {row}"),
                [l.as_str()],
            )
            .unwrap();
        });
        assert_eq!(
            store
                .claim(&scope(sc), &l, &t, 1000)
                .await
                .unwrap_err()
                .code(),
            "invalid_lifecycle_state",
            "{row}"
        );
    }
    let s3 = scope("st3:Room:shard0");
    assert_eq!(
        store.with_connection(|c| raw_state(c, &s3)),
        RawState {
            owner: None,
            generation: None
        }
    );
}

/// The record of task `t` holding `s` at generation `g` (lifecycle `ns:lockset`).
fn holder(s: &OwnerScope, t: &str, g: Generation) -> OwnerRecord {
    OwnerRecord::new(
        s.clone(),
        LifecycleId::new("ns:lockset").unwrap(),
        TaskId::new(t).unwrap(),
        g,
    )
}

fn rec(s: &OwnerScope, g: u64) -> OwnerRecord {
    holder(s, "t", gen_(g))
}

fn object_db(path: &Path) -> Connection {
    let c = Connection::open(path).unwrap();
    c.pragma_update(None, "journal_mode", "WAL").unwrap();
    c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    ensure_fence_schema(&c).unwrap();
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS lockset (seq INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT NULL,
         task TEXT NOT NULL, generation INTEGER NOT NULL, value INTEGER NOT NULL)",
    )
    .unwrap();
    c
}

#[test]
fn fence_rises_monotonically_and_refuses_older_generations() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = object_db(&dir.path().join("obj.db"));
    let s = scope("st1:Room:shard0");
    // Outside a transaction: refused, nothing written.
    assert_eq!(
        record_generation(&c, &rec(&s, 1)).unwrap_err().code(),
        "invalid_input"
    );
    assert_eq!(
        check_generation(&c, &rec(&s, 1)).unwrap_err().code(),
        "invalid_input"
    );
    assert_eq!(fenced_generation(&c, &s).unwrap(), None);
    let tx = c.transaction().unwrap();
    assert_eq!(
        check_generation(&tx, &rec(&s, 1)).unwrap_err().code(),
        "fence_not_recorded"
    );
    record_generation(&tx, &rec(&s, 2)).unwrap();
    record_generation(&tx, &rec(&s, 2)).unwrap();
    check_generation(&tx, &rec(&s, 2)).unwrap();
    tx.commit().unwrap();
    let tx = c.transaction().unwrap();
    let e = record_generation(&tx, &rec(&s, 1)).unwrap_err();
    assert_eq!(e.code(), "stale_generation");
    assert!(e.is_retryable());
    let e = check_generation(&tx, &rec(&s, 1)).unwrap_err();
    assert_eq!(e.code(), "stale_generation");
    assert_eq!(
        check_generation(&tx, &rec(&s, 3)).unwrap_err().code(),
        "fence_not_recorded"
    );
    record_generation(&tx, &rec(&s, 5)).unwrap();
    tx.commit().unwrap();
    assert_eq!(fenced_generation(&c, &s).unwrap(), Some(5));
    // A rolled-back record leaves the fence as it was.
    let tx = c.transaction().unwrap();
    record_generation(&tx, &rec(&s, 9)).unwrap();
    drop(tx);
    assert_eq!(fenced_generation(&c, &s).unwrap(), Some(5));
    // Fences of other scopes are independent.
    let other = scope("st1:Room:shard1");
    let tx = c.transaction().unwrap();
    record_generation(&tx, &rec(&other, 1)).unwrap();
    tx.commit().unwrap();
}

#[test]
fn a_takeover_between_check_and_commit_refuses_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("obj.db");
    let mut old = object_db(&path);
    let mut new = object_db(&path);
    let s = scope("st1:Room:shard0");
    let tx = old.transaction().unwrap();
    record_generation(&tx, &rec(&s, 1)).unwrap();
    tx.commit().unwrap();
    // The old owner checks its fence, then pauses before writing.
    let tx = old.transaction().unwrap();
    check_generation(&tx, &rec(&s, 1)).unwrap();
    // The new owner records its generation and commits meanwhile.
    let tx2 = new.transaction().unwrap();
    record_generation(&tx2, &rec(&s, 2)).unwrap();
    tx2.commit().unwrap();
    // The old owner's write cannot commit over the newer fence.
    let landed = tx
        .execute(
            "INSERT INTO lockset (scope, task, generation, value) VALUES (?1, 'old', 1, 1)",
            [s.host_id()],
        )
        .and_then(|_| tx.commit());
    assert!(
        landed.is_err(),
        "a commit that checked an older fence must be refused"
    );
    let rows: i64 = new
        .query_row("SELECT count(*) FROM lockset", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 0);
}

/// Deterministic xorshift64 so every schedule is reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

struct Paused {
    scope: OwnerScope,
    generation: Generation,
    value: i64,
}

#[derive(Default, Debug)]
struct History {
    claims: BTreeMap<String, Vec<u64>>,
    accepted: usize,
    refused_late: usize,
}

/// Appends through a fenced (or, with `fencing` off, unfenced) transaction.
fn fenced_append(
    conn: &mut Connection,
    recorded: &mut HashSet<(String, u64)>,
    scope: &OwnerScope,
    task: &str,
    generation: Generation,
    value: i64,
    fencing: bool,
) -> bool {
    let tx = conn.transaction().unwrap();
    if fencing {
        let key = (scope.to_string(), generation.get());
        let fenced = if recorded.contains(&key) {
            check_generation(&tx, &holder(scope, task, generation))
        } else {
            record_generation(&tx, &holder(scope, task, generation)).map(|()| {
                recorded.insert(key);
            })
        };
        if let Err(e) = fenced {
            assert_eq!(e.code(), "stale_generation", "unexpected fence error {e}");
            return false;
        }
    }
    tx.execute(
        "INSERT INTO lockset (scope, task, generation, value) VALUES (?1, ?2, ?3, ?4)",
        params![
            scope.host_id(),
            task,
            i64::try_from(generation.get()).unwrap(),
            value
        ],
    )
    .unwrap();
    tx.commit().is_ok()
}

/// Checks the lock-set history; returns the violations found.
fn check_history(conn: &Connection, history: &History) -> Vec<String> {
    let mut violations = Vec::new();
    for (scope, gens) in &history.claims {
        if gens.windows(2).any(|w| w[0] >= w[1]) {
            violations.push(format!(
                "{scope}: generations not strictly increasing: {gens:?}"
            ));
        }
    }
    let mut stmt = conn
        .prepare("SELECT seq, scope, task, generation FROM lockset ORDER BY seq")
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })
        .unwrap();
    let mut highest: HashMap<String, i64> = HashMap::new();
    for row in rows {
        let (seq, scope, task, generation) = row.unwrap();
        let top = highest.entry(scope.clone()).or_insert(generation);
        if generation < *top {
            violations.push(format!(
                "{scope}: write #{seq} by {task} at generation {generation} landed after generation {top} took over"
            ));
        }
        *top = (*top).max(generation);
    }
    violations
}

async fn lock_set_run(seed: u64, fencing: bool) -> (History, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let leases = dir.path().join("leases.db");
    let lifecycle = LifecycleId::new("ns:lockset").unwrap();
    let storage = StorageId::new("st1").unwrap();
    let settings = OwnershipSettings {
        owner_ttl_ms: 1000,
        lease_guard_ms: 100,
        ..OwnershipSettings::default()
    };
    let names = ["task-a", "task-b", "task-c"];
    let mut tasks = Vec::new();
    for name in names {
        // Every task has its own connections, as separate processes would.
        let store = open(&leases, &clock);
        store
            .set_active_storage(&lifecycle, Some(&storage))
            .await
            .unwrap();
        let o = Ownership::new(store, clock.clone(), TaskId::new(name).unwrap(), settings);
        tasks.push((
            o,
            object_db(&dir.path().join("obj.db")),
            None::<Paused>,
            HashSet::new(),
        ));
    }
    let scopes = [scope("st1:Room:shard0"), scope("st1:Room:shard1")];
    let mut rng = Rng(seed);
    let mut history = History::default();
    let mut value = 0_i64;
    let mut known: HashMap<String, u64> = HashMap::new();
    for _ in 0..400 {
        let i = usize::try_from(rng.next(3)).unwrap();
        let (o, conn, paused, recorded) = &mut tasks[i];
        match rng.next(10) {
            0..=5 if paused.is_none() => {
                let s = &scopes[usize::try_from(rng.next(2)).unwrap()];
                let Ok(Resolution::Local(g)) = o.resolve(s, &lifecycle).await else {
                    continue;
                };
                if known.get(s.host_id()) != Some(&g.get()) {
                    known.insert(s.to_string(), g.get());
                    history
                        .claims
                        .entry(s.to_string())
                        .or_default()
                        .push(g.get());
                }
                let Ok(permit) = o.admit(s, g).await else {
                    continue;
                };
                value += 1;
                if rng.next(3) == 0 {
                    // Paused after admission, before its commit (a GC or I/O stall).
                    *paused = Some(Paused {
                        scope: s.clone(),
                        generation: g,
                        value,
                    });
                } else if fenced_append(conn, recorded, s, names[i], g, value, fencing) {
                    history.accepted += 1;
                }
                drop(permit);
            }
            6 | 7 => {
                if let Some(p) = paused.take() {
                    if fenced_append(
                        conn,
                        recorded,
                        &p.scope,
                        names[i],
                        p.generation,
                        p.value,
                        fencing,
                    ) {
                        history.accepted += 1;
                    } else {
                        history.refused_late += 1;
                    }
                }
            }
            _ => clock.advance(rng.next(1500).cast_signed()),
        }
    }
    let violations = check_history(&tasks[0].1, &history);
    (history, violations)
}

#[tokio::test]
async fn lock_set_with_fencing_holds_and_without_fencing_is_caught() {
    let mut refused = 0;
    for seed in [0x9E37_79B9_7F4A_7C15_u64, 42, 7, 1234, 99_991] {
        let (h, violations) = lock_set_run(seed, true).await;
        assert!(
            violations.is_empty(),
            "seed {seed}: fenced run violated: {violations:?}"
        );
        assert!(
            h.accepted > 20,
            "seed {seed}: too few writes to mean anything: {h:?}"
        );
        assert!(
            h.claims.values().any(|g| g.len() > 2),
            "seed {seed}: no takeovers happened: {h:?}"
        );
        refused += h.refused_late;
        let (_, violations) = lock_set_run(seed, false).await;
        eprintln!(
            "seed {seed}: fenced: {} writes accepted, {} late writes refused, {} claims; unfenced: {} violations",
            h.accepted,
            h.refused_late,
            h.claims.values().map(Vec::len).sum::<usize>(),
            violations.len()
        );
        assert!(
            !violations.is_empty(),
            "seed {seed}: the checker missed late writes with fencing off"
        );
    }
    assert!(refused > 0, "the fence never had to refuse a paused holder");
}

#[test]
fn store_is_send_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<SqliteLeaseStore<ManualClock>>();
    check::<SqliteLeaseStore<durability_ownership::SystemClock>>();
}

/// The admission snapshot is answered from memory while the database is
/// unchanged; every kind of change made elsewhere shows at the next
/// snapshot: another connection's commit (another host process sharing
/// the file), this store's own writes, a raw write on its connection, and
/// time running the lease out.
#[tokio::test]
async fn a_remembered_snapshot_never_hides_a_commit_or_an_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let clock = ManualClock::new(1_000_000);
    let reader = open(&path, &clock);
    let other = open(&path, &clock);
    let l = LifecycleId::new("ns:w").unwrap();
    let sc = scope("st1:Room:shard3");
    reader
        .set_active_storage(&l, Some(&StorageId::new("st1").unwrap()))
        .await
        .unwrap();
    let empty = reader.snapshot(&sc, &l).await.unwrap();
    assert!(empty.owner.is_none());
    assert_eq!(reader.snapshot(&sc, &l).await.unwrap(), empty, "unchanged");

    // Another connection claims: the reader sees the owner at once.
    let lease = claimed(&other, &sc, &l, "b").await;
    let seen = reader.snapshot(&sc, &l).await.unwrap();
    assert_eq!(seen.owner.as_ref().map(|o| &o.record), Some(&lease.record));
    assert_eq!(seen.generation, 1);
    assert_eq!(seen.owner.as_ref().unwrap().remaining_ms, 10_000);

    // Time alone: the remembered lease runs down, then out.
    clock.advance(4_000);
    assert_eq!(
        reader
            .snapshot(&sc, &l)
            .await
            .unwrap()
            .owner
            .unwrap()
            .remaining_ms,
        6_000
    );
    clock.advance(6_000);
    assert!(reader.snapshot(&sc, &l).await.unwrap().owner.is_none());

    // The reader's own write (a claim), then the other's delete lock and
    // pointer move.
    let mine = claimed(&reader, &sc, &l, "a").await;
    let s = reader.snapshot(&sc, &l).await.unwrap();
    assert_eq!(s.owner.unwrap().record, mine.record);
    assert_eq!(s.generation, 2);
    other
        .set_delete_lock(&l, Some(durability_ownership::DeleteLock::Whole))
        .await
        .unwrap();
    assert_eq!(
        reader.snapshot(&sc, &l).await.unwrap().delete_lock,
        Some(durability_ownership::DeleteLock::Whole)
    );
    other.set_delete_lock(&l, None).await.unwrap();
    other
        .set_active_storage(&l, Some(&StorageId::new("st2").unwrap()))
        .await
        .unwrap();
    assert_eq!(
        reader
            .snapshot(&sc, &l)
            .await
            .unwrap()
            .active_storage
            .map(|s| s.as_str().to_owned()),
        Some("st2".to_owned())
    );

    // A raw write on the reader's own connection.
    reader.with_connection(|c| {
        c.execute(
            "UPDATE durability_owner_generations SET generation = 9 WHERE scope = ?1",
            [sc.host_id()],
        )
        .unwrap();
    });
    assert_eq!(reader.snapshot(&sc, &l).await.unwrap().generation, 9);
    // A raw write on another connection, as another process's tool would.
    let raw = Connection::open(&path).unwrap();
    raw.execute(
        "UPDATE durability_owner_generations SET generation = 11 WHERE scope = ?1",
        [sc.host_id()],
    )
    .unwrap();
    assert_eq!(reader.snapshot(&sc, &l).await.unwrap().generation, 11);
}

/// A stored shard count outside 1..=1024 fails its storage id closed
/// (claim, renew, snapshot, start-up check) and only that storage id.
#[tokio::test]
async fn a_corrupt_shard_count_fails_its_storage_id_closed_and_only_it() {
    let (_dir, store) = fresh();
    let t = TaskId::new("t").unwrap();
    for (i, bad) in [0_i64, -3, 1025, i64::MAX].into_iter().enumerate() {
        let (l, sc) = pointed(
            &store,
            &format!("ns:bad{i}"),
            &format!("bad{i}:Room:shard0"),
        )
        .await;
        store.with_connection(|c| {
            c.execute(
                "INSERT INTO durability_storage_shard_count (storage_id, shard_count) VALUES (?1, ?2)",
                params![sc.storage_id().as_str(), bad],
            )
            .unwrap();
        });
        let before = store.with_connection(|c| raw_state(c, &sc));
        let e = store.claim(&sc, &l, &t, 10_000).await.unwrap_err();
        assert_eq!(e.code(), "invalid_lifecycle_state", "{bad}: {e}");
        let e = store.snapshot(&sc, &l).await.unwrap_err();
        assert_eq!(e.code(), "invalid_lifecycle_state", "{bad}: {e}");
        let e = store.record_shard_count(&sc, &l).await.unwrap_err();
        assert_eq!(e.code(), "invalid_lifecycle_state", "{bad}: {e}");
        assert_eq!(
            store.with_connection(|c| raw_state(c, &sc)),
            before,
            "{bad}"
        );
    }
    // A healthy storage id next to them is claimed and renewed.
    let (l, sc) = pointed(&store, "ns:good", "good:Room:shard0").await;
    let lease = claimed(&store, &sc, &l, "t").await;
    store.renew(&lease.record, 10_000).await.unwrap();
    assert_eq!(
        store.snapshot(&sc, &l).await.unwrap().shard_count,
        Some(ShardCount::default())
    );
}

/// Admission and renewal compare the recorded shard count too: a count
/// that differs from the owned scope's (here rewritten under the owner, as
/// an operator or an older host could) refuses new work at once.
#[tokio::test]
async fn admission_and_renewal_refuse_a_scope_of_another_shard_count() {
    let (_dir, store) = fresh();
    let (l, sc) = pointed(&store, "ns:admit", "st1:Room:shard3").await;
    let clock = store.clock().clone();
    let o = Ownership::new(
        store,
        clock.clone(),
        TaskId::new("a").unwrap(),
        OwnershipSettings::default(),
    );
    let Resolution::Local(g) = o.resolve(&sc, &l).await.unwrap() else {
        panic!("claimed")
    };
    drop(o.admit_checked(&sc, g).await.unwrap());
    o.store().with_connection(|c| {
        c.execute(
            "UPDATE durability_storage_shard_count SET shard_count = 8 WHERE storage_id = 'st1'",
            [],
        )
        .unwrap();
    });
    let e = o.admit_checked(&sc, g).await.unwrap_err();
    assert_eq!(e.code(), "shard_count_mismatch", "{e}");
    assert!(!e.is_retryable());
    let owner = o.store().snapshot(&sc, &l).await.unwrap().owner.unwrap();
    let e = o.store().renew(&owner.record, 10_000).await.unwrap_err();
    assert_eq!(e.code(), "shard_count_mismatch", "{e}");
}
