//! Delivering one channel: claim with `SKIP LOCKED`, publish through the
//! outbox's [`Publisher`], settle guarded by version and attempt.

use std::sync::Arc;

use deadpool_postgres::Pool;
use durability_outbox::rules::{self, Claimed, Settle};
use durability_outbox::{
    ChannelConfig, CorruptEntry, DeliveryReport, EventKind, Publisher, Settled, Settlement, Sink,
    StoredEntry, StoredRow,
};
use durability_time::{MAX_SAFE_INTEGER, is_safe_non_negative};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Config, Row};

use super::PgOutbox;
use super::error::PgOutboxError;

/// Default fallback poll of [`PgDeliverer::run`]: 5 seconds (notifications
/// wake it sooner).
pub const DEFAULT_POLL_MS: i64 = 5_000;

/// The settings of the deliverer's own sessions: claims and settlements
/// commit asynchronously (see [`PgDeliverer::new`]), and every prepared
/// statement runs on its generic plan. A custom plan, which the server
/// makes for the first five runs of a statement on each connection, sees
/// the batch's 100 keys and joins them by hashing the whole channel (a
/// sequential scan per claim and per settlement, growing with the
/// backlog); the generic plan looks each key up in the primary key.
const SESSION_SETTINGS: [&str; 2] = [
    "synchronous_commit=off",
    "plan_cache_mode=force_generic_plan",
];

/// Delivers one channel of a [`PgOutbox`] to its sink.
///
/// Any number of deliverers of a channel may run, in one process or many:
/// `FOR UPDATE SKIP LOCKED` keeps them off each other's entries. Publish
/// calls of one deliverer run one at a time.
pub struct PgDeliverer<T, K> {
    pub(super) outbox: PgOutbox,
    pub(super) pool: Pool,
    pub(super) config: Config,
    pub(super) publisher: Publisher<T, K>,
    pub(super) poll_ms: i64,
    busy: tokio::sync::Mutex<()>,
    #[cfg(feature = "testkit")]
    /// The crash to come, and whether it happened (later commits are never sent).
    crash: std::sync::Mutex<(Option<CrashAt>, bool)>,
}

/// Where an injected crash happens (feature `testkit`): at the `nth`
/// commit (from 1) the deliverer makes (a claim's transaction, with the
/// settlements it carries), before it is sent (nothing of it lands) or
/// after it landed.
#[cfg(feature = "testkit")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashAt {
    /// Which commit.
    pub nth: u32,
    /// After the commit landed (else before it is sent).
    pub after_commit: bool,
}

impl<T, K> std::fmt::Debug for PgDeliverer<T, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgDeliverer")
            .field("outbox", &self.outbox)
            .field("publisher", &self.publisher)
            .finish_non_exhaustive()
    }
}

/// Decodes a row of `key, value, version, attempt, due_at, claimed_until`
/// strictly: anything out of range is corrupt, never misread.
fn decode(channel: &str, row: &Row) -> Result<StoredRow, PgOutboxError> {
    let get = |e| PgOutboxError::Corrupt(format!("unreadable outbox row: {e}"));
    let key: String = row.try_get(0).map_err(get)?;
    let value: Vec<u8> = row.try_get(1).map_err(get)?;
    let version: i64 = row.try_get(2).map_err(get)?;
    let attempt: i32 = row.try_get(3).map_err(get)?;
    let due_at: i64 = row.try_get(4).map_err(get)?;
    let claimed_until: Option<i64> = row.try_get(5).map_err(get)?;
    let reason = if !(1..=MAX_SAFE_INTEGER).contains(&version) {
        Some(format!("version {version} is outside 1..=2^53-1"))
    } else if attempt < 0 {
        Some(format!("attempt {attempt} is negative"))
    } else if !is_safe_non_negative(due_at) {
        Some(format!("due time {due_at} is outside 0..=2^53-1"))
    } else if claimed_until.is_some_and(|c| !is_safe_non_negative(c)) {
        Some(format!(
            "claim deadline {claimed_until:?} is outside 0..=2^53-1"
        ))
    } else {
        None
    };
    Ok(match reason {
        Some(reason) => StoredRow::Corrupt(CorruptEntry {
            channel: channel.to_owned(),
            row: key.as_bytes().to_vec(),
            key,
            reason,
        }),
        None => StoredRow::Entry(StoredEntry {
            channel: channel.to_owned(),
            key,
            value,
            version: version.unsigned_abs(),
            attempt: attempt.unsigned_abs(),
            due_at,
            claimed_until,
        }),
    })
}

