//! Exponential backoff with a cap, a jitter kind and a maximum of tries.

use std::future::Future;

use crate::{Clock, Random};

/// How a backoff delay is spread around its exponential ceiling `d`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// Exactly `d`.
    None,
    /// `d` scaled by a factor drawn uniformly from `[1 - f, 1)`: never above
    /// the ceiling (`Under(0.5)` is "equal jitter").
    Under(f64),
    /// An integer drawn uniformly from `floor(d·(1 - f))..=ceil(d·(1 + f))`:
    /// spread evenly around the ceiling.
    Around(f64),
}

/// Exponential backoff: the delay after the `n`-th failed try is
/// `min(cap, base · 2^(n-1))`, spread by a [`Jitter`], with an optional
/// maximum number of tries.
///
/// Plain data: capabilities keep their own policy types (their contracts
/// differ in defaults, limits and validation) and compute through this one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The delay after the first failed try, in milliseconds.
    pub base_ms: i64,
    /// The cap on the delay before jitter, in milliseconds.
    pub cap_ms: i64,
    /// How the delay is spread.
    pub jitter: Jitter,
    /// Tries before giving up; `None` retries forever.
    pub max_tries: Option<u32>,
}

impl Backoff {
    /// Backoff from `base_ms` doubling up to `cap_ms`, without jitter,
    /// retrying forever.
    pub const fn new(base_ms: i64, cap_ms: i64) -> Self {
        Self {
            base_ms,
            cap_ms,
            jitter: Jitter::None,
            max_tries: None,
        }
    }

    /// The same backoff with `jitter`.
    #[must_use]
    pub const fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The same backoff giving up after `max_tries` tries.
    #[must_use]
    pub const fn max_tries(mut self, max_tries: u32) -> Self {
        self.max_tries = Some(max_tries);
        self
    }

    /// Whether `tries` tries used up the allowance.
    pub fn exhausted(&self, tries: u32) -> bool {
        self.max_tries.is_some_and(|max| tries >= max)
    }

    /// The delay before jitter after the `tries`-th failed try (the first
    /// failure is try 1): `min(cap, base · 2^(tries-1))`.
    pub fn ceiling_ms(&self, tries: u32) -> i64 {
        let shift = tries.saturating_sub(1).min(62);
        self.base_ms
            .saturating_mul(1_i64 << shift)
            .min(self.cap_ms)
            .max(0)
    }

    /// The inclusive bounds a delay after the `tries`-th failed try falls in.
    pub fn bounds(&self, tries: u32) -> (i64, i64) {
        let d = self.ceiling_ms(tries);
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            reason = "delays are far below 2^53 ms"
        )]
        match self.jitter {
            Jitter::None => (d, d),
            Jitter::Under(f) => (((d as f64) * (1.0 - f.clamp(0.0, 1.0))).ceil() as i64, d),
            Jitter::Around(f) => {
                let f = f.clamp(0.0, 1.0);
                let lo = ((d as f64) * (1.0 - f)).floor().max(0.0) as i64;
                let hi = ((d as f64) * (1.0 + f)).ceil() as i64;
                (lo, hi)
            }
        }
    }

    /// The delay after the `tries`-th failed try for one uniform draw `unit`
    /// from `[0, 1)`, before rounding (only [`Jitter::Under`] and
    /// [`Jitter::None`] are continuous; [`Jitter::Around`] maps `unit` along
    /// its integer range).
    pub fn delay_for_unit(&self, tries: u32, unit: f64) -> f64 {
        let u = unit.clamp(0.0, 1.0);
        #[allow(clippy::cast_precision_loss, reason = "delays are far below 2^53 ms")]
        let d = self.ceiling_ms(tries) as f64;
        match self.jitter {
            Jitter::None => d,
            Jitter::Under(f) => {
                let f = f.clamp(0.0, 1.0);
                d * (1.0 - f + f * u)
            }
            Jitter::Around(_) => {
                let (lo, hi) = self.bounds(tries);
                #[allow(clippy::cast_precision_loss, reason = "delays are far below 2^53 ms")]
                let (lo, hi) = (lo as f64, hi as f64);
                (lo + (hi - lo) * u).round()
            }
        }
    }

    /// Waits on `clock` for a jittered delay after the `tries`-th failed
    /// try, drawn from `random`: the pause between two attempts of a retry
    /// loop. The future does not borrow `clock` or `random`.
    pub fn wait<C: Clock + ?Sized>(
        &self,
        clock: &C,
        tries: u32,
        random: &Random,
    ) -> impl Future<Output = ()> + Send + 'static + use<C> {
        let at = clock.now_ms().saturating_add(self.delay_ms(tries, random));
        clock.sleep_until(at)
    }

    /// A jittered delay after the `tries`-th failed try, in whole
    /// milliseconds, drawn from `random`.
    pub fn delay_ms(&self, tries: u32, random: &Random) -> i64 {
        match self.jitter {
            Jitter::None => self.ceiling_ms(tries),
            Jitter::Under(_) => {
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "delays are far below 2^53 ms"
                )]
                let ms = self.delay_for_unit(tries, random.unit()).ceil() as i64;
                ms
            }
            Jitter::Around(_) => {
                let (lo, hi) = self.bounds(tries);
                random.range_inclusive(lo, hi)
            }
        }
    }
}
