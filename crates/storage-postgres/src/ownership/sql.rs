//! The lease store's SQL: its tables, its three functions and its plain
//! statements, all naming their schema.

use crate::store_client::{SERVER_NOW_MS, SchemaName, in_setup_transaction};

/// The largest JavaScript-safe integer, the bound of a generation counter.
const MAX_SAFE: &str = "9007199254740991";

/// The tables and functions of the lease store in `schema`, created if
/// missing (functions replaced), in one transaction.
pub(super) fn setup(schema: &SchemaName) -> String {
    in_setup_transaction(schema, &body(schema))
}

fn body(schema: &SchemaName) -> String {
    let s = schema.quoted();
    let lit = schema.as_str();
    format!(
        "{}{}{}{}",
        tables(&s),
        claim_function(&s, lit),
        renew_and_floor_functions(&s, lit),
        record_count_function(&s)
    )
}

fn tables(s: &str) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {s}.durability_owner_leases (
    scope TEXT COLLATE "C" PRIMARY KEY,
    record BYTEA NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.durability_owner_generations (
    scope TEXT COLLATE "C" PRIMARY KEY,
    generation BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.durability_owner_lifecycle (
    lifecycle TEXT COLLATE "C" PRIMARY KEY,
    active_storage TEXT,
    delete_lock TEXT
);
CREATE TABLE IF NOT EXISTS {s}.durability_storage_shard_count (
    storage_id TEXT COLLATE "C" PRIMARY KEY,
    shard_count INT NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.durability_presence (
    grp TEXT COLLATE "C" NOT NULL,
    task TEXT COLLATE "C" NOT NULL,
    value BYTEA NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    PRIMARY KEY (grp, task)
);
"#
    )
}

/// The step of the claim and renew functions after the lifecycle check:
/// a storage id whose recorded shard count is not the scope's answers
/// `shards`, with the recorded count in the column `out`.
fn shard_count_check(s: &str, out: &str) -> String {
    format!(
        r#"SELECT n.shard_count INTO v_count
            FROM {s}.durability_storage_shard_count n WHERE n.storage_id = p_storages[v_i];
        IF FOUND AND v_count IS DISTINCT FROM p_counts[v_i] THEN
            o_outcome := 'shards'; {out} := v_count; RETURN NEXT; CONTINUE;
        END IF;"#
    )
}

fn claim_function(s: &str, lit: &str) -> String {
    let shards = shard_count_check(s, "o_number");
    format!(
        r#"-- Claims every scope of p_scopes for one lifecycle: per scope, a lifecycle
-- refusal, the live holder, a corrupt counter, or the bumped generation and
-- the new record (p_prefixes[i] || generation || p_suffix) with its lease
-- on this server's clock. Scopes are locked in one order (advisory lock per
-- scope, then each owner row), so batches never deadlock one another.
CREATE OR REPLACE FUNCTION {s}.durability_owner_claim(
    p_scopes TEXT[], p_storages TEXT[], p_lifecycle TEXT,
    p_prefixes TEXT[], p_suffix TEXT, p_ttl BIGINT, p_counts INT[])
RETURNS TABLE (o_ord INT, o_outcome TEXT, o_record BYTEA, o_number BIGINT,
               o_active TEXT, o_lock TEXT)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_i INT; v_now BIGINT; v_found BOOLEAN; v_active TEXT; v_lock TEXT;
    v_record BYTEA; v_expires BIGINT; v_gen BIGINT; v_count INT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('{lit}:' || u.s, 0))
        FROM (SELECT DISTINCT x AS s FROM unnest(p_scopes) AS x) AS u ORDER BY u.s;
    SELECT c.active_storage, c.delete_lock INTO v_active, v_lock
        FROM {s}.durability_owner_lifecycle c WHERE c.lifecycle = p_lifecycle FOR SHARE;
    FOR v_i IN SELECT x.i FROM generate_subscripts(p_scopes, 1) AS x(i)
               ORDER BY p_scopes[x.i], x.i LOOP
        o_ord := v_i; o_record := NULL; o_number := NULL;
        o_active := v_active; o_lock := v_lock;
        IF (v_lock IS NOT NULL AND v_lock <> 'version')
           OR v_active IS DISTINCT FROM p_storages[v_i] THEN
            o_outcome := 'lifecycle'; RETURN NEXT; CONTINUE;
        END IF;
        {shards}
        SELECT o.record, o.expires_at_ms INTO v_record, v_expires
            FROM {s}.durability_owner_leases o WHERE o.scope = p_scopes[v_i] FOR UPDATE;
        v_found := FOUND;
        v_now := {SERVER_NOW_MS};
        IF v_found AND v_expires > v_now THEN
            o_outcome := 'held'; o_record := v_record; o_number := v_expires - v_now;
            RETURN NEXT; CONTINUE;
        END IF;
        SELECT g.generation INTO v_gen
            FROM {s}.durability_owner_generations g WHERE g.scope = p_scopes[v_i] FOR UPDATE;
        IF FOUND AND (v_gen < 1 OR v_gen >= {MAX_SAFE}) THEN
            o_outcome := 'badgen'; o_number := v_gen; RETURN NEXT; CONTINUE;
        END IF;
        -- A claim that writes records the storage id's count (once).
        v_count := {s}.durability_storage_record_count(p_storages[v_i], p_counts[v_i]);
        IF v_count IS DISTINCT FROM p_counts[v_i] THEN
            o_outcome := 'shards'; o_number := v_count; RETURN NEXT; CONTINUE;
        END IF;
        v_gen := coalesce(v_gen, 0) + 1;
        INSERT INTO {s}.durability_owner_generations (scope, generation)
            VALUES (p_scopes[v_i], v_gen)
            ON CONFLICT (scope) DO UPDATE SET generation = excluded.generation;
        o_record := convert_to(p_prefixes[v_i] || v_gen::text || p_suffix, 'UTF8');
        INSERT INTO {s}.durability_owner_leases (scope, record, expires_at_ms)
            VALUES (p_scopes[v_i], o_record, v_now + p_ttl)
            ON CONFLICT (scope) DO UPDATE
            SET record = excluded.record, expires_at_ms = excluded.expires_at_ms;
        o_outcome := 'claimed'; o_number := v_gen; RETURN NEXT;
    END LOOP;
END
$fn$;
"#
    )
}

