//! `durability`: the operator CLI.
//!
//! Every command reads (or, for mutating commands, changes through the
//! crates' own APIs) stored state of the durability crates; it holds no SQL
//! and no Redis commands of its own. Reports are the crates' `Serialize`
//! types: `--json` prints one JSON document on stdout, otherwise a short
//! human rendering. Bad input is one line on stderr and exit code 1.
//!
//! Commands:
//!
//! - `durability object inspect <file>`: an object database's capabilities,
//!   their schema versions and due times, and its one alarm. The file is
//!   opened read-only and never created.
//! - `durability outbox list <file> [--channel C] [--limit N]`: stored outbox
//!   rows (read-only) with their state, and quarantine counts.
//! - `durability outbox retry|discard <file> --channel C --key K [--yes]`:
//!   makes an entry due now, or removes it, in one scheduler transaction
//!   that moves the object's alarm. Without `--yes` it asks on a terminal
//!   and refuses otherwise.
//! - `durability alarms jobs|counts (--sqlite <file> | --redis <url>)
//!   [--prefix P]`: a page of the alarm index's jobs by object-id prefix, or
//!   its counts (read-only).
//! - `durability leases list (--sqlite <file> | --redis <url> [--prefix P])`:
//!   live owner leases with owner, generation and lease left (read-only).
//! - `durability migrations status|recover|verify|purge|rebalance|abort
//!   --config <file>`: the migration journal of a shard set described by a
//!   JSON config file (see the `migrations` module): its operations and
//!   counts (read-only), recovery of interrupted moves, verification (with
//!   `--repair`), purge of archives, rebalancing, and an operator's abort.
//!   Every command except `status`, `verify` without `--repair` and
//!   `rebalance --dry-run` changes stored state and needs `--yes` (or a `y`
//!   on a terminal). Long runs show a progress line on stderr when it is a
//!   terminal. A command that ran but left something unsettled (verify not
//!   clean, recovery or rebalance moves that failed) exits with code 2 after
//!   printing its report.
#![doc = include_str!("../docs/commands.md")]
#![doc = include_str!("../docs/cli.md")]

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use durability_alarms::listing;
use durability_outbox::admin;
use durability_scheduler::{Clock, ObjectContext, ObjectId, Scheduler, SystemClock};
use durability_storage_redis::alarms::{IndexTime, RedisAlarmIndex};
use durability_storage_redis::ownership::RedisLeaseStore;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::{SqliteOptions, SqliteStorage};
use indicatif::{ProgressBar, ProgressStyle};

mod migrations;
mod objects;
mod render;

/// Operator tools for durability object databases.
#[derive(Debug, Parser)]
#[command(name = "durability", version, about)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
struct Global {
    /// Print one JSON document on stdout instead of the human rendering.
    #[arg(long, global = true)]
    json: bool,
    /// Read due state as of this time (ms since the Unix epoch) instead of
    /// the system clock.
    #[arg(long, global = true, value_name = "MS")]
    now_ms: Option<i64>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One object database.
    #[command(subcommand)]
    Object(ObjectCommand),
    /// Stored outbox entries of an object database.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// The alarm job index (SQLite file or Redis).
    #[command(subcommand)]
    Alarms(AlarmsCommand),
    /// Owner leases (SQLite lease store file or Redis).
    #[command(subcommand)]
    Leases(LeasesCommand),
    /// The migration journal of a shard set (a JSON config file).
    #[command(subcommand)]
    Migrations(MigrationsCommand),
    /// Objects of an object store (the SQLite directory or PostgreSQL):
    /// list a class, export one object, import it into another store.
    #[command(subcommand)]
    Objects(objects::ObjectsCommand),
}

