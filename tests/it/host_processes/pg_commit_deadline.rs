//! The host's commit deadline (`DO_DATABASE_COMMIT_TIMEOUT_MS`) with a
//! `pg-object-host` process on a private cluster whose
//! `synchronous_standby_names` names a standby that does not exist (as a
//! promoted standby that inherited the setting): every `COMMIT` then waits
//! for it forever. A call comes back as `outcome=unknown` (never as a
//! definite failure, never `ok`), the server's session still waits (no
//! cancel made the row visible), and once the operator clears the setting
//! the host serves again without a restart; every answer is checked
//! against the stored rows.

use durability_storage_postgres::testkit::cluster::Cluster;

use super::TTL_S;
use super::pg_faults::{incr_until_ok, outcome_violations};
use super::postgres::{Db, check, runtime, stored};

/// The host's commit deadline in this test (ms).
const COMMIT_TIMEOUT_MS: u64 = 2_000;

#[test]
fn a_commit_waiting_for_a_missing_synchronous_standby_is_unknown_and_the_host_serves_once_it_is_cleared()
 {
    let rt = runtime();
    let Some(mut cluster) = Cluster::init("host-commit-deadline") else {
        return;
    };
    rt.block_on(cluster.start());
    let db = Db {
        url: cluster.url(),
        schema: "hosts".to_owned(),
    };
    let dir = tempfile::tempdir().unwrap();
    let deadline = COMMIT_TIMEOUT_MS.to_string();
    let mut a = super::spawn_bin(
        env!("CARGO_BIN_EXE_pg-object-host"),
        "a",
        dir.path(),
        TTL_S,
        &["own=all", "create=1"],
        &[
            ("DO_DATABASE_URL", db.url.as_str()),
            ("DO_DATABASE_SCHEMA", db.schema.as_str()),
            ("DO_DATABASE_COMMIT_TIMEOUT_MS", deadline.as_str()),
        ],
    );
    a.wait_line("ready");
    a.wait_n("acquired ", 16);
    let answer = a.run_ok("incr w1");
    assert!(answer.starts_with("ok incr w1 value=1 "), "{answer}");
    rt.block_on(cluster.set_synchronous_standby_names("nobody"));
    // The reload reaches the host's sessions at their next statement; a
    // commit before it still returns at once.
    let mut acked_during = 0;
    let refused = loop {
        let answer = a.run("incr w1");
        if !answer.starts_with("ok ") {
            break answer;
        }
        acked_during += 1;
        assert!(acked_during < 100, "no commit ever waited for the standby");
    };
    let waiting = rt.block_on(async {
        let waiting = cluster.sync_rep_waiters().await;
        cluster.set_synchronous_standby_names("").await;
        waiting
    });
    eprintln!(
        "tried: synchronous_standby_names naming no standby under host a (commit deadline \
         {COMMIT_TIMEOUT_MS} ms, lease {TTL_S} s); {acked_during} call(s) acknowledged before the \
         reload reached the session, then: {refused}; {waiting} server session(s) waiting in SyncRep \
         when the setting was cleared"
    );
    assert!(
        refused.starts_with("err incr w1 ") && refused.contains(" outcome=unknown "),
        "the stuck commit is an unknown outcome, never a definite failure: {refused}"
    );
    assert!(refused.contains("no reply to COMMIT"), "{refused}");
    assert!(
        waiting >= 1,
        "the server still waited for the standby: no cancel was sent"
    );
    let answer = incr_until_ok(&mut [&mut a], "w1");
    eprintln!("resumed: {answer}");
    let n = stored(&db, "w1").n;
    assert!(
        answer.starts_with(&format!("ok incr w1 value={n} ")),
        "the host continues from every stored write, the unknown one included: {answer}"
    );
    let mut violations = check(&db, &[&a], &["w1"]);
    violations.extend(outcome_violations(&db, &[&a], &["w1"]));
    assert!(violations.is_empty(), "{violations:#?}");
}
