//! Unit tests of the clock, deadlines and backoff.

use std::time::Duration;

use super::*;

#[test]
fn manual_clock_never_moves_backwards() {
    let clock = ManualClock::new(1_000);
    clock.set(500);
    assert_eq!(clock.now_ms(), 1_000);
    clock.advance(-10);
    assert_eq!(clock.now_ms(), 1_000);
    clock.set(2_000);
    clock.advance(5);
    assert_eq!(clock.now_ms(), 2_005);
    let other = clock.clone();
    other.advance(1);
    assert_eq!(clock.now_ms(), 2_006, "clones share the time");
}

#[tokio::test]
async fn manual_sleepers_wake_when_time_passes_them() {
    let clock = ManualClock::new(0);
    let early = tokio::spawn(clock.sleep_until(10));
    let late = tokio::spawn(clock.sleep_until(20));
    tokio::task::yield_now().await;
    assert_eq!(clock.next_wake(), Some(10));
    clock.advance(10);
    early.await.expect("early sleeper");
    assert!(!late.is_finished());
    assert_eq!(clock.next_wake(), Some(20));
    clock.set(25);
    late.await.expect("late sleeper");
    assert_eq!(clock.next_wake(), None);
    // A deadline already passed completes at once.
    clock.sleep_until(3).await;
}

#[test]
fn system_clocks_agree_and_never_go_back() {
    let a = SystemClock::new();
    let b = SystemClock;
    let t1 = a.now_ms();
    let t2 = b.now_ms();
    let t3 = a.now_ms();
    assert!(t1 <= t2 && t2 <= t3);
    assert!(t1 > 1_600_000_000_000, "Unix milliseconds: {t1}");
    assert!(t3 <= MAX_SAFE_INTEGER);
}

#[tokio::test]
async fn timeout_at_prefers_a_ready_future_and_cancels_on_the_deadline() {
    let clock = ManualClock::new(100);
    // Ready at a deadline already passed: finished, not timed out.
    assert_eq!(timeout_at(&clock, 50, async { 7 }).await, Ok(7));
    let pending = timeout_at(&clock, 200, futures::future::pending::<()>());
    let task = tokio::spawn(pending);
    tokio::task::yield_now().await;
    clock.advance(99);
    tokio::task::yield_now().await;
    assert!(!task.is_finished());
    clock.advance(1);
    let elapsed = task.await.expect("joins");
    assert_eq!(elapsed, Err(Elapsed { deadline_ms: 200 }));
    let code = elapsed.expect_err("the deadline won").code();
    assert_eq!(code, "TIME_DEADLINE_ELAPSED");
    assert_eq!(Elapsed::CODES, [code]);
}

#[tokio::test]
async fn timeout_at_works_on_the_system_clock() {
    let clock = SystemClock;
    let deadline = clock.now_ms() + 20;
    let slept = timeout_at(&clock, deadline, tokio::time::sleep(Duration::from_secs(5))).await;
    assert_eq!(
        slept,
        Err(Elapsed {
            deadline_ms: deadline
        })
    );
}

#[test]
fn backoff_ceiling_doubles_up_to_the_cap() {
    let b = Backoff::new(1_000, 300_000);
    let ceilings: Vec<i64> = (1..=11).map(|n| b.ceiling_ms(n)).collect();
    assert_eq!(
        ceilings,
        [
            1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000, 300_000
        ]
    );
    assert_eq!(b.ceiling_ms(0), 1_000, "try 0 is treated as the first");
    assert_eq!(b.ceiling_ms(u32::MAX), 300_000);
    assert!(!b.exhausted(1_000_000));
    assert!(b.max_tries(6).exhausted(6));
    assert!(!b.max_tries(6).exhausted(5));
}

#[test]
fn under_jitter_stays_below_the_ceiling() {
    let b = Backoff::new(1_000, 300_000).jitter(Jitter::Under(0.5));
    assert_eq!(b.delay_for_unit(3, 0.0), 2_000.0);
    assert!(b.delay_for_unit(3, 0.999_999) < 4_000.0);
    let r = Random::seeded(1);
    for n in 1..40 {
        let (lo, hi) = b.bounds(n);
        let d = b.delay_ms(n, &r);
        assert!((lo..=hi).contains(&d), "try {n}: {d} not in {lo}..={hi}");
    }
}

#[test]
fn around_jitter_spreads_both_ways() {
    let b = Backoff::new(1_000, 300_000).jitter(Jitter::Around(0.2));
    assert_eq!(b.bounds(1), (800, 1_200));
    assert_eq!(b.bounds(20), (240_000, 360_000));
    assert_eq!(b.delay_ms(1, &Random::fixed(0.0)), 800);
    assert_eq!(b.delay_ms(1, &Random::fixed(0.5)), 1_000);
    let r = Random::os();
    for n in 1..40 {
        let (lo, hi) = b.bounds(n);
        let d = b.delay_ms(n, &r);
        assert!((lo..=hi).contains(&d));
    }
}

