//! A `cluster-host` child process as the parent sees it: its stdin, and
//! every line it printed with the time the parent read it (answers to
//! requests indexed by request id).

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use durability_ownership::{Clock as _, SystemClock};

use crate::Result;

/// Wall time in Unix milliseconds (the processes run on real time).
pub(crate) fn now_ms() -> i64 {
    SystemClock::new().now_ms()
}

/// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`) to `pid`.
/// Calls `step` every 10 ms until it returns something, for at most
/// `timeout_ms` (real time).
async fn poll<T>(
    timeout_ms: i64,
    mut step: impl FnMut() -> Result<Option<T>>,
) -> Result<Option<T>> {
    let end = now_ms() + timeout_ms;
    loop {
        if let Some(found) = step()? {
            return Ok(Some(found));
        }
        if now_ms() > end {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) fn signal(pid: u32, signal: &str) -> Result {
    let ok = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()?
        .success();
    if ok {
        Ok(())
    } else {
        Err(format!("kill -{signal} {pid} failed").into())
    }
}

/// The value of `key=` in a line of `key=value` words.
pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

#[derive(Default)]
struct Output {
    lines: Vec<(i64, String)>,
    answers: HashMap<u64, (i64, String)>,
}

/// One child host process.
pub(crate) struct Proc {
    pub(crate) task: String,
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<Output>>,
}

impl Proc {
    /// Starts `durability-demo cluster-host task=<task> <args…>` in the
    /// working directory `cwd` (made if missing).
    pub(crate) fn spawn(task: &str, cwd: &std::path::Path, args: &[String]) -> Result<Self> {
        std::fs::create_dir_all(cwd)?;
        let mut child = Command::new(std::env::current_exe()?)
            .current_dir(cwd)
            .arg("cluster-host")
            .arg(format!("task={task}"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let out = Arc::new(Mutex::new(Output::default()));
        let stdout = child.stdout.take().ok_or("child stdout is piped")?;
        let stderr = child.stderr.take().ok_or("child stderr is piped")?;
        for (stream, tag) in [
            (Box::new(stdout) as Box<dyn std::io::Read + Send>, ""),
            (Box::new(stderr), "stderr: "),
        ] {
            let sink = Arc::clone(&out);
            std::thread::spawn(move || {
                for line in BufReader::new(stream)
                    .lines()
                    .map_while(std::io::Result::ok)
                {
                    let at = now_ms();
                    let mut o = sink.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some(rest) = line.strip_prefix("ans ")
                        && let Some((id, _)) = rest.split_once(' ')
                        && let Ok(id) = id.parse::<u64>()
                    {
                        o.answers.insert(id, (at, line.clone()));
                    }
                    o.lines.push((at, format!("{tag}{line}")));
                }
            });
        }
        let stdin = child.stdin.take();
        Ok(Self {
            task: task.to_owned(),
            child,
            stdin,
            out,
        })
    }

    fn out(&self) -> std::sync::MutexGuard<'_, Output> {
        self.out.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn signal(&self, sig: &str) -> Result {
        signal(self.pid(), sig)
    }

    /// Writes one command line.
    pub(crate) fn send(&mut self, line: &str) -> Result {
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    /// The answer to request `id`, if it came, with the time it was read.
    pub(crate) fn answer(&self, id: u64) -> Option<(i64, String)> {
        self.out().answers.get(&id).cloned()
    }

    /// Every line starting with `prefix`, with the time it was read.
    pub(crate) fn lines(&self, prefix: &str) -> Vec<(i64, String)> {
        self.out()
            .lines
            .iter()
            .filter(|(_, l)| l.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// The last lines printed (for error messages).
    pub(crate) fn tail(&self) -> String {
        let o = self.out();
        let skip = o.lines.len().saturating_sub(12);
        o.lines[skip..]
            .iter()
            .map(|(_, l)| format!("\n    {}: {l}", self.task))
            .collect()
    }

    /// Waits (real time, polling) for `n` lines starting with `prefix`.
    pub(crate) async fn wait_lines(
        &self,
        prefix: &str,
        n: usize,
        timeout_ms: i64,
    ) -> Result<Vec<(i64, String)>> {
        let found = poll(timeout_ms, || {
            let found = self.lines(prefix);
            Ok((found.len() >= n).then_some(found))
        })
        .await?;
        found.ok_or_else(|| {
            format!(
                "host {} printed {} of {n} lines {prefix:?} within {timeout_ms} ms:{}",
                self.task,
                self.lines(prefix).len(),
                self.tail()
            )
            .into()
        })
    }

    /// Waits for the answer to request `id`.
    pub(crate) async fn wait_answer(&self, id: u64, timeout_ms: i64) -> Result<(i64, String)> {
        let answer = poll(timeout_ms, || Ok(self.answer(id))).await?;
        answer.ok_or_else(|| {
            format!(
                "host {} did not answer request {id} within {timeout_ms} ms:{}",
                self.task,
                self.tail()
            )
            .into()
        })
    }

    /// Waits for the process to exit.
    pub(crate) async fn wait_exit(&mut self, timeout_ms: i64) -> Result<ExitStatus> {
        let child = &mut self.child;
        let status = poll(timeout_ms, || Ok(child.try_wait()?)).await?;
        status.ok_or_else(|| {
            format!(
                "host {} did not exit within {timeout_ms} ms:{}",
                self.task,
                self.tail()
            )
            .into()
        })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = signal(self.pid(), "CONT");
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
