//! Unit tests: error codes, dialect generation, validation, the in-memory
//! mapping store.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::*;

fn all_errors() -> Vec<MigrationError> {
    let s = || "x".to_owned();
    vec![
        MigrationError::InvalidJournalShard(s()),
        MigrationError::JournalNotConfigured,
        MigrationError::InvalidConfig(s()),
        MigrationError::CutoverPending { key: s() },
        MigrationError::LookupUnavailable {
            key: s(),
            reason: s(),
        },
        MigrationError::ChainExceeded { key: s() },
        MigrationError::UnsupportedDialect {
            shard: s(),
            dialect: s(),
        },
        MigrationError::NoBatch(s()),
        MigrationError::NoAtomicBatch(s()),
        MigrationError::MappingNotFound(s()),
        MigrationError::RecoveryInProgress(s()),
        MigrationError::RecoveryFenced(s()),
        MigrationError::DestinationConflict(s()),
        MigrationError::RetentionNotElapsed(s()),
        MigrationError::NotVerified(s()),
        MigrationError::UnknownShard(s()),
        MigrationError::UnknownTable(s()),
        MigrationError::UnknownKeyColumn {
            table: s(),
            column: s(),
        },
        MigrationError::UnknownColumn {
            table: s(),
            column: s(),
        },
        MigrationError::InvalidIdentifier(s()),
        MigrationError::InvalidKey(s()),
        MigrationError::AlreadyActive(s()),
        MigrationError::SameShard {
            key: s(),
            shard: s(),
        },
        MigrationError::RowNotFound(s()),
        MigrationError::Aborted {
            key: s(),
            reason: s(),
        },
        MigrationError::TakenOver(s()),
        MigrationError::ShardUnavailable {
            shard: s(),
            source: "e".into(),
        },
        MigrationError::MappingUnavailable("e".into()),
        MigrationError::Corrupt(s()),
        MigrationError::TooManyEpochs(9),
        MigrationError::PlacementConflict(5),
        MigrationError::PlacementUnverified("e".into()),
        MigrationError::StaleTopology {
            shard: s(),
            fence: 2,
            generation: 1,
        },
        MigrationError::WriteUnresolved {
            key: s(),
            shard: s(),
            source: "e".into(),
        },
        MigrationError::PruneRefused(s()),
        MigrationError::ReconcileVerifyRequired,
        MigrationError::CoordinatorNotConfigured,
        MigrationError::CoordinatorUnavailable("e".into()),
        MigrationError::PartialMove {
            key: s(),
            tables: vec![s()],
        },
        MigrationError::DuplicateKey {
            key: s(),
            table: s(),
        },
        MigrationError::KeyColumnNotBytewise {
            table: s(),
            column: s(),
            collation: s(),
            fix: s(),
        },
        MigrationError::CopyRejected {
            key: s(),
            shard: s(),
            table: s(),
            column: Some(s()),
            reason: s(),
        },
        MigrationError::RowRejected {
            key: s(),
            shard: s(),
            table: s(),
            column: None,
            reason: s(),
        },
        MigrationError::OperationNotFound(s()),
        MigrationError::NotAbortable {
            op_id: s(),
            state: s(),
        },
    ]
}