fn renew_and_floor_functions(s: &str, lit: &str) -> String {
    let shards = shard_count_check(s, "o_count");
    format!(
        r#"-- Renews every record of p_records: per record, stale (not the exact live
-- record), a lifecycle refusal, or renewed (lease refreshed to p_ttl on this
-- server's clock). Lifecycle rows are locked before owner rows, owner rows
-- in scope order, as claims lock them.
CREATE OR REPLACE FUNCTION {s}.durability_owner_renew(
    p_scopes TEXT[], p_records BYTEA[], p_lifecycles TEXT[], p_storages TEXT[], p_ttl BIGINT,
    p_counts INT[])
RETURNS TABLE (o_ord INT, o_outcome TEXT, o_active TEXT, o_lock TEXT, o_count INT)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_i INT; v_active TEXT; v_lock TEXT; v_expires BIGINT; v_count INT;
BEGIN
    PERFORM 1 FROM {s}.durability_owner_lifecycle c
        WHERE c.lifecycle = ANY (p_lifecycles) ORDER BY c.lifecycle FOR SHARE;
    FOR v_i IN SELECT x.i FROM generate_subscripts(p_scopes, 1) AS x(i)
               ORDER BY p_scopes[x.i], x.i LOOP
        o_ord := v_i; o_active := NULL; o_lock := NULL; o_count := NULL;
        SELECT o.expires_at_ms INTO v_expires FROM {s}.durability_owner_leases o
            WHERE o.scope = p_scopes[v_i] AND o.record = p_records[v_i] FOR UPDATE;
        IF NOT FOUND OR v_expires <= {SERVER_NOW_MS} THEN
            o_outcome := 'stale'; RETURN NEXT; CONTINUE;
        END IF;
        SELECT c.active_storage, c.delete_lock INTO v_active, v_lock
            FROM {s}.durability_owner_lifecycle c WHERE c.lifecycle = p_lifecycles[v_i];
        IF (v_lock IS NOT NULL AND v_lock <> 'version')
           OR v_active IS DISTINCT FROM p_storages[v_i] THEN
            o_outcome := 'lifecycle'; o_active := v_active; o_lock := v_lock;
            RETURN NEXT; CONTINUE;
        END IF;
        {shards}
        UPDATE {s}.durability_owner_leases SET expires_at_ms = {SERVER_NOW_MS} + p_ttl
            WHERE scope = p_scopes[v_i];
        o_outcome := 'renewed'; RETURN NEXT;
    END LOOP;
END
$fn$;
-- Sets the counter of p_scope to max(counter, p_floor), under the scope's
-- claim lock; a corrupt counter is reported and left alone.
CREATE OR REPLACE FUNCTION {s}.durability_owner_raise_floor(p_scope TEXT, p_floor BIGINT)
RETURNS TABLE (o_outcome TEXT, o_generation BIGINT)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_gen BIGINT; v_found BOOLEAN;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('{lit}:' || p_scope, 0));
    SELECT g.generation INTO v_gen
        FROM {s}.durability_owner_generations g WHERE g.scope = p_scope FOR UPDATE;
    v_found := FOUND;
    IF v_found AND (v_gen < 1 OR v_gen > {MAX_SAFE}) THEN
        o_outcome := 'badgen'; o_generation := v_gen; RETURN NEXT; RETURN;
    END IF;
    IF v_found AND v_gen >= p_floor THEN
        o_outcome := 'kept'; o_generation := v_gen; RETURN NEXT; RETURN;
    END IF;
    INSERT INTO {s}.durability_owner_generations (scope, generation) VALUES (p_scope, p_floor)
        ON CONFLICT (scope) DO UPDATE SET generation = excluded.generation;
    o_outcome := 'raised'; o_generation := p_floor; RETURN NEXT;
END
$fn$;"#
    )
}

