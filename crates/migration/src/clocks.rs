//! Judging deadlines that other routers wrote, without comparing clocks.
//!
//! A deadline stored in the journal (an operation's `live_until_ms`, the
//! recovery lease's `expires_ms`) or on a data shard (a write hold's
//! `until_ms`) is a reading of the clock of the router that wrote it. A
//! router compares such a deadline with its own clock only when both read
//! the same clock ([`Core::same_clock`]: the writer is this router, one of
//! its recoveries, or a router of its configured clock domain). Otherwise it
//! judges the row by watching it ([`Sightings`]): a row it has seen
//! unchanged for the row's whole period, measured on its own clock, has
//! lapsed. So a router whose clock runs ahead never takes a live row for
//! lapsed, and one whose clock runs behind still sees a dead one lapse.
//! Clock offsets never matter; clock rates are assumed equal.
//!
//! The recovery lease and an operation's liveness are watched twice
//! ([`Core::lapsed_journaled`]): in this router's memory, on its own clock,
//! and in the journal (`durability_migration_sightings`), on the journal
//! database's own clock (PostgreSQL `clock_timestamp()`, MariaDB `NOW(6)`,
//! SQLite the clock of the machine holding the file). Either judgement is
//! one clock's reading of how long the row stood still, so either lapses
//! it. The journal's is what lets a router built fresh on every call (a
//! cron job, the one-shot CLI), which remembers nothing, take a crashed
//! recovery's lease over and settle a dead mover's operation once the
//! first sighting is a period old. A write hold on a data shard is watched
//! in memory only (recovery ends a dead mover's hold with its operation).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::dialect::Watched;
use crate::journal::Guard;
use crate::router::Core;

/// At most this many rows are watched at once; past it the sightings start
/// over (which only delays a judgement, never hastens one).
const MAX_SIGHTINGS: usize = 10_000;

/// Rows this router is watching: id → (the row as last seen, when this
/// router first saw it so, on its own clock).
#[derive(Debug, Default)]
pub(crate) struct Sightings {
    seen: Mutex<HashMap<String, (String, i64)>>,
}

impl Sightings {
    /// Whether row `id` has stood as `token` for at least `period_ms` of
    /// this router's clock (`now`). A first sight, or a changed token,
    /// starts the period at `now`.
    pub(crate) fn stood_still(&self, id: &str, token: &str, now: i64, period_ms: u64) -> bool {
        let mut seen = self.lock();
        if let Some((t, since)) = seen.get(id)
            && t == token
        {
            return now.saturating_sub(*since) >= i64::try_from(period_ms).unwrap_or(i64::MAX);
        }
        if seen.len() >= MAX_SIGHTINGS && !seen.contains_key(id) {
            seen.clear();
        }
        seen.insert(id.to_owned(), (token.to_owned(), now));
        false
    }

    /// Stops watching row `id` (it is gone).
    pub(crate) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Keeps watching only the rows `keep` accepts.
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|id, _| keep(id));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, i64)>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Core {
    /// Whether `owner` (the writer recorded with a deadline: an operation's
    /// owner, a lease holder, a hold's mover) reads this router's clock:
    /// this router, its own recoveries, or a router of its configured clock
    /// domain.
    pub(crate) fn same_clock(&self, owner: &str) -> bool {
        owner == self.instance
            || owner
                .strip_prefix(self.instance.as_str())
                .is_some_and(|rest| rest.starts_with(':'))
            || self.clock_domain.as_ref().is_some_and(|d| {
                owner
                    .strip_prefix(d.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
            })
    }

    /// Whether a deadline `until` that `owner` wrote has passed: on this
    /// router's clock when `owner` reads it, otherwise once this router has
    /// seen the row (`id`, as `token`) unchanged for `period_ms` of its own
    /// clock.
    pub(crate) fn lapsed(
        &self,
        seen: &Sightings,
        (owner, until): (&str, i64),
        (id, token): (&str, &str),
        period_ms: u64,
    ) -> bool {
        let now = self.now();
        if self.same_clock(owner) {
            now >= until
        } else {
            seen.stood_still(id, token, now, period_ms)
        }
    }

    /// [`Core::lapsed`] for a row of the journal (`watched`, as `token`):
    /// a row written on another clock lapses once it stood still for
    /// `period_ms` on this router's clock (in memory) or on the journal
    /// database's clock (a sighting persisted in the journal, so it
    /// outlives this router). `guard`: the recovery lease the sighting is
    /// written under (none before the lease is taken).
    pub(crate) async fn lapsed_journaled(
        &self,
        seen: &Sightings,
        (owner, until): (&str, i64),
        (watched, token): (Watched<'_>, &str),
        period_ms: u64,
        guard: Option<&Guard>,
    ) -> bool {
        let now = self.now();
        if self.same_clock(owner) {
            return now >= until;
        }
        let id = match watched {
            Watched::Lease => self.scope.as_str(),
            Watched::Op(id) => id,
        };
        let in_memory = seen.stood_still(id, token, now, period_ms);
        match self.journal_stood_still(watched, token, guard).await {
            Ok(age) => {
                in_memory || age.is_some_and(|a| a >= i64::try_from(period_ms).unwrap_or(i64::MAX))
            }
            Err(error) => {
                tracing::warn!(
                    event = "durability.migration.sighting_failed",
                    scope = %self.scope,
                    %error,
                    "a sighting could not be recorded in the journal; judged on this router's memory only"
                );
                in_memory
            }
        }
    }

    /// Records the sighting of `watched` as `token` in the journal and
    /// returns how long it has been seen so on the journal database's clock
    /// (`None` when the sighting was not written: the lease was lost).
    async fn journal_stood_still(
        &self,
        watched: Watched<'_>,
        token: &str,
        guard: Option<&Guard>,
    ) -> crate::error::Result<Option<i64>> {
        let (jname, js, q) = self.journal()?;
        let shard_err = |e| crate::error::MigrationError::shard(jname, e);
        js.batch(&q.sighting_note(watched, token, guard, self.now()))
            .await
            .map_err(shard_err)?;
        let rows = js
            .query(&q.sighting_age(watched, token))
            .await
            .map_err(shard_err)?;
        rows.first()
            .map(|r| crate::journal::int(r, "age_ms"))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::Sightings;

    #[test]
    fn a_row_lapses_after_standing_still_for_its_period() {
        let s = Sightings::default();
        assert!(!s.stood_still("a", "t1", 100, 50), "first sight");
        assert!(!s.stood_still("a", "t1", 149, 50));
        assert!(s.stood_still("a", "t1", 150, 50));
        // A changed row starts the period again.
        assert!(!s.stood_still("a", "t2", 151, 50));
        assert!(!s.stood_still("a", "t2", 200, 50));
        assert!(s.stood_still("a", "t2", 201, 50));
        s.forget("a");
        assert!(
            !s.stood_still("a", "t2", 1_000, 50),
            "forgotten: first sight"
        );
        s.retain(|id| id != "a");
        assert!(!s.stood_still("a", "t2", 2_000, 50));
    }

    #[test]
    fn overflowing_sightings_start_over_and_never_lapse_early() {
        let s = Sightings::default();
        for i in 0..super::MAX_SIGHTINGS {
            assert!(!s.stood_still(&i.to_string(), "t", 0, 10));
        }
        assert!(!s.stood_still("new", "t", 5, 10));
        // Row "0" was forgotten: its period starts again at 20.
        assert!(!s.stood_still("0", "t", 20, 10));
        assert!(s.stood_still("0", "t", 30, 10));
    }
}
