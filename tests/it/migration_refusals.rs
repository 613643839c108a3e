//! Definite refusals stay definite (issue 13 items 8 and 11), on SQLite,
//! PostgreSQL and MariaDB shards: a copy the destination server refuses for
//! its data aborts the move with `MIGRATION_COPY_REJECTED` (it was
//! `SHARD_UNAVAILABLE`, outcome unknown, and the operation stayed `prepared`
//! for good), and a routed write (or `migrate_record`'s copy) a shard
//! refuses for its data is `ROW_REJECTED` (it was `SHARD_UNAVAILABLE`). Without a server a test
//! prints that it skipped, unless `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use crate::shards::{Kind, clean_verify, env, op_of, router_with_user};
use durability_migration::{
    MigrateOptions, MigrationError, MoveState, Router, Row, Statement, Value, row,
};

use Kind::{MySql, Postgres, Sqlite};

/// A row of `users`: `name` (or none) and `n`.
fn user(name: Option<&str>, n: i64) -> Row {
    match name {
        Some(name) => row([("name", Value::from(name)), ("n", Value::from(n))]),
        None => row([("n", Value::from(n))]),
    }
}

async fn ddl(r: &Router, shard: &str, sql: &str) {
    r.raw_execute(shard, &Statement::new(sql)).await.unwrap();
}

/// Item 8 on the server dialects: the destination's `users` differs from
/// the source's (a NOT NULL, a shorter type, a narrower integer, a CHECK),
/// so the server refuses the copy. The move aborts with a definite, typed
/// error naming the table (and the column when the server's error does),
/// the key stays on its source, writable, and verification is clean.
#[tokio::test]
async fn a_copy_a_server_refuses_for_its_data_aborts_the_move() {
    let cases: [(Kind, &str, Row, Option<&str>); 7] = [
        (
            Postgres,
            "ALTER TABLE users ALTER COLUMN name SET NOT NULL",
            user(None, 1),
            Some("name"),
        ),
        (
            Postgres,
            "ALTER TABLE users ALTER COLUMN name TYPE varchar(3)",
            user(Some("too long"), 1),
            None,
        ),
        (
            Postgres,
            "ALTER TABLE users ALTER COLUMN n TYPE integer",
            user(Some("a"), 1 << 40),
            None,
        ),
        (
            MySql,
            "ALTER TABLE users MODIFY name LONGTEXT NOT NULL",
            user(None, 1),
            Some("name"),
        ),
        (
            MySql,
            "ALTER TABLE users MODIFY name VARCHAR(3)",
            user(Some("too long"), 1),
            Some("name"),
        ),
        (
            MySql,
            "ALTER TABLE users MODIFY n INT",
            user(Some("a"), 1 << 40),
            Some("n"),
        ),
        (
            MySql,
            "ALTER TABLE users ADD CONSTRAINT n_small CHECK (n < 100)",
            user(Some("a"), 1000),
            None,
        ),
    ];
    for (kind, alter, data, column) in cases {
        let Some(e) = env(&[Sqlite, kind, Sqlite]).await else {
            return;
        };
        let r = router_with_user(&e, "u1", "s0", data).await;
        ddl(&r, "s1", alter).await;
        // The unjournaled copy is refused the same way, definitely.
        let err = r
            .migrate_record("s0", "s1", "u1", "users", MigrateOptions::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), "ROW_REJECTED", "{alter}: {err}");
        assert!(!err.is_outcome_unknown(), "{err}");
        let err = r.reassign_shard("u1", "s1", "users").await.unwrap_err();
        assert_eq!(err.code(), "MIGRATION_COPY_REJECTED", "{alter}: {err}");
        assert!(!err.is_retryable() && !err.is_outcome_unknown(), "{err}");
        match &err {
            MigrationError::CopyRejected {
                table,
                column: got,
                shard,
                ..
            } => assert_eq!(
                (table.as_str(), got.as_deref(), shard.as_str()),
                ("users", column, "s1"),
                "{alter}: {err}"
            ),
            other => panic!("{other:?}"),
        }
        let op = op_of(&r, "u1", "users").await;
        assert_eq!(op.state, MoveState::Aborted, "{alter}: {op:?}");
        let live = e.live("users", "id", "u1").await;
        assert_eq!(live.len(), 1, "{alter}: {live:?}");
        assert_eq!(live[0].0, "s0", "{alter}");
        clean_verify(&r).await;
        // The key stays writable and moves elsewhere.
        assert_eq!(
            r.update("u1", "users", user(Some("b"), 2)).await.unwrap(),
            1
        );
        assert_eq!(
            r.reassign_shard("u1", "s2", "users").await.unwrap().target,
            "s2"
        );
    }
}

