//! Unit tests of the journal listing and the progress events, over a shard
//! that answers the journal's queries with stored rows (the SQL itself runs
//! against real databases in the CLI's and the backends' tests).

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use crate::*;

/// Answers a query whose SQL contains a needle with its rows (only while
/// the query's second parameter, the page cursor, is empty, or when it has
/// none), and every other query with no rows; records what it ran.
#[derive(Default)]
struct Canned {
    answers: Vec<(&'static str, Vec<Row>)>,
    ran: Mutex<Vec<Statement>>,
}

impl Canned {
    fn answer(&self, st: &Statement) -> Vec<Row> {
        let paged = st.sql.contains(" > ");
        let first_page = !paged || st.params.get(1) == Some(&Value::from(""));
        self.answers
            .iter()
            .find(|(needle, _)| st.sql.contains(needle))
            .filter(|_| first_page)
            .map(|(_, rows)| rows.clone())
            .unwrap_or_default()
    }
}

impl Shard for Canned {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
    fn batch_support(&self) -> BatchSupport {
        BatchSupport::Atomic
    }
    fn execute<'a>(&'a self, st: &'a Statement) -> BackendFuture<'a, u64> {
        self.ran.lock().unwrap().push(st.clone());
        Box::pin(async { Ok(1) })
    }
    fn query<'a>(&'a self, st: &'a Statement) -> BackendFuture<'a, Vec<Row>> {
        self.ran.lock().unwrap().push(st.clone());
        let rows = self.answer(st);
        Box::pin(async move { Ok(rows) })
    }
    fn batch<'a>(&'a self, sts: &'a [Statement]) -> BackendFuture<'a, Vec<u64>> {
        self.ran.lock().unwrap().extend(sts.iter().cloned());
        let n = sts.len();
        Box::pin(async move { Ok(vec![1; n]) })
    }
}

fn op_row(op_id: &str, key: &str, state: &str) -> Row {
    let finished = matches!(state, "retired" | "aborted");
    let mut r = row([
        ("op_id", Value::from(op_id)),
        ("scope", "default".into()),
        ("mkey", key.into()),
        ("tables", "users".into()),
        ("source", "east".into()),
        ("target", "west".into()),
        ("state", state.into()),
        ("attempts", 0i64.into()),
        ("digests", "users=abc".into()),
        ("owner", "mover-1".into()),
        ("live_until_ms", 5_000i64.into()),
        ("retain_ms", 0i64.into()),
        ("created_ms", 1_000i64.into()),
        ("updated_ms", 2_000i64.into()),
        ("purged", 0i64.into()),
        ("verified", 0i64.into()),
        ("error", Value::Null),
    ]);
    let t = if finished {
        Value::from(2_000i64)
    } else {
        Value::Null
    };
    r.insert("retire_at_ms".into(), t.clone());
    r.insert("finished_ms".into(), t);
    r
}

fn router(journal: Arc<Canned>) -> Router {
    Router::new(
        MigrationConfig::new(Arc::new(MemoryMappingStore::new()))
            .shard("east", journal)
            .journal_shard("east")
            .table("users")
            .clock(Arc::new(ManualClock::new(9_000))),
    )
    .unwrap()
}

#[tokio::test]
async fn status_counts_every_state_and_lists_a_bounded_page() {
    let journal = Arc::new(Canned {
        answers: vec![
            (
                "COUNT(*)",
                vec![
                    row([("state", Value::from("retired")), ("n", 5i64.into())]),
                    row([("state", Value::from("prepared")), ("n", 2i64.into())]),
                ],
            ),
            (
                "SELECT * FROM durability_migration_ops",
                vec![
                    op_row("op-1", "k1", "prepared"),
                    op_row("op-2", "k2", "retired"),
                ],
            ),
            (
                "FROM durability_migration_lease",
                vec![row([
                    ("holder", Value::from("cli:1")),
                    ("generation", 3i64.into()),
                    ("expires_ms", 8_000i64.into()),
                ])],
            ),
        ],
        ..Canned::default()
    });
    let r = router(journal.clone());
    let report = r
        .migration_status(&StatusOptions {
            limit: 1,
            ..StatusOptions::default()
        })
        .await
        .unwrap();
    assert_eq!((report.total, report.active), (7, 2));
    assert_eq!(report.counts.get("retired"), Some(&5));
    assert_eq!(report.counts.get("prepared"), Some(&2));
    assert_eq!(report.operations.len(), 1);
    assert_eq!(report.operations[0].op_id, "op-1");
    assert_eq!(report.operations[0].state, MoveState::Prepared);
    assert!(report.truncated, "two rows matched, one was listed");
    assert_eq!(report.now_ms, 9_000);
    assert_eq!(
        report.recovery_lease.as_ref().map(|l| l.generation),
        Some(3)
    );
    assert_eq!(report.last_clean_verify_ms, None);
    let ran = journal.ran.lock().unwrap();
    assert!(
        ran.iter().all(|s| s.sql.starts_with("SELECT")),
        "status only reads: {ran:?}"
    );
    let page = ran
        .iter()
        .find(|s| s.sql.contains("ORDER BY op_id"))
        .unwrap();
    assert!(
        page.sql.ends_with("LIMIT 2"),
        "one more than the limit: {}",
        page.sql
    );

    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["operations"][0]["state"], "prepared");
    assert_eq!(json["operations"][0]["key"], "k1");
    assert_eq!(json["counts"]["retired"], 5);
}

