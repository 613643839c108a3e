//! What every host process of the process tests shares (`object-host`,
//! `pg-object-host`): `key=value` arguments, one stdout line per step, the
//! owner events, the answers to commands, and the drain on SIGTERM.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::HashMap;
use std::future::Future;
use std::io::Write as _;
use std::sync::{Arc, Weak};

use durability_alarms::{AlarmIndex, DispatcherConfig};
use durability_host::{BoxError, Host, HostConfig, HostError, ObjectStore, OwnPolicy, OwnerEvent};
use durability_ownership::{LeaseStore, LifecycleAdmin, SystemClock};
use durability_scheduler::{Capability, Scheduler, Storage, StorageError, Transaction};
use futures::future::BoxFuture;
use tokio::io::AsyncBufReadExt as _;

/// Prints one line on stdout, flushed.
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Prints `refused <code> <message>` on stderr and exits with code 2.
pub fn refuse(code: &str, message: &str) -> ! {
    eprintln!("refused {code} {message}");
    std::process::exit(2);
}

/// The process's `key=value` arguments.
pub fn args() -> HashMap<String, String> {
    std::env::args()
        .skip(1)
        .filter_map(|a| a.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

/// The answer line to a command: `ok <cmd> <name> value=<v> gen=<g>` or
/// `err <cmd> <name> code=<c> outcome=<not_started|unknown> <message>`.
pub fn answer(cmd: &str, name: &str, result: Result<(i64, u64), HostError>) -> String {
    match result {
        Ok((v, g)) => format!("ok {cmd} {name} value={v} gen={g}"),
        Err(e) => format!(
            "err {cmd} {name} code={} outcome={} {e}",
            e.code(),
            match e.outcome() {
                durability_ownership::DispatchOutcome::NotStarted => "not_started",
                _ => "unknown",
            }
        ),
    }
}

/// Runs a started host: prints `ready task=<t>` and every owner event,
/// hands each stdin line to `command` (each in a task of its own), and
/// on SIGTERM drains, prints `drained timed_out=<b> released=<n>` and
/// exits (0, or 3 when the drain timed out). A host that stopped on its
/// own with an ownership error exits as [`refuse`] does.
pub async fn serve<S, I, O, F, Fut>(host: Host<S, I, O>, task: &str, command: F) -> !
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
    O: ObjectStore,
    F: Fn(Host<S, I, O>, String) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut events = host.subscribe();
    tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            say(&match e {
                OwnerEvent::Acquired { scope, generation } => {
                    format!("acquired scope={scope} gen={generation}")
                }
                OwnerEvent::Lost {
                    scope,
                    generation,
                    code,
                } => format!("lost scope={scope} gen={generation} code={code}"),
                OwnerEvent::Released { scope, generation } => {
                    format!("released scope={scope} gen={generation}")
                }
                _ => format!("event {e:?}"),
            });
        }
    });
    say(&format!("ready task={task}"));
    let commands = host.clone();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tokio::spawn(command(commands.clone(), line));
        }
    });
    let report = host.run_until_signal().await;
    if let Some(HostError::Ownership(e)) = host.failed() {
        refuse(e.code(), &e.to_string());
    }
    let released = match &report {
        durability_ownership::DrainReport::Drained { released, .. } => released.len(),
        _ => 0,
    };
    say(&format!(
        "drained timed_out={} released={released}",
        report.timed_out()
    ));
    // Exit at once: the stdin reader blocks a thread the runtime would
    // otherwise wait for (the seed's supervisor also kills the runtime
    // right after a drain succeeds).
    std::process::exit(if report.timed_out() { 3 } else { 0 });
}

/// The `probe` command's line.
pub fn probe_line<S, I, O>(host: &Host<S, I, O>) -> String
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
    O: ObjectStore,
{
    let p = host.probe();
    format!(
        "probe state={} scopes={} in_flight={} open={} cold={} fenced={} lost={} alarms_delivered={}",
        p.state,
        p.scopes.len(),
        p.in_flight,
        p.open_objects,
        p.dispatch.cold,
        p.dispatch.fenced,
        p.dispatch.ownership_lost,
        p.alarms.delivered
    )
}