/// A statement prepared once per pooled connection.
async fn prepared(
    client: &deadpool_postgres::Object,
    sql: &str,
) -> Result<tokio_postgres::Statement, PgOutboxError> {
    client
        .prepare_cached(sql)
        .await
        .map_err(PgOutboxError::statement)
}

/// A pooled connection inside a transaction begun with a plain `BEGIN`
/// (so its statements can be pipelined). Unless [`OpenTxn::done`] is
/// called after its `COMMIT`, dropping it (an error, a cancelled future)
/// takes the connection out of the pool and closes it, which rolls the
/// transaction back: no connection goes back to the pool mid-transaction.
struct OpenTxn(Option<deadpool_postgres::Object>);

impl OpenTxn {
    fn new(client: deadpool_postgres::Object) -> Self {
        Self(Some(client))
    }

    fn client(&self) -> &deadpool_postgres::Object {
        // Only `done` and `drop` take the connection, and both end the value.
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("an OpenTxn holds its connection until it ends"))
    }

    /// The transaction ended (committed or rolled back by the server): the
    /// connection may go back to the pool.
    fn done(mut self) {
        drop(self.0.take());
    }
}

impl Drop for OpenTxn {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

fn as_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A published batch's settlements, decided and not yet written: entries
/// to remove, and entries to retry at a time.
#[derive(Default)]
struct Decided {
    removed: Vec<Settled>,
    kept: Vec<(Settled, i64)>,
}

impl Decided {
    fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.kept.is_empty()
    }
}

/// What a claim came to: the entries claimed, the corrupt rows it
/// quarantined, and the settlements it carried that landed (a retry a
/// newer value replaced left out).
struct Claim {
    claimed: Vec<Claimed>,
    quarantined: Vec<CorruptEntry>,
    settled: Vec<Settled>,
}

/// The parameters of guarded settlement writes: each entry's key, the
/// version and attempt claimed, and (for a retry) its next due time.
struct Guards<'a> {
    keys: Vec<&'a str>,
    versions: Vec<i64>,
    attempts: Vec<i32>,
    due: Vec<i64>,
}

impl<'a> Guards<'a> {
    fn of(settled: impl Iterator<Item = (&'a Settled, Option<i64>)>) -> Self {
        let mut guards = Self {
            keys: Vec::new(),
            versions: Vec::new(),
            attempts: Vec::new(),
            due: Vec::new(),
        };
        for (s, due) in settled {
            guards.keys.push(&s.key);
            guards.versions.push(as_i64(s.version));
            guards.attempts.push(as_i32(s.attempt));
            guards.due.extend(due);
        }
        guards
    }
}

/// Runs a statement inside the claim's transaction when `run` (else
/// nothing, and no rows).
async fn run_if(
    client: &deadpool_postgres::Object,
    statement: &tokio_postgres::Statement,
    params: &[&(dyn ToSql + Sync)],
    run: bool,
) -> Result<Vec<Row>, tokio_postgres::Error> {
    if run {
        client.query(statement, params).await
    } else {
        Ok(Vec::new())
    }
}

impl<T, K> PgDeliverer<T, K>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    K: Sink<T>,
{
    /// A deliverer of `channel` (its name, codec, timeouts, retries, dead
    /// letters and hook) over a pool of `pool_size` connections made from
    /// `config`, on the outbox's clock. Connections open lazily.
    ///
    /// # Errors
    /// [`PgOutboxError::Outbox`] for a bad channel setting;
    /// [`PgOutboxError::Unavailable`] for a pool that cannot be built.
    pub fn new(
        outbox: &PgOutbox,
        config: Config,
        pool_size: usize,
        channel: ChannelConfig<T>,
        sink: K,
    ) -> Result<Self, PgOutboxError> {
        let publisher = Publisher::new(channel, sink, Arc::clone(&outbox.clock))?;
        // Claims and settlements commit asynchronously: a server crash can
        // forget the last of them, and then the entries are delivered again
        // (at least once), never lost. Stages are the caller's commits.
        let pool = crate::pool_with(config.clone(), &SESSION_SETTINGS, pool_size)
            .map_err(|e| PgOutboxError::Unavailable(Box::new(e)))?;
        Ok(Self {
            outbox: outbox.clone(),
            pool,
            config,
            publisher,
            poll_ms: DEFAULT_POLL_MS,
            busy: tokio::sync::Mutex::new(()),
            #[cfg(feature = "testkit")]
            crash: std::sync::Mutex::new((None, false)),
        })
    }