#[test]
fn error_codes_are_unique_and_listed() {
    let codes: Vec<&str> = all_errors().iter().map(MigrationError::code).collect();
    let unique: BTreeSet<&str> = codes.iter().copied().collect();
    assert_eq!(unique.len(), codes.len(), "codes are unique");
    assert_eq!(
        codes,
        MigrationError::CODES,
        "CODES lists every variant in order"
    );
    for c in [
        "INVALID_JOURNAL_SHARD",
        "JOURNAL_NOT_CONFIGURED",
        "MIGRATION_CUTOVER_PENDING",
        "MIGRATION_LOOKUP_UNAVAILABLE",
        "MIGRATION_CHAIN_EXCEEDED",
        "MIGRATION_UNSUPPORTED_DIALECT",
        "MIGRATION_NO_BATCH",
        "MIGRATION_NO_ATOMIC_BATCH",
        "MAPPING_NOT_FOUND",
        "RECOVERY_IN_PROGRESS",
        "RECOVERY_FENCED",
        "DESTINATION_CONFLICT",
        "RETENTION_NOT_ELAPSED",
        "NOT_VERIFIED",
        "TOO_MANY_EPOCHS",
        "PLACEMENT_CONFLICT",
        "PLACEMENT_UNVERIFIED",
        "STALE_TOPOLOGY",
        "WRITE_UNRESOLVED",
        "PRUNE_REFUSED",
        "RECONCILE_VERIFY_REQUIRED",
        "COORDINATOR_NOT_CONFIGURED",
    ] {
        assert!(unique.contains(c), "seed code {c} exists");
    }
    assert!(MigrationError::CutoverPending { key: "k".into() }.is_retryable());
    assert!(!MigrationError::JournalNotConfigured.is_retryable());
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<MigrationError>();
    send_sync::<Router>();
}

#[test]
fn identifiers_are_validated_and_quoted() {
    for bad in [
        "",
        "1abc",
        "a b",
        "a\"b",
        "a;drop",
        "durability_ops",
        "é",
        &"a".repeat(64),
    ] {
        assert_eq!(
            Ident::new(bad).unwrap_err().code(),
            "INVALID_IDENTIFIER",
            "{bad:?}"
        );
    }
    let i = Ident::new("users_2").unwrap();
    assert_eq!(Dialect::Sqlite.quote(&i), "\"users_2\"");
    assert_eq!(Dialect::Postgres.quote(&i), "\"users_2\"");
    assert_eq!(Dialect::MySql.quote(&i), "`users_2`");
}

#[test]
fn statements_bind_values_per_dialect() {
    let t = Ident::new("users").unwrap();
    let k = Ident::new("org_id").unwrap();
    let st = Dialect::Postgres.select_row(&t, &k, "a'b");
    assert_eq!(
        st.sql,
        "SELECT * FROM \"users\" WHERE \"org_id\" = $1 AND CAST(\"org_id\" AS TEXT) COLLATE \"C\" \
         IS NOT DISTINCT FROM CAST(COALESCE($2, \"org_id\") AS TEXT) COLLATE \"C\""
    );
    assert_eq!(st.params, vec![Value::from("a'b"), Value::from("a'b")]);
    let st = Dialect::MySql.select_row(&t, &k, "x");
    assert_eq!(
        st.sql,
        "SELECT * FROM `users` WHERE `org_id` = ? AND CAST(`org_id` AS BINARY) <=> CAST(? AS BINARY)"
    );
    let st = Dialect::Sqlite.select_row(&t, &k, "x");
    assert_eq!(st.sql, "SELECT * FROM \"users\" WHERE \"org_id\" = ?1");
    let cols = vec![(Ident::new("a").unwrap(), Value::Null)];
    let st = Dialect::Postgres.delete_matching(&t, &k, "x", &cols);
    assert!(
        st.sql
            .starts_with("DELETE FROM \"users\" WHERE \"org_id\" = $1 AND CAST(")
            && st.sql.ends_with(" AND \"a\" IS NOT DISTINCT FROM $3"),
        "{}",
        st.sql
    );
    let st = Dialect::MySql.delete_matching(&t, &k, "x", &cols);
    assert!(st.sql.contains("`a` <=> ?"), "{}", st.sql);
    let st = Dialect::Sqlite.fenced_insert(&t, "x", &cols, Some(&k));
    assert!(st.sql.contains("ON CONFLICT (\"org_id\")"), "{}", st.sql);
    let st = Dialect::MySql.fenced_insert(&t, "x", &cols, Some(&k));
    assert!(
        st.sql.contains("FROM DUAL WHERE NOT EXISTS") && st.sql.contains("ON DUPLICATE KEY UPDATE"),
        "{}",
        st.sql
    );
    for d in [Dialect::Sqlite, Dialect::Postgres, Dialect::MySql] {
        assert!(d.is_proven());
        for st in d.journal_schema().iter().chain(d.retired_schema().iter()) {
            assert!(st.params.is_empty());
        }
    }
    assert!(!Dialect::Other("oracle".into()).is_proven());
}

