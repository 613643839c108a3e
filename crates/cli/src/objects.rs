//! `durability objects list | export | import`: a class's objects by name
//! prefix, and one object moved between the SQLite directory and
//! PostgreSQL through an export file (the host's `store::moving`).

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use durability_host::store::moving::{Export, MoveError, export_object, import_object};
use durability_host::store::{ObjectKey, ObjectPage, ObjectQuery};
use durability_host::{ObjectStore, PostgresObjectStore, SqliteObjectStore};
use durability_ownership::{ShardCount, StorageId};
use durability_storage_postgres::object::PostgresObjectOptions;

use crate::CliError;

#[derive(Debug, Subcommand)]
pub(crate) enum ObjectsCommand {
    /// One page of a class's objects whose names start with a prefix, in
    /// bytewise name order.
    List {
        #[command(flatten)]
        store: StoreArgs,
        /// The class.
        #[arg(long)]
        class: String,
        /// The name prefix (default: every name).
        #[arg(long, default_value = "")]
        prefix: String,
        /// Objects per page (1..=1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// The cursor a previous page printed.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Export one object to a file, fenced: the object's owner fence is
    /// raised first, so no earlier owner commits to it afterwards.
    Export {
        #[command(flatten)]
        store: StoreArgs,
        /// The object's class.
        #[arg(long)]
        class: String,
        /// The object's name.
        #[arg(long)]
        name: String,
        /// The export file to create (refused when it exists).
        #[arg(long)]
        out: PathBuf,
        /// The deployment's shard count (for an object never fenced).
        #[arg(long, default_value_t = durability_ownership::DEFAULT_SHARD_COUNT)]
        shards: u32,
    },
    /// Import an export file's object into a store, all or nothing.
    Import {
        #[command(flatten)]
        store: StoreArgs,
        /// The export file.
        #[arg(long)]
        file: PathBuf,
        /// Replace the object when the store already holds it.
        #[arg(long)]
        replace: bool,
    },
}

/// Which object store, and which storage id in it.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// The SQLite object root (the hosts' object directory).
    #[arg(long, value_name = "DIR", conflicts_with = "postgres")]
    sqlite_root: Option<PathBuf>,
    /// A PostgreSQL URL (objects in the deployment schema `--schema`).
    #[arg(long, value_name = "URL")]
    postgres: Option<String>,
    /// The PostgreSQL deployment schema.
    #[arg(long, default_value = durability_host::DEFAULT_DATABASE_SCHEMA)]
    schema: String,
    /// The storage id.
    #[arg(long)]
    storage: String,
}

enum Store {
    Sqlite(SqliteObjectStore),
    Postgres(PostgresObjectStore),
}

impl StoreArgs {
    fn open(&self) -> Result<Store, CliError> {
        match (&self.sqlite_root, &self.postgres) {
            (Some(root), None) => {
                if !root.is_dir() {
                    return Err(CliError::NoObjectStore(format!(
                        "{} is not a directory",
                        root.display()
                    )));
                }
                Ok(Store::Sqlite(SqliteObjectStore::new(root)))
            }
            (None, Some(url)) => Ok(Store::Postgres(
                PostgresObjectStore::connect(url, &self.schema, PostgresObjectOptions::default())
                    .map_err(MoveError::from)?,
            )),
            _ => Err(CliError::NoObjectStore(
                "pass --sqlite-root <dir> or --postgres <url>".to_owned(),
            )),
        }
    }

    fn storage_id(&self) -> Result<StorageId, CliError> {
        StorageId::new(&self.storage).map_err(|e| {
            CliError::Move(MoveError::InvalidInput {
                what: "storage id",
                reason: e.to_string(),
            })
        })
    }
}

#[derive(serde::Serialize)]
struct Listed {
    class: String,
    name: String,
    object_id: String,
}

#[derive(serde::Serialize)]
struct ListReport {
    objects: Vec<Listed>,
    cursor: Option<String>,
}

#[derive(serde::Serialize)]
struct MoveReport {
    action: &'static str,
    object_id: String,
    store: &'static str,
    tables: usize,
    rows: usize,
    file: String,
    fenced_generation: Option<u64>,
}

