//! Peak-memory measurements: `durability-demo rss <scenario> <n>` runs one
//! scenario in a fresh process and prints its peak RSS (`VmHWM`, KiB) on
//! stdout.

use std::process::Command;

use crate::Result;

/// Runs a scenario in a child process and returns its peak RSS in KiB.
pub(crate) fn measure(scenario: &str, n: u64) -> Result<u64> {
    child_kib(&["rss", scenario, &n.to_string()])
}

/// Runs this executable with `args` (a child-process entry point that
/// prints its peak RSS) and returns the number it printed (KiB).
pub(crate) fn child_kib(args: &[&str]) -> Result<u64> {
    let exe = std::env::current_exe()?;
    let out = Command::new(exe).args(args).output()?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(out.stdout)?.trim().parse()?)
}

pub(crate) fn inner(args: &[String]) -> Result {
    let (Some(scenario), Some(n)) = (args.first(), args.get(1)) else {
        return Err("usage: durability-demo rss <scenario> <n>".into());
    };
    let n: u64 = n.parse()?;
    match scenario.as_str() {
        "outbox-delivery" => {
            let dir = tempfile::tempdir()?;
            let b = crate::bench::open_bench(&dir.path().join("rss.db"))?;
            crate::bench::stage_many(&b, n, 10_000)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(b.1.deliver_due())?;
            if b.1.len()? != 0 {
                return Err("not everything was delivered".into());
            }
        }
        other => return Err(format!("unknown rss scenario {other:?}").into()),
    }
    println!("{}", peak_rss_kib()?);
    Ok(())
}

/// This process's peak RSS (`VmHWM`, KiB).
pub(crate) fn peak_rss_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .ok_or("no VmHWM in /proc/self/status")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .ok_or("malformed VmHWM")?
        .parse()?)
}
