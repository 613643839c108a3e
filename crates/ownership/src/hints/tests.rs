//! Tests of the owner-hint cache.

use super::*;
use crate::scope::{LifecycleId, ShardCount};

fn scope(i: u32) -> OwnerScope {
    OwnerScope::parse(&format!("st1:Room:shard{i}"), ShardCount::default()).expect("scope")
}

fn hint(g: u64) -> OwnerHint {
    OwnerHint {
        task: TaskId::new("t1").expect("task"),
        generation: Generation::new(g).expect("gen"),
        endpoint: None,
    }
}

#[test]
fn default_capacity_is_10000_and_lru_bounded() {
    let c = OwnerHintCache::default();
    assert_eq!(c.lock().cap().get(), 10_000);
    let small = OwnerHintCache::with_capacity(NonZeroUsize::new(2).expect("nonzero"));
    small.insert(&scope(0), hint(1));
    small.insert(&scope(1), hint(1));
    assert!(small.get(&scope(0)).is_some());
    small.insert(&scope(2), hint(1));
    assert_eq!(small.len(), 2);
    assert!(
        small.get(&scope(1)).is_none(),
        "least recently used evicted"
    );
}

#[test]
fn stale_owner_clears_and_other_errors_keep() {
    let c = OwnerHintCache::default();
    c.insert(&scope(3), hint(2));
    assert!(!c.observe_error(&scope(3), &OwnershipError::Draining));
    assert!(c.get(&scope(3)).is_some());
    assert!(c.observe_error(
        &scope(3),
        &OwnershipError::StaleOwner {
            scope: scope(3).to_string()
        }
    ));
    assert!(c.get(&scope(3)).is_none());
}

#[test]
fn hints_must_match_the_scope_and_never_go_back() {
    let c = OwnerHintCache::default();
    let rec = OwnerRecord::new(
        scope(4),
        LifecycleId::new("ns:w").expect("l"),
        TaskId::new("t2").expect("t"),
        Generation::new(5).expect("g"),
    );
    assert!(c.learn(&scope(5), &rec).is_err());
    assert!(c.get(&scope(5)).is_none());
    c.learn(&scope(4), &rec).expect("matching scope");
    c.insert(&scope(4), hint(3));
    assert_eq!(
        c.get(&scope(4)).map(|h| h.generation.get()),
        Some(5),
        "older generation ignored"
    );
}

#[test]
fn an_equal_generation_replaces_the_hint_and_only_an_older_one_is_ignored() {
    let c = OwnerHintCache::default();
    c.insert(&scope(6), hint(4));
    let other = OwnerHint {
        task: TaskId::new("t9").expect("task"),
        generation: Generation::new(4).expect("gen"),
        endpoint: None,
    };
    c.insert(&scope(6), other);
    assert_eq!(
        c.get(&scope(6)).map(|h| h.task.as_str().to_owned()),
        Some("t9".to_owned()),
        "an equal generation from another task replaces the hint (as documented)"
    );
    c.insert(&scope(6), hint(3));
    assert_eq!(c.get(&scope(6)).map(|h| h.generation.get()), Some(4));
}
