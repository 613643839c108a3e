//! What a reply means: the replay rules of seed 003 as one pure function,
//! [`decide`], from what an attempt observed (and where it came from, and
//! what is left of the budgets) to what the router does next.
//!
//! - A success is returned (and teaches the hint).
//! - A trusted pre-dispatch `stale_owner` / `owner_race` proves nothing
//!   ran: one rediscovery through the router, for every kind and method;
//!   the hint is evicted. A second one is final (the trusted code).
//! - A valid trusted owner hint (connect's hint-only handoff) from the
//!   router is followed to the owner; from an owner's endpoint it is never
//!   followed: it evicts the hint and uses the one rediscovery, and a
//!   second is `owner_unavailable`.
//! - No trusted answer (a connection never made, an unmarked failure, a
//!   502/503/504 without the marker, an unreadable success, a broad
//!   trusted ownership error) evicts the hint. A safe `GET`/`HEAD` fetch
//!   replays once through the router; RPC, other fetches and connects
//!   return the error: the owner may have run it, and a `101` must come
//!   from the owner. An unreadable RPC success is `do_rpc_result_unknown`
//!   (the hint stays: the owner did answer).
//! - A trusted error envelope (the method's own error, a refusal) is the
//!   owner's final answer.

use crate::error::HostError;
use crate::protocol::{OwnerHeaders, REDISCOVERY_CODES, Reply};

#[cfg(test)]
mod tests;

/// The replay rules of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    /// After no trusted answer, replay once through the router (a safe
    /// `GET`/`HEAD` fetch).
    pub(crate) replay_untrusted: bool,
    /// What an unreadable success is.
    pub(crate) unreadable: Failure,
    /// What a broad trusted ownership error (`draining`, ...) is.
    pub(crate) broad_ownership: Failure,
}

impl Rules {
    /// RPC: never replayed; an unreadable success is a result unknown.
    pub(crate) const RPC: Self = Self {
        replay_untrusted: false,
        unreadable: Failure::Unknown,
        broad_ownership: Failure::Ownership,
    };

    /// A fetch: `safe` (`GET`/`HEAD`) replays once after no trusted answer.
    pub(crate) const fn fetch(safe: bool) -> Self {
        Self {
            replay_untrusted: safe,
            unreadable: Failure::Unavailable,
            broad_ownership: Failure::Ownership,
        }
    }

    /// A connect: never replayed, and no fallback to another host's `101`.
    pub(crate) const CONNECT: Self = Self {
        replay_untrusted: false,
        unreadable: Failure::Unavailable,
        broad_ownership: Failure::Unavailable,
    };
}

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The router (this host's resolution, or a client's entry host).
    Router,
    /// An owner's endpoint, sent the route fence.
    Owner,
}

/// What is left to spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Rediscoveries through the router (one per request).
    pub(crate) rediscoveries: u8,
    /// Replays through the router after no trusted answer.
    pub(crate) replays: u8,
}

impl Budget {
    /// The budget a request starts with.
    pub(crate) fn new(rules: &Rules) -> Self {
        Self {
            rediscoveries: 1,
            replays: u8::from(rules.replay_untrusted),
        }
    }

    /// Nothing to spend: a router that forwards once for a caller who
    /// applies the rules itself.
    pub(crate) const NONE: Self = Self {
        rediscoveries: 0,
        replays: 0,
    };
}

/// What an attempt observed, without its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// A valid success (a `101` for a connect).
    Success,
    /// A valid trusted hint-only handoff.
    Handoff,
    /// A trusted pre-dispatch `stale_owner` / `owner_race`.
    Rediscoverable,
    /// Another trusted ownership error (`draining`, ...).
    BroadOwnership,
    /// A trusted error envelope.
    Failed,
    /// The request never reached the owner: nothing ran.
    NotSent,
    /// No trusted answer after the request was sent.
    Unmarked,
    /// A success that could not be read.
    Unreadable,
}

/// Why a request failed, as its caller is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The owner's trusted error envelope, as it came.
    Remote,
    /// A trusted ownership refusal (its code; an untrusted code is
    /// `owner_unavailable`).
    Ownership,
    /// Nothing was sent (`owner_unavailable`, nothing ran).
    Unreachable,
    /// No trusted answer (`owner_unavailable`, it may have run).
    Unavailable,
    /// An unreadable success (`do_rpc_result_unknown`).
    Unknown,
    /// A second owner hint after the one rediscovery.
    SecondHint,
}

/// What the router does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Return the success.
    Success,
    /// Back through the router once (spends a rediscovery).
    Rediscover,
    /// The same request once more through the router (spends a replay).
    Replay,
    /// Connect to the owner the router handed off to.
    Follow,
    /// Return the failure.
    Fail(Failure),
}

/// A [`Verdict`] and whether the scope's hint is evicted first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision {
    /// What to do.
    pub(crate) verdict: Verdict,
    /// Evict the cached hint.
    pub(crate) evict: bool,
}

