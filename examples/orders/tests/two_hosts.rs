//! Runs the orders service as two host processes over Redis: orders placed
//! and paid through the host that owns the shop, unpaid orders cancelled by
//! the shop's alarm, every event in the sink file, then a drain (SIGTERM)
//! after which the other host serves the same shops and their state.
#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use durability_example_orders::newest_events;

struct Proc {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(url: &str, prefix: &str, dir: &std::path::Path, task: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_orders"))
            .args([
                format!("redis={url}"),
                format!("prefix={prefix}"),
                format!("dir={}", dir.display()),
                format!("task={task}"),
                "cancel_ms=1500".to_owned(),
                "interval=200".to_owned(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let p = Self {
            child,
            stdin,
            lines,
        };
        let ready = p.next();
        assert!(ready.starts_with("ready"), "{task}: {ready}");
        p
    }

    fn next(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a reply line within 30 s")
    }

    fn send(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let reply = self.next();
        eprintln!("{cmd:<22} -> {reply}");
        reply
    }

    fn term(mut self) -> String {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let drained = self.next();
        self.child.wait().unwrap();
        drained
    }
}

/// Sends `cmd` to whichever of the hosts owns its shop (calls between hosts
/// are not routed yet: a host that does not own the shop says so). The two
/// hosts balance the shards between them, so while a shard is handed over
/// its work is refused before it starts (`host_ownership_refused`,
/// `host_draining`): such a command never ran and is sent again, as a
/// client of this example must.
fn send_to_owner(hosts: &mut [&mut Proc], cmd: &str) -> String {
    const NOT_RUN: [&str; 3] = [
        "code=host_not_owner",
        "code=host_ownership_refused",
        "code=host_draining",
    ];
    for _round in 0..500 {
        for h in hosts.iter_mut() {
            let reply = h.send(cmd);
            if !NOT_RUN.iter().any(|code| reply.contains(code)) {
                return reply;
            }
        }
        // Real processes hand shards over on their own clocks.
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no host ran {cmd}");
}

fn redis_url() -> String {
    std::env::var("DURABILITY_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

#[test]
fn two_hosts_over_redis_place_pay_auto_cancel_and_hand_over_on_drain() {
    let url = redis_url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut conn = match rt.block_on(client.get_multiplexed_async_connection()) {
        Ok(c) => c,
        Err(e) if std::env::var_os("DURABILITY_REQUIRE_SERVICES").is_none() => {
            eprintln!("skipped: Redis at {url} unreachable ({e})");
            return;
        }
        Err(e) => panic!("Redis at {url} unreachable: {e}"),
    };
    let prefix = format!("orders-example-{}:", std::process::id());
    let dir = tempfile::tempdir().unwrap();

    let mut a = Proc::spawn(&url, &prefix, dir.path(), "host-a");
    let mut b = Proc::spawn(&url, &prefix, dir.path(), "host-b");
    for cmd in [
        "place s1 o1 500",
        "place s1 o2 700",
        "pay s1 o1",
        "place s2 o3 100",
        "place s3 o4 250",
        "pay s3 o4",
    ] {
        let reply = send_to_owner(&mut [&mut a, &mut b], cmd);
        assert!(
            reply.starts_with("ok ") && reply.ends_with(" true"),
            "{cmd}: {reply}"
        );
    }
    // A duplicate order is refused and changes nothing.
    let dup = send_to_owner(&mut [&mut a, &mut b], "place s1 o1 999");
    assert!(dup.ends_with(" false"), "{dup}");

    // The unpaid orders' alarms cancel them (1.5 s after placing).
    let sink = dir.path().join("events.jsonl");
    let cancelled =
        |events: &std::collections::BTreeMap<String, durability_example_orders::SinkLine>| {
            ["s1/o2", "s2/o3"].iter().all(|k| {
                events
                    .get(*k)
                    .is_some_and(|l| l.event.status == "cancelled")
            })
        };
    let mut waited = 0;
    while !cancelled(&newest_events(&sink).unwrap()) {
        assert!(waited < 300, "the auto-cancel alarms fired within 30 s");
        std::thread::sleep(Duration::from_millis(100));
        waited += 1;
    }

    // Drain host A: host B takes its shops at once and serves their state.
    let drained = a.term();
    assert!(drained.starts_with("drained timed_out=false"), "{drained}");
    for (cmd, want) in [
        ("status s1 o1", "paid"),
        ("status s1 o2", "cancelled"),
        ("status s2 o3", "cancelled"),
        ("status s3 o4", "paid"),
        ("status s3 nope", "none"),
    ] {
        let mut reply = b.send(cmd);
        let mut tries = 0;
        // B claims A's released shards on its next owner-loop cycle (200 ms).
        while reply.contains("code=host_not_owner") && tries < 50 {
            std::thread::sleep(Duration::from_millis(100));
            reply = b.send(cmd);
            tries += 1;
        }
        assert!(
            reply.starts_with("ok ") && reply.ends_with(want),
            "{cmd}: {reply}"
        );
    }
    let reply = b.send("place s1 o5 300");
    assert!(reply.ends_with(" true"), "{reply}");
    let reply = b.send("pay s1 o5");
    assert!(
        reply.ends_with(" true"),
        "paid well before its 1.5 s: {reply}"
    );
    // Its events are delivered by B (the outbox's due time is B's alarm).
    let mut waited = 0;
    while newest_events(&sink)
        .unwrap()
        .get("s1/o5")
        .is_none_or(|l| l.event.status != "paid")
    {
        assert!(waited < 300, "s1/o5's event was delivered within 30 s");
        std::thread::sleep(Duration::from_millis(100));
        waited += 1;
    }
    let drained = b.term();
    assert!(drained.starts_with("drained"), "{drained}");

    // Every order's newest event is in the sink.
    let events = newest_events(&sink).unwrap();
    let got: Vec<(String, String)> = events
        .iter()
        .map(|(k, l)| (k.clone(), l.event.status.clone()))
        .collect();
    eprintln!("newest events: {got:?}");
    assert_eq!(
        got,
        [
            ("s1/o1", "paid"),
            ("s1/o2", "cancelled"),
            ("s1/o5", "paid"),
            ("s2/o3", "cancelled"),
            ("s3/o4", "paid"),
        ]
        .map(|(k, s)| (k.to_owned(), s.to_owned()))
    );

    // Clean up this test's keys.
    rt.block_on(async {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    });
}
