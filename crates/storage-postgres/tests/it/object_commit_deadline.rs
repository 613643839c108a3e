//! The commit deadline (`PostgresObjectOptions::commit_timeout`) on a
//! private cluster whose `synchronous_standby_names` names a standby that
//! does not exist, so every `COMMIT` waits for it forever: each transaction
//! comes back `Unknown` (never a definite failure, never success), its
//! connection is closed rather than reused (with a pool of one, a reused
//! connection would queue the next transaction behind the waiting
//! `COMMIT`), the server's sessions keep waiting with their rows
//! invisible (no cancel is sent), and once the setting is cleared the
//! waiting commits land and new transactions commit again.

use std::time::Duration;

use durability_scheduler::{Storage, StorageError, StorageErrorKind};
use durability_storage_postgres::object::{PostgresObjectOptions, PostgresObjects};
use durability_storage_postgres::testkit::cluster::Cluster;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// How many sessions wait for synchronous replication, and the items of
/// objects `one` and `two` another session sees.
fn server_view(cluster: &Cluster) -> (i64, [Vec<i64>; 2]) {
    runtime().block_on(async {
        let waiting = cluster.sync_rep_waiters().await;
        let (c, conn) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut items: [Vec<i64>; 2] = Default::default();
        for (name, out) in ["one", "two"].into_iter().zip(items.iter_mut()) {
            let seq: i64 = c
                .query_one(
                    "SELECT seq FROM deadline_test.durability_objects WHERE id = $1",
                    &[&name],
                )
                .await
                .unwrap()
                .get(0);
            for r in c
                .query(
                    &format!("SELECT n FROM deadline_test_o{seq}.items ORDER BY n"),
                    &[],
                )
                .await
                .unwrap()
            {
                out.push(r.get(0));
            }
        }
        (waiting, items)
    })
}

#[test]
fn a_commit_past_its_deadline_is_unknown_and_its_connection_is_not_reused() {
    let rt = runtime();
    let Some(mut cluster) = Cluster::init("commit-deadline") else {
        return;
    };
    rt.block_on(cluster.start());
    let options = PostgresObjectOptions {
        pool_size: 1,
        commit_timeout: Duration::from_millis(500),
        ..PostgresObjectOptions::default()
    };
    let objects = PostgresObjects::connect(&cluster.url(), "deadline_test", options).unwrap();
    let one = objects.open("one").unwrap();
    let two = objects.open("two").unwrap();
    for s in [&one, &two] {
        s.transaction(|tx| {
            tx.sql().batch_execute(
                "CREATE TABLE items (n BIGINT PRIMARY KEY); INSERT INTO items VALUES (0)",
            )
        })
        .unwrap();
    }
    rt.block_on(cluster.set_synchronous_standby_names("nobody"));
    let add = |s: &durability_storage_postgres::object::PostgresObjectStorage, n: i64| {
        s.transaction(|tx| {
            tx.sql()
                .execute("INSERT INTO items (n) VALUES ($1)", &[&n])
                .map(|_| ())
        })
    };
    // The reload reaches the session asynchronously: until it does, a
    // commit still returns at once; the first to wait gives up.
    let mut n = 1;
    let first: StorageError = loop {
        match add(&one, n) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 10_000, "no commit ever waited for the standby");
    };
    assert_eq!(first.kind(), StorageErrorKind::Unknown, "{first}");
    assert!(first.to_string().contains("within 500 ms"), "{first}");
    // One connection in the pool: had the first been returned, this
    // transaction would queue behind its waiting COMMIT, forever.
    let second = add(&two, 1).unwrap_err();
    assert_eq!(second.kind(), StorageErrorKind::Unknown, "{second}");
    let (waiting, [seen_one, seen_two]) = server_view(&cluster);
    eprintln!(
        "tried: synchronous_standby_names naming no standby, commit deadline 500 ms, pool of 1: \
         {} commit(s) before the reload reached the session, then two unknown outcomes; \
         {waiting} server sessions waiting in SyncRep; rows visible {seen_one:?} {seen_two:?}",
        n - 1
    );
    assert_eq!(waiting, 2, "both sessions still wait: no cancel was sent");
    assert_eq!(
        seen_one,
        (0..n).collect::<Vec<_>>(),
        "every acknowledged row is visible, the waiting commit's is not"
    );
    assert_eq!(seen_two, vec![0], "the waiting commit's row is not visible");
    rt.block_on(cluster.set_synchronous_standby_names(""));
    // The waiting commits end (they were committed locally); new ones
    // commit as before.
    let mut tries = 0;
    while let Err(e) = add(&two, 2) {
        tries += 1;
        assert!(tries < 600, "no commit after the setting was cleared: {e}");
        std::thread::sleep(Duration::from_millis(50));
    }
    add(&one, n + 1).unwrap();
    let (waiting, [seen_one, seen_two]) = server_view(&cluster);
    assert_eq!(waiting, 0, "no session waits any more");
    assert_eq!(
        seen_one,
        (0..=n + 1).collect::<Vec<_>>(),
        "the unknown commit landed once the wait ended"
    );
    assert_eq!(seen_two, vec![0, 1, 2]);
}
