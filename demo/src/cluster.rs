//! The cluster scene of `cargo xtask demo` (also `durability-demo
//! demo-cluster [--redis | --postgres]`): three `durability-host` processes
//! (this binary run again as `cluster-host`, see [`host`]; a fourth
//! replaces the killed one) own the shards of one class, an even share
//! each (the hosts balance them; the scene waits for and prints the counts
//! per host after the start and after every phase), over a lease store and
//! an alarm index they share: SQLite files in a temporary directory, or
//! with `--redis` Redis under a key prefix made for the run and deleted at
//! the end, the objects' SQLite files in that directory too; or with
//! `--postgres` PostgreSQL alone, objects included, in a schema made for
//! the run and dropped at the end, each host in a working directory of its
//! own (no directory shared; see [`backing`]).
//!
//! The parent is the client. It sends each call to any live host, round
//! robin, and the host routes it (`host.object_by_name(..).call(..)` over HTTP/1.1
//! between the hosts): run there if it owns the object's scope, else
//! forwarded once to the owner, or sent straight to it on a learned owner
//! hint. A call whose owner is dead answers `owner_unavailable` with outcome
//! not started (the connection was refused) until a survivor takes the
//! scope over, and the parent sends it again; after a drain, a host whose
//! hint still names the drained owner gets a trusted `stale_owner` and
//! rediscovers the new owner once. Only the paused phase sends its calls to
//! the owner the lease store names (a routed call to a paused owner cannot
//! be told from one that ran until it times out). Work is increments
//! (counted when acknowledged) and alarms (an object timer that records its
//! tag and the task that ran it in the object's own file when it fires);
//! an alarm job claimed by a host that does not own the object is forwarded
//! to the owner too.
//!
//! Then one host is killed (SIGKILL), one paused past its lease (SIGSTOP)
//! inside a call that commits late, and one drained (SIGTERM), and the
//! scene ends with a table. Lost work (acknowledged increments not read
//! back at the end, alarms set that never fired) fails the scene, and so
//! does a stale commit that landed. The final read of every object goes
//! through a host.
//!
//! [`failover_times`] (on SQLite and on PostgreSQL) and [`share`] (one
//! host, two joining, then uniform load over many objects) reuse the same
//! processes for `cargo xtask bench host`.

mod backing;
mod host;
mod proc;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use durability_ownership::{ClassName, LifecycleId, ObjectName, OwnerScope, ShardCount, StorageId};

use backing::Run;
pub(crate) use backing::{Backing, drop_schemas};
pub(crate) use host::main as child;
use proc::{Proc, field, now_ms};

use crate::Result;

/// Shards of the class.
pub(crate) const SHARDS: u32 = 8;
/// Owner lease (`DO_OWNER_TTL_SECONDS=3`).
pub(crate) const TTL_MS: u64 = 3_000;
/// Owner-loop period: renew, claim free shards.
pub(crate) const INTERVAL_MS: u64 = 250;
/// Lease guard (`DO_OWNER_LEASE_GUARD_MS`).
pub(crate) const GUARD_MS: u64 = 500;
/// Objects per shard.
const PER_SHARD: usize = 3;
/// How long the parent waits for alarms to fire after a phase.
const ALARM_WAIT_MS: i64 = 15_000;
/// The hosts' retry cap of a failed alarm delivery (`RetryPolicy`'s
/// `max_delay_ms`): the final check waits for one more such retry before
/// it counts an alarm as never fired.
const RETRY_MAX_DELAY_MS: i64 = 30_000;
/// How long one call may keep being refused before it started.
const CALL_DEADLINE_MS: i64 = 30_000;

/// The hosts' alarm dispatcher poll (`DispatcherConfig::poll_ms`).
const POLL_MS: u64 = 100;
/// The hosts' owner-elsewhere retry cap (`DispatcherConfig::owner_wait_max_ms`).
const OWNER_WAIT_MAX_MS: u64 = 300;

/// The reference time for a pending alarm of a killed host to fire on a
/// survivor (its job not claimed by the dead host): the lease runs out, a
/// survivor's owner loop or dispatcher claims the scope, a poll finds the
/// job, and one owner-elsewhere retry waits at most the owner-wait cap.
/// Each further owner-elsewhere retry adds up to the cap, and the delivery
/// itself takes its time.
fn alarm_budget_ms() -> u64 {
    TTL_MS + INTERVAL_MS + POLL_MS + OWNER_WAIT_MAX_MS
}

/// `demo-cluster [--redis | --postgres]`: the scene alone.
pub(crate) fn run(args: &[String]) -> Result {
    let mut backing = Backing::Sqlite;
    for a in args {
        match a.as_str() {
            "--redis" => backing = Backing::Redis(crate::redis_url()),
            "--postgres" => backing = Backing::Postgres(crate::postgres_url()),
            other => {
                return Err(format!(
                    "unknown demo-cluster flag {other:?}; known: --redis --postgres"
                )
                .into());
            }
        }
    }
    tokio::runtime::Runtime::new()?.block_on(demo(backing))
}

fn lease_settings(shards: u32) -> String {
    format!(
        "owner lease {TTL_MS} ms (DO_OWNER_TTL_SECONDS={}), renew interval {INTERVAL_MS} ms, lease guard {GUARD_MS} ms, {shards} shards, drain budgets 3000 / 5000 ms",
        TTL_MS / 1000
    )
}

/// The scene, on the stores of `backing`.
pub(crate) async fn demo(backing: Backing) -> Result {
    println!(
        "== cluster: three host processes own the shards of one class; one is killed, one paused, one drained"
    );
    let run = Run::open(backing, SHARDS).await?;
    println!("{}", run.describe());
    println!("lease settings: {}", lease_settings(SHARDS));
    let mut c = Cluster::new(run).await?;
    let result = scene(&mut c).await;
    c.procs.clear();
    if let Some(done) = c.run.clean_up().await? {
        println!("{done}");
    }
    result
}

