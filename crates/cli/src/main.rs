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

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use durability_scheduler::{Clock, SystemClock};

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
    }
    out.flush()?;
    Ok(())
}

fn emit_json(out: &mut impl Write, value: &impl serde::Serialize) -> Result<(), CliError> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)?;
    Ok(())
}