/// Runs one `objects` command.
pub(crate) fn run(
    out: &mut impl Write,
    json: bool,
    command: &ObjectsCommand,
) -> Result<(), CliError> {
    let rt = crate::runtime()?;
    match command {
        ObjectsCommand::List {
            store,
            class,
            prefix,
            limit,
            cursor,
        } => {
            let query = ObjectQuery::new(class, prefix, cursor.as_deref(), *limit)?;
            let storage = store.storage_id()?;
            let page = match store.open()? {
                Store::Sqlite(s) => rt.block_on(s.list_class(&storage, &query)),
                Store::Postgres(s) => rt.block_on(s.list_class(&storage, &query)),
            }
            .map_err(MoveError::from)?;
            list_report(out, json, &storage, page)
        }
        ObjectsCommand::Export {
            store,
            class,
            name,
            out: file,
            shards,
        } => {
            let shards = ShardCount::new(*shards)?;
            let object = ObjectKey {
                class: class.clone(),
                name: name.clone(),
            };
            if file.exists() {
                return Err(CliError::NoObjectStore(format!(
                    "{} exists: not overwritten",
                    file.display()
                )));
            }
            let (export, kind) = match store.open()? {
                Store::Sqlite(s) => (
                    rt.block_on(export_object(&s, &store.storage, &object, shards))?,
                    "sqlite",
                ),
                Store::Postgres(s) => (
                    rt.block_on(export_object(&s, &store.storage, &object, shards))?,
                    "postgres",
                ),
            };
            write_new(file, &export.encode()?)?;
            let report = move_report("export", &export, kind, file);
            emit(out, json, &report)
        }
        ObjectsCommand::Import {
            store,
            file,
            replace,
        } => {
            let bytes = std::fs::read(file)?;
            let export = Export::decode(&bytes)?;
            let storage = Some(store.storage.as_str());
            let kind = match store.open()? {
                Store::Sqlite(s) => {
                    rt.block_on(import_object(&s, &export, storage, *replace))?;
                    "sqlite"
                }
                Store::Postgres(s) => {
                    rt.block_on(import_object(&s, &export, storage, *replace))?;
                    "postgres"
                }
            };
            let mut report = move_report("import", &export, kind, file);
            report.object_id = format!(
                "{}:{}:{}",
                store.storage, export.header.class, export.header.name
            );
            report.fenced_generation = None;
            emit(out, json, &report)
        }
    }
}

fn move_report(
    action: &'static str,
    export: &Export,
    store: &'static str,
    file: &Path,
) -> MoveReport {
    let h = &export.header;
    MoveReport {
        action,
        object_id: format!("{}:{}:{}", h.storage, h.class, h.name),
        store,
        tables: export.image.tables.len(),
        rows: export.image.tables.iter().map(|t| t.rows.len()).sum(),
        file: file.display().to_string(),
        fenced_generation: Some(h.fenced_generation),
    }
}

fn emit(out: &mut impl Write, json: bool, report: &MoveReport) -> Result<(), CliError> {
    if json {
        return crate::emit_json(out, report);
    }
    let verb = if report.action == "export" {
        "exported"
    } else {
        "imported"
    };
    write!(
        out,
        "{verb} {} ({} tables, {} rows) {} {} {}",
        report.object_id,
        report.tables,
        report.rows,
        if report.action == "export" {
            "from"
        } else {
            "into"
        },
        report.store,
        if report.action == "export" {
            "to"
        } else {
            "from"
        },
    )?;
    write!(out, " {}", report.file)?;
    if let Some(g) = report
        .fenced_generation
        .filter(|_| report.action == "export")
    {
        write!(out, "; the source is fenced at generation {g}")?;
    }
    writeln!(out)?;
    Ok(())
}

fn list_report(
    out: &mut impl Write,
    json: bool,
    storage: &StorageId,
    page: ObjectPage,
) -> Result<(), CliError> {
    let report = ListReport {
        objects: page
            .objects
            .iter()
            .map(|o| Listed {
                class: o.class.clone(),
                name: o.name.clone(),
                object_id: o.object_id(storage),
            })
            .collect(),
        cursor: page.cursor,
    };
    if json {
        return crate::emit_json(out, &report);
    }
    for o in &report.objects {
        writeln!(out, "{:?}\t{}", o.name, o.object_id)?;
    }
    writeln!(out, "{} objects", report.objects.len())?;
    if let Some(c) = &report.cursor {
        writeln!(out, "next page: --cursor {c:?}")?;
    }
    Ok(())
}

/// Writes `bytes` to a new file at `path` durably: a temporary file beside
/// it, fsynced, linked to `path` only if `path` does not exist, and the
/// directory fsynced.
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    linked?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
