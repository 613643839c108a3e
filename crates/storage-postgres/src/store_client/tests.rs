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
    let client = StoreClient::new(url.parse().unwrap(), 1, "test store").unwrap();
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

#[test]
fn servers_are_named_as_host_and_port_never_with_the_credentials() {
    let named = |url: &str| servers(&url.parse().unwrap());
    assert_eq!(
        named("postgres://u:pw@db.example:6543/d"),
        "db.example:6543"
    );
    assert_eq!(named("postgres://u@10.0.0.5/d"), "10.0.0.5:5432");
    assert_eq!(
        named("postgres://u:pw@a:5432,b:5433/d?target_session_attrs=read-write"),
        "a:5432,b:5433"
    );
    assert_eq!(named("postgres://u@a,b:6000/d"), "a:5432,b:6000");
    assert_eq!(
        named("host=/run/postgresql port=5433 user=u password=pw"),
        "/run/postgresql/.s.PGSQL.5433"
    );
    assert_eq!(named("postgres://u@[::1]:7000/d"), "[::1]:7000");
}

/// An error and its sources, `: `-separated.
#[cfg(feature = "alarms")]
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// An address nothing listens on (the port of a listener just closed).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[cfg(feature = "ownership")]
#[tokio::test]
async fn a_lease_store_error_names_the_server_address_and_not_the_password() {
    use durability_ownership::{
        ClassName, LeaseStore as _, LifecycleId, ObjectName, OwnerScope, ShardCount, StorageId,
    };
    let (p, q) = (closed_port(), closed_port());
    let url = format!("postgres://durable:hunter2@127.0.0.1:{p},127.0.0.1:{q}/db");
    let store =
        crate::ownership::PostgresLeaseStore::connect(&url, "leases", ShardCount::default())
            .unwrap()
            .with_timeout(Duration::from_secs(5));
    let scope = OwnerScope::for_object(
        StorageId::new("st1").unwrap(),
        ClassName::new("C").unwrap(),
        &ObjectName::new("x"),
        ShardCount::default(),
    )
    .unwrap();
    let e = store
        .snapshot(&scope, &LifecycleId::new("ns:app").unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "the PostgreSQL lease store at 127.0.0.1:{p},127.0.0.1:{q}: "
        )),
        "{e}"
    );
    assert!(!e.contains("hunter2") && !e.contains("durable"), "{e}");
}

#[cfg(feature = "alarms")]
#[tokio::test]
async fn an_alarm_index_error_names_the_server_address_and_not_the_password() {
    use durability_alarms::AlarmIndex as _;
    let p = closed_port();
    let url = format!("postgres://durable:hunter2@127.0.0.1:{p}/db");
    let index = crate::alarms::PostgresAlarmIndex::connect(&url, "alarms", Default::default())
        .unwrap()
        .with_timeout(Duration::from_secs(5));
    let e = chain(&index.next_due().await.unwrap_err());
    assert!(
        e.contains(&format!("the PostgreSQL alarm index at 127.0.0.1:{p}: ")),
        "{e}"
    );
    assert!(!e.contains("hunter2") && !e.contains("durable"), "{e}");
    let e = chain(&index.setup().await.unwrap_err());
    assert!(
        e.contains(&format!("the PostgreSQL alarm index at 127.0.0.1:{p}: ")),
        "{e}"
    );
}
