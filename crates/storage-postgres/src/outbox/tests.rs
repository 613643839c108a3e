//! Names, the printed schema and error codes, without a server.

#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn names_outside_the_grammar_are_refused_before_any_sql() {
    for bad in [
        "",
        "Public",
        "a-b",
        "x\"; DROP TABLE t; --",
        "a b",
        "1abc",
        "pg_catalog",
        "schéma",
        "a\0",
        &"a".repeat(MAX_NAME_BYTES + 1),
    ] {
        let e = PgOutbox::new(bad).unwrap_err();
        assert_eq!(e.code(), "PG_OUTBOX_INVALID_NAME", "{bad:?}");
        assert!(!e.is_retryable());
        let e = PgOutbox::with_table("ok", bad).unwrap_err();
        assert_eq!(e.code(), "PG_OUTBOX_INVALID_NAME", "{bad:?}");
    }
    let longest = "a".repeat(MAX_NAME_BYTES);
    assert!(PgOutbox::with_table(&longest, &longest).is_ok());
}

#[test]
fn the_printed_schema_quotes_every_name_and_is_idempotent() {
    let outbox = PgOutbox::with_table("app", "events").unwrap();
    let sql = outbox.schema_sql();
    assert!(sql.contains("CREATE SCHEMA IF NOT EXISTS \"app\";"));
    assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"app\".\"events\" ("));
    assert!(sql.contains("CREATE SEQUENCE IF NOT EXISTS \"app\".\"events_version\""));
    assert!(sql.contains("\"app\".\"events_quarantine\""));
    assert!(sql.contains("MAXVALUE 9007199254740991 NO CYCLE"));
    let creates = sql.matches("CREATE ").count();
    assert_eq!(creates, sql.matches(" IF NOT EXISTS ").count(), "{sql}");
    assert_eq!(outbox.notify_channel(), "app.events");
}

#[test]
fn error_codes_are_unique() {
    let mut codes = PgOutboxError::CODES.to_vec();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), PgOutboxError::CODES.len());
}
