//! Schema name grammar, without a server; a cancelled call's connection,
//! with one.
#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn schema_names_follow_the_grammar() {
    for ok in ["a", "_x", "tenant_42", "durability", &"a".repeat(63)] {
        assert_eq!(
            SchemaName::new(ok).map(|s| s.quoted()),
            Ok(format!("\"{ok}\""))
        );
    }
    let refused = [
        ("", "must not be empty"),
        (&*"a".repeat(64), "must be at most 63 bytes"),
        ("x; DROP TABLE t", "allowed characters are [a-z0-9_]"),
        ("a\"b", "allowed characters are [a-z0-9_]"),
        ("Upper", "allowed characters are [a-z0-9_]"),
        ("émoji", "allowed characters are [a-z0-9_]"),
        ("a-b", "allowed characters are [a-z0-9_]"),
        ("a\0b", "allowed characters are [a-z0-9_]"),
        ("1abc", "must not start with a digit"),
        ("pg_catalog", "names starting with pg_ are reserved"),
    ];
    for (raw, reason) in refused {
        let e = SchemaName::new(raw).expect_err(raw);
        assert_eq!(e.reason, reason, "{raw:?}");
    }
}

/// The pid of the server session a one-connection client hands out next.
async fn session(client: &StoreClient) -> i32 {
    let rows = client
        .query(Access::Read, "SELECT pg_backend_pid()", &[])
        .await
        .map_err(|e| format!("{e:?}"))
        .unwrap();
    rows[0].get(0)
}

#[tokio::test]
async fn a_call_dropped_before_its_reply_closes_its_connection() {
    // Skips (or panics, when services are required) without a server.
    let Some(_schema) = crate::testkit::TestSchema::create().await else {
        return;
    };
    let url = crate::testkit::url();
    let (other, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(conn);
    let client = StoreClient::new(url.parse().unwrap(), 1).unwrap();
    let first = session(&client).await;
    // Hold an advisory lock the pool's statement will wait for.
    // Unique per test process (nextest runs each test in its own).
    let key = 0x5354_4f52_0000_0000_i64 | i64::from(std::process::id());
    other
        .execute("SELECT pg_advisory_lock($1)", &[&key])
        .await
        .unwrap();
    let params: [&(dyn ToSql + Sync); 1] = [&key];
    let mut call = Box::pin(client.query(Access::Write, "SELECT pg_advisory_lock($1)", &params));
    // Drive the call until the server shows the statement waiting (polling
    // the server, for at most about 30 s).
    let mut waited = false;
    for _ in 0..3_000 {
        assert!(futures::poll!(call.as_mut()).is_pending());
        let waiting: i64 = other
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
                &[&first],
            )
            .await
            .unwrap()
            .get(0);
        if waiting == 1 {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(waited, "the statement never waited for the lock");
    // The caller's own deadline drops the call mid-statement.
    drop(call);
    let next = session(&client).await;
    assert_ne!(next, first, "the cancelled connection was handed out again");
    other
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await
        .unwrap();
}