fn record_count_function(s: &str) -> String {
    format!(
        r#"
-- The shard count of p_storage: the recorded one, or p_count recorded now
-- when none is (a concurrent first record waits and the winner's is read).
CREATE OR REPLACE FUNCTION {s}.durability_storage_record_count(p_storage TEXT, p_count INT)
RETURNS INT LANGUAGE plpgsql AS $fn$
DECLARE
    v_count INT;
BEGIN
    SELECT n.shard_count INTO v_count
        FROM {s}.durability_storage_shard_count n WHERE n.storage_id = p_storage;
    IF FOUND THEN
        RETURN v_count;
    END IF;
    INSERT INTO {s}.durability_storage_shard_count (storage_id, shard_count)
        VALUES (p_storage, p_count) ON CONFLICT (storage_id) DO NOTHING;
    SELECT n.shard_count INTO v_count
        FROM {s}.durability_storage_shard_count n WHERE n.storage_id = p_storage;
    RETURN v_count;
END
$fn$;
-- The start-up check: the lifecycle checks of a claim under p_storage,
-- then its shard count (recorded now when none is).
CREATE OR REPLACE FUNCTION {s}.durability_owner_record_count(
    p_lifecycle TEXT, p_storage TEXT, p_count INT)
RETURNS TABLE (o_outcome TEXT, o_active TEXT, o_lock TEXT, o_count INT)
LANGUAGE plpgsql AS $fn$
BEGIN
    SELECT c.active_storage, c.delete_lock INTO o_active, o_lock
        FROM {s}.durability_owner_lifecycle c WHERE c.lifecycle = p_lifecycle FOR SHARE;
    IF (o_lock IS NOT NULL AND o_lock <> 'version') OR o_active IS DISTINCT FROM p_storage THEN
        o_outcome := 'lifecycle'; RETURN NEXT; RETURN;
    END IF;
    o_count := {s}.durability_storage_record_count(p_storage, p_count);
    o_outcome := CASE WHEN o_count IS DISTINCT FROM p_count THEN 'shards' ELSE 'ok' END;
    RETURN NEXT;
END
$fn$;"#
    )
}

/// The statements of one store, built once for its schema.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) claim: String,
    pub(super) renew: String,
    pub(super) raise_floor: String,
    pub(super) release: String,
    pub(super) snapshot: String,
    pub(super) set_active: String,
    pub(super) set_lock: String,
    pub(super) list: String,
    pub(super) record_count: String,
    pub(super) announce: String,
    pub(super) withdraw: String,
    pub(super) live: String,
}