/// What a call came back with.
enum Outcome {
    /// Acknowledged: sent to `entered`, ran on `host`, read at `at`.
    Ok {
        entered: String,
        host: String,
        at: i64,
        line: String,
    },
    /// The outcome is unknown (it may have run).
    Unknown { host: String, line: String },
}

/// The client side: the processes, the lease store it reads owners from,
/// and how calls are routed.
struct Cluster {
    run: Run,
    lifecycle: LifecycleId,
    storage: StorageId,
    class: ClassName,
    count: ShardCount,
    procs: BTreeMap<String, Proc>,
    /// Hosts that take calls now (not killed, paused or draining).
    live: BTreeSet<String>,
    /// Where a call for a scope without a live owner goes first.
    prefer: HashMap<u32, String>,
    next_id: u64,
    rr: usize,
    /// Calls refused before they started and sent again.
    retried: u64,
    /// Send calls to any live host (routed by the hosts), not to the lease
    /// store's owner.
    route: bool,
}

impl Cluster {
    async fn new(run: Run) -> Result<Self> {
        let c = Self {
            count: run.count(),
            run,
            lifecycle: LifecycleId::new(host::LIFECYCLE)?,
            storage: StorageId::new(host::STORAGE)?,
            class: ClassName::new(host::CLASS)?,
            procs: BTreeMap::new(),
            live: BTreeSet::new(),
            prefer: HashMap::new(),
            next_id: 0,
            rr: 0,
            retried: 0,
            route: true,
        };
        // The control plane's record: the lifecycle's active storage.
        c.run.set_active(&c.lifecycle, &c.storage).await?;
        Ok(c)
    }

    fn proc(&self, task: &str) -> Result<&Proc> {
        self.procs
            .get(task)
            .ok_or_else(|| format!("no host {task}").into())
    }

    /// Starts a host and waits until it is ready.
    async fn spawn(&mut self, task: &str) -> Result {
        let p = Proc::spawn(task, &self.run.cwd(task), &self.run.args(task))?;
        p.wait_lines("ready ", 1, 30_000).await?;
        self.procs.insert(task.to_owned(), p);
        self.live.insert(task.to_owned());
        Ok(())
    }

    fn shard_scope(&self, shard: u32) -> Result<OwnerScope> {
        Ok(OwnerScope::new(
            self.storage.clone(),
            self.class.clone(),
            shard,
            self.count,
        )?)
    }

    fn scope(&self, name: &str) -> Result<OwnerScope> {
        Ok(OwnerScope::for_object(
            self.storage.clone(),
            self.class.clone(),
            &ObjectName::new(name),
            self.count,
        )?)
    }

    /// The live owner of `scope` in the lease store, if any.
    async fn owner(&self, scope: &OwnerScope) -> Result<Option<String>> {
        self.run.owner(scope, &self.lifecycle).await
    }

    /// Shard → live owner, from the lease store.
    async fn owners(&self) -> Result<BTreeMap<u32, Option<String>>> {
        let mut out = BTreeMap::new();
        for shard in 0..self.count.get() {
            out.insert(shard, self.owner(&self.shard_scope(shard)?).await?);
        }
        Ok(out)
    }

    /// Waits until the live hosts hold the class's shards evenly (every
    /// shard owned by a live host, counts within one), reading the lease
    /// store, and prints the counts and how long it took.
    async fn balanced(&self, after: &str) -> Result {
        let since = now_ms();
        let (ms, counts) = self.even_since(since).await?;
        println!(
            "shard counts after {after}: {} (even within one, {ms} ms after the check began)",
            counts_list(&counts)
        );
        Ok(())
    }

