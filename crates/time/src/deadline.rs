//! Deadlines on a [`Clock`].

use std::future::Future;

use futures::future::Either;

use crate::Clock;

/// The deadline of [`timeout_at`] passed before its future completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed {
    /// The deadline that passed, in Unix milliseconds.
    pub deadline_ms: i64,
}

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "deadline {} ms passed", self.deadline_ms)
    }
}

impl std::error::Error for Elapsed {}

crate::error_codes! { Elapsed { Self { .. } => "TIME_DEADLINE_ELAPSED" } }

/// Runs `fut` until `clock` reaches `deadline_ms`.
///
/// The future is polled before the deadline, so a future that is ready when
/// the deadline is also due counts as finished, never as timed out. When the
/// deadline wins, `fut` is dropped (cancelled) and [`Elapsed`] returned; the
/// caller decides what an abandoned operation means (usually: outcome
/// unknown). A deadline already passed still polls `fut` once.
pub fn timeout_at<C, F>(
    clock: &C,
    deadline_ms: i64,
    fut: F,
) -> impl Future<Output = Result<F::Output, Elapsed>> + use<C, F>
where
    C: Clock + ?Sized,
    F: Future,
{
    let sleep = clock.sleep_until(deadline_ms);
    async move {
        let fut = std::pin::pin!(fut);
        match futures::future::select(fut, sleep).await {
            Either::Left((out, _)) => Ok(out),
            Either::Right(((), _)) => Err(Elapsed { deadline_ms }),
        }
    }
}
