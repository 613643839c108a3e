//! Response classification, envelopes, fence parsing and the token.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

use super::http1::{classify, parse_generation, read_capped};
use super::*;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, HeaderValue::from_str(v).expect("header value"));
    }
    h
}

fn body(v: &Value) -> Result<Bytes, String> {
    Ok(Bytes::from(serde_json::to_vec(v).expect("json")))
}

#[test]
fn a_valid_success_envelope_is_ok_with_owner_headers() {
    let h = headers(&[
        (OWNER_TASK_HEADER, "task-a"),
        (OWNER_GENERATION_HEADER, "7"),
        (OWNER_KEY_HEADER, "st:C:shard3"),
    ]);
    let reply = classify(200, &h, body(&json!({"ok": true, "result": {"n": 1}})));
    assert_eq!(
        reply,
        Reply::Ok {
            result: json!({"n": 1}),
            owner: Some(OwnerHeaders {
                task: "task-a".to_owned(),
                generation: 7,
                key: "st:C:shard3".to_owned(),
                endpoint: None,
            }),
        }
    );
}

#[test]
fn an_unreadable_success_is_result_unknown() {
    let h = HeaderMap::new();
    let cases: Vec<(u16, Result<Bytes, String>)> = vec![
        (200, Err("the body crossed the cap".to_owned())),
        (200, Ok(Bytes::from_static(b"\xff\xfe"))),
        (200, Ok(Bytes::from_static(b"{\"ok\":tru"))),
        (200, body(&json!({"ok": false, "result": 1}))),
        (200, body(&json!({"ok": true}))),
        (200, body(&json!({"ok": true, "result": 1, "extra": 2}))),
        (204, Ok(Bytes::new())),
    ];
    for (status, b) in cases {
        let reply = classify(status, &h, b.clone());
        assert!(
            matches!(reply, Reply::ResultUnknown { .. }),
            "{status} {b:?}: {reply:?}"
        );
    }
}

#[test]
fn only_a_matching_marked_503_is_a_trusted_ownership_answer() {
    let env = json!({"error": "stale_owner", "message": "m"});
    let marked = headers(&[(OWNERSHIP_ERROR_HEADER, "stale_owner")]);
    assert_eq!(
        classify(503, &marked, body(&env)),
        Reply::Ownership {
            code: "stale_owner".to_owned()
        }
    );
    // Wrong status, marker value, or a code off the allowlist: untrusted.
    let untrusted = [
        (
            500,
            headers(&[(OWNERSHIP_ERROR_HEADER, "stale_owner")]),
            env.clone(),
        ),
        (
            503,
            headers(&[(OWNERSHIP_ERROR_HEADER, "owner_race")]),
            env.clone(),
        ),
        (
            503,
            headers(&[(OWNERSHIP_ERROR_HEADER, "internal_error")]),
            json!({"error": "internal_error", "message": "m"}),
        ),
        // A tenant body naming an ownership code without the marker.
        (503, HeaderMap::new(), env.clone()),
        (502, HeaderMap::new(), json!({"error": "x", "message": "m"})),
        (504, HeaderMap::new(), json!({"error": "x", "message": "m"})),
        // Not an envelope at all.
        (500, HeaderMap::new(), json!({"error": "x"})),
        (
            500,
            HeaderMap::new(),
            json!({"error": "x", "message": "m", "task": "t"}),
        ),
    ];
    for (status, h, env) in untrusted {
        let reply = classify(status, &h, body(&env));
        assert!(
            matches!(reply, Reply::Unmarked { .. }),
            "{status} {env}: {reply:?}"
        );
    }
}

#[test]
fn other_error_envelopes_are_failures_with_their_code() {
    let reply = classify(
        422,
        &HeaderMap::new(),
        body(&json!({"error": "out_of_stock", "message": "none left", "details": {"sku": 1}})),
    );
    assert_eq!(
        reply,
        Reply::Failed {
            status: 422,
            code: "out_of_stock".to_owned(),
            message: "none left".to_owned(),
            details: Some(json!({"sku": 1})),
        }
    );
}

#[test]
fn generations_are_positive_safe_integers_in_canonical_decimal() {
    assert_eq!(parse_generation("1"), Some(1));
    assert_eq!(
        parse_generation("9007199254740991"),
        Some(9_007_199_254_740_991)
    );
    for bad in [
        "",
        "0",
        "01",
        "-1",
        "+1",
        "1.0",
        "9007199254740992",
        "1e3",
        " 1",
    ] {
        assert_eq!(parse_generation(bad), None, "{bad:?}");
    }
}

#[test]
fn the_token_compares_whole_values() {
    let t = InternalToken::new("0123456789abcdef").expect("16 bytes");
    assert!(t.matches(b"0123456789abcdef"));
    assert!(!t.matches(b"0123456789abcdeF"));
    assert!(!t.matches(b"0123456789abcde"));
    assert!(!t.matches(b"0123456789abcdef0"));
    assert!(!t.matches(b""));
    assert!(InternalToken::new("short").is_err());
    assert!(InternalToken::new("0123456789abcde f").is_err());
    assert_eq!(format!("{t:?}"), "InternalToken(..)");
}

#[tokio::test]
async fn capped_reads_refuse_an_announced_oversize_and_stop_at_the_cap() {
    let at = http_body_util::Full::new(Bytes::from(vec![b'a'; 16]));
    assert_eq!(read_capped(at, 16, Some(16)).await.map(|b| b.len()), Ok(16));
    let announced = http_body_util::Full::new(Bytes::new());
    assert!(read_capped(announced, 16, Some(17)).await.is_err());
    let streamed = http_body_util::Full::new(Bytes::from(vec![b'a'; 17]));
    assert!(read_capped(streamed, 16, None).await.is_err());
}