#[test]
fn rows_encode_canonically() {
    let r = row([("b", Value::from(2i64)), ("a", Value::from("x"))]);
    let bytes = encode_row(&r);
    assert_eq!(decode_row(&bytes).unwrap(), r);
    assert_eq!(digest(Some(&r)), digest(Some(&r.clone())));
    assert_ne!(digest(Some(&r)), digest(None));
    assert_eq!(decode_row(&[9, 1, 2]).unwrap_err().code(), "CORRUPT_RECORD");
    assert_eq!(decode_row(&[]).unwrap_err().code(), "CORRUPT_RECORD");
}

struct NoShard(Dialect, BatchSupport);
impl Shard for NoShard {
    fn dialect(&self) -> Dialect {
        self.0.clone()
    }
    fn batch_support(&self) -> BatchSupport {
        self.1
    }
    fn execute<'a>(&'a self, _: &'a Statement) -> BackendFuture<'a, u64> {
        Box::pin(async { Err("no".into()) })
    }
    fn query<'a>(&'a self, _: &'a Statement) -> BackendFuture<'a, Vec<Row>> {
        Box::pin(async { Err("no".into()) })
    }
    fn batch<'a>(&'a self, _: &'a [Statement]) -> BackendFuture<'a, Vec<u64>> {
        Box::pin(async { Err("no".into()) })
    }
}

fn shard(d: Dialect, b: BatchSupport) -> Arc<dyn Shard> {
    Arc::new(NoShard(d, b))
}

#[test]
fn config_validation() {
    let m: Arc<dyn MappingStore> = Arc::new(MemoryMappingStore::new());
    let two = || {
        MigrationConfig::new(Arc::clone(&m))
            .shard("db-east", shard(Dialect::Sqlite, BatchSupport::Atomic))
            .shard("db-west", shard(Dialect::Sqlite, BatchSupport::Atomic))
    };
    let e = Router::new(two().journal_shard("nope")).unwrap_err();
    assert_eq!(e.code(), "INVALID_JOURNAL_SHARD");
    let r = Router::new(two()).unwrap();
    assert_eq!(r.journal_scope(), "default");
    let e = Router::new(MigrationConfig::new(Arc::clone(&m))).unwrap_err();
    assert_eq!(e.code(), "INVALID_CONFIG");
    let e = Router::new(two().shard("bad name", shard(Dialect::Sqlite, BatchSupport::Atomic)))
        .unwrap_err();
    assert_eq!(e.code(), "INVALID_CONFIG");
    let e = Router::new(two().mapping_cache_ttl_ms(MAX_MAPPING_CACHE_TTL_MS + 1)).unwrap_err();
    assert_eq!(e.code(), "INVALID_CONFIG");
    let e = Router::new(two().table("users; drop")).unwrap_err();
    assert_eq!(e.code(), "INVALID_IDENTIFIER");
    let e = Router::new(two().table_with_key_column("users", "id\"")).unwrap_err();
    assert_eq!(e.code(), "INVALID_IDENTIFIER");
}

