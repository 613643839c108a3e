//! The alarm index's SQL: its tables and statements, all naming their
//! schema. `$now` parameters are `NULL` on server time, so one statement
//! text serves both clocks.

use crate::store_client::{SERVER_NOW_MS, SchemaName, in_setup_transaction};

/// The tables of the alarm index in `schema`, created if missing, in one
/// transaction.
pub(super) fn setup(schema: &SchemaName) -> String {
    let s = schema.quoted();
    in_setup_transaction(
        schema,
        &format!(
            r#"-- One job per object. state: 0 due, 1 ready, 2 running. score: the due
-- or retry time, or the claim lease's end while running.
CREATE TABLE IF NOT EXISTS {s}.durability_alarm_jobs (
    object TEXT COLLATE "C" PRIMARY KEY,
    token TEXT NOT NULL,
    due_at BIGINT NOT NULL,
    state SMALLINT NOT NULL,
    run TEXT,
    tries BIGINT NOT NULL,
    score BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS durability_alarm_jobs_scheduled
    ON {s}.durability_alarm_jobs (score) WHERE state <> 1;
CREATE INDEX IF NOT EXISTS durability_alarm_jobs_ready
    ON {s}.durability_alarm_jobs (due_at, object) WHERE state = 1;
-- Jobs whose stored fields failed validation when claimed, kept for operators.
CREATE TABLE IF NOT EXISTS {s}.durability_alarm_quarantine (
    object TEXT COLLATE "C" PRIMARY KEY,
    token TEXT,
    due_at BIGINT,
    state SMALLINT,
    run TEXT,
    tries BIGINT,
    score BIGINT,
    reason TEXT NOT NULL,
    quarantined_at BIGINT NOT NULL
);"#
        ),
    )
}

/// The statements of one index, built once for its schema.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) upsert: String,
    pub(super) delete: String,
    pub(super) job: String,
    pub(super) promote: String,
    pub(super) claim: String,
    pub(super) quarantine: String,
    pub(super) finish: String,
    pub(super) retry: String,
    pub(super) release: String,
    pub(super) next_due: String,
    pub(super) counts: String,
    pub(super) list: String,
    pub(super) quarantined: String,
}

impl Statements {
    pub(super) fn new(schema: &SchemaName) -> Self {
        let s = schema.quoted();
        let jobs = format!("{s}.durability_alarm_jobs");
        let now = |n: u8| format!("COALESCE(${n}::bigint, {SERVER_NOW_MS})");
        Self {
            upsert: format!(
                "INSERT INTO {jobs} AS cur (object, token, due_at, state, run, tries, score)
                 VALUES ($1, $2, $3, 0, NULL, 0, $3)
                 ON CONFLICT (object) DO UPDATE SET token = excluded.token,
                   due_at = excluded.due_at, state = 0, run = NULL, tries = 0, score = excluded.score
                 WHERE cur.token <> excluded.token OR cur.due_at <> excluded.due_at
                 RETURNING 1"
            ),
            delete: format!("DELETE FROM {jobs} WHERE object = $1 AND token = $2 RETURNING 1"),
            job: format!("SELECT token, due_at, state, tries FROM {jobs} WHERE object = $1"),
            promote: format!(
                "UPDATE {jobs} SET state = 1, run = NULL
                 WHERE object IN (SELECT object FROM {jobs}
                                  WHERE state <> 1 AND score <= {now1}
                                  ORDER BY score, object LIMIT $2 FOR UPDATE SKIP LOCKED)
                   AND state <> 1
                 RETURNING 1",
                now1 = now(1),
            ),
            claim: claim(&jobs),
            quarantine: quarantine(&s, &jobs),
            finish: format!(
                "DELETE FROM {jobs} WHERE object = $1 AND state = 2 AND run = $2 RETURNING 1"
            ),
            retry: format!(
                "UPDATE {jobs} SET state = 0, run = NULL, tries = $3, score = {now4} + $5
                 WHERE object = $1 AND state = 2 AND run = $2 RETURNING 1",
                now4 = now(4),
            ),
            release: format!(
                "UPDATE {jobs} SET state = 1, run = NULL, tries = GREATEST(tries - 1, 0), score = due_at
                 WHERE object = $1 AND state = 2 AND run = $2 RETURNING 1"
            ),
            next_due: format!(
                "SELECT LEAST((SELECT min(score) FROM {jobs} WHERE state <> 1),
                              (SELECT min(due_at) FROM {jobs} WHERE state = 1))"
            ),
            counts: format!(
                "SELECT count(*) FILTER (WHERE state <> 1), count(*) FILTER (WHERE state = 1)
                 FROM {jobs}"
            ),
            // The prefix's ids are one range of the primary key (byte
            // order): from the prefix, or after the cursor, to the prefix
            // with its last byte raised ($3, when there is one).
            list: format!(
                "SELECT object, token, due_at, state, tries FROM {jobs}
                 WHERE object >= $1 AND ($2::text IS NULL OR object > $2)
                   AND ($3::text IS NULL OR object < $3) AND starts_with(object, $1)
                 ORDER BY object LIMIT $4"
            ),
            quarantined: format!("SELECT count(*) FROM {s}.durability_alarm_quarantine"),
        }
    }
}

/// The i-th earliest ready job not locked by another claimant goes to the
/// i-th run token ($3); tries rise by one unless the stored count is out of
/// range (then it is left for the decoder to quarantine, never overflowed).
fn claim(jobs: &str) -> String {
    format!(
        "WITH picked AS (
           SELECT object, due_at FROM {jobs} WHERE state = 1
           ORDER BY due_at, object LIMIT cardinality($3::text[]) FOR UPDATE SKIP LOCKED
         ), numbered AS (
           SELECT object, row_number() OVER (ORDER BY due_at, object) AS i FROM picked
         )
         UPDATE {jobs} j SET state = 2, run = ($3::text[])[n.i],
           tries = CASE WHEN j.tries BETWEEN 0 AND 4294967294 THEN j.tries + 1 ELSE j.tries END,
           score = COALESCE($1::bigint, {SERVER_NOW_MS}) + $2
         FROM numbered n WHERE j.object = n.object
         RETURNING n.i, j.object, j.token, j.due_at, j.tries, j.score"
    )
}

/// Moves claimed jobs (object, run token, reason) to quarantine, each fenced
/// by its run token.
fn quarantine(s: &str, jobs: &str) -> String {
    format!(
        "WITH bad AS (
           SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) AS b(object, run, reason)
         ), moved AS (
           DELETE FROM {jobs} j USING bad
           WHERE j.object = bad.object AND j.state = 2 AND j.run = bad.run
           RETURNING j.object, j.token, j.due_at, j.state, j.run, j.tries, j.score, bad.reason
         )
         INSERT INTO {s}.durability_alarm_quarantine
           (object, token, due_at, state, run, tries, score, reason, quarantined_at)
         SELECT object, token, due_at, state, run, tries, score, reason, {SERVER_NOW_MS}
         FROM moved
         ON CONFLICT (object) DO UPDATE SET token = excluded.token, due_at = excluded.due_at,
           state = excluded.state, run = excluded.run, tries = excluded.tries,
           score = excluded.score, reason = excluded.reason,
           quarantined_at = excluded.quarantined_at
         RETURNING object"
    )
}