#[tokio::test]
async fn status_filters_by_state_and_key_and_refuses_a_bad_key_before_reading() {
    let journal = Arc::new(Canned {
        answers: vec![(
            "SELECT * FROM durability_migration_ops",
            vec![
                op_row("op-2", "k", "retired"),
                op_row("op-1", "k", "aborted"),
            ],
        )],
        ..Canned::default()
    });
    let r = router(journal.clone());
    let by_key = r
        .migration_status(&StatusOptions {
            key: Some("k".into()),
            state: Some(MoveState::Aborted),
            ..StatusOptions::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = by_key.operations.iter().map(|o| o.op_id.as_str()).collect();
    assert_eq!(ids, ["op-1"], "only the aborted one");
    assert!(!by_key.truncated);
    let by_state = journal
        .ran
        .lock()
        .unwrap()
        .iter()
        .any(|s| s.sql.contains("mkey = ") && s.params.contains(&Value::from("k")));
    assert!(by_state, "the key's operations were read by key");

    let one = r
        .migration_status(&StatusOptions {
            op_id: Some("op-2".into()),
            state: Some(MoveState::Retired),
            ..StatusOptions::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = one.operations.iter().map(|o| o.op_id.as_str()).collect();
    assert_eq!(
        ids,
        ["op-2"],
        "the state filter applies to what the id read"
    );
    assert!(
        journal
            .ran
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.sql.contains("WHERE op_id = ") && s.params == [Value::from("op-2")]),
        "the operation was read by id"
    );

    journal.ran.lock().unwrap().clear();
    let err = r
        .migration_status(&StatusOptions {
            key: Some(String::new()),
            ..StatusOptions::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_KEY");
    assert!(journal.ran.lock().unwrap().is_empty(), "nothing was read");
}

#[tokio::test]
async fn verify_reports_progress_per_page_of_each_phase() {
    let journal = Arc::new(Canned {
        answers: vec![(
            "claim IS NOT NULL AND state NOT IN",
            vec![
                op_row("op-1", "k1", "prepared"),
                op_row("op-2", "k2", "copied"),
            ],
        )],
        ..Canned::default()
    });
    let r = router(journal);
    let seen = Mutex::new(Vec::new());
    let report = r
        .verify_migrations_observed(VerifyOptions::default(), &|p| {
            seen.lock().unwrap().push(p);
        })
        .await
        .unwrap();
    assert_eq!(report.dangling_count, 2);
    assert_eq!(
        *seen.lock().unwrap(),
        [Progress {
            phase: "operations",
            done: 2,
            changed: 0
        }],
        "one page of active operations, nothing else stored"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["dangling_ops"][1], "op-2");
    assert!(
        json.get("unclean_keys").is_none(),
        "internal state stays out"
    );
}

#[tokio::test]
async fn a_dry_rebalance_reports_every_examined_key() {
    let mapping = Arc::new(MemoryMappingStore::new());
    for k in ["a", "b", "c", "d"] {
        mapping.put(k, "east").await.unwrap();
    }
    let r = Router::new(
        MigrationConfig::new(mapping)
            .shard("east", Arc::new(Canned::default()))
            .shard("west", Arc::new(Canned::default()))
            .table("users"),
    )
    .unwrap();
    let seen = Mutex::new(Vec::new());
    let report = r
        .rebalance_observed(
            RebalanceOptions {
                dry_run: true,
                page_size: 3,
                ..RebalanceOptions::default()
            },
            &|p| seen.lock().unwrap().push(p),
        )
        .await
        .unwrap();
    assert_eq!(report.examined, 4);
    let done: Vec<u64> = seen.lock().unwrap().iter().map(|p| p.done).collect();
    assert_eq!(done, [1, 2, 3, 4]);
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|p| p.phase == "keys" && p.changed == 0)
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["planned"], report.planned);
    assert_eq!(
        json["plan"].as_array().unwrap().len() as u64,
        report.planned
    );
}