#[derive(Debug, Subcommand)]
enum MigrationsCommand {
    /// Operations of the journal with their state, key, source and
    /// destination, and the counts per state (read-only).
    Status {
        #[command(flatten)]
        config: ConfigArg,
        /// Only operations in this state (prepared, copied, verified,
        /// cutover_pending, committed, published, retired, aborted).
        #[arg(long, value_parser = parse_state)]
        state: Option<durability_migration::MoveState>,
        /// Only operations that have not ended.
        #[arg(long)]
        active: bool,
        /// Only operations of this key.
        #[arg(long)]
        key: Option<String>,
        /// List at most this many operations.
        #[arg(long, default_value_t = durability_migration::DEFAULT_STATUS_LIMIT)]
        limit: usize,
    },
    /// Finish or abort every interrupted move (takes the recovery lease).
    Recover {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Look for leftovers of stalled moves; with `--repair`, recover first
    /// and repair what can be proven. Records the pass on the journal shard
    /// (purge needs one); changes no row without `--repair`.
    Verify {
        #[command(flatten)]
        config: ConfigArg,
        /// Recover and repair (changes stored state: needs --yes).
        #[arg(long)]
        repair: bool,
        /// Rows read per page.
        #[arg(long, default_value_t = 500)]
        page_size: usize,
        /// Examine every finished move and every tombstone on every shard,
        /// not only the moves no pass has examined yet (after restoring a
        /// shard or the mapping store).
        #[arg(long)]
        full: bool,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Clear the archived payload of retired moves whose retention elapsed
    /// and that a verification pass covered.
    Purge {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Move every mapped key to its hash owner among the target shards.
    Rebalance {
        #[command(flatten)]
        config: ConfigArg,
        /// The target shard set (default: every configured shard).
        #[arg(long, value_delimiter = ',')]
        to: Vec<String>,
        /// The tables whose rows move (default: every configured table).
        #[arg(long = "table")]
        tables: Vec<String>,
        /// Plan only; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Keep each move's archived source rows this long before purge may
        /// clear them (default seven days).
        #[arg(long, value_name = "MS")]
        retain_ms: Option<u64>,
        /// Mappings read per page.
        #[arg(long, default_value_t = 500)]
        page_size: usize,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Abort one move that has not cut over (its destination copies are
    /// dropped; the key stays on its source).
    Abort {
        #[command(flatten)]
        config: ConfigArg,
        /// The operation id (see `migrations status`).
        #[arg(long = "op")]
        op_id: String,
        #[command(flatten)]
        confirm: Confirm,
    },
}

/// The shard set's config file.
#[derive(Debug, Args)]
struct ConfigArg {
    /// The JSON config file naming the shards, mapping store, journal and
    /// tables.
    #[arg(long = "config", value_name = "FILE")]
    file: PathBuf,
}

/// The confirmation of a mutating command.
#[derive(Debug, Args)]
struct Confirm {
    /// Change stored state without asking.
    #[arg(long)]
    yes: bool,
}

fn parse_state(s: &str) -> Result<durability_migration::MoveState, String> {
    durability_migration::MoveState::parse(s).map_err(|_| format!("unknown state {s:?}"))
}

#[derive(Debug, Subcommand)]
enum LeasesCommand {
    /// One page of live leases: scope, owner, generation and lease left.
    List {
        #[command(flatten)]
        store: BackendArgs,
        /// The shard count the scopes were made with.
        #[arg(long, default_value_t = durability_ownership::DEFAULT_SHARD_COUNT)]
        shards: u32,
        /// Leases per page (about, on Redis: `SCAN` counts keys).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// The cursor a previous page printed.
        #[arg(long)]
        cursor: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum AlarmsCommand {
    /// One page of jobs whose object id starts with `--object-prefix`.
    Jobs {
        #[command(flatten)]
        index: BackendArgs,
        /// Only objects whose id starts with this.
        #[arg(long, default_value = "")]
        object_prefix: String,
        /// Jobs per page (about: a Redis scan may return a few more).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// The cursor a previous page printed.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// How many jobs are scheduled (due or running) and ready.
    Counts {
        #[command(flatten)]
        index: BackendArgs,
    },
}

/// Where the alarm index or lease store is.
#[derive(Debug, Args)]
struct BackendArgs {
    /// The SQLite file (opened read-only).
    #[arg(long, required_unless_present = "redis", conflicts_with = "redis")]
    sqlite: Option<PathBuf>,
    /// The Redis URL.
    #[arg(long)]
    redis: Option<String>,
    /// The Redis key prefix.
    #[arg(long, default_value = "", requires = "redis")]
    prefix: String,
}

#[derive(Debug, Subcommand)]
enum OutboxCommand {
    /// Stored rows with version, attempts, next due time and state, and the
    /// quarantine counts (read-only).
    List {
        /// The object's SQLite file.
        file: PathBuf,
        /// Only this channel.
        #[arg(long)]
        channel: Option<String>,
        /// List at most this many rows.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Make an entry due now (attempts kept) and move the object's alarm to
    /// now, so the next driver of the object delivers it.
    Retry(EntryTarget),
    /// Remove an entry (healthy or corrupt) and move the object's alarm to
    /// the channel's next entry.
    Discard(EntryTarget),
}

#[derive(Debug, Args)]
struct EntryTarget {
    /// The object's SQLite file.
    file: PathBuf,
    /// The entry's channel.
    #[arg(long)]
    channel: String,
    /// The entry's key.
    #[arg(long)]
    key: String,
    /// Change the file without asking.
    #[arg(long)]
    yes: bool,
}

#[derive(Debug, Subcommand)]
enum ObjectCommand {
    /// Capabilities, schema versions, due times and the alarm of an object
    /// database (read-only; the file is never created).
    Inspect {
        /// The object's SQLite file.
        file: PathBuf,
    },
}

/// A failed command: its one line for stderr.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Inspect(#[from] durability_storage_sqlite::inspect::InspectError),
    #[error("{}: {source}", file.display())]
    Outbox {
        file: PathBuf,
        source: durability_outbox::OutboxError,
    },
    #[error("{}: opening for writing: {source}", file.display())]
    Open {
        file: PathBuf,
        source: durability_scheduler::StorageError,
    },
    #[error("{}: {source}", file.display())]
    Scheduler {
        file: PathBuf,
        source: durability_scheduler::SchedulerError,
    },
    #[error("{}: {what} of key {key:?} in channel {channel:?}", file.display())]
    Refused {
        file: PathBuf,
        channel: String,
        key: String,
        what: String,
    },
    #[error("pass --sqlite <file> or --redis <url>")]
    NoBackend,
    #[error("{0}")]
    NoObjectStore(String),
    #[error("{code}: {0}", code = .0.code())]
    Move(#[from] durability_host::store::MoveError),
    #[error("lease store: {0}")]
    Ownership(#[from] durability_ownership::OwnershipError),
    #[error(transparent)]
    Runtime(io::Error),
    #[error("alarm index: {0}")]
    Alarms(#[from] durability_alarms::AlarmError),
    #[error("{}: not changed: {reason}", file.display())]
    NotConfirmed { file: PathBuf, reason: &'static str },
    #[error(transparent)]
    Config(#[from] migrations::ConfigError),
    #[error("{}: {source}", file.display())]
    Migration {
        file: PathBuf,
        source: Box<durability_migration::MigrationError>,
    },
    /// The command ran and printed its report, which leaves something
    /// unsettled (exit code 2).
    #[error("{0}")]
    Unsettled(String),
    #[error("writing output: {0}")]
    Output(#[from] io::Error),
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Unsettled(what)) => {
            let _ = writeln!(io::stderr(), "unsettled: {what}");
            ExitCode::from(2)
        }
        Err(e) => {
            // One line: the error and its sources, joined.
            let mut line = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                let text = s.to_string();
                if !line.contains(&text) {
                    line.push_str(": ");
                    line.push_str(&text);
                }
                source = s.source();
            }
            let _ = writeln!(io::stderr(), "error: {}", line.replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), CliError> {
    let now_ms = cli.global.now_ms.unwrap_or_else(|| SystemClock.now_ms());
    let mut out = io::stdout().lock();
    match &cli.command {
        Command::Object(ObjectCommand::Inspect { file }) => {
            let report = durability_storage_sqlite::inspect::inspect_object(file, now_ms)?;
            if cli.global.json {
                emit_json(&mut out, &report)?;
            } else {
                render::object(&mut out, file, &report)?;
            }
        }
        Command::Outbox(OutboxCommand::List {
            file,
            channel,
            limit,
        }) => {
            let listing = durability_storage_sqlite::inspect::outbox_entries(
                file,
                channel.as_deref(),
                now_ms,
                *limit,
            )?;
            if cli.global.json {
                emit_json(&mut out, &listing)?;
            } else {
                render::outbox(&mut out, file, &listing)?;
            }
        }
        Command::Alarms(command) => alarms(&mut out, cli.global.json, command)?,
        Command::Objects(command) => objects::run(&mut out, cli.global.json, command)?,
        Command::Migrations(command) => {
            let ran = migrations_command(&mut out, cli.global.json, cli.global.now_ms, command);
            // An unsettled report is printed before its exit code.
            out.flush()?;
            ran?;
        }
        Command::Leases(LeasesCommand::List {
            store,
            shards,
            limit,
            cursor,
        }) => {
            let count = durability_ownership::ShardCount::new(*shards)?;
            let listing = match (&store.sqlite, &store.redis) {
                (Some(file), _) => durability_storage_sqlite::inspect::leases(
                    file,
                    now_ms,
                    count,
                    cursor.as_deref(),
                    *limit,
                )?,
                (None, Some(url)) => runtime()?.block_on(async {
                    let leases = RedisLeaseStore::connect(url, &store.prefix, count).await?;
                    leases.list_leases(cursor.as_deref(), *limit).await
                })?,
                (None, None) => return Err(CliError::NoBackend),
            };
            if cli.global.json {
                emit_json(&mut out, &listing)?;
            } else {
                render::leases(&mut out, &listing)?;
            }
        }
        Command::Outbox(OutboxCommand::Retry(target)) => {
            let outcome = outbox_admin(target, now_ms, "retry", admin::retry_now)?;
            let show = |out: &mut _, o: &_| render::admin(out, "due now", target, o);
            emit(&mut out, cli.global.json, &outcome, show)?;
        }
        Command::Outbox(OutboxCommand::Discard(target)) => {
            let outcome = outbox_admin(target, now_ms, "discard", admin::discard)?;
            let show = |out: &mut _, o: &_| render::admin(out, "discarded", target, o);
            emit(&mut out, cli.global.json, &outcome, show)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// The runtime of the commands that talk to Redis (or an async index).
fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)
}

/// An alarm index opened for reading.
enum Index {
    Sqlite(SqliteAlarmIndex),
    Redis(Box<RedisAlarmIndex>),
}

fn alarms(out: &mut impl Write, json: bool, command: &AlarmsCommand) -> Result<(), CliError> {
    let runtime = runtime()?;
    let args = match command {
        AlarmsCommand::Jobs { index, .. } | AlarmsCommand::Counts { index } => index,
    };
    runtime.block_on(async {
        let index = match (&args.sqlite, &args.redis) {
            (Some(file), _) => Index::Sqlite(SqliteAlarmIndex::open_read_only(file)?),
            (None, Some(url)) => Index::Redis(Box::new(
                RedisAlarmIndex::connect(url, &args.prefix, IndexTime::Server).await?,
            )),
            (None, None) => return Err(CliError::NoBackend),
        };
        match command {
            AlarmsCommand::Jobs {
                object_prefix,
                limit,
                cursor,
                ..
            } => {
                let cursor = cursor.as_deref();
                let page = match &index {
                    Index::Sqlite(ix) => {
                        listing::list_jobs(ix, object_prefix, cursor, *limit).await
                    }
                    Index::Redis(ix) => {
                        listing::list_jobs(&**ix, object_prefix, cursor, *limit).await
                    }
                }?;
                emit(out, json, &page, render::jobs)
            }
            AlarmsCommand::Counts { .. } => {
                let counts = match &index {
                    Index::Sqlite(ix) => listing::counts(ix).await,
                    Index::Redis(ix) => listing::counts(&**ix).await,
                }?;
                emit(out, json, &counts, render::counts)
            }
        }
    })
}

/// The admin function of `outbox retry` / `outbox discard`.
type AdminFn = fn(
    &mut durability_scheduler::Transaction<'_, '_, SqliteStorage>,
    &str,
    &str,
    i64,
) -> Result<admin::AdminOutcome, durability_outbox::OutboxError>;

/// Checks the file read-only, asks (or requires `--yes`), then runs `f` in
/// one scheduler transaction; an outcome other than done is an error.
fn outbox_admin(
    target: &EntryTarget,
    now_ms: i64,
    verb: &str,
    f: AdminFn,
) -> Result<admin::AdminOutcome, CliError> {
    let file = &target.file;
    // Refuse a missing or foreign file before anything opens it for writing.
    drop(durability_storage_sqlite::inspect::open_object_read_only(
        file,
    )?);
    confirm(target, verb)?;
    let storage =
        SqliteStorage::open(file, SqliteOptions::default()).map_err(|source| CliError::Open {
            file: file.clone(),
            source,
        })?;
    let scheduler_error = |source| CliError::Scheduler {
        file: file.clone(),
        source,
    };
    let id = ObjectId::new("durability-cli").map_err(scheduler_error)?;
    let scheduler =
        Scheduler::new(ObjectContext::new(id, Arc::new(storage))).map_err(scheduler_error)?;
    let outcome = scheduler
        .transaction(|tx| f(tx, &target.channel, &target.key, now_ms))
        .map_err(|source| CliError::Outbox {
            file: file.clone(),
            source,
        })?;
    let refused = |what: String| CliError::Refused {
        file: file.clone(),
        channel: target.channel.clone(),
        key: target.key.clone(),
        what,
    };
    match outcome {
        admin::AdminOutcome::Done { .. } => Ok(outcome),
        admin::AdminOutcome::NotFound => Err(refused("no stored entry".to_owned())),
        admin::AdminOutcome::InFlight { claimed_until } => Err(refused(format!(
            "an attempt is in flight until {claimed_until}; nothing changed"
        ))),
        admin::AdminOutcome::Corrupt { problem } => Err(refused(format!(
            "the row is corrupt ({problem}); nothing changed"
        ))),
        _ => Err(refused("unexpected outcome; nothing changed".to_owned())),
    }
}

/// `--yes`, or a `y` typed on a terminal.
fn confirm(target: &EntryTarget, verb: &str) -> Result<(), CliError> {
    ask(
        target.yes,
        &target.file,
        &format!(
            "{verb} key {:?} of channel {:?} in {}?",
            target.key,
            target.channel,
            target.file.display()
        ),
    )
}

/// `yes`, or a `y` typed on a terminal after `question`; refuses off a
/// terminal. `file` names what would have changed.
fn ask(yes: bool, file: &Path, question: &str) -> Result<(), CliError> {
    if yes {
        return Ok(());
    }
    let not_confirmed = |reason| CliError::NotConfirmed {
        file: file.to_owned(),
        reason,
    };
    if !(io::stdin().is_terminal() && io::stderr().is_terminal()) {
        return Err(not_confirmed("pass --yes (stdin is not a terminal)"));
    }
    let mut err = io::stderr();
    write!(err, "{question} [y/N] ")?;
    err.flush()?;
    let mut answer = String::new();
    io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(not_confirmed("not confirmed"))
    }
}

/// Writes `value` as JSON when `json`, else as `render` writes it.
fn emit<W: Write, T: serde::Serialize>(
    out: &mut W,
    json: bool,
    value: &T,
    render: impl FnOnce(&mut W, &T) -> io::Result<()>,
) -> Result<(), CliError> {
    if json {
        emit_json(out, value)
    } else {
        Ok(render(out, value)?)
    }
}

fn emit_json(out: &mut impl Write, value: &impl serde::Serialize) -> Result<(), CliError> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)?;
    Ok(())
}

/// A spinner with a message on stderr when stderr is a terminal; hidden
/// otherwise (pipes, files, tests).
fn progress_line(message: &str) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed}] {msg}") {
        bar.set_style(style);
    }
    bar.set_message(message.to_owned());
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Shows a progress event on the spinner.
fn show_progress(bar: &ProgressBar, p: durability_migration::Progress) {
    bar.set_message(format!(
        "{}: {} examined, {} changed",
        p.phase, p.done, p.changed
    ));
}

/// Runs `work` with a [`progress_line`] showing `message` (the work may
/// report its progress on it) and clears the line once the work ends.
async fn with_progress<T>(message: &str, work: impl AsyncFnOnce(&ProgressBar) -> T) -> T {
    let bar = progress_line(message);
    let result = work(&bar).await;
    bar.finish_and_clear();
    result
}

/// `durability migrations ...`: opens the router (writing nothing), checks
/// the journal can be read, asks for mutating commands, runs, prints.
fn migrations_command(
    out: &mut impl Write,
    json: bool,
    now_ms: Option<i64>,
    command: &MigrationsCommand,
) -> Result<(), CliError> {
    use MigrationsCommand as C;
    use durability_migration::{
        MigrationError, MoveOptions, MoveState, RebalanceOptions, Retire, StatusOptions,
        VerifyOptions,
    };
    let (C::Status { config, .. }
    | C::Recover { config, .. }
    | C::Verify { config, .. }
    | C::Purge { config, .. }
    | C::Rebalance { config, .. }
    | C::Abort { config, .. }) = command;
    let file = &config.file;
    // `status` reads as of exactly `--now-ms`; a changing command's clock
    // starts there and runs on (leases and liveness need time to pass).
    let clock: Arc<dyn Clock> = match (now_ms, command) {
        (Some(ms), C::Status { .. }) => Arc::new(durability_migration::ManualClock::new(ms)),
        (Some(ms), _) => Arc::new(durability_time::ShiftedClock::starting_at(ms)),
        (None, _) => Arc::new(SystemClock),
    };
    let failed = |source| CliError::Migration {
        file: file.clone(),
        source: Box::new(source),
    };
    runtime()?.block_on(async {
        let router = migrations::open(file, clock).await?;
        // Before asking: the journal is configured, its tables exist and
        // they read (a read-only query).
        let preflight = || async {
            router
                .migration_status(&StatusOptions {
                    limit: 1,
                    ..StatusOptions::default()
                })
                .await
                .map(drop)
                .map_err(failed)
        };
        let preflight_and_ask = async |yes: bool, question: String| {
            preflight().await?;
            ask(yes, file, &question)
        };
        let scope = router.journal_scope().to_owned();
        match command {
            C::Status {
                state,
                active,
                key,
                limit,
                ..
            } => {
                let report = router
                    .migration_status(&StatusOptions {
                        state: *state,
                        active_only: *active,
                        key: key.clone(),
                        op_id: None,
                        limit: *limit,
                    })
                    .await
                    .map_err(failed)?;
                emit(out, json, &report, render::migration_status)
            }
            C::Recover { confirm, .. } => {
                let question = format!("recover the interrupted moves of journal scope {scope:?}?");
                preflight_and_ask(confirm.yes, question).await?;
                let report = with_progress("recovering interrupted moves", async |_| {
                    router.recover_migrations().await
                })
                .await
                .map_err(failed)?;
                emit(out, json, &report, render::recovery)?;
                match report.failed.len() {
                    0 => Ok(()),
                    n => Err(CliError::Unsettled(format!(
                        "{n} operations could not be settled"
                    ))),
                }
            }
            C::Verify {
                repair,
                page_size,
                full,
                confirm,
                ..
            } => {
                if *repair {
                    let question = format!("recover and repair journal scope {scope:?}?");
                    preflight_and_ask(confirm.yes, question).await?;
                } else {
                    preflight().await?;
                }
                let opts = VerifyOptions {
                    repair: *repair,
                    page_size: *page_size,
                    full: *full,
                };
                let report = with_progress("verifying", async |bar| {
                    let shown = |p| show_progress(bar, p);
                    router.verify_migrations_observed(opts, &shown).await
                })
                .await
                .map_err(failed)?;
                emit(out, json, &report, render::verify)?;
                if report.clean {
                    Ok(())
                } else {
                    Err(CliError::Unsettled("verification is not clean".to_owned()))
                }
            }
            C::Purge { confirm, .. } => {
                let question = format!("purge the archives of journal scope {scope:?}?");
                preflight_and_ask(confirm.yes, question).await?;
                let report =
                    with_progress("purging archives", async |_| router.purge_retired().await)
                        .await
                        .map_err(failed)?;
                emit(out, json, &report, render::purge)
            }
            C::Rebalance {
                to,
                tables,
                dry_run,
                retain_ms,
                page_size,
                confirm,
                ..
            } => {
                let names = router.shard_names();
                if let Some(unknown) = to.iter().find(|t| !names.contains(&t.as_str())) {
                    return Err(failed(MigrationError::UnknownShard(unknown.clone())));
                }
                if !*dry_run {
                    let question = format!("rebalance the keys of journal scope {scope:?}?");
                    preflight_and_ask(confirm.yes, question).await?;
                }
                let opts = RebalanceOptions {
                    target_shards: (!to.is_empty()).then(|| to.clone()),
                    tables: tables.clone(),
                    dry_run: *dry_run,
                    page_size: *page_size,
                    move_options: MoveOptions {
                        retire: retain_ms.map_or_else(Retire::default, Retire::After),
                    },
                };
                let report = with_progress("rebalancing", async |bar| {
                    let shown = |p| show_progress(bar, p);
                    router.rebalance_observed(opts, &shown).await
                })
                .await
                .map_err(failed)?;
                emit(out, json, &report, |out, r| {
                    render::rebalance(out, *dry_run, r)
                })?;
                match report.failed.len() {
                    0 => Ok(()),
                    n => Err(CliError::Unsettled(format!("{n} moves failed"))),
                }
            }
            C::Abort { op_id, confirm, .. } => {
                // Refuse an unknown or finished operation before asking
                // (the abort itself takes the recovery lease first).
                let found = router
                    .migration_status(&StatusOptions {
                        op_id: Some(op_id.clone()),
                        ..StatusOptions::default()
                    })
                    .await
                    .map_err(failed)?;
                match found.operations.first().map(|op| op.state) {
                    None => return Err(failed(MigrationError::OperationNotFound(op_id.clone()))),
                    Some(
                        s @ (MoveState::CutoverPending
                        | MoveState::Committed
                        | MoveState::Published
                        | MoveState::Retired),
                    ) => {
                        return Err(failed(MigrationError::NotAbortable {
                            op_id: op_id.clone(),
                            state: s.as_str().to_owned(),
                        }));
                    }
                    Some(_) => {}
                }
                ask(confirm.yes, file, &format!("abort operation {op_id}?"))?;
                let report = router.abort_operation(op_id).await.map_err(failed)?;
                emit(out, json, &report, render::abort)
            }
        }
    })
}
