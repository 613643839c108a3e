//! A private PostgreSQL cluster (initdb / pg_ctl as the `postgres` user, on
//! a free port) crashed with `pg_ctl stop -m immediate` and restarted while
//! object transactions run: nothing acknowledged is lost, nothing refused
//! lands, and a commit whose reply was lost is reported as unknown.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;

use durability_scheduler::{SchedulerTx, Storage, StorageError, StorageErrorKind};
use durability_storage_postgres::object::{PostgresObjectOptions, PostgresObjects};

const BIN: &str = "/usr/lib/postgresql/15/bin";

/// A cluster of its own, stopped (immediately) and removed on drop.
struct Cluster {
    dir: tempfile::TempDir,
    port: u16,
}

fn as_postgres(program: &str, args: &[&str]) -> bool {
    Command::new("runuser")
        .args(["-u", "postgres", "--", &format!("{BIN}/{program}")])
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Cluster {
    /// Starts a new cluster, or says why it cannot (skipped unless
    /// services are required).
    fn start() -> Option<Self> {
        let required = std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1");
        if !Path::new(BIN).join("initdb").exists() {
            assert!(!required, "PostgreSQL 15 binaries are required at {BIN}");
            eprintln!("skipped: no PostgreSQL 15 binaries at {BIN}");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let owned = Command::new("chown")
            .args(["-R", "postgres:postgres", &dir.path().display().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        let data = dir.path().join("data");
        let data = data.display().to_string();
        if !owned
            || !as_postgres(
                "initdb",
                &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"],
            )
        {
            assert!(!required, "could not initdb a private cluster as postgres");
            eprintln!("skipped: could not initdb a private cluster as the postgres user");
            return None;
        }
        let cluster = Self { dir, port };
        assert!(cluster.pg_ctl_start(), "the private cluster starts");
        Some(cluster)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    fn pg_ctl_start(&self) -> bool {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=on",
            self.port,
            self.dir.path().display()
        );
        let log = self.log().display().to_string();
        as_postgres(
            "pg_ctl",
            &["-D", &self.data(), "-o", &opts, "-l", &log, "-w", "start"],
        )
    }

    fn crash(&self) {
        assert!(
            as_postgres(
                "pg_ctl",
                &["-D", &self.data(), "-m", "immediate", "-w", "stop"]
            ),
            "the cluster stops"
        );
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = as_postgres(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }
}

/// How each attempted insert ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Acked,
    Refused,
    Unknown,
}

#[test]
fn a_crashed_and_restarted_server_loses_nothing_acknowledged() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let objects = PostgresObjects::connect(
        &cluster.url(),
        "crash_test",
        PostgresObjectOptions::default(),
    )
    .unwrap();
    let s = objects.open("loaded").unwrap();
    s.transaction(|tx| {
        tx.sql()
            .batch_execute("CREATE TABLE items (n BIGINT PRIMARY KEY)")
    })
    .unwrap();
    // The loader's transaction `CRASH_AT` asks for the crash between its
    // last statement and its COMMIT, so one commit is certainly in doubt.
    const CRASH_AT: i64 = 30;
    let (crash_tx, crash_rx) = mpsc::channel::<()>();
    let (crashed_tx, crashed_rx) = mpsc::channel::<()>();
    let (restarted_tx, restarted_rx) = mpsc::channel::<()>();
    let outcomes: BTreeMap<i64, Outcome> = std::thread::scope(|scope| {
        let s = &s;
        let loader = scope.spawn(move || {
            let mut outcomes = BTreeMap::new();
            let mut after_restart = 0;
            let mut restarted = false;
            for n in 0_i64.. {
                let r = s.transaction(|tx| {
                    tx.sql()
                        .execute("INSERT INTO items (n) VALUES ($1)", &[&n])?;
                    tx.set_alarm(Some(n))?;
                    if n == CRASH_AT {
                        crash_tx.send(()).unwrap();
                        crashed_rx.recv().unwrap();
                    }
                    Ok::<_, StorageError>(())
                });
                let outcome = match r {
                    Ok(()) => Outcome::Acked,
                    Err(e) if e.kind() == StorageErrorKind::Unknown => Outcome::Unknown,
                    Err(_) => Outcome::Refused,
                };
                outcomes.insert(n, outcome);
                restarted = restarted || restarted_rx.try_recv().is_ok();
                if restarted && outcome == Outcome::Acked {
                    after_restart += 1;
                }
                if after_restart >= 30 {
                    break;
                }
            }
            outcomes
        });
        crash_rx.recv().unwrap();
        cluster.crash();
        crashed_tx.send(()).unwrap();
        assert!(cluster.pg_ctl_start(), "the cluster restarts");
        restarted_tx.send(()).unwrap();
        loader.join().unwrap()
    });
    assert_eq!(
        outcomes.get(&CRASH_AT),
        Some(&Outcome::Unknown),
        "a commit whose reply was lost is unknown, never a definite failure"
    );
    let stored: Vec<i64> = s
        .transaction(|tx| {
            tx.sql()
                .query("SELECT n FROM items ORDER BY n", &[])?
                .iter()
                .map(|r| r.try_get(0).map_err(|e| StorageError::backend("n", e)))
                .collect()
        })
        .unwrap();
    let mut count = BTreeMap::new();
    for (n, outcome) in &outcomes {
        *count.entry(format!("{outcome:?}")).or_insert(0) += 1;
        let present = stored.binary_search(n).is_ok();
        match outcome {
            Outcome::Acked => assert!(present, "acknowledged insert {n} survived the crash"),
            Outcome::Refused => assert!(!present, "refused insert {n} did not land"),
            Outcome::Unknown => {}
        }
    }
    eprintln!("private cluster crash mid-load: outcomes {count:?}");
    assert!(
        count.get("Refused").copied().unwrap_or(0) + count.get("Unknown").copied().unwrap_or(0) > 0,
        "the crash interrupted the load"
    );
    let last_acked = outcomes
        .iter()
        .rev()
        .find(|(_, o)| **o == Outcome::Acked)
        .map(|(n, _)| *n);
    assert_eq!(
        s.transaction(|tx| tx.alarm()).unwrap(),
        last_acked,
        "the alarm is the last commit's"
    );
}