    /// The fallback poll of [`PgDeliverer::run`], in ms (at least 1).
    #[must_use]
    pub fn poll_interval_ms(mut self, ms: i64) -> Self {
        self.poll_ms = ms.max(1);
        self
    }

    /// Crashes at a commit (feature `testkit`): the call that reaches it
    /// fails with `PG_OUTBOX_UNAVAILABLE` and the test drops this
    /// deliverer, as a process that died there.
    #[cfg(feature = "testkit")]
    pub fn crash_at(&self, at: CrashAt) {
        *self
            .crash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (Some(at), false);
    }

    /// Whether this commit crashes, and after landing or before. Once
    /// the crash happened, every later commit (one sent together with the
    /// crashing one, say) crashes before it is sent: the process is dead.
    #[cfg(feature = "testkit")]
    fn crash_now(&self) -> Option<bool> {
        let mut crash = self
            .crash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (next, dead) = &mut *crash;
        if *dead {
            return Some(false);
        }
        let at = next.as_mut()?;
        at.nth = at.nth.saturating_sub(1);
        let fired = (at.nth == 0)
            .then(|| next.take().map(|at| at.after_commit))
            .flatten();
        *dead = fired.is_some();
        fired
    }

    /// The channel's name.
    pub fn name(&self) -> &str {
        self.publisher.name()
    }

    /// Delivers every entry due when the run starts, batch by batch, and
    /// reports what happened. The next batch is claimed (on another pooled
    /// connection) while one is published; a published batch's
    /// settlements ride in the transaction of the claim after it (one
    /// commit and two round trips a batch), and the run ends with them
    /// written. Publish calls run one at a time, in claim order.
    ///
    /// # Errors
    /// [`PgOutboxError::Unavailable`] or [`PgOutboxError::Rejected`]
    /// (nothing of the failed step applied) or
    /// [`PgOutboxError::OutcomeUnknown`] (a claim, and the settlements it
    /// carried, may or may not have landed); claimed entries (the batch
    /// claimed ahead, and a published batch whose settlements did not
    /// land, among them) are retried after their deadline.
    pub async fn deliver_due(&self) -> Result<DeliveryReport, PgOutboxError> {
        let _busy = self.busy.lock().await;
        let start = self.publisher.now_ms();
        let mut report = DeliveryReport::default();
        let mut next = self.claim(start, Decided::default()).await?;
        // The settlements of the batch last published, written with the
        // next claim.
        let mut decided = Decided::default();
        // Whether `next` was claimed while the batch before it was still
        // being published: then an entry that became due meanwhile (a newer
        // value staged by the sink, say) may have been missed.
        let mut ahead = false;
        loop {
            let Claim {
                claimed,
                quarantined,
                settled,
            } = next;
            self.publisher.report_settled(settled, &mut report);
            let any_quarantined = !quarantined.is_empty();
            for corrupt in quarantined {
                self.publisher.report_quarantined(corrupt, &mut report);
            }
            if claimed.is_empty() {
                if any_quarantined || ahead || !decided.is_empty() {
                    next = self.claim(start, std::mem::take(&mut decided)).await?;
                    ahead = false;
                    continue;
                }
                return Ok(report);
            }
            let (following, outcomes) = futures::join!(
                self.claim(start, std::mem::take(&mut decided)),
                self.publisher.attempt(claimed)
            );
            decided = self.decide(outcomes);
            next = following?;
            ahead = true;
        }
    }

