//! Names that reach SQL, the deployment's shared tables, and the built-in
//! capabilities' schema steps.
//!
//! Only two kinds of name are ever spliced into SQL text: the deployment
//! schema (validated against a strict grammar, then quoted) and the
//! per-object schema derived from it and a number the database assigned.
//! Everything else (object ids, channels, keys, scopes) is a bound
//! parameter.

use durability_scheduler::{SchemaStep, StorageError, StorageErrorKind};

/// The longest deployment schema name: the per-object schema names
/// `<deployment>_o<n>` must fit PostgreSQL's 63-byte identifiers.
pub const MAX_DEPLOYMENT_NAME_BYTES: usize = 40;

/// A validated deployment schema name: `[a-z_][a-z0-9_]*`, at most
/// [`MAX_DEPLOYMENT_NAME_BYTES`] bytes, not starting with `pg_`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deployment(String);

impl Deployment {
    pub(crate) fn new(name: &str) -> Result<Self, StorageError> {
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !first_ok
            || !rest_ok
            || name.len() > MAX_DEPLOYMENT_NAME_BYTES
            || name.starts_with("pg_")
        {
            return Err(StorageError::new(
                StorageErrorKind::Backend,
                format!(
                    "invalid deployment schema name {name:?}: use [a-z_][a-z0-9_]*, at most \
                     {MAX_DEPLOYMENT_NAME_BYTES} bytes, not starting with pg_"
                ),
            ));
        }
        Ok(Self(name.to_owned()))
    }

    /// The schema's name, unquoted (as the catalog holds it).
    pub(crate) fn name(&self) -> &str {
        &self.0
    }

    /// The schema, quoted for SQL text.
    pub(crate) fn quoted(&self) -> String {
        quote(&self.0)
    }

    /// The quoted schema of the object the database numbered `seq`.
    pub(crate) fn object_schema(&self, seq: i64) -> String {
        quote(&format!("{}_o{seq}", self.0))
    }
}

