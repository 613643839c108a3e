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

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use durability_alarms::listing;
use durability_outbox::admin;
use durability_scheduler::{Clock, ObjectContext, ObjectId, Scheduler, SystemClock};
use durability_storage_redis::alarms::{IndexTime, RedisAlarmIndex};
use durability_storage_redis::ownership::RedisLeaseStore;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::{SqliteOptions, SqliteStorage};

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
    #[error("lease store: {0}")]
    Ownership(#[from] durability_ownership::OwnershipError),
    #[error(transparent)]
    Runtime(io::Error),
    #[error("alarm index: {0}")]
    Alarms(#[from] durability_alarms::AlarmError),
    #[error("{}: not changed: {reason}", file.display())]
    NotConfirmed { file: PathBuf, reason: &'static str },
    #[error("writing output: {0}")]
    Output(#[from] io::Error),
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
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
            if cli.global.json {
                emit_json(&mut out, &outcome)?;
            } else {
                render::admin(&mut out, "due now", target, &outcome)?;
            }
        }
        Command::Outbox(OutboxCommand::Discard(target)) => {
            let outcome = outbox_admin(target, now_ms, "discard", admin::discard)?;
            if cli.global.json {
                emit_json(&mut out, &outcome)?;
            } else {
                render::admin(&mut out, "discarded", target, &outcome)?;
            }
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
                if json {
                    emit_json(out, &page)
                } else {
                    Ok(render::jobs(out, &page)?)
                }
            }
            AlarmsCommand::Counts { .. } => {
                let counts = match &index {
                    Index::Sqlite(ix) => listing::counts(ix).await,
                    Index::Redis(ix) => listing::counts(&**ix).await,
                }?;
                if json {
                    emit_json(out, &counts)
                } else {
                    Ok(render::counts(out, &counts)?)
                }
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
    if target.yes {
        return Ok(());
    }
    let not_confirmed = |reason| CliError::NotConfirmed {
        file: target.file.clone(),
        reason,
    };
    if !(io::stdin().is_terminal() && io::stderr().is_terminal()) {
        return Err(not_confirmed("pass --yes (stdin is not a terminal)"));
    }
    let mut err = io::stderr();
    write!(
        err,
        "{verb} key {:?} of channel {:?} in {}? [y/N] ",
        target.key,
        target.channel,
        target.file.display()
    )?;
    err.flush()?;
    let mut answer = String::new();
    io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(not_confirmed("not confirmed"))
    }
}

fn emit_json(out: &mut impl Write, value: &impl serde::Serialize) -> Result<(), CliError> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)?;
    Ok(())
}