    /// Claims up to a batch of due entries in one transaction, after
    /// writing the settlements `decided` (so they commit with the claim):
    /// rows other deliverers hold are skipped, corrupt rows are
    /// quarantined, and each claim is recorded before it is published. Two
    /// round trips: `BEGIN` with the settlements and the due rows' `SELECT
    /// … FOR UPDATE SKIP LOCKED`, then the claims' `UPDATE` with `COMMIT`
    /// (pipelined on one connection).
    async fn claim(&self, now: i64, decided: Decided) -> Result<Claim, PgOutboxError> {
        let sql = &self.outbox.sql;
        let name = self.publisher.name();
        let limit = i64::try_from(self.publisher.batch_size()).unwrap_or(i64::MAX);
        let open = OpenTxn::new(self.pool.get().await?);
        let client = open.client();
        let due = prepared(client, &sql.due).await?;
        let claim = prepared(client, &sql.claim).await?;
        let remove = prepared(client, &sql.remove_if).await?;
        let reschedule = prepared(client, &sql.reschedule_if).await?;
        let removed = Guards::of(decided.removed.iter().map(|s| (s, None)));
        let kept = Guards::of(decided.kept.iter().map(|(s, at)| (s, Some(*at))));
        let removals: [&(dyn ToSql + Sync); 4] =
            [&name, &removed.keys, &removed.versions, &removed.attempts];
        let reschedules: [&(dyn ToSql + Sync); 5] =
            [&name, &kept.keys, &kept.versions, &kept.attempts, &kept.due];
        let params: [&(dyn ToSql + Sync); 3] = [&name, &now, &limit];
        let (begun, removed_rows, kept_rows, rows) = futures::join!(
            client.batch_execute("BEGIN"),
            run_if(client, &remove, &removals, !decided.removed.is_empty()),
            run_if(client, &reschedule, &reschedules, !decided.kept.is_empty()),
            client.query(&due, &params)
        );
        begun.map_err(PgOutboxError::statement)?;
        removed_rows.map_err(PgOutboxError::statement)?;
        let kept_rows = kept_rows.map_err(PgOutboxError::statement)?;
        let rows = rows.map_err(PgOutboxError::statement)?;
        let mut rescheduled = std::collections::HashSet::new();
        for row in kept_rows {
            rescheduled.insert(
                row.try_get::<_, String>(0)
                    .map_err(PgOutboxError::statement)?,
            );
        }
        let deadline = self.publisher.claim_deadline(now);
        let mut claimed = Vec::with_capacity(rows.len());
        let mut quarantined = Vec::new();
        for row in &rows {
            match decode(name, row)? {
                StoredRow::Entry(stored) => claimed.push(self.publisher.claim(stored)),
                StoredRow::Corrupt(corrupt) => {
                    client
                        .execute(
                            &sql.quarantine,
                            &[&name, &corrupt.key, &corrupt.reason, &now],
                        )
                        .await
                        .map_err(PgOutboxError::statement)?;
                    quarantined.push(corrupt);
                }
            }
        }
        let keys: Vec<&str> = claimed.iter().map(|c| c.stored.key.as_str()).collect();
        let attempts: Vec<i32> = claimed.iter().map(|c| as_i32(c.attempt)).collect();
        let params: [&(dyn ToSql + Sync); 4] = [&name, &deadline, &keys, &attempts];
        self.commit_claim(open, (!claimed.is_empty()).then_some((&claim, &params[..])))
            .await?;
        let mut settled = decided.removed;
        // A newer value staged meanwhile replaced a retried attempt: nothing
        // to retry, and no event to report.
        settled.extend(
            decided
                .kept
                .into_iter()
                .map(|(s, _)| s)
                .filter(|s| rescheduled.contains(&s.key)),
        );
        Ok(Claim {
            claimed,
            quarantined,
            settled,
        })
    }

    /// Sends the claims' `UPDATE` (when there are claims) and `COMMIT`
    /// together. A refused `UPDATE` aborts the transaction (its `COMMIT`
    /// rolls back): definite. A `COMMIT` without a reply: unknown.
    async fn commit_claim(
        &self,
        open: OpenTxn,
        update: Option<(&tokio_postgres::Statement, &[&(dyn ToSql + Sync)])>,
    ) -> Result<(), PgOutboxError> {
        #[cfg(feature = "testkit")]
        let crash = self.crash_now();
        #[cfg(feature = "testkit")]
        if crash == Some(false) {
            return Err(PgOutboxError::Unavailable("injected crash".into()));
        }
        let client = open.client();
        let (updated, committed) = match update {
            Some((statement, params)) => {
                let (u, c) = futures::join!(
                    client.execute(statement, params),
                    client.batch_execute("COMMIT")
                );
                (u.map(drop), c)
            }
            None => (Ok(()), client.batch_execute("COMMIT").await),
        };
        committed.map_err(PgOutboxError::commit)?;
        updated.map_err(PgOutboxError::statement)?;
        open.done();
        #[cfg(feature = "testkit")]
        if crash == Some(true) {
            return Err(PgOutboxError::Unavailable("injected crash".into()));
        }
        Ok(())
    }

