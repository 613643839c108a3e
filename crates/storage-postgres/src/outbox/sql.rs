//! The SQL of one outbox (a schema and a table name), written once when
//! the outbox is built. Names are validated and quoted; every value is a
//! bound parameter.

use durability_time::MAX_SAFE_INTEGER;

use super::names::{Ident, quote};

/// The statements of one outbox.
#[derive(Debug, Clone)]
pub(crate) struct Sql {
    pub(crate) schema: String,
    pub(crate) listen: String,
    pub(crate) notify_channel: String,
    pub(crate) stage: String,
    pub(crate) stage_one: String,
    pub(crate) due: String,
    pub(crate) claim: String,
    pub(crate) remove_if: String,
    pub(crate) reschedule_if: String,
    pub(crate) quarantine: String,
    pub(crate) get: String,
    pub(crate) len: String,
    pub(crate) next_due: String,
    pub(crate) quarantined_len: String,
    pub(crate) purge_quarantined: String,
}

impl Sql {
    /// The staging statements: for one entry, and for many.
    pub(crate) fn staging(&self) -> (&str, &str) {
        (&self.stage_one, &self.stage)
    }

    pub(crate) fn new(schema: &Ident, table: &Ident) -> Self {
        let s = quote(schema.as_str());
        let t = format!("{s}.{}", quote(table.as_str()));
        let q = format!("{s}.{}", quote(&format!("{}_quarantine", table.as_str())));
        let seq_ident = format!("{s}.{}", quote(&format!("{}_version", table.as_str())));
        // The name inside a string literal: validated names hold no quote.
        let seq = format!("nextval('{seq_ident}'::regclass)");
        let index = quote(&format!("{}_due", table.as_str()));
        let stage_fn = format!("{s}.{}", quote(&format!("{}_stage", table.as_str())));
        let stage_one_fn = format!("{s}.{}", quote(&format!("{}_stage_one", table.as_str())));
        // The staging upsert, the same for one entry and many: it assigns
        // the version under the key's row lock when a row is there (so a
        // key's versions follow its commit order), and one notification
        // fires on commit.
        let upsert = format!(
            "ON CONFLICT (channel, key) DO UPDATE SET value = EXCLUDED.value, \
             version = {seq}, attempt = EXCLUDED.attempt, due_at = EXCLUDED.due_at, \
             claimed_until = EXCLUDED.claimed_until RETURNING o.key, o.version"
        );
        let notify_channel = format!("{}.{}", schema.as_str(), table.as_str());
        let cols = "key, value, version, attempt, due_at, claimed_until";
        let max = MAX_SAFE_INTEGER;
        Self {
            schema: format!(
                "CREATE SCHEMA IF NOT EXISTS {s};\n\
                 CREATE SEQUENCE IF NOT EXISTS {seq_ident} AS bigint MINVALUE 1 MAXVALUE {max} NO CYCLE;\n\
                 CREATE TABLE IF NOT EXISTS {t} (\n    \
                     channel text COLLATE \"C\" NOT NULL,\n    \
                     key text COLLATE \"C\" NOT NULL,\n    \
                     value bytea NOT NULL,\n    \
                     version bigint NOT NULL,\n    \
                     attempt integer NOT NULL,\n    \
                     due_at bigint NOT NULL,\n    \
                     claimed_until bigint,\n    \
                     PRIMARY KEY (channel, key)\n);\n\
                 CREATE INDEX IF NOT EXISTS {index} ON {t} (channel, due_at, version);\n\
                 CREATE TABLE IF NOT EXISTS {q} (\n    \
                     id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n    \
                     channel text COLLATE \"C\" NOT NULL,\n    \
                     key text COLLATE \"C\" NOT NULL,\n    \
                     value bytea,\n    \
                     version bigint,\n    \
                     attempt integer,\n    \
                     due_at bigint,\n    \
                     claimed_until bigint,\n    \
                     reason text NOT NULL,\n    \
                     quarantined_at bigint NOT NULL\n);\n\
                 CREATE OR REPLACE FUNCTION {stage_fn}(p_channel text, p_keys text[], \
                 p_values bytea[], p_attempt integer, p_due_at bigint, p_claimed_until bigint, \
                 p_notify text)\n\
                 RETURNS TABLE (k text, v bigint) LANGUAGE plpgsql AS $fn$\nBEGIN\n    \
                     RETURN QUERY INSERT INTO {t} AS o (channel, {cols})\n    \
                     SELECT p_channel, b.key, b.value, {seq}, p_attempt, p_due_at, p_claimed_until\n    \
                     FROM unnest(p_keys, p_values) WITH ORDINALITY AS b(key, value, n) ORDER BY b.n\n    \
                     {upsert};\n    \
                     PERFORM pg_notify(p_notify, p_channel);\n\
                 END\n$fn$;\n\
                 CREATE OR REPLACE FUNCTION {stage_one_fn}(p_channel text, p_key text, \
                 p_value bytea, p_attempt integer, p_due_at bigint, p_claimed_until bigint, \
                 p_notify text)\n\
                 RETURNS bigint LANGUAGE plpgsql AS $fn$\nDECLARE\n    \
                     staged_key text;\n    \
                     staged_version bigint;\n\
                 BEGIN\n    \
                     INSERT INTO {t} AS o (channel, {cols})\n    \
                     VALUES (p_channel, p_key, p_value, {seq}, p_attempt, p_due_at, p_claimed_until)\n    \
                     {upsert} INTO staged_key, staged_version;\n    \
                     PERFORM pg_notify(p_notify, p_channel);\n    \
                     RETURN staged_version;\n\
                 END\n$fn$;\n"
            ),
            listen: format!("LISTEN {}", quote(&notify_channel)),
            // One round trip for one entry or many, each a call of a
            // function `setup` created: its statement is parsed and planned
            // once per session (PL/pgSQL caches it), not on every call as a
            // statement sent in the caller's transaction would be (the
            // caller's connection has no statement cache of ours).
            stage: format!("SELECT k, v FROM {stage_fn}($1, $2, $3, $4, $5, $6, $7)"),
            stage_one: format!("SELECT $2, {stage_one_fn}($1, $2, $3, $4, $5, $6, $7)"),
            // Two index range searches: the rows due by `$2` (a negative,
            // corrupt due time among them), earliest first, then rows whose
            // due time is past 2^53-1 (corrupt: they come back to be
            // quarantined instead of sitting there unseen; nothing on
            // healthy data). One scan with an `OR` of the two would bound
            // the index by channel only and walk every row not yet due (the
            // entries in flight, retries waiting) whenever fewer than a
            // batch are due.
            due: format!(
                "SELECT * FROM (SELECT {cols} FROM {t} WHERE channel = $1 AND due_at <= $2 \
                 ORDER BY due_at, version LIMIT $3 FOR UPDATE SKIP LOCKED) AS due \
                 UNION ALL \
                 SELECT * FROM (SELECT {cols} FROM {t} WHERE channel = $1 AND due_at > {max} \
                 LIMIT $3 FOR UPDATE SKIP LOCKED) AS corrupt"
            ),
            claim: format!(
                "UPDATE {t} AS o SET attempt = c.attempt, due_at = $2, claimed_until = $2 \
                 FROM unnest($3::text[], $4::int[]) AS c(key, attempt) \
                 WHERE o.channel = $1 AND o.key = c.key"
            ),
            remove_if: format!(
                "DELETE FROM {t} AS o USING unnest($2::text[], $3::bigint[], $4::int[]) \
                 AS c(key, version, attempt) \
                 WHERE o.channel = $1 AND o.key = c.key AND o.version = c.version \
                 AND o.attempt = c.attempt"
            ),
            reschedule_if: format!(
                "UPDATE {t} AS o SET due_at = c.due_at, claimed_until = NULL \
                 FROM unnest($2::text[], $3::bigint[], $4::int[], $5::bigint[]) \
                 AS c(key, version, attempt, due_at) \
                 WHERE o.channel = $1 AND o.key = c.key AND o.version = c.version \
                 AND o.attempt = c.attempt RETURNING o.key"
            ),
            quarantine: format!(
                "WITH moved AS (DELETE FROM {t} WHERE channel = $1 AND key = $2 \
                 RETURNING channel, {cols}) \
                 INSERT INTO {q} (channel, {cols}, reason, quarantined_at) \
                 SELECT channel, {cols}, $3, $4 FROM moved"
            ),
            get: format!("SELECT {cols} FROM {t} WHERE channel = $1 AND key = $2"),
            len: format!("SELECT count(*) FROM {t} WHERE channel = $1"),
            next_due: format!("SELECT min(due_at) FROM {t} WHERE channel = $1"),
            quarantined_len: format!("SELECT count(*) FROM {q} WHERE channel = $1"),
            purge_quarantined: format!("DELETE FROM {q} WHERE channel = $1"),
            notify_channel,
        }
    }
}
