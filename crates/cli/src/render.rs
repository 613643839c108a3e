//! The human rendering of the crates' reports: plain aligned text, with a
//! summary table at the end of each migration command.

use std::io::{self, Write};
use std::path::Path;

use durability_alarms::listing::{CountsReport, JobListing};
use durability_migration::{
    AbortReport, Leftover, PurgeReport, RebalanceReport, RecoveryReport, StatusReport, VerifyReport,
};
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
        let mut rows = vec![header([
            "CHANNEL", "KEY", "VERSION", "ATTEMPTS", "NEXT DUE", "STATE",
        ])];
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
        let mut rows = vec![header(["OBJECT", "STATE", "DUE AT", "TRIES", "TOKEN"])];
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
        let mut rows = vec![header([
            "SCOPE",
            "OWNER",
            "GENERATION",
            "LEASE LEFT",
            "PROBLEM",
        ])];
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

/// `migrations status`.
pub(crate) fn migration_status(out: &mut impl Write, r: &StatusReport) -> io::Result<()> {
    let now = r.now_ms;
    writeln!(
        out,
        "journal scope {:?} on shard {} (now {now})",
        r.scope, r.journal_shard
    )?;
    writeln!(out, "operations: {} ({} active)", r.total, r.active)?;
    if !r.counts.is_empty() {
        let mut rows = vec![vec!["STATE".to_owned(), "COUNT".to_owned()]];
        for (state, n) in &r.counts {
            rows.push(vec![state.clone(), n.to_string()]);
        }
        table(out, &rows)?;
    }
    match &r.recovery_lease {
        None => writeln!(out, "recovery lease: never taken")?,
        Some(l) if l.expires_ms > now => writeln!(
            out,
            "recovery lease: held by {} (generation {}) until {}",
            l.holder,
            l.generation,
            at(l.expires_ms, now)
        )?,
        Some(l) => writeln!(out, "recovery lease: free (generation {})", l.generation)?,
    }
    writeln!(
        out,
        "last verify pass: {}; last clean: {}",
        r.last_verify_pass_ms
            .map_or_else(|| "never".to_owned(), |t| at(t, now)),
        r.last_clean_verify_ms
            .map_or_else(|| "never".to_owned(), |t| at(t, now))
    )?;
    if r.operations.is_empty() {
        return writeln!(out, "listed: none");
    }
    writeln!(out, "listed:")?;
    let mut rows = vec![header([
        "OPERATION",
        "KEY",
        "STATE",
        "SOURCE",
        "TARGET",
        "ATTEMPTS",
        "UPDATED",
        "NOTE",
    ])];
    for op in &r.operations {
        let mut note = Vec::new();
        if !op.state.is_terminal() && op.live_until_ms > now {
            note.push(format!("mover live until {}", at(op.live_until_ms, now)));
        }
        if op.purged {
            note.push("purged".to_owned());
        } else if let Some(t) = op.retire_at_ms.filter(|_| op.state.as_str() == "retired") {
            note.push(format!("purgeable from {}", at(t, now)));
        }
        if let Some(e) = &op.error {
            note.push(e.clone());
        }
        rows.push(vec![
            op.op_id.clone(),
            op.key.clone(),
            op.state.to_string(),
            op.source.clone(),
            op.target.clone(),
            op.attempts.to_string(),
            at(op.updated_ms, now),
            if note.is_empty() {
                "-".to_owned()
            } else {
                note.join("; ")
            },
        ]);
    }
    table(out, &rows)?;
    if r.truncated {
        writeln!(out, "(more operations match: raise --limit)")?;
    }
    Ok(())
}

/// A table's header row.
fn header<const N: usize>(columns: [&str; N]) -> Vec<String> {
    columns.map(str::to_owned).to_vec()
}

/// A summary row: what, how many, and the first ids.
fn summary_row(what: &str, n: usize, ids: &[&str]) -> Vec<String> {
    const SHOWN: usize = 5;
    let mut list = ids
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if ids.len() > SHOWN {
        list.push_str(&format!(", and {} more", ids.len() - SHOWN));
    }
    vec![
        what.to_owned(),
        n.to_string(),
        if list.is_empty() {
            "-".to_owned()
        } else {
            list
        },
    ]
}