    /// Decides a published batch's settlements ([`rules::settle`]): the
    /// entries to remove, and those to retry with their next due time; each
    /// write is guarded by the version and attempt claimed.
    fn decide(&self, outcomes: Vec<Settlement>) -> Decided {
        let now = self.publisher.now_ms();
        let mut decided = Decided::default();
        for s in outcomes {
            let (kind, fate, next_at) = match rules::settle(s.outcome) {
                Settle::Remove { kind, fate } => {
                    if kind == EventKind::Delivered {
                        self.publisher
                            .delivered_late_by(now.saturating_sub(s.stored.due_at));
                    }
                    (kind, fate, None)
                }
                Settle::Reschedule {
                    error,
                    requested,
                    fate,
                } => {
                    let at = self
                        .publisher
                        .retry_at(&s.stored.key, s.attempt, requested, now);
                    (
                        EventKind::RetryScheduled { next_at: at, error },
                        fate,
                        Some(at),
                    )
                }
            };
            let settled = Settled::new(s.stored, s.attempt, kind, fate, s.undecodable);
            match next_at {
                None => decided.removed.push(settled),
                Some(at) => decided.kept.push((settled, at)),
            }
        }
        decided
    }

    /// The pending entry of `key`: its version and attempts so far.
    ///
    /// # Errors
    /// `OUTBOX_INVALID_KEY`; [`PgOutboxError::Corrupt`] for a corrupt row;
    /// a server error.
    pub async fn pending(&self, key: &str) -> Result<Option<(u64, u32)>, PgOutboxError> {
        rules::check_key(key)?;
        let client = self.pool.get().await?;
        let row = client
            .query_opt(&self.outbox.sql.get, &[&self.publisher.name(), &key])
            .await
            .map_err(PgOutboxError::statement)?;
        match row.map(|r| decode(self.publisher.name(), &r)).transpose()? {
            None => Ok(None),
            Some(StoredRow::Entry(e)) => Ok(Some((e.version, e.attempt))),
            Some(StoredRow::Corrupt(c)) => Err(PgOutboxError::Corrupt(c.reason)),
        }
    }

    /// How many entries of the channel are pending.
    ///
    /// # Errors
    /// A server error.
    pub async fn len(&self) -> Result<u64, PgOutboxError> {
        self.count(&self.outbox.sql.len).await
    }

    /// Whether nothing is pending.
    ///
    /// # Errors
    /// A server error.
    pub async fn is_empty(&self) -> Result<bool, PgOutboxError> {
        Ok(self.len().await? == 0)
    }

    /// How many of the channel's rows are in quarantine.
    ///
    /// # Errors
    /// A server error.
    pub async fn quarantined(&self) -> Result<u64, PgOutboxError> {
        self.count(&self.outbox.sql.quarantined_len).await
    }

    /// Deletes the channel's quarantined rows; how many there were.
    ///
    /// # Errors
    /// A server error.
    pub async fn purge_quarantined(&self) -> Result<u64, PgOutboxError> {
        let client = self.pool.get().await?;
        client
            .execute(
                &self.outbox.sql.purge_quarantined,
                &[&self.publisher.name()],
            )
            .await
            .map_err(PgOutboxError::statement)
    }

    /// The earliest due time of the channel's entries.
    pub(super) async fn next_due(&self) -> Result<Option<i64>, PgOutboxError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(&self.outbox.sql.next_due, &[&self.publisher.name()])
            .await
            .map_err(PgOutboxError::statement)?;
        row.try_get(0).map_err(PgOutboxError::statement)
    }

    async fn count(&self, sql: &str) -> Result<u64, PgOutboxError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(sql, &[&self.publisher.name()])
            .await
            .map_err(PgOutboxError::statement)?;
        let n: i64 = row.try_get(0).map_err(PgOutboxError::statement)?;
        Ok(n.unsigned_abs())
    }
}
