//! Rate-limited logging of repeated per-object outcomes: at most one line
//! per object and outcome per interval, the next line counting the ones
//! suppressed in between.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use durability_scheduler::ObjectId;

/// Entries kept before expired ones are pruned (bounds memory).
const MAX_ENTRIES: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// No line for this key before this time.
    quiet_until: i64,
    /// Lines suppressed since the last one.
    suppressed: u64,
}

/// One line per object and outcome per interval.
#[derive(Debug)]
pub(crate) struct LogLimit {
    interval_ms: i64,
    slots: Mutex<HashMap<(ObjectId, &'static str), Slot>>,
}

impl LogLimit {
    pub(crate) fn new(interval_ms: i64) -> Self {
        Self {
            interval_ms,
            slots: Mutex::default(),
        }
    }

    /// `Some(n)` when a line may be logged now (`n` lines were suppressed
    /// since the previous one), `None` when this one is suppressed.
    pub(crate) fn admit(&self, object: &ObjectId, outcome: &'static str, now: i64) -> Option<u64> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if slots.len() >= MAX_ENTRIES {
            slots.retain(|_, s| s.quiet_until > now);
            if slots.len() >= MAX_ENTRIES {
                slots.clear();
            }
        }
        let slot = slots.entry((object.clone(), outcome)).or_insert(Slot {
            quiet_until: i64::MIN,
            suppressed: 0,
        });
        if now < slot.quiet_until {
            slot.suppressed = slot.suppressed.saturating_add(1);
            return None;
        }
        let suppressed = slot.suppressed;
        slot.suppressed = 0;
        slot.quiet_until = now.saturating_add(self.interval_ms);
        Some(suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_object_and_outcome_per_interval() {
        let l = LogLimit::new(1_000);
        let a = ObjectId::new("a").expect("valid id");
        let b = ObjectId::new("b").expect("valid id");
        assert_eq!(l.admit(&a, "x", 0), Some(0));
        assert_eq!(l.admit(&a, "x", 10), None);
        assert_eq!(l.admit(&a, "x", 999), None);
        assert_eq!(l.admit(&a, "y", 10), Some(0), "another outcome");
        assert_eq!(l.admit(&b, "x", 10), Some(0), "another object");
        assert_eq!(l.admit(&a, "x", 1_000), Some(2), "counts the suppressed");
        assert_eq!(l.admit(&a, "x", 1_001), None);
    }

    #[test]
    fn memory_stays_bounded() {
        let l = LogLimit::new(1_000);
        for i in 0..(MAX_ENTRIES * 2) {
            let o = ObjectId::new(format!("o{i}")).expect("valid id");
            assert_eq!(l.admit(&o, "x", 0), Some(0));
        }
        assert!(l.slots.lock().expect("not poisoned").len() <= MAX_ENTRIES);
    }
}
