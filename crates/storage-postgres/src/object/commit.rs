//! `COMMIT` under a deadline ([`PostgresObjectOptions::commit_timeout`](super::PostgresObjectOptions::commit_timeout)).
//!
//! A commit can wait on the server with no end: with a synchronous standby
//! named in `synchronous_standby_names` that is gone (or a promoted standby
//! that inherited the setting and has no standby of its own), every
//! `COMMIT` writes its commit record locally and then waits for a standby
//! that never answers. The wait is ended on the client's side only: past
//! the deadline the call's outcome is `Unknown` (the commit record is
//! already written locally; it becomes visible when the wait ends) and the
//! connection is not returned to the pool (the caller's guard closes it).
//!
//! No server-side cancel is sent, and `statement_timeout` is not used: a
//! cancelled synchronous-replication wait makes PostgreSQL answer the
//! `COMMIT` with success and a `WARNING` ("canceling wait for synchronous
//! replication ...: the transaction has already committed locally, but
//! might not have been replicated"), which a client could take for a
//! replicated commit, and it makes the unreplicated rows visible to every
//! other session at once. Left alone, the server's session keeps the
//! transaction invisible and its row locks held until a standby confirms
//! it or the operator clears the setting; a later call on the same object
//! meanwhile fails on the object row's lock timeout, before it writes.

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::Object;
use durability_scheduler::{StorageError, StorageErrorKind};
use durability_time::{Clock, SystemClock};

use super::runtime::park_until;
use super::tx::commit_error;

/// Parks the calling thread until `fut` is ready or `timeout` passed on
/// `clock`: `None` then (`fut` is dropped unfinished). As
/// [`wait`](super::runtime::wait), for futures that need no runtime
/// context of their own.
pub(crate) fn wait_for<F: Future>(
    fut: F,
    timeout: Duration,
    clock: &dyn Clock,
) -> Option<F::Output> {
    let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
    let deadline = clock.now_ms().saturating_add(timeout_ms);
    park_until(fut, Some((deadline, clock)))
}

/// Sends `COMMIT` on `client` and waits at most `timeout` for its reply.
/// Any `Err` leaves the connection unusable: the caller must close it.
///
/// # Errors
/// As [`commit_error`] for a reply that is an error or a lost connection;
/// `Unknown` when no reply came within `timeout`.
pub(crate) fn commit(client: &Object, timeout: Duration) -> Result<(), StorageError> {
    match wait_for(client.batch_execute("COMMIT"), timeout, &SystemClock::new()) {
        Some(done) => done.map_err(commit_error),
        None => Err(StorageError::new(
            StorageErrorKind::Unknown,
            format!(
                "the commit's outcome is unknown: no reply to COMMIT within {} ms (a synchronous \
                 standby that does not answer?); the connection is closed, and the server may \
                 still commit it",
                timeout.as_millis()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use durability_time::ManualClock;

    use super::*;

    #[test]
    fn a_ready_future_is_returned_and_a_pending_one_gives_up_at_its_deadline() {
        let clock = ManualClock::new(1_000);
        assert_eq!(
            wait_for(std::future::ready(7), Duration::ZERO, &clock),
            Some(7)
        );
        // The clock is past the deadline at the first look.
        assert_eq!(
            wait_for(std::future::pending::<u8>(), Duration::ZERO, &clock),
            None
        );
    }

    #[test]
    fn a_deadline_beyond_the_clock_waits_for_the_future() {
        let clock = ManualClock::new(i64::MAX - 1);
        assert_eq!(
            wait_for(std::future::ready(1), Duration::MAX, &clock),
            Some(1)
        );
    }
}
