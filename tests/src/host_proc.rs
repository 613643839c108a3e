//! What every host process of the process tests shares (`object-host`,
//! `pg-object-host`, in part `routing-host` and the demo's cluster host):
//! `key=value` arguments, one stdout line per step, the owner events, the
//! answers to commands, the peer directory, the `Counter` object, and the
//! drain on SIGTERM.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::HashMap;
use std::future::Future;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use durability_alarms::{AlarmIndex, DispatcherConfig};
use durability_host::transport::PeerDirectory;
use durability_host::{
    BoxError, Host, HostConfig, HostError, HostIds, HostSettings, LifecycleId, ObjectStore,
    OwnPolicy, OwnerEvent, StorageId, TaskId,
};
use durability_ownership::{LeaseStore, LifecycleAdmin, ShardCount, SystemClock};
use durability_scheduler::{Capability, Clock as _, Scheduler, Storage, StorageError, Transaction};
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::ownership::SqliteLeaseStore;
use durability_storage_sqlite::{SqliteStorage, Synchronous};
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
            outcome(&e)
        ),
    }
}

/// `not_started` when a refusal proves nothing ran, else `unknown`.
#[must_use]
pub fn outcome(e: &HostError) -> &'static str {
    match e.outcome() {
        durability_ownership::DispatchOutcome::NotStarted => "not_started",
        _ => "unknown",
    }
}

/// The answer line to a failed routed request `what` (`call <name>
/// <method>`, `fetch <name> <method>`, `connect <name>`): `err <what>
/// code=<rpc code> host_code=<code> outcome=<not_started|unknown>`.
#[must_use]
pub fn err_line(what: &str, e: &HostError) -> String {
    format!(
        "err {what} code={} host_code={} outcome={}",
        e.rpc_code(),
        e.code(),
        outcome(e)
    )
}

/// Calls `method` of the object `class`/`name` with the JSON `args`
/// (`null` when empty), on whichever host owns it; returns the answer
/// line: `ok call <name> <method> result=<json>` or [`err_line`]'s.
///
/// # Panics
/// When `args` is not JSON.
pub async fn call_line<S, I, O>(
    host: &Host<S, I, O>,
    class: &str,
    name: &str,
    method: &str,
    args: &str,
) -> String
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
    O: ObjectStore,
{
    let args: serde_json::Value =
        serde_json::from_str(if args.is_empty() { "null" } else { args }).expect("JSON args");
    match host.object_by_name(class, name).call(method, args).await {
        Ok(v) => format!("ok call {name} {method} result={v}"),
        Err(e) => err_line(&format!("call {name} {method}"), &e),
    }
}

/// An owner event's line: `acquired scope=<s> gen=<g>`, `lost scope=<s>
/// gen=<g> code=<c>`, `released scope=<s> gen=<g>`, or `event <debug>`.
#[must_use]
pub fn owner_event_line(e: &OwnerEvent) -> String {
    match e {
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
    }
}

/// Prints every owner event of `host` from now on, as
/// [`owner_event_line`], from a task of its own.
pub fn say_owner_events<S, I, O>(host: &Host<S, I, O>)
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
    O: ObjectStore,
{
    let mut events = host.subscribe();
    tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            say(&owner_event_line(&e));
        }
    });
}

/// Peers as files `<dir>/<task>` holding the raw endpoint (the host checks
/// it against its endpoint policy on every read); a task id with other
/// characters than ASCII letters, digits, `-` and `_` has none.
pub struct FilePeers(pub PathBuf);

impl PeerDirectory for FilePeers {
    fn endpoint(&self, task: &str) -> Option<String> {
        if !task
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return None;
        }
        std::fs::read_to_string(self.0.join(task)).ok()
    }
}

