//! Our Redis leases against their peers, for `cargo xtask bench ownership`.
//!
//! Three contenders do the same work on Redis on loopback, each on one
//! connection of its own, in interleaved rounds so that load from other
//! processes on a shared machine falls on all of them alike:
//!
//! - **ours**: [`RedisLeaseStore`] claim + release, and renew (every check
//!   kept: exact owner bytes, storage pointer, delete lock, generation,
//!   server time);
//! - **rslock** 0.10 (the most-used Rust Redis lock crate, no fencing):
//!   `lock` + `unlock`, and `extend`, on one server;
//! - **raw** redis-rs: `SET NX PX` + a compare-and-delete script, and a
//!   compare-and-expire script called by SHA.
//!
//! Each round runs every contender for `iterations` operations, in blocks of
//! [`BLOCK`] with the contenders' order rotating every block; a contender's
//! figure is its operations per second over all rounds, and the ratio is
//! ours over theirs (higher is better for us), with each round's ratio
//! printed beside it to show the spread.

#![allow(clippy::print_stdout, reason = "the bench prints its JSON lines")]

mod contenders;

use std::time::Duration;

use durability_storage_redis::ownership::RedisLeaseStore;

use contenders::{BLOCK, BoxResult, Contenders, Who};

const ROUNDS: usize = 3;

fn per_second(n: u64, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// Runs the comparison: `iterations` operations per contender per round,
/// [`ROUNDS`] interleaved rounds. Prints one JSON line per figure.
///
/// # Errors
/// Redis failures, or a contender whose operation did not do what it should.
pub(crate) async fn bench(
    redis_url: &str,
    store: &RedisLeaseStore,
    iterations: u64,
) -> BoxResult<()> {
    let mut c = Contenders::connect(redis_url, store.clone(), store.prefix()).await?;
    c.warm_up(500).await?;
    // Blocks of BLOCK operations, the contenders' order rotating every
    // block, so that a burst of load from another process falls on all
    // three alike; per round, each contender's total time.
    let blocks = (iterations / BLOCK).max(1);
    let ops = blocks * BLOCK;
    let mut pairs = [[Duration::ZERO; 3]; ROUNDS];
    let mut renews = [[Duration::ZERO; 3]; ROUNDS];
    for round in 0..ROUNDS {
        (pairs[round], renews[round]) = c.rotate(blocks, round).await?;
    }
    for (what, rounds, target) in [
        ("acquire_release", pairs, ">=1.0 rslock, >=0.9 raw"),
        ("renew", renews, ">=1.0 rslock, >=0.95 raw"),
    ] {
        let rate =
            |i: usize| -> Vec<f64> { rounds.iter().map(|r| per_second(ops, r[i])).collect() };
        let total = |i: usize| per_second(ops * ROUNDS as u64, rounds.iter().map(|r| r[i]).sum());
        let ours = total(0);
        let mut line = format!("{what}: ours {ours:.0}/s");
        for i in [1, 2] {
            let theirs = total(i);
            let round_ratios: Vec<f64> = rate(0)
                .iter()
                .zip(rate(i))
                .map(|(o, t)| (o / t * 1000.0).round() / 1000.0)
                .collect();
            line.push_str(&format!(
                ", {} {theirs:.0}/s ({:.3}x; rounds {round_ratios:?})",
                Who::ALL[i].name(),
                ours / theirs
            ));
            let v = serde_json::json!({
                "name": format!("ownership.peers.{what}.vs_{}", Who::ALL[i].name()),
                "value": ours.round(),
                "baseline": theirs.round(),
                "unit": "ops/s",
                "ratio": ((ours / theirs) * 1000.0).round() / 1000.0,
                "round_ratios": round_ratios,
                "higher_is_better": true,
                "target": target,
                "rounds": ROUNDS,
                "n": ops,
                "backend": "redis",
            });
            println!("{v}");
        }
        eprintln!("{line}");
    }
    Ok(())
}