fn ids(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `migrations recover`, and the recovery a repairing verify ran.
pub(crate) fn recovery(out: &mut impl Write, r: &RecoveryReport) -> io::Result<()> {
    writeln!(out, "recovery (lease generation {}):", r.generation)?;
    let failed: Vec<&str> = r.failed.iter().map(|f| f.op_id.as_str()).collect();
    let rows = vec![
        header(["OUTCOME", "COUNT", "OPERATIONS"]),
        summary_row("examined", r.examined.len(), &ids(&r.examined)),
        summary_row("committed", r.committed.len(), &ids(&r.committed)),
        summary_row("aborted", r.aborted.len(), &ids(&r.aborted)),
        summary_row("claims released", r.released.len(), &ids(&r.released)),
        summary_row("skipped (mover live)", r.skipped.len(), &ids(&r.skipped)),
        summary_row("failed", r.failed.len(), &failed),
    ];
    table(out, &rows)?;
    for f in &r.failed {
        writeln!(
            out,
            "failed: {} (key {:?}): {}: {}",
            f.op_id,
            f.key,
            f.error.code(),
            f.error
        )?;
    }
    Ok(())
}

/// `migrations verify`.
pub(crate) fn verify(out: &mut impl Write, r: &VerifyReport) -> io::Result<()> {
    if let Some(rec) = &r.recovery {
        recovery(out, rec)?;
    }
    let leftover = |l: &Leftover| format!("{}:{}:{} ({})", l.shard, l.table, l.key, l.op_id);
    let list = |v: Vec<String>| {
        v.iter()
            .map(String::as_str)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let ghosts = list(r.ghosts.iter().map(leftover).collect());
    let archives = list(r.stranded_archives.iter().map(leftover).collect());
    let copies = list(r.stranded_copies.iter().map(leftover).collect());
    let markers = list(r.leftover_markers.iter().map(leftover).collect());
    let stale: Vec<String> = r
        .stale_cutovers
        .iter()
        .map(|s| {
            let restorable = if s.restorable {
                "restorable"
            } else {
                "not restorable"
            };
            format!("{} {restorable}", leftover(&s.leftover))
        })
        .collect();
    let mismatches: Vec<String> = r
        .mapping_mismatches
        .iter()
        .map(|m| {
            format!(
                "{} on {} (mapping: {}; {})",
                m.key,
                m.expected,
                m.found.as_deref().unwrap_or("none"),
                m.op_id
            )
        })
        .collect();
    let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let rows = vec![
        header(["FINDING", "COUNT", "FIRST"]),
        summary_row(
            "dangling operations",
            count(r.dangling_count),
            &ids(&r.dangling_ops),
        ),
        summary_row("ghost rows", count(r.ghost_count), &ids(&ghosts)),
        summary_row(
            "stranded archives",
            count(r.stranded_archive_count),
            &ids(&archives),
        ),
        summary_row(
            "stranded copies",
            count(r.stranded_copy_count),
            &ids(&copies),
        ),
        summary_row("stale cutovers", count(r.stale_cutover_count), &ids(&stale)),
        summary_row(
            "mapping mismatches",
            count(r.mapping_mismatch_count),
            &ids(&mismatches),
        ),
        summary_row(
            "leftover markers",
            count(r.leftover_marker_count),
            &ids(&markers),
        ),
        summary_row("repaired", count(r.repaired_count), &ids(&r.repaired)),
    ];
    writeln!(out, "verification:")?;
    table(out, &rows)?;
    writeln!(
        out,
        "{}",
        if r.clean {
            "clean"
        } else {
            "not clean (repair with --repair; see `migrations status --active`)"
        }
    )
}

/// `migrations purge`.
pub(crate) fn purge(out: &mut impl Write, r: &PurgeReport) -> io::Result<()> {
    let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let refused: Vec<String> = r
        .refused
        .iter()
        .map(|f| format!("{} ({})", f.op_id, f.error.code()))
        .collect();
    let rows = vec![
        header(["OUTCOME", "COUNT", "OPERATIONS"]),
        summary_row("purged", count(r.purged_count), &ids(&r.purged)),
        summary_row("refused", count(r.refused_count), &ids(&refused)),
    ];
    writeln!(out, "purge:")?;
    table(out, &rows)
}

/// `migrations rebalance`.
pub(crate) fn rebalance(
    out: &mut impl Write,
    dry_run: bool,
    r: &RebalanceReport,
) -> io::Result<()> {
    const SHOWN: usize = 20;
    if r.plan.is_empty() {
        writeln!(out, "plan: nothing to move")?;
    } else {
        writeln!(out, "plan{}:", if dry_run { " (dry run)" } else { "" })?;
        let mut rows = vec![header(["KEY", "FROM", "TO"])];
        for m in r.plan.iter().take(SHOWN) {
            rows.push(vec![m.key.clone(), m.from.clone(), m.to.clone()]);
        }
        table(out, &rows)?;
        if r.planned > SHOWN as u64 {
            writeln!(out, "  ... and {} more", r.planned - SHOWN as u64)?;
        }
    }
    let failed: Vec<String> = r
        .failed
        .iter()
        .map(|(k, code)| format!("{k} ({code})"))
        .collect();
    let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let rows = vec![
        header(["", "COUNT", "KEYS"]),
        summary_row("examined", count(r.examined), &[]),
        summary_row("planned", count(r.planned), &[]),
        summary_row("moved", count(r.moved), &[]),
        summary_row("skipped", count(r.skipped), &[]),
        summary_row("failed", failed.len(), &ids(&failed)),
    ];
    writeln!(out, "summary:")?;
    table(out, &rows)
}

/// `migrations abort`.
pub(crate) fn abort(out: &mut impl Write, r: &AbortReport) -> io::Result<()> {
    if r.already_aborted {
        writeln!(
            out,
            "operation {} (key {:?}) was aborted already; nothing changed",
            r.op_id, r.key
        )
    } else {
        writeln!(
            out,
            "aborted operation {} (key {:?}); {} destination copies dropped",
            r.op_id, r.key, r.copies_dropped
        )
    }
}
