//! The test side of the process tests: one spawned process (a host binary
//! of `src/bin`) and every line it printed, each with the time the test
//! read it. Real processes run in real time, so every wait polls with a
//! deadline ([`DEADLINE_MS`]) and panics past it with the lines printed so
//! far. The answer lines are those of [`crate::host_proc::answer`].
#![allow(clippy::unwrap_used, clippy::missing_panics_doc, clippy::print_stderr)]

use std::io::{BufRead as _, Write as _};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use durability_ownership::SystemClock;
use durability_scheduler::Clock as _;

/// How long a wait for a process's line or exit may take (real time: a
/// loaded two-core machine stalls processes for seconds).
pub const DEADLINE_MS: i64 = 30_000;

/// The system clock's now (ms).
#[must_use]
pub fn now() -> i64 {
    SystemClock::new().now_ms()
}

/// The value of `key=value` in `line`.
///
/// # Panics
/// When `line` has no `key=`.
#[must_use]
pub fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// Calls `step` every 5 ms until it returns something, for at most `ms`.
fn poll<T>(ms: i64, mut step: impl FnMut() -> Option<T>) -> Option<T> {
    let end = now() + ms;
    loop {
        if let Some(found) = step() {
            return Some(found);
        }
        if now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A spawned process and the lines it printed (stdout and stderr, where
/// piped, each read by a thread of its own), in arrival order, each with
/// the time it was read. Killed (SIGKILL, a stopped one too) on drop.
pub struct Proc {
    name: String,
    /// The process.
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Arc<Mutex<Vec<(i64, String)>>>,
}

/// The command of host binary `bin` run as task `name` over the shared
/// directory `dir` with internal token `token` (`dir=… task=… token=…`).
#[must_use]
pub fn host_command(bin: &str, name: &str, dir: &std::path::Path, token: &str) -> Command {
    let mut command = Command::new(bin);
    command
        .arg(format!("dir={}", dir.display()))
        .arg(format!("task={name}"))
        .arg(format!("token={token}"));
    command
}

impl Proc {
    /// Spawns `command` with stdin, stdout and stderr piped, as `name`.
    #[must_use]
    pub fn spawn(name: &str, mut command: Command) -> Self {
        let child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: spawn {command:?}: {e}"));
        Self::of(name, child)
    }

    /// Collects the lines of a spawned `child` (whatever of stdout and
    /// stderr was piped) and keeps its stdin if piped.
    #[must_use]
    pub fn of(name: &str, mut child: Child) -> Self {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let outs: [Option<Box<dyn std::io::Read + Send>>; 2] = [
            child.stdout.take().map(|o| Box::new(o) as _),
            child.stderr.take().map(|o| Box::new(o) as _),
        ];
        for out in outs.into_iter().flatten() {
            let sink = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((now(), line));
                }
            });
        }
        let stdin = child.stdin.take();
        Self {
            name: name.to_owned(),
            child,
            stdin,
            lines,
        }
    }

    /// The name the test gave the process.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every line so far, with the time it was read.
    #[must_use]
    pub fn lines(&self) -> Vec<(i64, String)> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every line so far.
    #[must_use]
    pub fn texts(&self) -> Vec<String> {
        self.lines().into_iter().map(|(_, l)| l).collect()
    }

    /// How many lines so far start with `prefix`.
    #[must_use]
    pub fn count(&self, prefix: &str) -> usize {
        self.lines()
            .iter()
            .filter(|(_, l)| l.starts_with(prefix))
            .count()
    }

    /// Writes `line` to the process's stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin piped");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits until `done` returns something for the lines so far.
    pub fn wait_until<T>(&self, what: &str, done: impl FnMut(&[(i64, String)]) -> Option<T>) -> T {
        self.wait_within(what, DEADLINE_MS, done)
    }

    /// [`Proc::wait_until`] with a deadline of `ms` instead of
    /// [`DEADLINE_MS`].
    pub fn wait_within<T>(
        &self,
        what: &str,
        ms: i64,
        mut done: impl FnMut(&[(i64, String)]) -> Option<T>,
    ) -> T {
        poll(ms, || done(&self.lines())).unwrap_or_else(|| {
            panic!(
                "{}: timed out waiting for {what}: {:#?}",
                self.name,
                self.lines()
            )
        })
    }

    /// Waits for `n` lines that match; returns every matching line.
    pub fn wait_matching(
        &self,
        what: &str,
        matches: impl Fn(&str) -> bool,
        n: usize,
    ) -> Vec<(i64, String)> {
        self.wait_until(&format!("{n} × {what}"), |lines| {
            let found: Vec<(i64, String)> =
                lines.iter().filter(|(_, l)| matches(l)).cloned().collect();
            (found.len() >= n).then_some(found)
        })
    }

    /// Waits for `n` lines starting with `prefix`; returns every such line.
    pub fn wait_n(&self, prefix: &str, n: usize) -> Vec<(i64, String)> {
        self.wait_matching(prefix, |l| l.starts_with(prefix), n)
    }

    /// Waits for the first line starting with `prefix`.
    pub fn wait_line(&self, prefix: &str) -> (i64, String) {
        self.wait_n(prefix, 1).swap_remove(0)
    }

    /// Waits for the line starting with `prefix` after the first `skip`
    /// such lines.
    pub fn wait_new(&self, prefix: &str, skip: usize) -> String {
        self.wait_n(prefix, skip + 1).swap_remove(skip).1
    }

    /// Sends `command` and returns its answer: the first new line that
    /// `answer` matches.
    pub fn ask_matching(&mut self, command: &str, answer: impl Fn(&str) -> bool) -> String {
        let before = self.lines().iter().filter(|(_, l)| answer(l)).count();
        self.send(command);
        self.wait_matching(command, answer, before + 1)
            .swap_remove(before)
            .1
    }

    /// Sends `command` and returns the first new line starting with
    /// `answer`.
    pub fn ask(&mut self, command: &str, answer: &str) -> String {
        self.ask_matching(command, |l| l.starts_with(answer))
    }

    /// Sends `command` and returns its answer line: the first new line
    /// starting with `ok <what> ` or `err <what> `.
    pub fn ask_for(&mut self, command: &str, what: &str) -> String {
        let (ok, err) = (format!("ok {what} "), format!("err {what} "));
        self.ask_matching(command, |l| l.starts_with(&ok) || l.starts_with(&err))
    }

    /// Waits for the first answer to a command sent earlier: the first
    /// line starting with `ok <what> ` or `err <what> `.
    pub fn wait_answer(&self, what: &str) -> String {
        let (ok, err) = (format!("ok {what} "), format!("err {what} "));
        self.wait_matching(what, |l| l.starts_with(&ok) || l.starts_with(&err), 1)
            .swap_remove(0)
            .1
    }

    /// Sends `<cmd> <name> …` and returns its answer line (`ok <cmd>
    /// <name> …` or `err <cmd> <name> …`).
    pub fn run(&mut self, command: &str) -> String {
        let mut parts = command.split_whitespace();
        let what = format!("{} {}", parts.next().unwrap(), parts.next().unwrap());
        self.ask_for(command, &what)
    }

    /// [`Proc::run`], retrying (as a client would, through a fresh
    /// resolution) while the command is refused before it started: on a
    /// loaded machine a short lease can lapse between a claim and its
    /// admission. Prints each retry.
    pub fn run_ok(&mut self, command: &str) -> String {
        for _ in 0..50 {
            let answer = self.run(command);
            if !answer.contains(" outcome=not_started ") {
                return answer;
            }
            eprintln!(
                "{}: {command} refused before it started, retrying: {answer}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "{}: {command} kept being refused: {:#?}",
            self.name,
            self.lines()
        );
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let child = &mut self.child;
        poll(DEADLINE_MS, || child.try_wait().unwrap())
            .unwrap_or_else(|| panic!("{} did not exit: {:#?}", self.name, self.lines()))
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}
