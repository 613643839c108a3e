//! Rolling deploys: a host binary older than an object's stored schema
//! refuses to open that object with a typed error and changes nothing, so
//! hosts can be replaced one by one (a newer host keeps serving it).

use durability_host::HostError;

use crate::support::{STORAGE, World, incr};

/// The object file of `Counter` `name` (the SQLite store's layout).
fn object_file(w: &World, name: &str) -> std::path::PathBuf {
    w.root()
        .join(STORAGE)
        .join("Counter")
        .join(format!("{name}.sqlite"))
}

fn stored(w: &World, name: &str) -> (i64, i64) {
    let conn = rusqlite::Connection::open(object_file(w, name)).unwrap();
    let version = conn
        .query_row(
            "SELECT version FROM durability_schema WHERE capability = 'alarms'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let n = conn
        .query_row("SELECT n FROM counter", [], |r| r.get(0))
        .unwrap();
    (version, n)
}

#[tokio::test]
async fn a_host_older_than_an_objects_stored_schema_refuses_it_and_changes_nothing() {
    let w = World::new();
    let a = w.host("host-a").await;
    assert_eq!(incr(&a, "c1").await.unwrap(), 1);
    a.shutdown().await;

    // A newer host binary migrated the object's alarm rows one step past
    // what this code knows.
    let (version, _) = stored(&w, "c1");
    rusqlite::Connection::open(object_file(&w, "c1"))
        .unwrap()
        .execute(
            "UPDATE durability_schema SET version = version + 1 WHERE capability = 'alarms'",
            [],
        )
        .unwrap();

    // The older binary refuses to open it: a typed error naming the
    // schema, never old code on newer data.
    let b = w.host("host-b").await;
    let err = incr(&b, "c1").await.unwrap_err();
    let chain = {
        let mut text = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(e) = source {
            text.push_str(" / ");
            text.push_str(&e.to_string());
            source = e.source();
        }
        text
    };
    assert!(
        chain.contains("newer than"),
        "the refusal names the stored schema as newer: {chain}"
    );
    assert_eq!(err.code(), "host_schema_ahead", "{err}");
    assert!(
        matches!(
            &err,
            HostError::SchemaAhead { capability, stored: 2, latest: 1 } if capability == "alarms"
        ),
        "{err:?}"
    );
    assert!(
        !err.is_retryable(),
        "retrying the same binary cannot help: {err}"
    );
    assert!(
        !matches!(err, HostError::Handler(_)),
        "refused before the call body ran: {err}"
    );
    // Nothing changed: the stored schema is still the newer one and the
    // counter was not incremented.
    assert_eq!(stored(&w, "c1"), (version + 1, 1));
    b.shutdown().await;
}
