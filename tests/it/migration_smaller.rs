//! Regression tests of the review's smaller items (issue 13, item 15), on
//! SQLite, PostgreSQL and MariaDB shards. Without a server a test prints
//! that it skipped, unless `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::shards::{Env, Kind, env};
use durability_migration::conformance::FaultMode;
use durability_migration::conformance::harness::{BeforeWrite, HookedShard};
use durability_migration::{
    BackendError, BoxFuture, MoveState, Router, Row, Shard, Statement, Value, VerifyOptions, row,
};

use Kind::{MySql, Postgres, Sqlite};

const SAME: [[Kind; 2]; 3] = [[Sqlite, Sqlite], [Postgres, Postgres], [MySql, MySql]];

fn user(name: &str, n: i64) -> Row {
    row([("name", Value::from(name)), ("n", Value::from(n))])
}

/// A text column's bytes (MariaDB keys are `VARBINARY`, read as bytes).
fn bytes(v: Option<&Value>) -> &[u8] {
    match v {
        Some(Value::Text(t)) => t.as_bytes(),
        Some(Value::Blob(b)) => b,
        other => panic!("not text: {other:?}"),
    }
}

/// A router over `e` whose shard `name` is `shard` instead.
async fn router_replacing(e: &Env, name: &str, shard: Arc<dyn Shard>) -> Router {
    let r = Router::new(e.config(false, 30_000).shard(name, shard)).unwrap();
    r.init().await.unwrap();
    r
}

fn is_copy(stmts: &[Statement]) -> bool {
    stmts
        .iter()
        .any(|s| s.sql.starts_with("INSERT INTO durability_retired"))
}

/// On the first copy batch to the destination, the recovery that runs it
/// stalls past its lease: meanwhile another router's recovery takes over,
/// finishes the move, and the application deletes the key (acknowledged).
/// Then the stalled batch runs.
struct StaleCopy {
    e: OnceLock<Arc<Env>>,
    other: OnceLock<Arc<Router>>,
    fired: AtomicBool,
    seen: Mutex<Vec<String>>,
}

impl BeforeWrite for StaleCopy {
    fn before_write<'a>(
        &'a self,
        _inner: &'a Arc<dyn Shard>,
        stmts: &'a [Statement],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            if !is_copy(stmts) || self.fired.swap(true, Ordering::SeqCst) {
                return Ok(());
            }
            let e = self.e.get().ok_or("no env")?;
            let b = self.other.get().ok_or("no router")?;
            // The stalled recovery's lease (60 s) and its claim on the
            // operation (30 s) both lapse.
            e.clock.advance(61_000);
            let rep = b.recover_migrations().await.map_err(|e| e.to_string())?;
            let deleted = b.delete("u1", "users").await.map_err(|e| e.to_string())?;
            self.seen
                .lock()
                .unwrap()
                .push(format!("committed {:?}, deleted {deleted}", rep.committed));
            Ok(())
        })
    }
}

