//! The caller's reading of a connect answer that is not a `101`: a valid
//! trusted owner hint, and every malformed variant reduced to a sanitized
//! `owner_unavailable` (no task id, endpoint or shard key of the response
//! in the error, its message or its diagnostics).

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};

use crate::error::HostError;
use crate::protocol::{
    CONNECT_HINT_HEADER, CONNECT_HINT_VALUE, ConnectReply, OWNER_ENDPOINT_HEADER,
    OWNER_GENERATION_HEADER, OWNER_KEY_HEADER, OWNER_TASK_HEADER, OWNERSHIP_ERROR_HEADER, Reply,
    classify_connect,
};
use crate::routing::rules::{
    Answer, Budget, Rules, Source, Verdict, decide, error_of as rule_error,
};

const KEY: &str = "st1:Counter:17";
const TASK: &str = "secret-task-9";
const ENDPOINT: &str = "http://10.9.8.7:4321";

type Pairs = Vec<(&'static str, String)>;

fn valid() -> Pairs {
    vec![
        (CONNECT_HINT_HEADER, CONNECT_HINT_VALUE.to_owned()),
        (OWNER_TASK_HEADER, TASK.to_owned()),
        (OWNER_GENERATION_HEADER, "42".to_owned()),
        (OWNER_KEY_HEADER, KEY.to_owned()),
        (OWNER_ENDPOINT_HEADER, ENDPOINT.to_owned()),
    ]
}

fn map(pairs: &[(&'static str, String)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, HeaderValue::from_str(v).expect("header value"));
    }
    h
}

fn without(name: &str) -> Vec<(&'static str, String)> {
    valid().into_iter().filter(|(k, _)| *k != name).collect()
}

fn with(name: &'static str, value: &str) -> Vec<(&'static str, String)> {
    let mut pairs = without(name);
    pairs.push((name, value.to_owned()));
    pairs
}

fn envelope() -> Result<Bytes, String> {
    Ok(Bytes::from_static(
        br#"{"error":"owner_hint","message":"Connect to the owner"}"#,
    ))
}

/// The router's reading of a refused connect from an owner's endpoint,
/// with the rediscovery still to spend: `Ok` the code it rediscovers
/// after, `Err` the final error.
fn after_refusal(reply: Reply<Infallible>) -> Result<String, HostError> {
    let code = match &reply {
        Reply::Ownership { code } => code.clone(),
        _ => String::new(),
    };
    let rules = Rules::CONNECT;
    let (seen, _) = Answer::<()>::Reply(super::refused(reply.clone())).split();
    match decide(&rules, Source::Owner, Budget::new(&rules), seen).verdict {
        Verdict::Rediscover => Ok(code),
        Verdict::Fail(failure) => Err(rule_error(failure, Some(reply))),
        other => panic!("a refusal is never {other:?}"),
    }
}

/// The error a caller ends with for a non-hint answer.
fn error_of(status: u16, pairs: &[(&'static str, String)]) -> HostError {
    match classify_connect(status, &map(pairs), envelope(), KEY) {
        ConnectReply::Refused(reply) => match after_refusal(reply) {
            Err(e) => e,
            Ok(code) => panic!("{status} {pairs:?}: rediscovers with {code}"),
        },
        other => panic!("{status} {pairs:?}: {other:?}"),
    }
}

fn assert_sanitized(e: &HostError, what: &str) {
    assert_eq!(e.code(), "owner_unavailable", "{what}: {e:?}");
    assert!(
        matches!(e, HostError::OwnerUnavailable { .. }),
        "{what}: may have run is not claimed as not started: {e:?}"
    );
    let wire = e.wire();
    assert_eq!(
        (
            wire.status,
            wire.code.as_str(),
            wire.message.as_str(),
            wire.marked
        ),
        (503, "owner_unavailable", "Owner unavailable", false),
        "{what}"
    );
    for shown in [e.to_string(), format!("{e:?}"), wire.message] {
        for secret in [TASK, ENDPOINT, "10.9.8.7", KEY, "other-shard"] {
            assert!(!shown.contains(secret), "{what}: {secret} in {shown:?}");
        }
    }
}

#[test]
fn a_valid_trusted_hint_is_a_hint() {
    match classify_connect(503, &map(&valid()), envelope(), KEY) {
        ConnectReply::Hint(owner) => {
            assert_eq!(
                (
                    owner.task.as_str(),
                    owner.generation,
                    owner.key.as_str(),
                    owner.endpoint.as_deref()
                ),
                (TASK, 42, KEY, Some(ENDPOINT))
            );
        }
        other => panic!("{other:?}"),
    }
    // The body is not part of the hint: an unreadable one does not matter.
    assert!(matches!(
        classify_connect(503, &map(&valid()), Err("cut".to_owned()), KEY),
        ConnectReply::Hint(_)
    ));
}

#[test]
fn every_malformed_hint_is_a_sanitized_owner_unavailable() {
    let mut cases: Vec<(String, u16, Pairs)> = Vec::new();
    // A valid hint, but not on a 503.
    for status in [200, 502, 500, 101] {
        cases.push((format!("wrong status {status}"), status, valid()));
    }
    // A 503 without one of the hint's headers.
    for name in [
        OWNER_TASK_HEADER,
        OWNER_GENERATION_HEADER,
        OWNER_KEY_HEADER,
        OWNER_ENDPOINT_HEADER,
    ] {
        cases.push((format!("no {name}"), 503, without(name)));
    }
    // A 503 with one header's value wrong, or one header too many.
    #[rustfmt::skip]
    let wrong = [
        ("wrong marker value", CONNECT_HINT_HEADER, "connect2"),
        ("empty marker value", CONNECT_HINT_HEADER, ""),
        ("marker in capitals", CONNECT_HINT_HEADER, "CONNECT"),
        ("malformed owner task", OWNER_TASK_HEADER, "bad task!"),
        ("generation 0", OWNER_GENERATION_HEADER, "0"),
        ("generation 01", OWNER_GENERATION_HEADER, "01"),
        ("generation past the safe range", OWNER_GENERATION_HEADER, "9007199254740992"),
        ("another shard's key", OWNER_KEY_HEADER, "st1:Counter:other-shard"),
        ("empty endpoint", OWNER_ENDPOINT_HEADER, ""),
        ("an ownership-error marker too", OWNERSHIP_ERROR_HEADER, "stale_owner"),
    ];
    for (what, name, value) in wrong {
        cases.push((what.to_owned(), 503, with(name, value)));
    }
    for (what, status, pairs) in &cases {
        let e = error_of(*status, pairs);
        assert_sanitized(&e, what);
    }
    eprintln!("tried: {} malformed hint variants", cases.len());
}

#[test]
fn after_a_handoff_only_a_narrow_race_rediscovers() {
    let marked = |code: &str| vec![(OWNERSHIP_ERROR_HEADER, code.to_owned())];
    let body = |code: &str| {
        Ok(Bytes::from(format!(
            r#"{{"error":"{code}","message":"Ownership refused the call before dispatch"}}"#
        )))
    };
    for code in ["stale_owner", "owner_race"] {
        let reply = classify_connect(503, &map(&marked(code)), body(code), KEY);
        let ConnectReply::Refused(reply) = reply else {
            panic!("{code}: {reply:?}");
        };
        assert_eq!(after_refusal(reply).ok().as_deref(), Some(code));
    }
    // A broad trusted ownership error, an unmarked 503 naming a rediscovery
    // code, a gateway error, a success status: final owner_unavailable.
    let cases = [
        ("broad draining", 503, marked("draining"), body("draining")),
        ("unmarked stale_owner", 503, vec![], body("stale_owner")),
        ("gateway 504", 504, vec![], Ok(Bytes::new())),
        ("a 200", 200, vec![], body("stale_owner")),
    ];
    for (what, status, pairs, b) in cases {
        let reply = classify_connect(status, &map(&pairs), b, KEY);
        let ConnectReply::Refused(reply) = reply else {
            panic!("{what}: {reply:?}");
        };
        match after_refusal(reply) {
            Err(e) => assert_sanitized(&e, what),
            Ok(code) => panic!("{what}: rediscovers with {code}"),
        }
    }
    // A trusted refusal keeps its code (nothing ran).
    let reply = classify_connect(
        401,
        &HeaderMap::new(),
        Ok(Bytes::from_static(
            br#"{"error":"unauthorized","message":"missing or wrong internal token"}"#,
        )),
        KEY,
    );
    let ConnectReply::Refused(reply) = reply else {
        panic!("{reply:?}");
    };
    let e = after_refusal(reply).expect_err("final");
    assert_eq!(e.rpc_code(), "unauthorized");
}
