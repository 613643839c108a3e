//! Results files: what `cargo xtask bench` and `cargo xtask verify` measured,
//! kept under `results/` so that figures live in files a command writes,
//! never in hand-edited prose (ARCHITECTURE.md and the README link here; a
//! tidy test keeps pasted figures out of them).
//!
//! - `results/bench-<area>.jsonl`: every JSON line a benchmark printed, one
//!   per figure, with `"run"` (the UTC time the run started) and `"commit"`
//!   (`git describe --always --dirty`) added first. A run appends; the file
//!   is the history, newest last. The area is the figure name's first part
//!   (`host.routed_call` → `bench-host.jsonl`; `peers.*` → `bench-peers.jsonl`).
//! - `results/verify.txt`: one section per `verify` run: when, the commit,
//!   the campaign's settings, each step's exit status, and the lines the
//!   suites print about what they tried (crash points, seeds, the soak).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use crate::Result;

/// The directory of the results files.
pub(crate) fn dir() -> PathBuf {
    crate::workspace_root().join("results")
}

/// What a command printed, line by line, while it was also shown as usual.
pub(crate) struct Teed {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: Vec<String>,
    pub(crate) stderr: Vec<String>,
}

/// Runs `cmd` with its stdout and stderr passed through line by line (so
/// progress shows as it happens) and kept.
pub(crate) fn run_teed(cmd: &mut Command) -> Result<Teed> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let err = child.stderr.take().ok_or("stderr is piped")?;
    let err_thread = std::thread::spawn(move || -> Vec<String> {
        let mut kept = Vec::new();
        for line in BufReader::new(err)
            .lines()
            .map_while(std::result::Result::ok)
        {
            eprintln!("{line}");
            kept.push(line);
        }
        kept
    });
    let out = child.stdout.take().ok_or("stdout is piped")?;
    let mut stdout = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line?;
        #[allow(clippy::print_stdout, reason = "the command's own stdout, passed on")]
        {
            println!("{line}");
        }
        stdout.push(line);
    }
    let status = child.wait()?;
    let stderr = err_thread
        .join()
        .map_err(|_| "the stderr reader panicked")?;
    Ok(Teed {
        status,
        stdout,
        stderr,
    })
}

/// The stamp of one run: its UTC start time and the commit it measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) run: String,
    pub(crate) commit: String,
}

impl Stamp {
    /// Now, and the working tree's commit (`unknown` outside git).
    pub(crate) fn now() -> Stamp {
        #[expect(
            clippy::disallowed_methods,
            reason = "xtask stamps a results file with the wall time; no library clock is involved"
        )]
        let now = std::time::SystemTime::now();
        let secs = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let commit = Command::new("git")
            .args(["describe", "--always", "--dirty", "--abbrev=12"])
            .current_dir(crate::workspace_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "unknown".to_owned());
        Stamp {
            run: utc_timestamp(secs),
            commit,
        }
    }
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (the proleptic
/// Gregorian calendar; days to civil date by Howard Hinnant's algorithm).
pub(crate) fn utc_timestamp(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{d:02}T{h:02}:{m:02}:{s:02}Z")
}

/// A benchmark's JSON line with the stamp's fields put first, and the file
/// (`bench-<area>.jsonl`) it belongs in; `None` for a line that is not a
/// figure (not a JSON object with a string `"name"` of the form
/// `<area>.<figure>`).
pub(crate) fn stamped_figure(line: &str, stamp: &Stamp) -> Option<(String, String)> {
    let body = line.trim().strip_prefix('{')?;
    if !line.trim_end().ends_with('}') {
        return None;
    }
    let name_at = body.find("\"name\":\"")? + "\"name\":\"".len();
    let name = &body[name_at..];
    let name = &name[..name.find('"')?];
    let (area, figure) = name.split_once('.')?;
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    };
    if !plain(area) || !plain(figure) {
        return None;
    }
    let sep = if body.trim_start().starts_with('}') {
        ""
    } else {
        ","
    };
    Some((
        format!("bench-{area}.jsonl"),
        format!(
            "{{\"run\":\"{}\",\"commit\":\"{}\"{sep}{body}",
            stamp.run, stamp.commit
        ),
    ))
}

