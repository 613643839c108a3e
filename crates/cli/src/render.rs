//! The human rendering of the crates' reports: plain aligned text.

use std::io::{self, Write};
use std::path::Path;

use durability_alarms::listing::{CountsReport, JobListing};
use durability_outbox::admin::{AdminOutcome, EntryState, OutboxListing};
use durability_ownership::listing::LeaseListing;
use durability_scheduler::ObjectReport;

use crate::EntryTarget;

/// A time in ms with its distance from `now`: `1000 (in 2.5s)`.
fn at(ms: i64, now: i64) -> String {
    let delta = ms.saturating_sub(now);
    let abs = delta.unsigned_abs();
    let span = if abs < 1000 {
        format!("{abs}ms")
    } else {
        format!("{}.{}s", abs / 1000, (abs % 1000) / 100)
    };
    match delta {
        0 => format!("{ms} (now)"),
        d if d > 0 => format!("{ms} (in {span})"),
        _ => format!("{ms} ({span} ago)"),
    }
}

fn opt_at(ms: Option<i64>, now: i64) -> String {
    ms.map_or_else(|| "none".to_owned(), |ms| at(ms, now))
}

/// Renders `rows` (first row: headers) as left-aligned columns.
fn table(out: &mut impl Write, rows: &[Vec<String>]) -> io::Result<()> {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::from(" ");
        for (cell, width) in row.iter().zip(&widths) {
            line.push(' ');
            line.push_str(cell);
            line.push_str(&" ".repeat(width - cell.chars().count()));
            line.push(' ');
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// `object inspect`.
pub(crate) fn object(out: &mut impl Write, file: &Path, report: &ObjectReport) -> io::Result<()> {
    let now = report.now_ms;
    writeln!(out, "object database {}", file.display())?;
    writeln!(out, "now:          {now}")?;
    writeln!(out, "alarm:        {}", opt_at(report.alarm, now))?;
    writeln!(out, "earliest due: {}", opt_at(report.earliest_due, now))?;
    if report.alarm != report.earliest_due {
        writeln!(
            out,
            "warning: the alarm is not at the earliest due time of the capabilities"
        )?;
    }
    let due: Vec<&str> = report.due_capabilities().collect();
    writeln!(
        out,
        "due now:      {}",
        if due.is_empty() {
            "nothing".to_owned()
        } else {
            due.join(", ")
        }
    )?;
    if report.capabilities.is_empty() {
        return writeln!(out, "capabilities: none");
    }
    writeln!(out, "capabilities:")?;
    let mut rows = vec![vec![
        "NAME".to_owned(),
        "SCHEMA".to_owned(),
        "DUE".to_owned(),
    ]];
    for c in &report.capabilities {
        rows.push(vec![
            c.name.clone(),
            c.schema_version
                .map_or_else(|| "-".to_owned(), |v| format!("v{v}")),
            opt_at(c.due, now),
        ]);
    }
    table(out, &rows)
}

fn state(s: EntryState) -> &'static str {
    match s {
        EntryState::Due => "due",
        EntryState::Waiting => "waiting",
        EntryState::InFlight => "in flight",
        EntryState::Corrupt => "corrupt",
        _ => "unknown",
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// `outbox list`.
pub(crate) fn outbox(out: &mut impl Write, file: &Path, listing: &OutboxListing) -> io::Result<()> {
    let now = listing.now_ms;
    writeln!(out, "outbox of {}", file.display())?;
    writeln!(out, "now: {now}")?;
    if listing.entries.is_empty() {
        writeln!(out, "entries: none")?;
    } else {
        writeln!(out, "entries:")?;
        let mut rows = vec![
            ["CHANNEL", "KEY", "VERSION", "ATTEMPTS", "NEXT DUE", "STATE"]
                .map(str::to_owned)
                .to_vec(),
        ];
        for e in &listing.entries {
            let mut state = state(e.state).to_owned();
            if let Some(until) = e.claimed_until.filter(|_| e.state == EntryState::InFlight) {
                state = format!("{state} until {}", at(until, now));
            }
            if let Some(problem) = &e.problem {
                state = format!("{state}: {problem}");
            }
            rows.push(vec![
                e.channel.clone(),
                e.key.clone(),
                opt(e.version),
                opt(e.attempts),
                e.due_at.map_or_else(|| "-".to_owned(), |d| at(d, now)),
                state,
            ]);
        }
        table(out, &rows)?;
    }
    if listing.truncated {
        writeln!(out, "(more rows are stored: raise --limit)")?;
    }
    for q in &listing.quarantined {
        writeln!(out, "quarantined in {}: {} rows", q.channel, q.rows)?;
    }
    Ok(())
}

/// `outbox retry` / `outbox discard` (only a done outcome is rendered).
pub(crate) fn admin(
    out: &mut impl Write,
    done: &str,
    target: &EntryTarget,
    outcome: &AdminOutcome,
) -> io::Result<()> {
    if let AdminOutcome::Done { entry } = outcome {
        writeln!(
            out,
            "{done}: key {:?} of channel {:?} (version {}, attempts {}) in {}",
            target.key,
            target.channel,
            opt(entry.version),
            opt(entry.attempts),
            target.file.display()
        )?;
    }
    Ok(())
}

/// `alarms jobs`.
pub(crate) fn jobs(out: &mut impl Write, page: &JobListing) -> io::Result<()> {
    if page.jobs.is_empty() {
        writeln!(out, "jobs with prefix {:?}: none", page.prefix)?;
    } else {
        writeln!(out, "jobs with prefix {:?}:", page.prefix)?;
        let mut rows = vec![
            ["OBJECT", "STATE", "DUE AT", "TRIES", "TOKEN"]
                .map(str::to_owned)
                .to_vec(),
        ];
        for j in &page.jobs {
            rows.push(vec![
                j.object.clone(),
                j.state.to_owned(),
                j.due_at.to_string(),
                j.tries.to_string(),
                j.token.clone(),
            ]);
        }
        table(out, &rows)?;
    }
    if let Some(cursor) = &page.cursor {
        writeln!(out, "more: --cursor {cursor}")?;
    }
    Ok(())
}

/// `alarms counts`.
pub(crate) fn counts(out: &mut impl Write, c: &CountsReport) -> io::Result<()> {
    writeln!(out, "scheduled: {}", c.scheduled)?;
    writeln!(out, "ready:     {}", c.ready)?;
    writeln!(out, "total:     {}", c.total)
}

/// `leases list`.
pub(crate) fn leases(out: &mut impl Write, page: &LeaseListing) -> io::Result<()> {
    if page.leases.is_empty() {
        writeln!(out, "live leases: none")?;
    } else {
        writeln!(out, "live leases:")?;
        let mut rows = vec![
            ["SCOPE", "OWNER", "GENERATION", "LEASE LEFT", "PROBLEM"]
                .map(str::to_owned)
                .to_vec(),
        ];
        for l in &page.leases {
            rows.push(vec![
                l.scope.clone(),
                opt(l.owner.as_deref()),
                opt(l.generation),
                format!("{}ms", l.lease_left_ms),
                opt(l.problem.as_deref()),
            ]);
        }
        table(out, &rows)?;
    }
    if let Some(cursor) = &page.cursor {
        writeln!(out, "more: --cursor {cursor}")?;
    }
    Ok(())
}