/// `name` as a quoted identifier (inner quotes doubled).
pub(crate) fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The deployment's shared tables, keyed by object id (`{s}`: the quoted
/// deployment schema). Text keys compare and sort bytewise (`COLLATE "C"`).
pub(crate) const INSTALL: &str = r#"
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.durability_objects (
    id TEXT COLLATE "C" PRIMARY KEY,
    seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {s}.durability_object_fences (
    object_id TEXT COLLATE "C" NOT NULL,
    scope TEXT COLLATE "C" NOT NULL,
    generation BIGINT NOT NULL CHECK (generation > 0),
    holder BYTEA,
    PRIMARY KEY (object_id, scope)
);
CREATE TABLE IF NOT EXISTS {s}.durability_object_schema (
    object_id TEXT COLLATE "C" NOT NULL,
    capability TEXT COLLATE "C" NOT NULL,
    version BIGINT NOT NULL,
    PRIMARY KEY (object_id, capability)
);
CREATE TABLE IF NOT EXISTS {s}.durability_object_due (
    object_id TEXT COLLATE "C" NOT NULL,
    capability TEXT COLLATE "C" NOT NULL,
    due BIGINT NOT NULL,
    PRIMARY KEY (object_id, capability)
);
CREATE INDEX IF NOT EXISTS durability_object_due_by_time
    ON {s}.durability_object_due (object_id, due);
CREATE TABLE IF NOT EXISTS {s}.durability_object_alarm (
    object_id TEXT COLLATE "C" PRIMARY KEY,
    at BIGINT
);
CREATE TABLE IF NOT EXISTS {s}.durability_object_outbox (
    object_id TEXT COLLATE "C" NOT NULL,
    channel TEXT COLLATE "C" NOT NULL,
    key TEXT COLLATE "C" NOT NULL,
    value BYTEA NOT NULL,
    version BIGINT NOT NULL,
    attempt BIGINT NOT NULL,
    due_at BIGINT NOT NULL,
    claimed_until BIGINT,
    PRIMARY KEY (object_id, channel, key)
);
CREATE INDEX IF NOT EXISTS durability_object_outbox_due
    ON {s}.durability_object_outbox (object_id, channel, due_at, version);
CREATE TABLE IF NOT EXISTS {s}.durability_object_outbox_version (
    object_id TEXT COLLATE "C" PRIMARY KEY,
    last BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.durability_object_outbox_quarantine (
    object_id TEXT COLLATE "C" NOT NULL,
    channel TEXT COLLATE "C" NOT NULL,
    key TEXT COLLATE "C" NOT NULL,
    value BYTEA,
    version BIGINT,
    attempt BIGINT,
    due_at BIGINT,
    claimed_until BIGINT,
    reason TEXT NOT NULL,
    quarantined_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS durability_object_outbox_quarantine_channel
    ON {s}.durability_object_outbox_quarantine (object_id, channel);
CREATE TABLE IF NOT EXISTS {s}.durability_object_alarm_row (
    object_id TEXT COLLATE "C" PRIMARY KEY,
    at BIGINT NOT NULL,
    token TEXT COLLATE "C" NOT NULL,
    fence TEXT COLLATE "C"
);
CREATE TABLE IF NOT EXISTS {s}.durability_object_topology_groups (
    object_id TEXT COLLATE "C" NOT NULL,
    group_id TEXT COLLATE "C" NOT NULL,
    version BIGINT NOT NULL,
    members TEXT NOT NULL,
    deleted BOOLEAN NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (object_id, group_id)
);
CREATE TABLE IF NOT EXISTS {s}.durability_object_topology_states (
    object_id TEXT COLLATE "C" NOT NULL,
    group_id TEXT COLLATE "C" NOT NULL,
    channel TEXT COLLATE "C" NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (object_id, group_id, channel)
);
CREATE TABLE IF NOT EXISTS {s}.durability_object_topology_writes (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    object_id TEXT COLLATE "C" NOT NULL,
    group_id TEXT COLLATE "C" NOT NULL,
    land_by BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS durability_object_topology_writes_by_group
    ON {s}.durability_object_topology_writes (object_id, group_id, land_by);
CREATE TABLE IF NOT EXISTS {s}.durability_tombstones (
    storage_id TEXT COLLATE "C" PRIMARY KEY,
    lifecycle TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('deleting', 'deleted')),
    written_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
"#;

/// Every table and index [`INSTALL`] creates, by name (all in the
/// deployment schema). A deployment holding all of them is installed: a
/// host starting into a running deployment runs no DDL, since `CREATE
/// INDEX IF NOT EXISTS` takes a `SHARE` lock on its table even when the
/// index exists, and several of those in one transaction deadlock against
/// object transactions writing the same tables.
pub(crate) fn install_relations() -> Vec<String> {
    INSTALL
        .lines()
        .filter_map(|line| {
            let rest = line
                .strip_prefix("CREATE TABLE IF NOT EXISTS {s}.")
                .or_else(|| line.strip_prefix("CREATE INDEX IF NOT EXISTS "))?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// One schema step with its SQL, as an application registers it for its
/// own capability with
/// [`PostgresObjects::register_schema`](super::PostgresObjects::register_schema).
/// The SQL runs with the object's own schema as the `search_path`, so it
/// names tables without a schema, exactly as on SQLite.
#[derive(Debug, Clone, Copy)]
pub struct PostgresSchemaStep {
    /// The step's version and name.
    pub step: SchemaStep,
    /// SQL applied going up (may hold several statements).
    pub up: &'static str,
    /// SQL applied going down.
    pub down: &'static str,
}

/// What applying a schema step does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StepSql {
    /// An application's step: its SQL, in the object's own schema.
    Own(&'static PostgresSchemaStep),
    /// A built-in capability's step on the shared tables: up prepares the
    /// object's rows, down deletes them (`{s}`: the deployment schema,
    /// `$1`: the object id).
    Shared {
        up: &'static [&'static str],
        down: &'static [&'static str],
    },
}

/// The built-in capabilities: name, steps, and what each step does.
pub(crate) type Builtin = (
    &'static str,
    &'static [SchemaStep],
    &'static [(&'static [&'static str], &'static [&'static str])],
);

const fn step(version: u32, name: &'static str) -> SchemaStep {
    SchemaStep { version, name }
}

/// The capabilities every object storage registers, as on SQLite (same
/// names and versions).
pub(crate) const BUILTINS: &[Builtin] = &[
    (
        durability_outbox::SCHEMA,
        durability_outbox::SCHEMA_STEPS,
        &[
            (
                &[
                    "INSERT INTO {s}.durability_object_outbox_version (object_id, last) \
                   VALUES ($1, 0) ON CONFLICT (object_id) DO NOTHING",
                ],
                &[
                    "DELETE FROM {s}.durability_object_outbox WHERE object_id = $1",
                    "DELETE FROM {s}.durability_object_outbox_version WHERE object_id = $1",
                ],
            ),
            (
                &[],
                &["DELETE FROM {s}.durability_object_outbox_quarantine WHERE object_id = $1"],
            ),
        ],
    ),
    (
        "topology",
        &[step(1, "initial")],
        &[(
            &[],
            &[
                "DELETE FROM {s}.durability_object_topology_groups WHERE object_id = $1",
                "DELETE FROM {s}.durability_object_topology_states WHERE object_id = $1",
                "DELETE FROM {s}.durability_object_topology_writes WHERE object_id = $1",
            ],
        )],
    ),
    (
        "alarms",
        &[step(1, "initial")],
        &[(
            &[],
            &["DELETE FROM {s}.durability_object_alarm_row WHERE object_id = $1"],
        )],
    ),
];

#[cfg(test)]
mod tests {
    #[test]
    fn every_relation_the_install_creates_is_named() {
        let names = super::install_relations();
        let creates = super::INSTALL.matches("IF NOT EXISTS").count();
        // The schema itself is the one `IF NOT EXISTS` that is not a relation.
        assert_eq!(names.len(), creates - 1, "{names:?}");
        for name in [
            "durability_objects",
            "durability_tombstones",
            "durability_object_due_by_time",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} missing: {names:?}");
        }
    }
}