/// The seed's undetectable case: a stale destination insert (the copy of a
/// recovery that stalled past its lease) lands after the new lease holder
/// committed the move and an acknowledged delete removed the key. The key's
/// row is back on the destination, under the stale copy's in-flight marker,
/// and verification reports nothing. The stalled recovery ends with
/// `RECOVERY_FENCED` (its next journal write is refused), which is the only
/// trace. This pins that behaviour; see ARCHITECTURE.md (`crates/migration`,
/// "the undetectable case").
#[tokio::test]
async fn stale_copy_after_commit_and_acknowledged_delete_is_not_detected() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { continue };
        let e = Arc::new(e);
        let r = e.router().await;
        e.mapping.put("u1", "s0").await.unwrap();
        r.insert("u1", "users", user("ann", 1)).await.unwrap();
        // The move crashes before its copy (write 2): journaled `prepared`.
        e.interrupt_move("u1", "s1", "users", 2, FaultMode::Before)
            .await;
        let hook = StaleCopy {
            e: OnceLock::new(),
            other: OnceLock::new(),
            fired: AtomicBool::new(false),
            seen: Mutex::new(Vec::new()),
        };
        let hooked = Arc::new(HookedShard::new(Arc::clone(e.shard("s1")), hook));
        let a = router_replacing(&e, "s1", hooked.clone()).await;
        let _ = hooked.hook.e.set(Arc::clone(&e));
        let _ = hooked.hook.other.set(Arc::new(e.router().await));
        let err = a.recover_migrations().await.unwrap_err();
        assert_eq!(err.code(), "RECOVERY_FENCED", "{kinds:?}: {err}");
        assert!(hooked.hook.fired.load(Ordering::SeqCst), "{kinds:?}");
        let seen = hooked.hook.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{kinds:?}: {seen:?}");
        assert!(seen[0].ends_with("deleted 1"), "{kinds:?}: {seen:?}");
        let op = r
            .get_migration_status("u1", "users")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(op.state, MoveState::Retired, "{kinds:?}: the move finished");
        // The deleted row is back, on the destination only.
        let live = e.live("users", "id", "u1").await;
        assert_eq!(live.len(), 1, "{kinds:?}: {live:?}");
        assert_eq!(live[0].0, "s1", "{kinds:?}");
        assert_eq!(
            live[0].1.get("name"),
            Some(&Value::from("ann")),
            "{kinds:?}"
        );
        let fresh = e.router().await;
        // Reads return the deleted row (the marker's own cutover tombstone
        // on the source leads to it); writes are held by the stale marker.
        let got = fresh.get("u1", "users").await.unwrap().unwrap();
        assert_eq!(got.get("name"), Some(&Value::from("ann")), "{kinds:?}");
        for res in [
            fresh.update("u1", "users", user("x", 2)).await,
            fresh.insert("u1", "users", user("x", 2)).await,
            fresh.delete("u1", "users").await,
        ] {
            assert_eq!(
                res.unwrap_err().code(),
                "MIGRATION_CUTOVER_PENDING",
                "{kinds:?}"
            );
        }
        // Nothing reports it: verification is clean, recovery finds nothing.
        let rep = fresh
            .verify_migrations(VerifyOptions::default())
            .await
            .unwrap();
        assert!(rep.clean, "{kinds:?}: {rep:?}");
        let rep = fresh.recover_migrations().await.unwrap();
        assert!(rep.examined.is_empty(), "{kinds:?}: {rep:?}");
        // The operator's way out (ARCHITECTURE.md): the in-flight markers of
        // finished operations name the key; the application's record says it
        // was deleted; delete the row and the marker on that shard.
        let markers = fresh
            .raw_query(
                "s1",
                &Statement::new(
                    "SELECT mkey, op_id FROM durability_retired WHERE digest = 'in-flight'",
                ),
            )
            .await
            .unwrap();
        assert_eq!(markers.len(), 1, "{kinds:?}: {markers:?}");
        assert_eq!(bytes(markers[0].get("mkey")), b"u1", "{kinds:?}");
        assert_eq!(
            bytes(markers[0].get("op_id")),
            op.op_id.as_bytes(),
            "{kinds:?}: the marker names the finished operation"
        );
        let d = e.shard("s1").dialect();
        let id = durability_migration::Ident::new("id").unwrap();
        let users = durability_migration::Ident::new("users").unwrap();
        assert_eq!(
            fresh
                .raw_execute("s1", &d.delete_key(&users, &id, "u1"))
                .await
                .unwrap(),
            1
        );
        let mut clear = durability_migration::Sql::new(&d);
        clear
            .raw("DELETE FROM durability_retired WHERE mkey = ")
            .bind("u1")
            .raw(" AND op_id = ")
            .bind(op.op_id.as_str())
            .raw(" AND digest = 'in-flight'");
        assert_eq!(fresh.raw_execute("s1", &clear.finish()).await.unwrap(), 1);
        assert_eq!(fresh.get("u1", "users").await.unwrap(), None, "{kinds:?}");
        assert_eq!(
            fresh.insert("u1", "users", user("new", 3)).await.unwrap(),
            1,
            "{kinds:?}: writes land again"
        );
    }
}
