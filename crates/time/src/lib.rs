//! Time for the durability crates: one [`Clock`], deadlines, backoff.
//!
//! Every durable time in the workspace is Unix milliseconds as an `i64`.
//! Library code reads time only through a [`Clock`], so tests and
//! simulations drive time by hand ([`ManualClock`]) and never sleep for
//! real; [`SystemClock`] is the production clock and the only code that
//! reads the operating system's clocks.
//!
//! - [`Clock`], [`SystemClock`] (one wall-clock read per process, then the
//!   monotonic clock), [`ManualClock`] (moves only when told, never
//!   backwards).
//! - [`timeout_at`]: run a future until a deadline on a clock; every
//!   deadline in the workspace goes through it.
//! - [`Backoff`] and [`Jitter`]: exponential backoff with a cap, a jitter
//!   kind and an optional maximum number of tries, drawing from a
//!   [`Random`] source that a test can seed or fix.
//! - [`debug_fields!`]: a `Debug` that prints only the named fields, for
//!   types holding connections, scripts or callbacks.
//! - [`error_codes!`]: an error type's `code()` and `CODES` from one list,
//!   so the two cannot disagree.
//! - [`MAX_SAFE_INTEGER`]: the largest integer a JavaScript number holds
//!   exactly, the bound on stored times, versions and generations.
//! - [`check_name`]: the rule the crates' names and keys share (1 to a
//!   bound of bytes, no control characters).
//!
//! ```
//! use durability_time::{Backoff, Clock, Jitter, ManualClock, Random};
//!
//! let clock = ManualClock::new(1_000);
//! clock.advance(500);
//! assert_eq!(clock.now_ms(), 1_500);
//! clock.set(0); // never backwards: a no-op
//! assert_eq!(clock.now_ms(), 1_500);
//!
//! let backoff = Backoff::new(1_000, 300_000).jitter(Jitter::Under(0.5));
//! let delay = backoff.delay_ms(3, &Random::seeded(7));
//! assert!((2_000..=4_000).contains(&delay));
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

mod backoff;
mod clock;
mod deadline;
mod macros;
mod random;

pub use backoff::{Backoff, Jitter};
pub use clock::{Clock, ManualClock, ShiftedClock, SystemClock};
pub use deadline::{Elapsed, timeout_at};
pub use random::Random;

#[doc(hidden)]
pub use macros::__codes;

/// The largest integer a JavaScript number (and so the stored times,
/// versions and generations JavaScript peers read) represents exactly: `2^53 - 1`.
pub const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// [`MAX_SAFE_INTEGER`] as a `u64`, for unsigned generations, versions and
/// settings.
pub const MAX_SAFE_UNSIGNED: u64 = MAX_SAFE_INTEGER.unsigned_abs();

/// Whether `n` is in `0..=MAX_SAFE_INTEGER`.
pub const fn is_safe_non_negative(n: i64) -> bool {
    n >= 0 && n <= MAX_SAFE_INTEGER
}

/// Checks `text` against the rule the crates' names and keys share: 1 to
/// `max_bytes` bytes, no control characters. `too_long` is the reason for a
/// longer text (it states the bound: `"must be at most 256 bytes"`).
///
/// # Errors
/// The reason `text` breaks the rule, for the caller's own error.
pub fn check_name(
    text: &str,
    max_bytes: usize,
    too_long: &'static str,
) -> Result<(), &'static str> {
    if text.is_empty() {
        Err("must not be empty")
    } else if text.len() > max_bytes {
        Err(too_long)
    } else if text.chars().any(char::is_control) {
        Err("must not contain control characters")
    } else {
        Ok(())
    }
}

/// Parses a canonical positive decimal (`[1-9][0-9]*`, at most 16 digits)
/// no greater than `max`: the rule every numeric setting read from the
/// environment follows (a value that breaks it falls back to its default,
/// logged by the caller).
pub fn parse_canonical_positive(raw: &str, max: u64) -> Option<u64> {
    let canonical = !raw.is_empty()
        && raw.len() <= 16
        && raw.bytes().all(|b| b.is_ascii_digit())
        && !raw.starts_with('0');
    if !canonical {
        return None;
    }
    raw.parse::<u64>().ok().filter(|v| *v <= max)
}

#[cfg(test)]
mod tests;

pub mod docs;