/// Appends `lines` to `results/<file>`, creating the directory and file.
pub(crate) fn append(file: &str, lines: &[String]) -> Result<PathBuf> {
    let dir = dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(file);
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)?;
    for line in lines {
        writeln!(out, "{line}")?;
    }
    out.sync_all()?;
    Ok(path)
}

/// The figures among `stdout`, stamped and grouped by results file, in
/// the order their files first appear.
pub(crate) fn group_figures(stdout: &[String], stamp: &Stamp) -> Vec<(String, Vec<String>)> {
    let mut by_file: Vec<(String, Vec<String>)> = Vec::new();
    for (file, line) in stdout.iter().filter_map(|l| stamped_figure(l, stamp)) {
        match by_file.iter_mut().find(|(f, _)| *f == file) {
            Some((_, lines)) => lines.push(line),
            None => by_file.push((file, vec![line])),
        }
    }
    by_file
}

/// Appends every figure among `stdout` to its area's results file; returns
/// the files written.
pub(crate) fn record_figures(stdout: &[String], stamp: &Stamp) -> Result<Vec<PathBuf>> {
    group_figures(stdout, stamp)
        .iter()
        .map(|(file, lines)| append(file, lines))
        .collect()
}

/// Whether a line a `verify` step printed says what a suite tried or how a
/// step ended, and so belongs in `results/verify.txt`.
pub(crate) fn verify_line_kept(line: &str) -> bool {
    let t = line.trim();
    let lower = t.to_ascii_lowercase();
    lower.contains("tried")
        || lower.contains("crash points")
        || t.starts_with("Summary [")
        || t.starts_with("FAIL [")
        || t.starts_with("TIMEOUT [")
        || lower.starts_with("alarms soak:")
        || t.starts_with("{\"name\":\"alarms.soak\"")
        || (lower.contains("seed") && (lower.contains("ops") || lower.contains("operations")))
}

/// One `verify` step as the results file records it.
pub(crate) struct VerifyStep {
    pub(crate) what: String,
    pub(crate) status: String,
    pub(crate) kept: Vec<String>,
}

/// The section of `results/verify.txt` for one run.
pub(crate) fn verify_section(stamp: &Stamp, settings: &str, steps: &[VerifyStep]) -> Vec<String> {
    let mut out = vec![format!(
        "== {} commit {}: cargo xtask verify ({settings})",
        stamp.run, stamp.commit
    )];
    for step in steps {
        out.push(format!("-- {}: {}", step.what, step.status));
        out.extend(step.kept.iter().map(|l| format!("   {}", l.trim())));
    }
    out.push(String::new());
    out
}

