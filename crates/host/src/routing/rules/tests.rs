//! The replay rules of seed 003 ("Ownership", "Concurrency", "Failure
//! Semantics") as a table over [`decide`], for RPC, fetch and connect.

use super::{Budget, Decision, Failure, Rules, Seen, Source, Verdict, decide};
use crate::protocol::Reply;

const FULL: Budget = Budget {
    rediscoveries: 1,
    replays: 1,
};
const SPENT: Budget = Budget {
    rediscoveries: 0,
    replays: 0,
};
const GET: Rules = Rules::fetch(true);
const POST: Rules = Rules::fetch(false);
const RPC: Rules = Rules::RPC;
const CONNECT: Rules = Rules::CONNECT;

fn d(verdict: Verdict, evict: bool) -> Decision {
    Decision { verdict, evict }
}

/// (rule, kind, where from, budget left, what was seen, the decision).
type Row = (&'static str, Rules, Source, Budget, Seen, Decision);

#[rustfmt::skip]
fn table() -> Vec<Row> {
    use Failure::*;
    use Seen::*;
    use Source::{Owner, Router};
    use Verdict::{Fail, Follow, Replay, Rediscover, Success as Ok};
    vec![
        // A success is returned and keeps (teaches) the hint.
        ("success", RPC, Owner, FULL, Success, d(Ok, false)),
        ("success", GET, Router, FULL, Success, d(Ok, false)),
        ("success: a 101", CONNECT, Owner, FULL, Success, d(Ok, false)),
        // One rediscovery after a trusted pre-dispatch stale_owner /
        // owner_race, for every method and RPC; the hint is evicted.
        ("one rediscovery: rpc", RPC, Owner, FULL, Rediscoverable, d(Rediscover, true)),
        ("one rediscovery: non-idempotent fetch", POST, Owner, FULL, Rediscoverable, d(Rediscover, true)),
        ("one rediscovery: safe fetch", GET, Router, FULL, Rediscoverable, d(Rediscover, true)),
        ("one rediscovery: connect race", CONNECT, Owner, FULL, Rediscoverable, d(Rediscover, true)),
        // At most one: a second is final, with its trusted code.
        ("at most one rediscovery: rpc", RPC, Router, SPENT, Rediscoverable, d(Fail(Ownership), true)),
        ("at most one rediscovery: fetch", GET, Owner, SPENT, Rediscoverable, d(Fail(Ownership), true)),
        ("at most one rediscovery: connect", CONNECT, Owner, SPENT, Rediscoverable, d(Fail(Ownership), true)),
        // RPC is never replayed after an unknown outcome.
        ("rpc: unmarked failure", RPC, Owner, FULL, Unmarked, d(Fail(Unavailable), true)),
        ("rpc: unreadable success is result unknown, hint kept", RPC, Owner, FULL, Unreadable, d(Fail(Unknown), false)),
        ("rpc: broad ownership error terminates", RPC, Owner, FULL, BroadOwnership, d(Fail(Ownership), true)),
        ("rpc: never sent, nothing ran", RPC, Owner, FULL, NotSent, d(Fail(Unreachable), true)),
        ("rpc: the method's own error", RPC, Owner, FULL, Failed, d(Fail(Remote), false)),
        // GET/HEAD replay once through the router after no trusted answer.
        ("get: unmarked replays", GET, Owner, FULL, Unmarked, d(Replay, true)),
        ("get: unreadable replays", GET, Owner, FULL, Unreadable, d(Replay, true)),
        ("get: broad ownership replays", GET, Owner, FULL, BroadOwnership, d(Replay, true)),
        ("get: never sent replays", GET, Owner, FULL, NotSent, d(Replay, true)),
        ("get: once only", GET, Router, Budget { rediscoveries: 1, replays: 0 }, Unmarked, d(Fail(Unavailable), true)),
        ("get: once only, unreadable", GET, Router, SPENT, Unreadable, d(Fail(Unavailable), true)),
        ("get: once only, broad", GET, Router, SPENT, BroadOwnership, d(Fail(Ownership), true)),
        ("get: a trusted error is final", GET, Owner, FULL, Failed, d(Fail(Remote), false)),
        // Non-idempotent fetches terminate: owner_unavailable.
        ("post: unmarked", POST, Owner, FULL, Unmarked, d(Fail(Unavailable), true)),
        ("post: unreadable", POST, Owner, FULL, Unreadable, d(Fail(Unavailable), true)),
        ("post: broad ownership", POST, Owner, FULL, BroadOwnership, d(Fail(Ownership), true)),
        ("post: never sent", POST, Owner, FULL, NotSent, d(Fail(Unreachable), true)),
        // Connect: the 101 only from the owner; a valid trusted hint from
        // the router is followed, from an owner's endpoint it evicts and
        // rediscovers once; a second hint is owner_unavailable.
        ("connect: the router's handoff is followed", CONNECT, Router, FULL, Handoff, d(Follow, false)),
        ("connect: followed without spending", CONNECT, Router, SPENT, Handoff, d(Follow, false)),
        ("connect: an owner's hint rediscovers once", CONNECT, Owner, FULL, Handoff, d(Rediscover, true)),
        ("connect: a second hint", CONNECT, Owner, SPENT, Handoff, d(Fail(SecondHint), true)),
        // No fallback: broad errors and unmarked failures are final.
        ("connect: broad ownership, no fallback", CONNECT, Owner, FULL, BroadOwnership, d(Fail(Unavailable), true)),
        ("connect: unmarked, no fallback", CONNECT, Owner, FULL, Unmarked, d(Fail(Unavailable), true)),
        ("connect: malformed 101", CONNECT, Owner, FULL, Unreadable, d(Fail(Unavailable), true)),
        ("connect: never sent", CONNECT, Owner, FULL, NotSent, d(Fail(Unreachable), true)),
        ("connect: a refusal", CONNECT, Owner, FULL, Failed, d(Fail(Remote), false)),
    ]
}

#[test]
fn every_replay_rule_decides_as_the_seed_says() {
    let mut wrong = Vec::new();
    for (rule, rules, source, budget, seen, want) in table() {
        let got = decide(&rules, source, budget, seen);
        if got != want {
            wrong.push(format!(
                "{rule}: {seen:?} from {source:?} -> {got:?}, want {want:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every kind, source, budget and observation: the safety rules hold in
/// all of them, not only in the table's rows.
#[test]
fn no_decision_replays_what_may_have_run_or_accepts_a_non_owner_upgrade() {
    let seen = [
        Seen::Success,
        Seen::Handoff,
        Seen::Rediscoverable,
        Seen::BroadOwnership,
        Seen::Failed,
        Seen::NotSent,
        Seen::Unmarked,
        Seen::Unreadable,
    ];
    let budgets = [
        FULL,
        SPENT,
        Budget {
            rediscoveries: 1,
            replays: 0,
        },
        Budget {
            rediscoveries: 0,
            replays: 1,
        },
    ];
    let mut tried = 0;
    for rules in [RPC, GET, POST, CONNECT] {
        for source in [Source::Router, Source::Owner] {
            for budget in budgets {
                for s in seen {
                    tried += 1;
                    let got = decide(&rules, source, budget, s).verdict;
                    let context = format!("{rules:?} {source:?} {budget:?} {s:?} -> {got:?}");
                    if got == Verdict::Replay {
                        assert!(rules.replay_untrusted && budget.replays > 0, "{context}");
                    }
                    if got == Verdict::Rediscover {
                        assert!(budget.rediscoveries > 0, "{context}");
                        assert!(
                            matches!(s, Seen::Rediscoverable | Seen::Handoff),
                            "{context}"
                        );
                    }
                    if got == Verdict::Follow {
                        assert_eq!((s, source), (Seen::Handoff, Source::Router), "{context}");
                    }
                    if got == Verdict::Success {
                        assert_eq!(s, Seen::Success, "{context}");
                    }
                }
            }
        }
    }
    assert_eq!(tried, 4 * 2 * 4 * 8);
}

#[test]
fn failures_become_the_seed_codes() {
    use super::error_of;
    let ownership = |code: &str| Reply::Ownership {
        code: code.to_owned(),
    };
    let unmarked = || Reply::Unmarked {
        reason: "reset".to_owned(),
    };
    let cases = [
        (Failure::Ownership, ownership("stale_owner"), "stale_owner"),
        (Failure::Ownership, ownership("draining"), "draining"),
        (
            Failure::Unavailable,
            ownership("draining"),
            "owner_unavailable",
        ),
        (Failure::Unavailable, unmarked(), "owner_unavailable"),
        (
            Failure::Unreachable,
            Reply::NotSent {
                reason: "refused".to_owned(),
            },
            "owner_unavailable",
        ),
        (
            Failure::Unknown,
            Reply::ResultUnknown {
                reason: "bad json".to_owned(),
            },
            "do_rpc_result_unknown",
        ),
        (Failure::SecondHint, unmarked(), "owner_unavailable"),
    ];
    for (failure, reply, code) in cases {
        let e = error_of(failure, Some(reply));
        assert_eq!(e.rpc_code(), code, "{failure:?}: {e:?}");
    }
    let remote = error_of(
        Failure::Remote,
        Some(Reply::Failed {
            status: 400,
            code: "missing_sku".to_owned(),
            message: "add needs a sku".to_owned(),
            details: None,
        }),
    );
    assert_eq!(remote.rpc_code(), "missing_sku");
}
