//! A private PostgreSQL cluster for tests that crash and restart the
//! server: `initdb` into a temporary directory and `postgres` on a free
//! port, run as the `postgres` user when the test runs as root, stopped by
//! its pid. The binaries come from `DURABILITY_PG_BIN` (default
//! `/usr/lib/postgresql/15/bin`); without them the test says it skipped,
//! unless `DURABILITY_REQUIRE_SERVICES=1`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Sends `signal` (`STOP`, `CONT`, `QUIT`, `KILL`) to `pid`.
pub(crate) fn signal(pid: u32, signal: &str) {
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

/// A cluster of this test's own.
pub(crate) struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    server: Option<Child>,
}

impl Cluster {
    /// Creates the cluster (not started), or `None` when PostgreSQL's
    /// binaries are not there and services are not required.
    pub(crate) fn init(test: &str) -> Option<Self> {
        let bin = PathBuf::from(
            std::env::var("DURABILITY_PG_BIN")
                .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_owned()),
        );
        if !bin.join("initdb").is_file() {
            if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") {
                panic!(
                    "{}: no initdb (DURABILITY_REQUIRE_SERVICES=1)",
                    bin.display()
                );
            }
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
        let data = dir.join("data");
        let ok = as_postgres(
            &bin,
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
        )
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success();
        assert!(ok, "initdb");
        Some(Self {
            bin,
            dir,
            port,
            server: None,
        })
    }

    /// The URL of the cluster's `postgres` database.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server and waits until it accepts connections.
    pub(crate) async fn start(&mut self) {
        let data = self.dir.join("data");
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

    /// Stops the server at once by its pid (`SIGQUIT`: PostgreSQL's
    /// immediate shutdown, no checkpoint, crash recovery at the next start)
    /// and waits for it to exit.
    pub(crate) fn crash(&mut self) {
        if let Some(mut child) = self.server.take() {
            signal(child.id(), "QUIT");
            let _ = child.wait();
        }
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