/// Where a results file is, relative to the workspace root, for messages.
pub(crate) fn shown(path: &Path) -> String {
    path.strip_prefix(crate::workspace_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> Stamp {
        Stamp {
            run: "2026-12-06T04:00:00Z".to_owned(),
            commit: "abc123".to_owned(),
        }
    }

    #[test]
    fn a_teed_command_keeps_both_streams_line_by_line() {
        let teed = run_teed(Command::new("sh").args([
            "-c",
            "echo '{\"name\":\"host.x\",\"value\":1}'; echo 'a: 3 crash points tried' >&2; echo plain; exit 3",
        ]))
        .expect("sh runs");
        assert_eq!(teed.status.code(), Some(3));
        assert_eq!(teed.stdout, [r#"{"name":"host.x","value":1}"#, "plain"]);
        assert_eq!(teed.stderr, ["a: 3 crash points tried"]);
        let files = group_figures(&teed.stdout, &stamp());
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].0, "bench-host.jsonl");
    }

    #[test]
    fn timestamps_are_utc_calendar_times() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_timestamp(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_timestamp(1_709_251_199), "2024-02-29T23:59:59Z");
        // 2026-12-06T03:36:41Z, the day this module was written.
        assert_eq!(utc_timestamp(1_796_528_201), "2026-12-06T03:36:41Z");
    }

    #[test]
    fn a_figure_line_is_stamped_and_filed_by_its_area() {
        let line = r#"{"name":"host.routed_call","value":1.3,"ratio":1.3,"extra":{"a":1}}"#;
        let (file, out) = stamped_figure(line, &stamp()).expect("a figure");
        assert_eq!(file, "bench-host.jsonl");
        assert_eq!(
            out,
            r#"{"run":"2026-12-06T04:00:00Z","commit":"abc123","name":"host.routed_call","value":1.3,"ratio":1.3,"extra":{"a":1}}"#
        );
        let (file, _) = stamped_figure(
            r#"{"name":"ownership.renew_cycle.100","value":1}"#,
            &stamp(),
        )
        .expect("a figure");
        assert_eq!(file, "bench-ownership.jsonl");
    }

    #[test]
    fn lines_that_are_not_figures_are_not_filed() {
        for line in [
            "",
            "building durability-demo in release …",
            r#"{"value":1}"#,
            r#"{"name":"nodot","value":1}"#,
            r#"{"name":"../etc.passwd","value":1}"#,
            r#"{"name":"a/b.c","value":1}"#,
            r#"{"name":"host.x","value":1"#,
            r#"["name","host.x"]"#,
        ] {
            assert_eq!(stamped_figure(line, &stamp()), None, "{line:?}");
        }
    }

    #[test]
    fn figures_of_several_areas_go_to_their_own_files() {
        let lines = [
            r#"{"name":"outbox.delivery","value":1}"#.to_owned(),
            "text".to_owned(),
            r#"{"name":"topology.update","value":2}"#.to_owned(),
            r#"{"name":"outbox.stage_overhead","value":3}"#.to_owned(),
        ];
        let got: Vec<(String, usize)> = group_figures(&lines, &stamp())
            .into_iter()
            .map(|(file, lines)| (file, lines.len()))
            .collect();
        assert_eq!(
            got,
            [
                ("bench-outbox.jsonl".to_owned(), 2),
                ("bench-topology.jsonl".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn verify_keeps_what_was_tried_and_how_steps_ended() {
        for kept in [
            "alarms: object crash points tried: 24",
            "[Kind::Sqlite] [\"users\"]: 31 crash points tried",
            "     Summary [ 912.3s] 40 tests run: 40 passed, 1200 skipped",
            "        FAIL [  3.1s] durability-tests::it migration_model::sqlite",
            "sqlite seed=3 ops: insert 400 | faults: crash 3",
            "alarms soak: 100000 alarms: 99990 delivered, 10 discarded",
            r#"{"name":"alarms.soak","n":100000}"#,
        ] {
            assert!(verify_line_kept(kept), "{kept:?}");
        }
        for dropped in [
            "   Compiling durability-tests v0.1.0",
            "        PASS [   0.2s] durability-outbox::it stage",
            "running 1 test",
        ] {
            assert!(!verify_line_kept(dropped), "{dropped:?}");
        }
    }

    #[test]
    fn a_verify_section_names_the_run_and_each_step() {
        let steps = [VerifyStep {
            what: "nextest".to_owned(),
            status: "passed".to_owned(),
            kept: vec!["  a: 3 crash points tried".to_owned()],
        }];
        assert_eq!(
            verify_section(&stamp(), "seeds 20, ops 2000", &steps),
            [
                "== 2026-12-06T04:00:00Z commit abc123: cargo xtask verify (seeds 20, ops 2000)",
                "-- nextest: passed",
                "   a: 3 crash points tried",
                "",
            ]
        );
    }
}