#[tokio::test]
async fn journal_not_configured_and_capabilities() {
    let m: Arc<dyn MappingStore> = Arc::new(MemoryMappingStore::new());
    m.put("k", "a").await.unwrap();
    // `k` on `a`, moved to `b`; the journal on `a` when named.
    let move_code = async |b: Arc<dyn Shard>, journal: Option<&str>| {
        let mut config = MigrationConfig::new(Arc::clone(&m))
            .shard("a", shard(Dialect::Sqlite, BatchSupport::Atomic))
            .shard("b", b)
            .table("users");
        if let Some(j) = journal {
            config = config.journal_shard(j);
        }
        let r = Router::new(config).unwrap();
        let e = r.reassign_shard("k", "b", "users").await.unwrap_err();
        (r, e.code())
    };
    let (r, code) = move_code(shard(Dialect::Sqlite, BatchSupport::Atomic), None).await;
    assert_eq!(code, "JOURNAL_NOT_CONFIGURED");
    assert_eq!(
        r.recover_migrations().await.unwrap_err().code(),
        "JOURNAL_NOT_CONFIGURED"
    );
    let e = r.rebalance(RebalanceOptions::default()).await.unwrap_err();
    assert_eq!(e.code(), "JOURNAL_NOT_CONFIGURED");
    for (b, code) in [
        (
            shard(Dialect::Other("oracle".into()), BatchSupport::Atomic),
            "MIGRATION_UNSUPPORTED_DIALECT",
        ),
        (
            shard(Dialect::Sqlite, BatchSupport::None),
            "MIGRATION_NO_BATCH",
        ),
        (
            shard(Dialect::Sqlite, BatchSupport::NonAtomic),
            "MIGRATION_NO_ATOMIC_BATCH",
        ),
    ] {
        assert_eq!(move_code(b, Some("a")).await.1, code);
    }
}

#[tokio::test]
async fn memory_mapping_store_conforms() {
    let m = MemoryMappingStore::new();
    conformance::mapping_store_suite(&m, "t:").await;
}

#[test]
fn hash_placement_is_stable() {
    let a = hash_owner("user-1", &["b", "a"]);
    assert_eq!(
        a,
        hash_owner("user-1", &["a", "b"]),
        "order of names does not matter"
    );
    assert_eq!(hash_owner("x", &[]), None);
    assert_eq!(
        validate_key(&"k".repeat(MAX_KEY_BYTES + 1))
            .unwrap_err()
            .code(),
        "INVALID_KEY"
    );
    assert_eq!(validate_key("").unwrap_err().code(), "INVALID_KEY");
}

#[test]
fn depends_on_no_database_client() {
    let manifest = include_str!("../Cargo.toml");
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .unwrap();
    for forbidden in ["rusqlite", "redis", "postgres", "sqlx", "mysql"] {
        assert!(
            !deps.contains(forbidden),
            "durability-migration must not depend on {forbidden}"
        );
    }
}

#[allow(dead_code)]
fn public_futures_are_send(r: &Router) {
    fn send<T: Send>(_: T) {}
    send(r.reassign_shard("k", "s", "t"));
    send(r.reassign_keys("k", "s", &["t"]));
    send(r.recover_migrations());
    send(r.verify_migrations(VerifyOptions::default()));
    send(r.purge_retired());
    send(r.rebalance(RebalanceOptions::default()));
    send(r.get("k", "t"));
    send(r.update("k", "t", Row::new()));
    send(r.migrate_record("a", "b", "k", "t", MigrateOptions::default()));
}

#[test]
fn an_epoch_owner_is_the_hash_owner_of_its_shard_set() {
    let e = Epoch {
        number: 1,
        shards: vec!["a".into(), "b".into(), "c".into()],
        algorithm: Algorithm::Hash,
    };
    for i in 0..500 {
        let k = format!("key-{i}");
        assert_eq!(e.owner(&k), hash_owner(&k, &["c", "a", "b"]), "{k}");
    }
    let empty = Epoch {
        shards: Vec::new(),
        ..e
    };
    assert_eq!(empty.owner("k"), None);
}

/// Compile-time check: `f` can be handed to `tokio::spawn` (`Send` and
/// `'static`).
fn spawnable<F: Future + Send + 'static>(f: F) {
    drop(f);
}

