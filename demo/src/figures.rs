//! The figures `cargo xtask demo` prints at its end: a debugging recorder
//! of the `metrics` facade installed before the first scene, so every
//! library figure recorded in this process (outbox, ownership, alarms,
//! topology, migration; the cluster scene's host processes keep their
//! own) is read back once and shown as a short table.

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use crate::Result;

/// Installs the process-wide recorder; returns what reads it back.
///
/// # Errors
/// When a recorder is installed already.
pub(crate) fn install() -> Result<Snapshotter> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .map_err(|_| "a metrics recorder is installed already")?;
    Ok(snapshotter)
}

/// One table row per figure and label set, sorted: counters as their
/// total, gauges as their value, histograms as count, median and maximum.
/// Figures that stayed at zero are left out.
pub(crate) fn rows(snapshotter: &Snapshotter) -> Vec<(String, String, String)> {
    let mut rows = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let shown = match value {
            DebugValue::Counter(0) => continue,
            DebugValue::Counter(n) => n.to_string(),
            DebugValue::Gauge(v) => format!("{}", v.into_inner()),
            DebugValue::Histogram(samples) if samples.is_empty() => continue,
            DebugValue::Histogram(mut samples) => {
                samples.sort();
                let median = samples[samples.len() / 2].into_inner();
                let max = samples[samples.len() - 1].into_inner();
                format!("n={} p50={median} max={max}", samples.len())
            }
        };
        rows.push((key.name().to_owned(), labels.join(","), shown));
    }
    rows.sort();
    rows
}

/// Prints the table.
pub(crate) fn print(snapshotter: &Snapshotter) {
    let rows = rows(snapshotter);
    println!("== figures recorded in this process (the metrics facade)");
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let w1 = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    for (name, labels, value) in rows {
        println!("{name:<w0$}  {labels:<w1$}  {value}");
    }
}