    /// Waits until the live hosts hold the class's shards evenly (every
    /// shard owned by a live host, counts within one); returns the time
    /// from `since` and the shard count of each live host.
    async fn even_since(&self, since: i64) -> Result<(i64, BTreeMap<String, usize>)> {
        let end = now_ms() + i64::try_from(TTL_MS * 4)? + 10_000;
        loop {
            let owners = self.owners().await?;
            let mut counts: BTreeMap<String, usize> =
                self.live.iter().map(|t| (t.clone(), 0)).collect();
            let mut all = true;
            for o in owners.values() {
                match o.as_ref().and_then(|o| counts.get_mut(o)) {
                    Some(n) => *n += 1,
                    None => all = false,
                }
            }
            let min = counts.values().min().copied().unwrap_or(0);
            let max = counts.values().max().copied().unwrap_or(0);
            if all && max - min <= 1 {
                return Ok((now_ms() - since, counts));
            }
            if now_ms() > end {
                return Err(format!("shards not balanced: {owners:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Drains every live host (SIGTERM) and waits until each says so.
    async fn drain_all(&self) -> Result {
        for t in &self.live {
            self.proc(t)?.signal("TERM")?;
        }
        for t in &self.live {
            self.proc(t)?.wait_lines("drained ", 1, 15_000).await?;
        }
        Ok(())
    }

    /// The objects of `names` whose scope `task` owns now.
    async fn owned_by(&self, task: &str, names: &[String]) -> Result<Vec<String>> {
        let owners = self.owners().await?;
        let mut out = Vec::new();
        for n in names {
            if owners
                .get(&self.scope(n)?.shard())
                .cloned()
                .flatten()
                .as_deref()
                == Some(task)
            {
                out.push(n.clone());
            }
        }
        Ok(out)
    }

    /// The live host with the most shards (ties: the first by name).
    async fn busiest(&self) -> Result<(String, usize)> {
        let owners = self.owners().await?;
        self.live
            .iter()
            .map(|t| {
                let n = owners.values().filter(|o| o.as_deref() == Some(t)).count();
                (t.clone(), n)
            })
            .max_by_key(|(t, n)| (*n, std::cmp::Reverse(t.clone())))
            .ok_or_else(|| "no live host".into())
    }

    /// Where a call on `scope` goes: the preferred host while placing;
    /// routed, the next live host; else its live owner in the lease store
    /// or the next live host (which claims the scope once it is free).
    async fn target(&mut self, scope: &OwnerScope) -> Result<String> {
        if !self.route
            && let Some(owner) = self.owner(scope).await?
            && self.live.contains(&owner)
        {
            return Ok(owner);
        }
        if let Some(p) = self.prefer.get(&scope.shard())
            && self.live.contains(p)
        {
            return Ok(p.clone());
        }
        let live: Vec<&String> = self.live.iter().collect();
        if live.is_empty() {
            return Err("no live host to call".into());
        }
        self.rr += 1;
        Ok(live[self.rr % live.len()].clone())
    }

    /// Sends `command` to `task` with a fresh request id.
    fn send(&mut self, task: &str, command: &str) -> Result<u64> {
        self.next_id += 1;
        let id = self.next_id;
        self.procs
            .get_mut(task)
            .ok_or_else(|| format!("no host {task}"))?
            .send(&format!("{id} {command}"))?;
        Ok(id)
    }

    /// Runs `commands` (each `<cmd> <object> …`) concurrently, each routed
    /// to its object's owner and sent again while it is refused before it
    /// started; returns one outcome per command, in order.
    async fn calls(&mut self, commands: &[String]) -> Result<Vec<Outcome>> {
        let mut done: Vec<Option<Outcome>> = commands.iter().map(|_| None).collect();
        let mut todo: Vec<usize> = (0..commands.len()).collect();
        let mut pending: Vec<(usize, String, u64)> = Vec::new();
        let end = now_ms() + CALL_DEADLINE_MS;
        while !todo.is_empty() || !pending.is_empty() {
            for i in std::mem::take(&mut todo) {
                let name = commands[i]
                    .split_whitespace()
                    .nth(1)
                    .ok_or("a command names its object")?;
                let scope = self.scope(name)?;
                let task = self.target(&scope).await?;
                let command = if self.route {
                    format!("via {}", commands[i])
                } else {
                    commands[i].clone()
                };
                let id = self.send(&task, &command)?;
                pending.push((i, task, id));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            let mut retry = false;
            for (i, task, id) in std::mem::take(&mut pending) {
                let Some((at, line)) = self.proc(&task)?.answer(id) else {
                    pending.push((i, task, id));
                    continue;
                };
                if line.contains(" ok ") {
                    // A routed call names the host it ran on.
                    let host = field(&line, "ran").map_or_else(|| task.clone(), str::to_owned);
                    done[i] = Some(Outcome::Ok {
                        entered: task,
                        host,
                        at,
                        line,
                    });
                } else if line.contains(" outcome=not_started ") {
                    self.retried += 1;
                    todo.push(i);
                    retry = true;
                } else {
                    done[i] = Some(Outcome::Unknown { host: task, line });
                }
            }
            if now_ms() > end {
                return Err(format!(
                    "calls still refused or unanswered after {CALL_DEADLINE_MS} ms: {:?}",
                    todo.iter()
                        .chain(pending.iter().map(|(i, _, _)| i))
                        .map(|i| &commands[*i])
                        .collect::<Vec<_>>()
                )
                .into());
            }
            if retry {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(done.into_iter().flatten().collect())
    }

    /// Every `fired` line of every host: tag → (time read, task).
    fn fired(&self) -> BTreeMap<String, (i64, String)> {
        let mut out = BTreeMap::new();
        for p in self.procs.values() {
            for (at, line) in p.lines("fired ") {
                if let (Some(tag), Some(task)) = (field(&line, "tag"), field(&line, "task")) {
                    out.entry(tag.to_owned())
                        .or_insert_with(|| (at, task.to_owned()));
                }
            }
        }
        out
    }

    /// The live host owning the most shards, its shard count, and the
    /// objects of `names` it owns.
    async fn busiest_objects(&self, names: &[String]) -> Result<(String, usize, Vec<String>)> {
        let (task, shards) = self.busiest().await?;
        let objs = self.owned_by(&task, names).await?;
        Ok((task, shards, objs))
    }

    /// Waits for the alarms of a phase (tags `<phase>-<name>`, one per
    /// object of `objs`) to fire; returns those that fired (tag → time,
    /// task), how many alarms there are, and how many fired on another
    /// host than `host`.
    async fn phase_alarms(
        &self,
        objs: &[String],
        phase: &str,
        host: &str,
    ) -> (BTreeMap<String, (i64, String)>, usize, usize) {
        let tags: BTreeSet<String> = objs.iter().map(|n| format!("{phase}-{n}")).collect();
        let fired = self.wait_fired(&tags).await;
        let elsewhere = fired.values().filter(|(_, t)| *t != host).count();
        (fired, tags.len(), elsewhere)
    }

    /// Waits until every tag of `tags` fired (or [`ALARM_WAIT_MS`] pass);
    /// returns those that fired.
    async fn wait_fired(&self, tags: &BTreeSet<String>) -> BTreeMap<String, (i64, String)> {
        self.wait_fired_for(tags, ALARM_WAIT_MS).await
    }

    /// Waits until every tag of `tags` fired (or `wait_ms` pass); returns
    /// those that fired.
    async fn wait_fired_for(
        &self,
        tags: &BTreeSet<String>,
        wait_ms: i64,
    ) -> BTreeMap<String, (i64, String)> {
        let end = now_ms() + wait_ms;
        loop {
            let fired: BTreeMap<String, (i64, String)> = self
                .fired()
                .into_iter()
                .filter(|(t, _)| tags.contains(t))
                .collect();
            if fired.len() == tags.len() || now_ms() > end {
                return fired;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// What the client knows about one object.
#[derive(Default)]
struct Obj {
    /// Increments acknowledged.
    acked: u64,
    /// Increments whose outcome is unknown.
    unknown: u64,
    /// Alarm tags acknowledged as set.
    alarms: BTreeSet<String>,
}

/// The client's ledger.
#[derive(Default)]
struct Ledger {
    objs: BTreeMap<String, Obj>,
    acked_calls: u64,
    unknown_calls: u64,
}

impl Ledger {
    fn obj(&mut self, name: &str) -> &mut Obj {
        self.objs.entry(name.to_owned()).or_default()
    }

    fn account(&mut self, command: &str, outcome: &Outcome) {
        let mut words = command.split_whitespace();
        let (cmd, name) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let tag = words.next().unwrap_or("").to_owned();
        match outcome {
            Outcome::Ok { .. } => {
                self.acked_calls += 1;
                match cmd {
                    "incr" => self.obj(name).acked += 1,
                    "timer" => {
                        self.obj(name).alarms.insert(tag);
                    }
                    _ => {}
                }
            }
            Outcome::Unknown { .. } => {
                self.unknown_calls += 1;
                if cmd == "incr" {
                    self.obj(name).unknown += 1;
                }
            }
        }
    }

    fn alarms(&self) -> BTreeSet<String> {
        self.objs
            .values()
            .flat_map(|o| o.alarms.iter().cloned())
            .collect()
    }
}

async fn work(c: &mut Cluster, ledger: &mut Ledger, commands: &[String]) -> Result<Vec<Outcome>> {
    let outcomes = c.calls(commands).await?;
    for (cmd, o) in commands.iter().zip(&outcomes) {
        ledger.account(cmd, o);
        if let Outcome::Unknown { host, line } = o {
            println!("  {cmd} on {host}: outcome unknown ({line})");
        }
    }
    Ok(outcomes)
}

/// First and last acknowledgement time of `outcomes`, and by which hosts.
fn acked_span(outcomes: &[Outcome]) -> (Option<i64>, Option<i64>, BTreeMap<String, usize>) {
    let mut by = BTreeMap::new();
    let (mut first, mut last) = (None::<i64>, None::<i64>);
    for o in outcomes {
        if let Outcome::Ok { host, at, .. } = o {
            *by.entry(host.clone()).or_insert(0) += 1;
            first = Some(first.map_or(*at, |f| f.min(*at)));
            last = Some(last.map_or(*at, |l| l.max(*at)));
        }
    }
    (first, last, by)
}

fn counts_list(counts: &BTreeMap<String, usize>) -> String {
    counts
        .iter()
        .map(|(t, n)| format!("{t}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn hosts_list(by: &BTreeMap<String, usize>) -> String {
    by.iter()
        .map(|(h, n)| format!("{n} on {h}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn incrs(names: &[String]) -> Vec<String> {
    names.iter().map(|n| format!("incr {n}")).collect()
}

fn timers(names: &[String], phase: &str, delay_ms: u64) -> Vec<String> {
    names
        .iter()
        .map(|n| format!("timer {n} {phase}-{n} {delay_ms}"))
        .collect()
}

/// `per_shard` object names in each shard (the first names that hash there).
fn objects(c: &Cluster, per_shard: usize) -> Result<BTreeMap<u32, Vec<String>>> {
    let mut by_shard: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut i = 0;
    while by_shard.len() < c.count.get() as usize || by_shard.values().any(|v| v.len() < per_shard)
    {
        let name = format!("o{i:03}");
        let list = by_shard.entry(c.scope(&name)?.shard()).or_default();
        if list.len() < per_shard {
            list.push(name);
        }
        i += 1;
    }
    Ok(by_shard)
}

/// The figures of the closing table.
#[derive(Default)]
struct Figures {
    kill_first_ms: i64,
    kill_all_ms: i64,
    kill_alarms: (usize, usize, i64),
    stop_first_ms: i64,
    refused_fenced: u64,
    refused_cancelled: u64,
    stale_landed: u64,
    drain_first_ms: i64,
    drain_all_ms: i64,
    drain_ms: i64,
}

const TASKS: [&str; 3] = ["a", "b", "c"];

async fn scene(c: &mut Cluster) -> Result {
    let mut ledger = Ledger::default();
    let mut fig = Figures::default();
    let by_shard = objects(c, PER_SHARD)?;
    let names: Vec<String> = by_shard.values().flatten().cloned().collect();

    // Placement: the hosts balance the class's shards themselves (presence
    // records on the lease store, an even share each, graceful hand-off),
    // so the first host's shards spread as the others join.
    for task in TASKS {
        c.spawn(task).await?;
    }
    println!("started hosts a, b, c (pids {})", {
        let pids: Vec<String> = c.procs.values().map(|p| p.pid().to_string()).collect();
        pids.join(", ")
    });
    c.balanced("start").await?;
    let owners = c.owners().await?;
    for task in TASKS {
        let shards: Vec<String> = owners
            .iter()
            .filter(|(_, o)| o.as_deref() == Some(task))
            .map(|(s, _)| s.to_string())
            .collect();
        println!("host {task} owns shards [{}]", shards.join(", "));
    }

    // Work on every object: increments, and an alarm each.
    let mut placed = Vec::new();
    for _ in 0..4 {
        placed.extend(incrs(&names));
    }
    placed.extend(timers(&names, "warm", 500));
    let outcomes = work(c, &mut ledger, &placed).await?;
    let (_, _, by) = acked_span(&outcomes);
    println!(
        "placed {} calls on {} objects in {SHARDS} shards: {}",
        placed.len(),
        names.len(),
        hosts_list(&by)
    );
    let warm: BTreeSet<String> = names.iter().map(|n| format!("warm-{n}")).collect();
    let fired = c.wait_fired(&warm).await;
    let mut by_task: BTreeMap<String, usize> = BTreeMap::new();
    for (_, t) in fired.values() {
        *by_task.entry(t.clone()).or_insert(0) += 1;
    }
    println!(
        "{} of {} alarms (one per object, due 0.5 s after it was set) fired: {}",
        fired.len(),
        warm.len(),
        hosts_list(&by_task)
    );

    kill_phase(c, &mut ledger, &mut fig, &names).await?;
    // A replacement host, as an operator would start one: it owns nothing
    // until a scope is free, and routes the calls it gets to the owners.
    c.balanced("the kill").await?;
    c.spawn("d").await?;
    println!("started host d in place of the killed host");
    work(c, &mut ledger, &incrs(&names)).await?;
    c.balanced("d joined").await?;
    stop_phase(c, &mut ledger, &mut fig, &names).await?;
    work(c, &mut ledger, &incrs(&names)).await?;
    c.balanced("the pause").await?;
    drain_phase(c, &mut ledger, &mut fig, &names).await?;
    work(c, &mut ledger, &incrs(&names)).await?;
    c.balanced("the drain").await?;

    // The end: every alarm set has had its chance to fire; read every
    // object back through a host, then drain the last one.
    let set = ledger.alarms();
    let missing = set.len() - c.wait_fired(&set).await.len();
    if missing > 0 {
        // A delivery that failed (its owner dead or paused, a store call
        // timed out) is retried after a backoff of up to the retry cap.
        let fired = c.wait_fired_for(&set, RETRY_MAX_DELAY_MS).await.len();
        println!(
            "{missing} alarms had not fired {ALARM_WAIT_MS} ms after the last phase; {} of them fired within one more retry cap ({RETRY_MAX_DELAY_MS} ms)",
            missing - (set.len() - fired)
        );
    }
    let reads: Vec<String> = names.iter().map(|n| format!("read {n}")).collect();
    let outcomes = c.calls(&reads).await?;
    let mut lost_increments = 0;
    let mut unaccounted = 0;
    let mut fired_tags: BTreeSet<String> = BTreeSet::new();
    let mut read_on = BTreeMap::new();
    for (name, o) in names.iter().zip(&outcomes) {
        let Outcome::Ok { line, host, .. } = o else {
            return Err(format!("the final read of {name} has an unknown outcome").into());
        };
        *read_on.entry(host.clone()).or_insert(0) += 1;
        let value: u64 = field(line, "value").ok_or("read has value=")?.parse()?;
        let obj = ledger.obj(name);
        lost_increments += obj.acked.saturating_sub(value);
        unaccounted += value.saturating_sub(obj.acked + obj.unknown);
        let fired = field(line, "fired").ok_or("read has fired=")?;
        for entry in fired.split(',').filter(|e| *e != "-") {
            let tag = entry.split_once('@').map_or(entry, |(t, _)| t);
            fired_tags.insert(tag.to_owned());
        }
    }
    // What the surviving hosts routed (the killed and drained hosts'
    // counters went with them).
    let mut routed: BTreeMap<&str, u64> = BTreeMap::new();
    let live: Vec<String> = c.live.iter().cloned().collect();
    for t in &live {
        let id = c.send(t, "probe")?;
        let (_, report) = c.proc(t)?.wait_answer(id, 10_000).await?;
        for k in ["forwarded", "direct", "rediscoveries", "alarms_forwarded"] {
            *routed.entry(k).or_insert(0) += field(&report, k).unwrap_or("0").parse::<u64>()?;
        }
    }
    println!(
        "read every object back through hosts {} (ran: {})",
        live.join(", "),
        hosts_list(&read_on)
    );
    c.drain_all().await?;
    let lost_alarms: Vec<&String> = set.difference(&fired_tags).collect();
    let lost = lost_increments + lost_alarms.len() as u64;
    // What the objects with an alarm that never fired hold (their pending
    // tags and what fired), for the diagnosis.
    for (name, o) in names.iter().zip(&outcomes) {
        if let Outcome::Ok { line, host, .. } = o
            && lost_alarms.iter().any(|t| t.ends_with(&format!("-{name}")))
        {
            println!("object {name} with an alarm that never fired, read on {host}: {line}");
        }
    }

    println!();
    println!("| figure                                              | value |");
    println!("|-----------------------------------------------------|-------|");
    let routed_row = |k: &str| routed.get(k).copied().unwrap_or(0).to_string();
    let failover = format!(
        "failover after SIGKILL, ms (budget {})",
        TTL_MS + INTERVAL_MS
    );
    let drain_move = format!("move after SIGTERM drain, ms (lease {TTL_MS})");
    #[rustfmt::skip]
    let rows = [
        ("objects", names.len().to_string()),
        ("calls acknowledged (increments, alarms set)", ledger.acked_calls.to_string()),
        ("calls with an unknown outcome", ledger.unknown_calls.to_string()),
        ("calls refused before they started, sent again", c.retried.to_string()),
        ("calls forwarded to the owner (surviving hosts)", routed_row("forwarded")),
        ("  sent straight to an owner hint", routed_row("direct")),
        ("  rediscoveries after a takeover", routed_row("rediscoveries")),
        ("alarm deliveries forwarded to the owner", routed_row("alarms_forwarded")),
        ("alarms set", set.len().to_string()),
        ("alarms fired", set.intersection(&fired_tags).count().to_string()),
        (&failover, fig.kill_first_ms.to_string()),
        ("  all of its objects answering elsewhere, ms", fig.kill_all_ms.to_string()),
        ("  its pending alarms fired on survivors", format!("{}/{}", fig.kill_alarms.0, fig.kill_alarms.1)),
        ("  last of them, ms after the kill", fig.kill_alarms.2.to_string()),
        ("takeover after SIGSTOP, ms", fig.stop_first_ms.to_string()),
        ("refused stale commits (fence / watchdog)", format!("{}/{}", fig.refused_fenced, fig.refused_cancelled)),
        ("stale writes landed", fig.stale_landed.to_string()),
        (&drain_move, fig.drain_first_ms.to_string()),
        ("  all of its objects answering elsewhere, ms", fig.drain_all_ms.to_string()),
        ("  drain itself, ms", fig.drain_ms.to_string()),
        ("writes not accounted for", unaccounted.to_string()),
        ("lost work", lost.to_string()),
    ];
    for (k, v) in rows {
        println!("| {k:<51} | {v:>5} |");
    }
    if lost > 0 || fig.stale_landed > 0 || unaccounted > 0 {
        return Err(format!(
            "cluster scene: lost work {lost} ({lost_increments} increments, alarms {lost_alarms:?}), {} stale writes landed, {unaccounted} writes not accounted for",
            fig.stale_landed
        )
        .into());
    }
    println!("no acknowledged work was lost.");
    Ok(())
}

/// The host owning the most of `names` and its objects, announced as the
/// next to get `signal`; each of its objects gets an alarm (tagged
/// `phase`) due `delay_ms` later.
async fn busiest_with_alarms(
    c: &mut Cluster,
    ledger: &mut Ledger,
    names: &[String],
    signal: &str,
    phase: &str,
    delay_ms: u64,
) -> Result<(String, Vec<String>)> {
    let (host, shards, objs) = c.busiest_objects(names).await?;
    println!();
    println!(
        "-- {signal} host {host} ({shards} shards, {} objects), each object with an alarm due {} s later",
        objs.len(),
        delay_ms as f64 / 1000.0
    );
    work(c, ledger, &timers(&objs, phase, delay_ms)).await?;
    Ok((host, objs))
}

async fn kill_phase(
    c: &mut Cluster,
    ledger: &mut Ledger,
    fig: &mut Figures,
    names: &[String],
) -> Result {
    let (k, objs) = busiest_with_alarms(c, ledger, names, "SIGKILL", "kill", 1_500).await?;
    let killed = now_ms();
    let p = c.procs.get_mut(&k).ok_or("victim")?;
    p.signal("KILL")?;
    c.live.remove(&k);
    c.procs
        .get_mut(&k)
        .ok_or("victim")?
        .wait_exit(10_000)
        .await?;
    let outcomes = work(c, ledger, &incrs(&objs)).await?;
    let (first, last, by) = acked_span(&outcomes);
    fig.kill_first_ms = first.map_or(-1, |t| t - killed);
    fig.kill_all_ms = last.map_or(-1, |t| t - killed);
    println!(
        "first call on a survivor for one of its objects {} ms after the kill, all {} answering after {} ms ({}); budget: lease + renew interval = {} ms",
        fig.kill_first_ms,
        objs.len(),
        fig.kill_all_ms,
        hosts_list(&by),
        TTL_MS + INTERVAL_MS
    );
    let (fired, alarms, on_survivors) = c.phase_alarms(&objs, "kill", &k).await;
    let worst = fired
        .values()
        .map(|(at, _)| at - killed)
        .max()
        .unwrap_or(-1);
    fig.kill_alarms = (on_survivors, alarms, worst);
    let mut by_task: BTreeMap<String, usize> = BTreeMap::new();
    for (_, t) in fired.values() {
        *by_task.entry(t.clone()).or_insert(0) += 1;
    }
    println!(
        "its pending alarms: {on_survivors} of {alarms} fired on survivors ({}), the last {worst} ms after the kill (due 1.5 s after it was set; reference: lease + renew interval + dispatcher poll + one owner-wait retry = {} ms, plus the delivery; a survivor that claims a job whose scope the other survivor took forwards it there)",
        hosts_list(&by_task),
        alarm_budget_ms()
    );
    Ok(())
}

async fn stop_phase(
    c: &mut Cluster,
    ledger: &mut Ledger,
    fig: &mut Figures,
    names: &[String],
) -> Result {
    let (p, shards, objs) = c.busiest_objects(names).await?;
    let target = objs
        .first()
        .cloned()
        .ok_or("the paused host owns no object")?;
    println!();
    println!(
        "-- SIGSTOP host {p} ({shards} shards, {} objects) past its lease, inside `slow {target}`: one write committed, the second due after a 1 s pause",
        objs.len()
    );
    work(c, ledger, &timers(&objs, "stop", 1_000)).await?;
    let id = slow_started(c, &p, &target).await?;
    ledger.obj(&target).acked += 1;
    ledger.acked_calls += 1;
    c.proc(&p)?.signal("STOP")?;
    let stopped = now_ms();
    c.live.remove(&p);
    // Sent to the lease store's owner: routed, a call to the paused owner
    // would time out with an unknown outcome.
    c.route = false;
    let outcomes = work(c, ledger, &incrs(&objs)).await;
    c.route = true;
    let outcomes = outcomes?;
    let (first, _, by) = acked_span(&outcomes);
    fig.stop_first_ms = first.map_or(-1, |t| t - stopped);
    let before = outcomes
        .iter()
        .zip(&objs)
        .find_map(|(o, n)| match o {
            Outcome::Ok { line, .. } if *n == target => field(line, "value")?.parse::<u64>().ok(),
            _ => None,
        })
        .ok_or("the survivor's write to the slow call's object was not acknowledged")?;
    println!(
        "a survivor took over {} ms after the pause ({}); {target} = {before} after its write there",
        fig.stop_first_ms,
        hosts_list(&by)
    );
    c.proc(&p)?.signal("CONT")?;
    let (_, answer) = c.proc(&p)?.wait_answer(id, 20_000).await?;
    println!("SIGCONT: host {p}'s late call ended with: {answer}");
    let refused =
        answer.contains("code=host_fenced") || answer.contains("code=host_ownership_lost");
    c.live.insert(p.clone());
    let after = work(c, ledger, &incrs(std::slice::from_ref(&target))).await?;
    let now = match after.first() {
        Some(Outcome::Ok { line, .. }) => field(line, "value")
            .ok_or("incr has value=")?
            .parse::<u64>()?,
        _ => return Err(format!("the check write to {target} has an unknown outcome").into()),
    };
    if answer.contains(" ok ") || now != before + 1 {
        fig.stale_landed += 1;
        // Keep the ledger exact: the late write is in the object.
        ledger.obj(&target).acked += 1;
        println!(
            "STALE WRITE LANDED: {target} = {now} after the survivor's next write (expected {})",
            before + 1
        );
    } else {
        println!(
            "{target} = {now} after the survivor's next write: the paused host's late write never landed{}",
            if refused {
                ""
            } else {
                " (its call was not refused by the fence)"
            }
        );
    }
    let id = c.send(&p, "probe")?;
    let (_, report) = c.proc(&p)?.wait_answer(id, 10_000).await?;
    println!("host {p}'s own report: {report}");
    fig.refused_fenced = field(&report, "fenced").unwrap_or("0").parse()?;
    fig.refused_cancelled = field(&report, "lost").unwrap_or("0").parse()?;
    let (_, alarms, elsewhere) = c.phase_alarms(&objs, "stop", &p).await;
    println!(
        "its pending alarms: {elsewhere} of {alarms} fired on the survivor while it was paused"
    );
    Ok(())
}

/// Sends `slow <target> 1000` to `p` until its first write committed (a
/// call refused before it started is sent again); returns its request id.
async fn slow_started(c: &mut Cluster, p: &str, target: &str) -> Result<u64> {
    let end = now_ms() + CALL_DEADLINE_MS;
    loop {
        let id = c.send(p, &format!("slow {target} 1000"))?;
        loop {
            let proc = c.proc(p)?;
            if !proc.lines(&format!("slow-wrote {id} ")).is_empty() {
                return Ok(id);
            }
            if let Some((_, answer)) = proc.answer(id) {
                if !answer.contains(" outcome=not_started ") {
                    return Err(format!(
                        "`slow {target}` on {p} ended before its first write was reported: {answer}"
                    )
                    .into());
                }
                c.retried += 1;
                break;
            }
            if now_ms() > end {
                return Err(format!("`slow {target}` on {p} did not start:{}", proc.tail()).into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn drain_phase(
    c: &mut Cluster,
    ledger: &mut Ledger,
    fig: &mut Figures,
    names: &[String],
) -> Result {
    let (d, objs) = busiest_with_alarms(c, ledger, names, "SIGTERM (drain)", "drain", 700).await?;
    let term = now_ms();
    c.proc(&d)?.signal("TERM")?;
    c.live.remove(&d);
    let outcomes = work(c, ledger, &incrs(&objs)).await?;
    let (first, last, by) = acked_span(&outcomes);
    fig.drain_first_ms = first.map_or(-1, |t| t - term);
    fig.drain_all_ms = last.map_or(-1, |t| t - term);
    let (at, drained) = c
        .proc(&d)?
        .wait_lines("drained ", 1, 15_000)
        .await?
        .remove(0);
    fig.drain_ms = at - term;
    let status = c
        .procs
        .get_mut(&d)
        .ok_or("drained host")?
        .wait_exit(10_000)
        .await?;
    println!(
        "host {d}: {drained} in {} ms ({status}); first call elsewhere {} ms after the signal, all {} answering after {} ms ({}); lease {TTL_MS} ms",
        fig.drain_ms,
        fig.drain_first_ms,
        objs.len(),
        fig.drain_all_ms,
        hosts_list(&by)
    );
    if let Some((name, Outcome::Ok { entered, host, .. })) = objs
        .iter()
        .zip(&outcomes)
        .find(|(_, o)| matches!(o, Outcome::Ok { entered, host, .. } if entered != host))
    {
        println!(
            "redirected after the takeover: `incr {name}` entered host {entered}, which routed it to the new owner {host} (where it ran once)"
        );
    }
    let (_, alarms, elsewhere) = c.phase_alarms(&objs, "drain", &d).await;
    println!("its pending alarms: {elsewhere} of {alarms} fired on the host that took over");
    Ok(())
}

/// Failover times for `bench host`: `rounds` times, the owner of every
/// shard is killed (SIGKILL) and the time from the signal to the first
/// successful call on the standby is measured; then `rounds` times the
/// owner is drained (SIGTERM) instead. SQLite lease store and alarm index.
pub(crate) struct FailoverTimes {
    /// Signal → first successful call on the survivor, per kill (ms).
    pub(crate) kill_ms: Vec<i64>,
    /// Signal → first successful call on the survivor, per drain (ms).
    pub(crate) drain_ms: Vec<i64>,
}

/// Runs the failover rounds of `bench host` on the stores of `backing`
/// (balancing off: the owner holds every shard until it dies or drains).
pub(crate) async fn failover_times(rounds: usize, backing: Backing) -> Result<FailoverTimes> {
    let run = Run::open(backing, SHARDS).await?.balance(false);
    eprintln!(
        "host failover: {}; {}",
        lease_settings(SHARDS),
        run.describe()
    );
    let mut c = Cluster::new(run).await?;
    let times = failover_rounds(&mut c, rounds).await;
    c.procs.clear();
    c.run.clean_up().await?;
    times
}

async fn failover_rounds(c: &mut Cluster, rounds: usize) -> Result<FailoverTimes> {
    // These figures time ownership moving, not routing: each call goes to
    // the lease store's live owner or the standby, as a client with a fresh
    // view would send it. (Routed through the standby, a call sent in the
    // instant after the SIGKILL can reach the dying owner and come back
    // with an unknown outcome.)
    c.route = false;
    let names: Vec<String> = objects(c, 1)?.into_values().flatten().collect();
    let mut n = 0;
    let mut owner = format!("h{n}");
    c.spawn(&owner).await?;
    c.proc(&owner)?
        .wait_lines("acquired ", SHARDS as usize, 30_000)
        .await?;
    c.calls(&incrs(&names)).await?;
    let mut times = FailoverTimes {
        kill_ms: Vec::new(),
        drain_ms: Vec::new(),
    };
    for round in 0..2 * rounds {
        n += 1;
        let standby = format!("h{n}");
        c.spawn(&standby).await?;
        let sig = if round < rounds { "KILL" } else { "TERM" };
        let t = now_ms();
        c.proc(&owner)?.signal(sig)?;
        c.live.remove(&owner);
        let outcomes = c.calls(&incrs(&names)).await?;
        let (first, _, by) = acked_span(&outcomes);
        let ms = first.ok_or("no call was acknowledged after the failover")? - t;
        if by.keys().any(|h| *h != standby) {
            return Err(format!("calls answered by {by:?}, expected {standby}").into());
        }
        c.procs
            .get_mut(&owner)
            .ok_or("old owner")?
            .wait_exit(15_000)
            .await?;
        c.procs.remove(&owner);
        eprintln!(
            "host failover: SIG{sig} of the owner of {SHARDS} shards → first call on the standby after {ms} ms"
        );
        if sig == "KILL" {
            times.kill_ms.push(ms);
        } else {
            times.drain_ms.push(ms);
        }
        owner = standby;
    }
    if let Some(p) = c.procs.get(&owner) {
        p.signal("TERM")?;
        p.wait_lines("drained ", 1, 15_000).await?;
    }
    Ok(times)
}

/// `bench host`'s share figures (see [`share`]).
pub(crate) struct Share {
    /// Two hosts started → every live host holds its even share (ms).
    pub(crate) join_ms: i64,
    /// Shards per host once even.
    pub(crate) shards: BTreeMap<String, usize>,
    /// Calls each host ran (the owner it was routed to), by host.
    pub(crate) served: BTreeMap<String, usize>,
    /// Calls with an unknown outcome (none expected).
    pub(crate) unknown: usize,
    /// Whether a shard moved during the load.
    pub(crate) moved: bool,
}

/// Starts one host (it claims every shard of `shards`), adds two and
/// times them receiving their share; then sends `calls` increments over
/// `objects` objects (uniform, round robin over the entry hosts, routed to
/// the owners; 64 in flight) and counts the calls each host ran. SQLite stores, the
/// scene's lease settings.
pub(crate) async fn share(shards: u32, objects: usize, calls: usize) -> Result<Share> {
    let run = Run::open(Backing::Sqlite, shards).await?;
    eprintln!("host share: {}; {}", lease_settings(shards), run.describe());
    let mut c = Cluster::new(run).await?;
    let share = share_rounds(&mut c, objects, calls).await;
    c.procs.clear();
    c.run.clean_up().await?;
    share
}

async fn share_rounds(c: &mut Cluster, objects: usize, calls: usize) -> Result<Share> {
    c.spawn("a").await?;
    let all = usize::try_from(c.count.get())?;
    c.proc("a")?.wait_lines("acquired ", all, 30_000).await?;
    let joined = now_ms();
    c.spawn("b").await?;
    c.spawn("c").await?;
    let (join_ms, shards) = c.even_since(joined).await?;
    let names: Vec<String> = (0..objects).map(|i| format!("u{i:05}")).collect();
    let commands: Vec<String> = (0..calls)
        .map(|i| format!("incr {}", names[i % objects]))
        .collect();
    // At most 64 calls in flight (a client's window, not a flood of
    // forwarded calls timing out on a loaded machine).
    let mut outcomes = Vec::new();
    for chunk in commands.chunks(64) {
        outcomes.extend(c.calls(chunk).await?);
    }
    let (_, _, served) = acked_span(&outcomes);
    let unknown: Vec<&String> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Unknown { line, .. } => Some(line),
            Outcome::Ok { .. } => None,
        })
        .collect();
    if let Some(first) = unknown.first() {
        eprintln!(
            "host share: {} calls with an unknown outcome, the first: {first}",
            unknown.len()
        );
    }
    let unknown = unknown.len();
    let (_, after) = c.even_since(now_ms()).await?;
    c.drain_all().await?;
    Ok(Share {
        join_ms,
        moved: after != shards,
        shards,
        served,
        unknown,
    })
}