/// Every public future of the crate is `Send + 'static` when it owns its
/// inputs (a router behind an `Arc`, owned arguments): the function only
/// compiles when each one is (never run: building the futures is the check).
#[allow(dead_code, clippy::too_many_lines)]
fn public_futures_are_spawnable(r0: Arc<Router>, st0: Statement, row0: Row) {
    macro_rules! spawn {
        ($r:ident, $st:ident, $row:ident => $e:expr) => {{
            let $r = Arc::clone(&r0);
            let $st = st0.clone();
            let $row = row0.clone();
            spawnable(async move {
                let _ = (&$r, &$st, &$row);
                let _ = $e.await;
            });
        }};
    }
    spawn!(r, st, row => r.init());
    spawn!(r, st, row => r.route("k"));
    spawn!(r, st, row => r.get("k", "t"));
    spawn!(r, st, row => r.get_with("k", "t", ReadOptions::default()));
    spawn!(r, st, row => r.insert("k", "t", row.clone()));
    spawn!(r, st, row => r.upsert("k", "t", row.clone()));
    spawn!(r, st, row => r.update("k", "t", row.clone()));
    spawn!(r, st, row => r.delete("k", "t"));
    spawn!(r, st, row => r.raw_execute("s", &st));
    spawn!(r, st, row => r.raw_query("s", &st));
    spawn!(r, st, row => r.reassign_shard("k", "s", "t"));
    spawn!(r, st, row => r.reassign_shard_with("k", "s", "t", MoveOptions::default()));
    spawn!(r, st, row => r.reassign_keys("k", "s", &["t"]));
    spawn!(r, st, row => r.reassign_keys_with("k", "s", &["t"], MoveOptions::default()));
    spawn!(r, st, row => r.get_migration_status("k", "t"));
    spawn!(r, st, row => r.recover_migrations());
    spawn!(r, st, row => r.verify_migrations(VerifyOptions::default()));
    spawn!(r, st, row => r.purge_retired());
    spawn!(r, st, row => r.abort_operation("op"));
    spawn!(r, st, row => r.rebalance(RebalanceOptions::default()));
    spawn!(r, st, row => r.reconcile_allocations(&ReconcileOptions::default()));
    spawn!(r, st, row => r.migrate_record("a", "b", "k", "t", MigrateOptions::default()));
    spawn!(r, st, row => r.manifest_from_journal());
    spawn!(r, st, row => r.manifest());
    spawn!(r, st, row => r.fence("s"));
    spawn!(r, st, row => r.add_epoch(&["s"]));
    spawn!(r, st, row => r.prune_epochs(PruneOptions::default()));
    spawnable(async move {
        let shard = conformance::FaultShard::new(
            Arc::new(conformance::FaultShard::new(
                Arc::new(NoShard(Dialect::Sqlite, BatchSupport::Atomic)),
                conformance::FaultPlan::new(),
            )),
            conformance::FaultPlan::new(),
        );
        let _ = ShardMappingStore::new(shard).await;
    });
}

#[test]
fn public_futures_are_send_and_static() {
    // The assertions are in `public_futures_are_spawnable`, checked when
    // this test compiles; naming it keeps it compiled.
    let f: fn(Arc<Router>, Statement, Row) = public_futures_are_spawnable;
    assert!(!std::ptr::fn_addr_eq(
        f,
        (|_, _, _| {}) as fn(Arc<Router>, Statement, Row)
    ));
}

/// An unclean pass remembers the keys it found something on for purge, up
/// to `MAX_UNCLEAN_KEYS` distinct keys; past that it remembers none (and is
/// not recorded), so a pass's memory stays bounded.
#[test]
fn an_unclean_pass_remembers_a_bounded_set_of_keys() {
    let mut rep = VerifyReport::default();
    for i in 0..verify::MAX_UNCLEAN_KEYS {
        rep.flag(&format!("k{i}"));
        rep.flag(&format!("k{i}"));
    }
    assert_eq!(
        rep.unclean_keys.as_ref().map(BTreeSet::len),
        Some(verify::MAX_UNCLEAN_KEYS)
    );
    rep.flag("k0");
    assert!(rep.unclean_keys.is_some(), "a known key adds nothing");
    rep.flag("one-more");
    assert!(rep.unclean_keys.is_none());
    rep.flag("k1");
    assert!(rep.unclean_keys.is_none());
}
