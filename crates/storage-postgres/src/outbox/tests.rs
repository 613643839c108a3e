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
    assert!(sql.contains("CREATE OR REPLACE FUNCTION \"app\".\"events_stage\"("));
    assert!(sql.contains("CREATE OR REPLACE FUNCTION \"app\".\"events_stage_one\"("));
    // Idempotent: every object is created only if missing, or replaced.
    let creates = sql.matches("CREATE ").count();
    let idempotent =
        sql.matches(" IF NOT EXISTS ").count() + sql.matches("CREATE OR REPLACE ").count();
    assert_eq!(creates, idempotent, "{sql}");
    assert_eq!(outbox.notify_channel(), "app.events");
}

#[test]
fn error_codes_are_unique() {
    let mut codes = PgOutboxError::CODES.to_vec();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), PgOutboxError::CODES.len());
}

async fn connect() -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(&crate::testkit::url(), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn a_connection_lost_at_commit_is_unknown_and_a_refused_commit_is_definite() {
    let Some(_schema) = crate::testkit::TestSchema::create().await else {
        return;
    };
    let mut c = connect().await;
    let pid: i32 = c
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let tx = c.transaction().await.unwrap();
    tx.execute("SELECT 1", &[]).await.unwrap();
    let killer = connect().await;
    killer
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let e = PgOutboxError::commit(tx.commit().await.unwrap_err());
    assert!(e.is_outcome_unknown(), "{e}");
    assert!(e.is_retryable());
    assert_eq!(e.code(), "PG_OUTBOX_OUTCOME_UNKNOWN");

    let mut c = connect().await;
    c.batch_execute("CREATE TEMP TABLE u (x int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
        .await
        .unwrap();
    let tx = c.transaction().await.unwrap();
    tx.batch_execute("INSERT INTO u VALUES (1); INSERT INTO u VALUES (1)")
        .await
        .unwrap();
    let e = PgOutboxError::commit(tx.commit().await.unwrap_err());
    assert_eq!(
        e.code(),
        "PG_OUTBOX_REJECTED",
        "a constraint at commit is definite: {e}"
    );
    assert!(!e.is_outcome_unknown());
}

/// Public futures are `Send`, so they run on a multi-threaded runtime.
#[allow(dead_code)]
fn futures_are_send(
    outbox: &PgOutbox,
    tx: &tokio_postgres::Transaction<'_>,
    deliverer: &PgDeliverer<String, NoSink>,
    client: &mut tokio_postgres::Client,
) {
    fn send<F: Send>(_: F) {}
    send(outbox.stage(tx, "c", "k", &String::new()));
    send(outbox.setup(client));
    send(deliverer.deliver_due());
    send(deliverer.run(std::future::pending()));
    send(deliverer.len());
}

struct NoSink;

impl durability_outbox::Sink<String> for NoSink {
    async fn publish(
        &self,
        _batch: &[durability_outbox::Entry<String>],
    ) -> Result<(), durability_outbox::SinkError> {
        Ok(())
    }
}

/// An outbox in a schema of its own whose channel `drain` holds 10,000
/// analysed rows `key-1` … `key-10000`, row `i` due at the SQL expression
/// `due` (of `i`).
async fn drain_table(
    due: &str,
) -> Option<(crate::testkit::TestSchema, tokio_postgres::Client, PgOutbox)> {
    let schema = crate::testkit::TestSchema::create().await?;
    let mut c = connect().await;
    let outbox = PgOutbox::new(schema.name()).unwrap();
    outbox.setup(&mut c).await.unwrap();
    let t = format!("{}.outbox", schema.name());
    c.batch_execute(&format!(
        "INSERT INTO {t} SELECT 'drain', 'key-' || i, '\\x01', i, 0, {due}, NULL \
         FROM generate_series(1, 10000) AS i; ANALYZE {t}"
    ))
    .await
    .unwrap();
    Some((schema, c, outbox))
}

/// The lines of the plan an `EXPLAIN` (the last statement of `sql`) printed.
async fn plan(client: &tokio_postgres::Client, sql: &str) -> String {
    let lines: Vec<String> = client
        .simple_query(sql)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .collect();
    lines.join("\n")
}

/// The claim's read is bounded by the due time in the index: with 50 rows
/// due among 10,000 (the rest in flight or waiting for a retry), it reads
/// the 50 and finds no corrupt row past 2^53-1, filtering nothing. (A scan
/// with an `OR` of both conditions was bounded by the channel only and
/// filtered out the 9,950 rows not due, on every claim of a short batch.)
#[tokio::test]
async fn the_claim_reads_only_due_rows_through_the_index() {
    let due = "CASE WHEN i <= 50 THEN 1000 ELSE 99999999 END";
    let Some((_schema, c, outbox)) = drain_table(due).await else {
        return;
    };
    // The deliverer prepares the statement once per connection: the
    // server may plan it for any parameters (a generic plan) or for the
    // ones given (a custom plan); both must be bounded.
    c.batch_execute(&format!(
        "PREPARE due(text, bigint, bigint) AS {}",
        outbox.sql.due
    ))
    .await
    .unwrap();
    for mode in ["force_generic_plan", "force_custom_plan"] {
        let plan = plan(
            &c,
            &format!(
                "SET plan_cache_mode = {mode}; \
                 EXPLAIN (ANALYZE, COSTS OFF) EXECUTE due('drain', 5000, 100)"
            ),
        )
        .await;
        assert!(!plan.contains("Rows Removed by Filter"), "{mode}: {plan}");
        assert!(
            plan.contains("due_at <= "),
            "{mode}: bounded by the due time: {plan}"
        );
    }
    let rows = c
        .query(&outbox.sql.due, &[&"drain", &5_000_i64, &100_i64])
        .await
        .unwrap();
    assert_eq!(rows.len(), 50, "exactly the due rows");
}

/// The deliverer's sessions plan every statement generically, so a
/// claim's and a settlement's batch of keys is looked up in the primary
/// key from the first batch on: a custom plan (the server's choice for the
/// first five runs on a connection) hashes the batch and reads the whole
/// channel to join it.
#[tokio::test]
async fn claims_and_settlements_look_keys_up_in_the_primary_key() {
    let Some((_schema, _c, outbox)) = drain_table("1000").await else {
        return;
    };
    let config = crate::testkit::url().parse().unwrap();
    let deliverer = PgDeliverer::new(
        &outbox,
        config,
        1,
        durability_outbox::ChannelConfig::new("drain"),
        NoSink,
    )
    .unwrap();
    let session = deliverer.pool.get().await.unwrap();
    let mode: String = session
        .query_one("SHOW plan_cache_mode", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mode, "force_generic_plan");
    let sql = &outbox.sql;
    // A batch of 100, as literal arrays (EXECUTE takes no subquery).
    let list = |f: fn(i32) -> String| (1..=100).map(f).collect::<Vec<_>>().join(",");
    let keys = format!("'{{{}}}'", list(|i| format!("key-{i}")));
    let numbers = format!("'{{{}}}'", list(|i| i.to_string()));
    for (name, types, statement, args) in [
        (
            "claim",
            "text, bigint, text[], int[]",
            &sql.claim,
            format!("'drain', 5, {keys}, {numbers}"),
        ),
        (
            "remove_if",
            "text, text[], bigint[], int[]",
            &sql.remove_if,
            format!("'drain', {keys}, {numbers}, {numbers}"),
        ),
        (
            "reschedule_if",
            "text, text[], bigint[], int[], bigint[]",
            &sql.reschedule_if,
            format!("'drain', {keys}, {numbers}, {numbers}, {numbers}"),
        ),
    ] {
        session
            .batch_execute(&format!("PREPARE {name}({types}) AS {statement}"))
            .await
            .unwrap();
        let plan = plan(
            &session,
            &format!("EXPLAIN (COSTS OFF) EXECUTE {name}({args})"),
        )
        .await;
        assert!(
            plan.contains("Index Scan using outbox_pkey"),
            "{name}: {plan}"
        );
        assert!(!plan.contains("Seq Scan"), "{name}: {plan}");
    }
}