/// Records a fired timer in the object's own table (the backend's SQL).
pub type RecordFired<D> = fn(&mut Transaction<'_, '_, D>, i64, &str) -> Result<(), StorageError>;

/// A `Counter` object's state: its scheduler and its timer capability
/// (`timer`), which records each firing with `record`, clears its due time
/// and prints `fired <name> task=<t>` (or `fire-failed <name> <error>`).
/// The object must keep the returned `Arc` alive (the scheduler holds the
/// timer weakly).
pub struct TimerObject<D: Storage> {
    sched: Scheduler<D>,
    name: String,
    task: String,
    record: RecordFired<D>,
}

impl<D: Storage + Send + Sync + 'static> TimerObject<D> {
    /// Attaches the timer to `sched`.
    ///
    /// # Errors
    /// The scheduler's refusal to attach it.
    pub fn attach(
        sched: &Scheduler<D>,
        name: &str,
        task: &str,
        record: RecordFired<D>,
    ) -> Result<Arc<Self>, BoxError> {
        let inner = Arc::new(Self {
            sched: sched.clone(),
            name: name.to_owned(),
            task: task.to_owned(),
            record,
        });
        sched.attach("timer", None, Arc::new(Timer(Arc::downgrade(&inner))))?;
        Ok(inner)
    }
}

struct Timer<D: Storage>(Weak<TimerObject<D>>);

impl<D: Storage + Send + Sync + 'static> Capability for Timer<D> {
    fn run(&self, now_ms: i64) -> BoxFuture<'_, ()> {
        let inner = self.0.upgrade();
        Box::pin(async move {
            let Some(inner) = inner else { return };
            let done = inner.sched.transaction(|tx| {
                (inner.record)(tx, now_ms, &inner.task)?;
                tx.set_due("timer", None)
            });
            match done {
                Ok(()) => say(&format!("fired {} task={}", inner.name, inner.task)),
                Err(e) => say(&format!("fire-failed {} {e}", inner.name)),
            }
        })
    }
}

/// The options every test host shares: `clock`, the owner policy of the
/// `own` argument (`all`: every shard), the `create` argument (`1`:
/// create the active storage pointer if absent), and a fast dispatcher.
pub fn test_options<S, I, O: ObjectStore>(
    config: HostConfig<S, I, O>,
    clock: SystemClock,
    own: &str,
    create: &str,
) -> HostConfig<S, I, O> {
    config
        .clock(Arc::new(clock))
        .own(if own == "all" {
            OwnPolicy::AllShards
        } else {
            OwnPolicy::OnDemand
        })
        .create_active_storage_if_absent(create == "1")
        .dispatcher(DispatcherConfig {
            poll_ms: 100,
            idle_ms: 20,
            owner_wait_max_ms: 300,
            ..DispatcherConfig::fast()
        })
}

/// A command line as `(command, object name, number)` (missing parts
/// empty, a missing or malformed number 0).
pub fn parse(line: &str) -> (&str, &str, i64) {
    let mut parts = line.split_whitespace();
    let cmd = parts.next().unwrap_or("");
    let name = parts.next().unwrap_or("");
    let number = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    (cmd, name, number)
}

/// Collects every line a spawned child prints on stdout and stderr (each
/// read by a thread of its own) into the returned list, in arrival order.
///
/// # Panics
/// When the child's stdout or stderr was not piped.
pub fn collect_lines(child: &mut std::process::Child) -> Arc<std::sync::Mutex<Vec<String>>> {
    use std::io::BufRead as _;
    let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
    let outs: [Box<dyn std::io::Read + Send>; 2] = [
        Box::new(child.stdout.take().expect("stdout piped")),
        Box::new(child.stderr.take().expect("stderr piped")),
    ];
    for out in outs {
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(line);
            }
        });
    }
    lines
}
