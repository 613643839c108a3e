//! The host's figures, kept once and read twice: every [`Figure`] is a
//! plain number (what [`crate::Host::probe`] and the `/metrics` endpoint
//! report) and a counter of the `metrics` facade (names in ARCHITECTURE.md,
//! "Metrics"), labelled with the host's task. The facade handles are bound
//! when the host starts, to the recorder installed then (none: recording is
//! a no-op and the plain numbers still count).

use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{Counter, counter};

/// One figure: a plain number and its facade counter, moved together.
#[derive(Debug)]
pub(crate) struct Figure {
    n: AtomicU64,
    counter: Counter,
}

impl Figure {
    /// `name` labelled with `task` and the given bounded labels.
    pub(crate) fn new(
        name: &'static str,
        task: &str,
        labels: &[(&'static str, &'static str)],
    ) -> Self {
        let mut all = vec![("task", task.to_owned())];
        all.extend(labels.iter().map(|(k, v)| (*k, (*v).to_owned())));
        Self {
            n: AtomicU64::new(0),
            counter: counter!(name, &all),
        }
    }

    /// `name` with only the given bounded labels (no task: a figure of the
    /// [`crate::RpcClient`], which is not a host).
    pub(crate) fn untasked(name: &'static str, labels: &[(&'static str, &'static str)]) -> Self {
        let all: Vec<(&'static str, String)> =
            labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        Self {
            n: AtomicU64::new(0),
            counter: counter!(name, &all),
        }
    }

    /// Counts one.
    pub(crate) fn bump(&self) {
        self.n.fetch_add(1, Ordering::Relaxed);
        self.counter.increment(1);
    }

    /// The plain number.
    pub(crate) fn get(&self) -> u64 {
        self.n.load(Ordering::Relaxed)
    }
}

/// `durability_host_dispatches_total`, outcome `outcome`.
pub(crate) fn dispatch(task: &str, outcome: &'static str) -> Figure {
    Figure::new(
        "durability_host_dispatches_total",
        task,
        &[("outcome", outcome)],
    )
}

/// `durability_host_routed_total`, route `route`.
pub(crate) fn routed(task: &str, route: &'static str) -> Figure {
    Figure::new("durability_host_routed_total", task, &[("route", route)])
}

/// `durability_host_refusals_total`, reason `reason`.
pub(crate) fn refusal(task: &str, reason: &'static str) -> Figure {
    Figure::new(
        "durability_host_refusals_total",
        task,
        &[("reason", reason)],
    )
}

/// `durability_host_alarm_forwards_total`, side `side`.
pub(crate) fn alarm_forward(task: &str, side: &'static str) -> Figure {
    Figure::new(
        "durability_host_alarm_forwards_total",
        task,
        &[("side", side)],
    )
}

/// `durability_host_client_calls_total`, outcome `outcome`.
pub(crate) fn client_call(outcome: &'static str) -> Figure {
    Figure::untasked(
        "durability_host_client_calls_total",
        &[("outcome", outcome)],
    )
}

/// `durability_host_client_routed_total`, route `route`.
pub(crate) fn client_routed(route: &'static str) -> Figure {
    Figure::untasked("durability_host_client_routed_total", &[("route", route)])
}
