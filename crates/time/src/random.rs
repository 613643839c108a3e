//! The injected source of randomness for jitter.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Where jitter draws its random numbers: the operating system's generator
/// by default, a seeded generator for reproducible tests and simulations, or
/// a fixed value for tests that pin one draw.
///
/// Cloning shares the generator: two clones of a seeded source draw one
/// sequence between them.
#[derive(Clone, Default)]
pub struct Random(Source);

#[derive(Clone, Default)]
enum Source {
    #[default]
    Os,
    Seeded(Arc<Mutex<StdRng>>),
    Fixed(f64),
}

impl fmt::Debug for Random {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::Os => f.write_str("Random::Os"),
            Source::Seeded(_) => f.write_str("Random::Seeded"),
            Source::Fixed(u) => write!(f, "Random::Fixed({u})"),
        }
    }
}

impl Random {
    /// The operating system's thread-local generator (the default).
    pub fn os() -> Self {
        Self(Source::Os)
    }

    /// A deterministic generator: the same seed draws the same sequence.
    pub fn seeded(seed: u64) -> Self {
        Self(Source::Seeded(Arc::new(Mutex::new(StdRng::seed_from_u64(
            seed,
        )))))
    }

    /// Every draw is `unit` (clamped into `[0, 1)`): [`Random::unit`]
    /// returns it, and [`Random::range_inclusive`] picks the point that far
    /// along its range.
    pub fn fixed(unit: f64) -> Self {
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0 - f64::EPSILON)
        } else {
            0.0
        };
        Self(Source::Fixed(unit))
    }

    /// A number drawn uniformly from `[0, 1)`.
    pub fn unit(&self) -> f64 {
        match &self.0 {
            Source::Os => rand::rng().random::<f64>(),
            Source::Seeded(rng) => rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .random::<f64>(),
            Source::Fixed(u) => *u,
        }
    }

    /// An integer drawn uniformly from `lo..=hi` (`lo` when `hi <= lo`).
    pub fn range_inclusive(&self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        match &self.0 {
            Source::Os => rand::rng().random_range(lo..=hi),
            Source::Seeded(rng) => rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .random_range(lo..=hi),
            Source::Fixed(u) => {
                #[allow(
                    clippy::cast_precision_loss,
                    clippy::cast_possible_truncation,
                    reason = "a point along the range; clamped into it"
                )]
                let at = lo.saturating_add(((hi - lo) as f64 * u).round() as i64);
                at.clamp(lo, hi)
            }
        }
    }
}