/// Item 11's rule for every definite refusal: a routed insert or update the
/// shard refuses for its data (a CHECK constraint on PostgreSQL and
/// MariaDB, a trigger's `RAISE(ABORT)` on SQLite, a NOT NULL column left
/// out) is `ROW_REJECTED`, neither retryable nor of unknown outcome, and
/// nothing was written.
#[tokio::test]
async fn a_routed_write_a_shard_refuses_for_its_data_is_row_rejected() {
    for kind in [Sqlite, Postgres, MySql] {
        let Some(e) = env(&[kind, kind]).await else {
            return;
        };
        let r = e.router().await;
        let alters: &[&str] = match kind {
            Sqlite => &[
                "CREATE TRIGGER users_n_insert BEFORE INSERT ON users WHEN NEW.n < 0 \
                 BEGIN SELECT RAISE(ABORT, 'n must not be negative'); END",
                "CREATE TRIGGER users_n_update BEFORE UPDATE ON users WHEN NEW.n < 0 \
                 BEGIN SELECT RAISE(ABORT, 'n must not be negative'); END",
            ],
            Postgres => &[
                "ALTER TABLE users ADD CONSTRAINT n_nonneg CHECK (n >= 0)",
                "ALTER TABLE users ALTER COLUMN name SET NOT NULL",
            ],
            MySql => &[
                "ALTER TABLE users ADD CONSTRAINT n_nonneg CHECK (n >= 0)",
                "ALTER TABLE users MODIFY name LONGTEXT NOT NULL",
            ],
        };
        for sql in alters {
            ddl(&r, "s0", sql).await;
        }
        e.mapping.put("u1", "s0").await.unwrap();
        let rejected = |err: MigrationError, column: Option<&str>| {
            assert_eq!(err.code(), "ROW_REJECTED", "{kind:?}: {err}");
            assert!(!err.is_retryable() && !err.is_outcome_unknown(), "{err}");
            match &err {
                MigrationError::RowRejected {
                    key,
                    shard,
                    table,
                    column: got,
                    ..
                } => assert_eq!(
                    (key.as_str(), shard.as_str(), table.as_str(), got.as_deref()),
                    ("u1", "s0", "users", column),
                    "{kind:?}: {err}"
                ),
                other => panic!("{other:?}"),
            }
        };
        let err = r
            .insert("u1", "users", user(Some("a"), -1))
            .await
            .unwrap_err();
        rejected(err, None);
        assert_eq!(r.get("u1", "users").await.unwrap(), None, "{kind:?}");
        r.insert("u1", "users", user(Some("a"), 1)).await.unwrap();
        let err = r
            .update("u1", "users", user(Some("b"), -5))
            .await
            .unwrap_err();
        rejected(err, None);
        let got = r.get("u1", "users").await.unwrap().unwrap();
        assert_eq!(
            (got.get("name"), got.get("n")),
            (Some(&Value::from("a")), Some(&Value::Integer(1))),
            "{kind:?}"
        );
        if kind != Sqlite {
            // A NOT NULL column left out: the server names it.
            e.mapping.put("u2", "s0").await.unwrap();
            let err = r.insert("u2", "users", user(None, 1)).await.unwrap_err();
            let MigrationError::RowRejected { key, .. } = &err else {
                panic!("{kind:?}: {err:?}");
            };
            assert_eq!(key, "u2");
            assert_eq!(
                match &err {
                    MigrationError::RowRejected { column, .. } => column.as_deref(),
                    _ => None,
                },
                Some("name"),
                "{kind:?}: {err}"
            );
            assert_eq!(r.get("u2", "users").await.unwrap(), None, "{kind:?}");
        }
    }
}