impl Statements {
    pub(super) fn new(schema: &SchemaName) -> Self {
        let s = schema.quoted();
        Self {
            claim: format!(
                "SELECT o_ord, o_outcome, o_record, o_number, o_active, o_lock \
                 FROM {s}.durability_owner_claim($1, $2, $3, $4, $5, $6, $7)"
            ),
            renew: format!(
                "SELECT o_ord, o_outcome, o_active, o_lock, o_count \
                 FROM {s}.durability_owner_renew($1, $2, $3, $4, $5, $6)"
            ),
            raise_floor: format!(
                "SELECT o_outcome, o_generation FROM {s}.durability_owner_raise_floor($1, $2)"
            ),
            release: format!(
                "DELETE FROM {s}.durability_owner_leases WHERE scope = $1 AND record = $2 RETURNING 1"
            ),
            snapshot: format!(
                "SELECT k.now_ms, l.record, l.expires_at_ms, g.generation, c.active_storage, c.delete_lock,
                   (SELECT n.shard_count FROM {s}.durability_storage_shard_count n WHERE n.storage_id = $3)
                 FROM (SELECT {SERVER_NOW_MS} AS now_ms) AS k
                 LEFT JOIN {s}.durability_owner_leases l ON l.scope = $1
                 LEFT JOIN {s}.durability_owner_generations g ON g.scope = $1
                 LEFT JOIN {s}.durability_owner_lifecycle c ON c.lifecycle = $2"
            ),
            set_active: format!(
                "INSERT INTO {s}.durability_owner_lifecycle (lifecycle, active_storage) VALUES ($1, $2)
                 ON CONFLICT (lifecycle) DO UPDATE SET active_storage = excluded.active_storage"
            ),
            list: format!(
                "SELECT l.scope, l.record, l.expires_at_ms - k.now_ms
                 FROM (SELECT {SERVER_NOW_MS} AS now_ms) AS k
                 JOIN {s}.durability_owner_leases l ON l.expires_at_ms > k.now_ms
                 WHERE $1::text IS NULL OR l.scope > $1
                 ORDER BY l.scope LIMIT $2"
            ),
            record_count: format!(
                "SELECT o_outcome, o_active, o_lock, o_count \
                 FROM {s}.durability_owner_record_count($1, $2, $3)"
            ),
            announce: format!(
                "INSERT INTO {s}.durability_presence (grp, task, value, expires_at_ms)
                 VALUES ($1, $2, $3, {SERVER_NOW_MS} + $4)
                 ON CONFLICT (grp, task) DO UPDATE
                 SET value = excluded.value, expires_at_ms = excluded.expires_at_ms"
            ),
            withdraw: format!(
                "DELETE FROM {s}.durability_presence WHERE grp = $1 AND task = $2 RETURNING 1"
            ),
            live: format!(
                "SELECT p.task, p.value, p.expires_at_ms - k.now_ms
                 FROM (SELECT {SERVER_NOW_MS} AS now_ms) AS k
                 JOIN {s}.durability_presence p ON p.grp = $1 AND p.expires_at_ms > k.now_ms
                 ORDER BY p.task"
            ),
            set_lock: format!(
                "INSERT INTO {s}.durability_owner_lifecycle (lifecycle, delete_lock) VALUES ($1, $2)
                 ON CONFLICT (lifecycle) DO UPDATE SET delete_lock = excluded.delete_lock"
            ),
        }
    }
}
