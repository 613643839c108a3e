//! A private PostgreSQL cluster for tests that crash, restart or fail
//! over the server: `initdb` into a temporary directory and `postgres` on a
//! free port, run as the `postgres` user when the test runs as root, stopped
//! by its pid. A synchronous standby is a `pg_basebackup -R` of a running
//! primary ([`Cluster::standby`]), promoted with `pg_ctl promote`. The
//! binaries come from `DURABILITY_PG_BIN` (default
//! `/usr/lib/postgresql/15/bin`); without them [`Cluster::init`] says it
//! skipped, unless `DURABILITY_REQUIRE_SERVICES=1`.
#![allow(clippy::unwrap_used, clippy::print_stderr, clippy::missing_panics_doc)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Sends `signal` (`STOP`, `CONT`, `QUIT`, `KILL`) to `pid`.
///
/// # Panics
/// When `kill` fails.
pub fn signal(pid: u32, signal: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{signal} {pid}");
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// `bin/<program>` with `args`, as the `postgres` user when we are root.
fn as_postgres(bin: &Path, program: &str, args: &[&str]) -> Command {
    let exe = bin.join(program);
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ])
        .arg(exe)
        .args(args);
        c
    } else {
        let mut c = Command::new(exe);
        c.args(args);
        c
    }
}

/// Runs `bin/<program>` with `args` ([`as_postgres`]), its output
/// discarded, to the end.
///
/// # Panics
/// When it cannot be run or fails.
fn run_as_postgres(bin: &Path, program: &str, args: &[&str]) {
    let ok = as_postgres(bin, program, args)
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "{program} {}", args.join(" "));
}

/// The direct children of `pid` (from `/proc`).
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                // `pid (comm) state ppid ...`; comm may hold spaces.
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// A cluster of this test's own.
#[derive(Debug)]
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    server: Option<Child>,
}

impl Cluster {
    /// Creates the cluster (not started), or `None` when PostgreSQL's
    /// binaries are not there and services are not required.
    pub fn init(test: &str) -> Option<Self> {
        let cluster = Self::empty(test)?;
        let data = cluster.data();
        run_as_postgres(
            &cluster.bin,
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        Some(cluster)
    }

    /// A directory and a free port, nothing in it yet.
    fn empty(test: &str) -> Option<Self> {
        let bin = PathBuf::from(
            std::env::var("DURABILITY_PG_BIN")
                .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_owned()),
        );
        if !bin.join("initdb").is_file() {
            assert!(
                std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "{}: no initdb (DURABILITY_REQUIRE_SERVICES=1)",
                bin.display()
            );
            eprintln!("skipped {test}: no initdb in {}", bin.display());
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("durability-pg-{test}-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let ok = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown {}", dir.display());
        }
        Some(Self {
            bin,
            dir,
            port,
            server: None,
        })
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Appends `lines` to the cluster's `postgresql.conf` (read at the
    /// next start).
    pub fn configure(&self, lines: &[&str]) {
        let path = self.data().join("postgresql.conf");
        let mut conf = std::fs::read_to_string(&path).unwrap();
        for l in lines {
            conf.push_str(l);
            conf.push('\n');
        }
        std::fs::write(&path, conf).unwrap();
    }

    /// A standby of this running cluster (`pg_basebackup -R`: streaming
    /// replication from it, `standby.signal` written), on a port of its
    /// own, not started.
    pub fn standby(&self, test: &str) -> Self {
        let standby = Self::empty(test).unwrap();
        run_as_postgres(
            &self.bin,
            "pg_basebackup",
            &[
                "-D",
                standby.data().to_str().unwrap(),
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "--no-sync",
            ],
        );
        standby
    }

    /// The cluster's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.server.as_ref().map(Child::id)
    }

    /// Starts the server and waits until it accepts connections.
    pub async fn start(&mut self) {
        let data = self.data();
        let port = self.port.to_string();
        let child = as_postgres(
            &self.bin,
            "postgres",
            &[
                "-D",
                data.to_str().unwrap(),
                "-p",
                &port,
                "-k",
                self.dir.to_str().unwrap(),
                "-c",
                "listen_addresses=127.0.0.1",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        self.server = Some(child);
        // Up to a minute of attempts, 50 ms apart.
        for _ in 0..1_200 {
            if tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the private server did not start");
    }

    /// Stops the server at once by its pid (`SIGQUIT`, what `pg_ctl stop
    /// -m immediate` sends: no checkpoint, crash recovery at the next
    /// start) and waits for it to exit.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.server.take() {
            signal(child.id(), "QUIT");
            let _ = child.wait();
        }
    }

    /// The machine's loss, as near as one machine gets: `SIGKILL` of the
    /// postmaster and, at the same moment, of every process it started
    /// (its backends, WAL sender, writers), by their pids; no process of
    /// the server runs afterwards, and nothing is flushed on the way out.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.server.take() {
            let pids: Vec<u32> = std::iter::once(child.id())
                .chain(children(child.id()))
                .collect();
            for pid in &pids {
                // A backend may exit between listing and signalling.
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
            let _ = child.wait();
            // The postmaster's children are reaped by init; wait until gone.
            for pid in pids {
                for _ in 0..1_200 {
                    if !Path::new(&format!("/proc/{pid}")).exists()
                        || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                            .is_ok_and(|s| s.contains(") Z "))
                    {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// A connection to the running server (its task spawned on the
    /// caller's runtime).
    async fn admin(&self) -> tokio_postgres::Client {
        let (c, conn) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        c
    }

    /// Sets `synchronous_standby_names` (`ALTER SYSTEM`) and reloads the
    /// configuration; `''` clears it.
    pub async fn set_synchronous_standby_names(&self, names: &str) {
        let c = self.admin().await;
        c.batch_execute(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
        ))
        .await
        .unwrap();
        c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    }

    /// How many sessions wait for synchronous replication now.
    pub async fn sync_rep_waiters(&self) -> i64 {
        self.admin()
            .await
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Promotes this standby (`pg_ctl promote -w`: it ends recovery and
    /// accepts writes when this returns).
    pub fn promote(&self) {
        let data = self.data();
        run_as_postgres(
            &self.bin,
            "pg_ctl",
            &["promote", "-w", "-t", "60", "-D", data.to_str().unwrap()],
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.server.take() {
            // Immediate shutdown: the postmaster takes its backends down.
            let _ = Command::new("kill")
                .args(["-QUIT", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