/// What a reply means (see the module docs).
pub(crate) fn decide(rules: &Rules, source: Source, budget: Budget, seen: Seen) -> Decision {
    let rediscover = |last: Failure| {
        if budget.rediscoveries > 0 {
            Verdict::Rediscover
        } else {
            Verdict::Fail(last)
        }
    };
    let untrusted = |failure: Failure| {
        if rules.replay_untrusted && budget.replays > 0 {
            Verdict::Replay
        } else {
            Verdict::Fail(failure)
        }
    };
    let verdict = match seen {
        Seen::Success => Verdict::Success,
        Seen::Handoff if source == Source::Router => Verdict::Follow,
        Seen::Handoff => rediscover(Failure::SecondHint),
        Seen::Rediscoverable => rediscover(Failure::Ownership),
        Seen::BroadOwnership => untrusted(rules.broad_ownership),
        Seen::Failed => Verdict::Fail(Failure::Remote),
        Seen::NotSent => untrusted(Failure::Unreachable),
        Seen::Unmarked => untrusted(Failure::Unavailable),
        Seen::Unreadable => untrusted(rules.unreadable),
    };
    let evict = match verdict {
        Verdict::Success | Verdict::Follow => false,
        Verdict::Rediscover | Verdict::Replay => true,
        Verdict::Fail(failure) => !matches!(failure, Failure::Remote | Failure::Unknown),
    };
    Decision { verdict, evict }
}

/// An owner's answer to one attempt, as the transport classified it.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    /// An invoke's, fetch's or (refused) connect's answer.
    Reply(Reply<T>),
    /// A valid trusted hint-only handoff (connect).
    Handoff(OwnerHeaders),
}

/// An answer split into what was seen and what it carries.
#[derive(Debug)]
pub(crate) enum Payload<T> {
    /// A success's value and owner headers.
    Success(T, Option<OwnerHeaders>),
    /// A handoff's owner.
    Handoff(OwnerHeaders),
    /// Anything else: the reply, to build the error from.
    Other(Reply<std::convert::Infallible>),
}

impl<T> Answer<T> {
    /// What the answer is, and what it carries.
    pub(crate) fn split(self) -> (Seen, Payload<T>) {
        let reply = match self {
            Self::Handoff(owner) => return (Seen::Handoff, Payload::Handoff(owner)),
            Self::Reply(reply) => reply,
        };
        let seen = match &reply {
            Reply::Ok { .. } => Seen::Success,
            Reply::Ownership { code } if REDISCOVERY_CODES.contains(&code.as_str()) => {
                Seen::Rediscoverable
            }
            Reply::Ownership { .. } => Seen::BroadOwnership,
            Reply::Failed { .. } => Seen::Failed,
            Reply::NotSent { .. } => Seen::NotSent,
            Reply::Unmarked { .. } => Seen::Unmarked,
            Reply::ResultUnknown { .. } => Seen::Unreadable,
        };
        let payload = match reply {
            Reply::Ok { result, owner } => Payload::Success(result, owner),
            Reply::Ownership { code } => Payload::Other(Reply::Ownership { code }),
            Reply::Failed {
                status,
                code,
                message,
                details,
            } => Payload::Other(Reply::Failed {
                status,
                code,
                message,
                details,
            }),
            Reply::NotSent { reason } => Payload::Other(Reply::NotSent { reason }),
            Reply::Unmarked { reason } => Payload::Other(Reply::Unmarked { reason }),
            Reply::ResultUnknown { reason } => Payload::Other(Reply::ResultUnknown { reason }),
        };
        (seen, payload)
    }
}

/// The error a [`Failure`] is, built from the reply that caused it.
pub(crate) fn error_of(
    failure: Failure,
    reply: Option<Reply<std::convert::Infallible>>,
) -> HostError {
    let (code, reason) = match reply {
        None => (None, "no readable answer".to_owned()),
        Some(Reply::Ok { result, .. }) => match result {},
        Some(Reply::Ownership { code }) => (Some(code), String::new()),
        Some(Reply::Failed {
            status,
            code,
            message,
            details,
        }) => {
            return HostError::remote(status, code, message, details);
        }
        Some(
            Reply::NotSent { reason }
            | Reply::Unmarked { reason }
            | Reply::ResultUnknown { reason },
        ) => (None, reason),
    };
    match (failure, code) {
        (Failure::Ownership, Some(code)) => HostError::remote_ownership(&code),
        (Failure::Unreachable, _) => HostError::OwnerUnreachable { reason },
        (Failure::Unknown, _) => HostError::RpcResultUnknown { reason },
        (Failure::SecondHint, _) => HostError::OwnerUnavailable {
            reason: "a second owner hint after the one rediscovery".to_owned(),
        },
        (_, Some(code)) => HostError::OwnerUnavailable {
            reason: format!("a broad ownership refusal ({code})"),
        },
        (_, None) => HostError::OwnerUnavailable { reason },
    }
}

/// A refusal as an answer of any kind (it carries no success).
pub(crate) fn refused<T>(reply: Reply<std::convert::Infallible>) -> Reply<T> {
    match reply {
        Reply::Ok { result, .. } => match result {},
        Reply::Ownership { code } => Reply::Ownership { code },
        Reply::Failed {
            status,
            code,
            message,
            details,
        } => Reply::Failed {
            status,
            code,
            message,
            details,
        },
        Reply::NotSent { reason } => Reply::NotSent { reason },
        Reply::Unmarked { reason } => Reply::Unmarked { reason },
        Reply::ResultUnknown { reason } => Reply::ResultUnknown { reason },
    }
}