#[test]
fn seeded_random_is_reproducible() {
    let b = Backoff::new(1_000, 300_000).jitter(Jitter::Around(0.2));
    let draw = |seed| {
        let r = Random::seeded(seed);
        (1..20).map(|n| b.delay_ms(n, &r)).collect::<Vec<_>>()
    };
    assert_eq!(draw(42), draw(42));
    assert_ne!(draw(42), draw(43));
    let u = Random::seeded(9);
    let shared = u.clone();
    let (a, b2) = (u.unit(), shared.unit());
    assert_ne!(a, b2, "clones draw one sequence between them");
}

#[test]
fn fixed_random_is_clamped() {
    assert_eq!(Random::fixed(0.25).unit(), 0.25);
    assert!(Random::fixed(7.0).unit() < 1.0);
    assert_eq!(Random::fixed(f64::NAN).unit(), 0.0);
    assert_eq!(Random::fixed(0.5).range_inclusive(10, 20), 15);
    assert_eq!(Random::fixed(0.9).range_inclusive(5, 5), 5);
}

#[test]
fn safe_integers() {
    assert_eq!(MAX_SAFE_INTEGER, 9_007_199_254_740_991);
    assert!(is_safe_non_negative(0));
    assert!(is_safe_non_negative(MAX_SAFE_INTEGER));
    assert!(!is_safe_non_negative(MAX_SAFE_INTEGER + 1));
    assert!(!is_safe_non_negative(-1));
}

#[tokio::test]
async fn backoff_wait_sleeps_on_the_clock_for_a_drawn_delay() {
    let clock = ManualClock::new(1_000);
    let b = Backoff::new(100, 1_000);
    let waiting = tokio::spawn(b.wait(&clock, 2, &Random::os()));
    tokio::task::yield_now().await;
    assert_eq!(
        clock.next_wake(),
        Some(1_200),
        "ceiling of try 2, no jitter"
    );
    clock.advance(199);
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    clock.advance(1);
    waiting.await.expect("woke");
}

/// Error types as a crate declares them; the macro's items are `pub`.
#[allow(unreachable_pub)]
mod codes {
    /// A wrapped error whose codes [`Outer`] passes through.
    #[derive(Debug)]
    pub enum Wrapped {
        Broken,
    }
    crate::error_codes! { Wrapped { Self::Broken => "WRAPPED_BROKEN" } }

    #[derive(Debug)]
    pub enum Outer {
        Invalid {
            #[allow(dead_code)] // only shown by `Debug`
            name: &'static str,
        },
        Gone,
        Lost,
        Wrapped(Wrapped),
        Storage(u8),
    }
    crate::error_codes! {
        Outer {
            Self::Invalid { .. } => "OUTER_INVALID",
            Self::Storage(kind) if *kind == 0 => "OUTER_CORRUPT",
            Self::Gone | Self::Lost => "OUTER_GONE",
            Self::Wrapped(e) => e.code(),
            Self::Storage(kind) if *kind == 1 => "OUTER_CORRUPT",
            Self::Storage(_) => "OUTER_STORAGE",
        }
    }
}

use codes::{Outer, Wrapped};

#[test]
fn error_codes_lists_each_literal_code_once_in_arm_order_and_matches_code() {
    assert_eq!(
        Outer::CODES,
        [
            "OUTER_INVALID",
            "OUTER_CORRUPT",
            "OUTER_GONE",
            "OUTER_STORAGE"
        ]
    );
    assert_eq!(Wrapped::CODES, ["WRAPPED_BROKEN"]);
    let cases = [
        (Outer::Invalid { name: "x" }, "OUTER_INVALID"),
        (Outer::Gone, "OUTER_GONE"),
        (Outer::Lost, "OUTER_GONE"),
        (Outer::Wrapped(Wrapped::Broken), "WRAPPED_BROKEN"),
        (Outer::Storage(0), "OUTER_CORRUPT"),
        (Outer::Storage(1), "OUTER_CORRUPT"),
        (Outer::Storage(2), "OUTER_STORAGE"),
    ];
    for (error, code) in cases {
        assert_eq!(error.code(), code, "{error:?}");
        let listed = Outer::CODES.contains(&code) || Wrapped::CODES.contains(&code);
        assert!(listed, "{code} is listed");
    }
}

#[test]
fn the_code_list_helpers_keep_first_appearances() {
    use crate::__codes::{unique, unique_count};
    const ALL: &[&str] = &["B", "A", "B", "AB", "A", "C"];
    assert_eq!(unique_count(ALL), 4);
    assert_eq!(unique::<4>(ALL), ["B", "A", "AB", "C"]);
    assert_eq!(unique_count(&[]), 0);
    assert_eq!(unique::<0>(&[]), [""; 0]);
}

#[test]
fn check_name_refuses_empty_long_and_control_text_with_its_reason() {
    let check = |text: &str| check_name(text, 4, "must be at most 4 bytes");
    assert_eq!(check("abcd"), Ok(()));
    assert_eq!(check("é"), Ok(()), "bytes, not characters: 2 of 4");
    assert_eq!(check(""), Err("must not be empty"));
    assert_eq!(check("abcde"), Err("must be at most 4 bytes"));
    assert_eq!(check("éé é"), Err("must be at most 4 bytes"));
    assert_eq!(check("a\nb"), Err("must not contain control characters"));
}