/// Adds one to the `counter` table's one row (`id` 0, column `n`) of a
/// SQLite object; returns the new value.
///
/// # Errors
/// The statement's, as a backend error.
pub fn incr_sqlite_counter(
    tx: &mut Transaction<'_, '_, SqliteStorage>,
) -> Result<i64, StorageError> {
    tx.sql()
        .query_row(
            "INSERT INTO counter (id, n) VALUES (0, 1)
             ON CONFLICT (id) DO UPDATE SET n = n + 1 RETURNING n",
            [],
            |r| r.get(0),
        )
        .map_err(counter_sql)
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
    say_owner_events(&host);
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

/// The host settings from the `DO_*` environment variables, with the owner
/// loop period `interval` (ms; the default when not a number); a bad one
/// refuses as [`refuse`] does.
pub fn settings_or_refuse(interval: &str) -> HostSettings {
    let mut settings = match HostSettings::from_env() {
        Ok(s) => s,
        Err(e) => refuse(e.code(), &e.to_string()),
    };
    settings.renew_interval_ms = interval.parse().ok();
    settings
}

/// Starts the host, or refuses as [`refuse`] does with the error's code
/// (an ownership refusal with the ownership error's code, as [`serve`]
/// does when the host stops on its own).
pub async fn start_or_refuse<S, I, O>(config: HostConfig<S, I, O>) -> Host<S, I, O>
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
    O: ObjectStore,
{
    match Host::start(config).await {
        Ok(h) => h,
        Err(HostError::Ownership(e)) => refuse(e.code(), &e.to_string()),
        Err(e) => refuse(e.code(), &e.to_string()),
    }
}

/// The `timer <name> <delay ms>` command of a `Counter` object of type
/// `T`: sets its `timer` due `delay_ms` from now; answers the due time and
/// the generation. With `abort_after_commit` (`timer-abort`) the process
/// aborts inside the call right after its commit, before the host syncs
/// the moved alarm to its index (the crash point between a call's commit
/// and its alarm sync): it never answers.
///
/// # Errors
/// The call's.
pub async fn set_timer<T, S, I, O>(
    host: &Host<S, I, O>,
    clock: &SystemClock,
    name: &str,
    delay_ms: i64,
    abort_after_commit: bool,
) -> Result<(i64, u64), HostError>
where
    T: Send + Sync + 'static,
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
    O: ObjectStore,
{
    let at = clock.now_ms() + delay_ms;
    host.call::<T, _, _, _>("Counter", name, |h| async move {
        h.scheduler
            .transaction(|tx| tx.set_due("timer", Some(at)))?;
        if abort_after_commit {
            std::process::abort();
        }
        Ok((at, h.generation))
    })
    .await
}

/// The commands every counter host answers alike, after its own: `probe`
/// prints [`probe_line`], any other `err <cmd> <name>
/// code=unknown_command`.
pub fn other_command<S, I, O>(host: &Host<S, I, O>, cmd: &str, name: &str)
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
    O: ObjectStore,
{
    if cmd == "probe" {
        say(&probe_line(host));
    } else {
        say(&format!("err {cmd} {name} code=unknown_command"));
    }
}

/// The owner scope of the test hosts' `Counter` object `name` (storage
/// `st1`, the default shard count).
///
/// # Panics
/// Never for a valid name.
#[must_use]
pub fn counter_scope(name: &str) -> durability_ownership::OwnerScope {
    durability_ownership::OwnerScope::for_object(
        StorageId::new("st1").expect("valid"),
        durability_ownership::ClassName::new("Counter").expect("valid"),
        &durability_ownership::ObjectName::new(name),
        ShardCount::default(),
    )
    .expect("a valid scope")
}

/// The lease store and the alarm index the SQLite test hosts of a test
/// share in `dir` (`leases.db`, `alarms.db`).
///
/// # Panics
/// When either cannot be opened.
#[must_use]
pub fn shared_sqlite(
    dir: &std::path::Path,
    clock: SystemClock,
) -> (Arc<SqliteLeaseStore<SystemClock>>, Arc<SqliteAlarmIndex>) {
    let store = SqliteLeaseStore::open(dir.join("leases.db"), clock, ShardCount::default())
        .expect("open the shared lease store");
    let index = SqliteAlarmIndex::open(dir.join("alarms.db"), Synchronous::Full)
        .expect("open the shared alarm index");
    (Arc::new(store), Arc::new(index))
}

/// A test host's ids: storage `st1`, lifecycle `ns:app`, task `task`.
///
/// # Panics
/// When `task` is not a valid task id.
#[must_use]
pub fn test_ids(task: &str) -> HostIds {
    HostIds::new(
        StorageId::new("st1").expect("valid"),
        LifecycleId::new("ns:app").expect("valid"),
        TaskId::new(task).expect("a valid task id"),
    )
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

/// A counter host's SQL error, as a backend storage error.
pub fn counter_sql(e: impl std::error::Error + Send + Sync + 'static) -> StorageError {
    StorageError::backend("counter sql", e)
}

/// Creates a `Counter` object's tables if missing (the backend's SQL).
pub type CreateTables<D> = fn(&mut Transaction<'_, '_, D>) -> Result<(), StorageError>;

/// Adds the class `Counter` of [`TimerObject`]s: each object opened runs
/// `create` in a transaction of its own, then attaches its timer, which
/// records each firing by `task` with `record`.
pub fn counter_class<S, I, O: ObjectStore>(
    config: HostConfig<S, I, O>,
    task: &str,
    create: CreateTables<O::Storage>,
    record: RecordFired<O::Storage>,
) -> HostConfig<S, I, O> {
    let task = task.to_owned();
    config.class("Counter", move |ctx| {
        ctx.scheduler.transaction(create)?;
        TimerObject::attach(&ctx.scheduler, &ctx.name, &task, record)
    })
}

/// Records a fired timer in the object's own table (the backend's SQL).
pub type RecordFired<D> = fn(&mut Transaction<'_, '_, D>, i64, &str) -> Result<(), StorageError>;

/// A `Counter` object whose state is its timer capability (`timer`), which
/// records each firing with `record`, clears its due time and prints
/// `fired <name> task=<t>` (or `fire-failed <name> <error>`). The object
/// keeps the timer's state alive (the scheduler holds the timer weakly).
pub struct TimerObject<D: Storage> {
    _state: Arc<TimerState<D>>,
}

struct TimerState<D: Storage> {
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
    ) -> Result<Self, BoxError> {
        let inner = Arc::new(TimerState {
            sched: sched.clone(),
            name: name.to_owned(),
            task: task.to_owned(),
            record,
        });
        sched.attach("timer", None, Arc::new(Timer(Arc::downgrade(&inner))))?;
        Ok(Self { _state: inner })
    }
}

struct Timer<D: Storage>(Weak<TimerState<D>>);

/// The environment variable that makes a host's timer pause this many
/// milliseconds inside its firing (after printing `firing <name>
/// task=<t>`), before it writes anything: a test kills the host there.
pub const ENV_FIRE_PAUSE_MS: &str = "DURABILITY_TEST_FIRE_PAUSE_MS";

impl<D: Storage + Send + Sync + 'static> Capability for Timer<D> {
    fn run(&self, now_ms: i64) -> BoxFuture<'_, ()> {
        let inner = self.0.upgrade();
        Box::pin(async move {
            let Some(inner) = inner else { return };
            let pause = std::env::var(ENV_FIRE_PAUSE_MS)
                .ok()
                .and_then(|ms| ms.parse::<u64>().ok())
                .unwrap_or(0);
            if pause > 0 {
                say(&format!("firing {} task={}", inner.name, inner.task));
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
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
/// create the active storage pointer if absent), and a fast dispatcher
/// (claim lease and dispatch timeout from the environment when set:
/// `claim_leases`).
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
            ..claim_leases()
        })
}

/// [`DispatcherConfig::fast`], with the claim lease and dispatch timeout
/// of the environment (`WORKFLOWS_DO_ALARM_CLAIM_LEASE_MS`,
/// `WORKFLOWS_DISPATCH_TIMEOUT_MS`) when the claim lease is set there.
fn claim_leases() -> DispatcherConfig {
    let fast = DispatcherConfig::fast();
    if std::env::var(durability_alarms::ENV_CLAIM_LEASE_MS).is_err() {
        return fast;
    }
    let env = DispatcherConfig::from_env();
    DispatcherConfig {
        claim_lease_ms: env.claim_lease_ms,
        dispatch_timeout_ms: env.dispatch_timeout_ms,
        ..fast
    }
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
