//! Fetch request and response limits, each at its boundary and one past,
//! and control-header stripping.
#![allow(clippy::unwrap_used)]

use super::*;

fn code(r: Result<FetchRequest, HostError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(e) => e.code(),
    }
}

fn get() -> FetchRequest {
    FetchRequest::new("GET", "/x")
}

#[test]
fn the_method_is_an_http_token_of_at_most_64_bytes() {
    for m in ["GET", "POST", "PATCH", "M-SEARCH", "x!#$%&'*+.^_`|~9"] {
        assert_eq!(code(FetchRequest::new(m, "/").validate()), "ok", "{m}");
    }
    for m in ["", "GE T", "GET\r", "GÉT", "(GET)", "GET/"] {
        assert_eq!(
            code(FetchRequest::new(m, "/").validate()),
            "host_invalid_request",
            "{m:?}"
        );
    }
    let at = "M".repeat(MAX_METHOD_BYTES);
    assert_eq!(code(FetchRequest::new(&at, "/").validate()), "ok");
    let past = "M".repeat(MAX_METHOD_BYTES + 1);
    assert_eq!(
        code(FetchRequest::new(&past, "/").validate()),
        "host_invalid_request"
    );
}

#[test]
fn the_url_is_at_most_16_kib_of_utf8() {
    // 16 KiB exactly, counting UTF-8 bytes (`é` is two).
    let prefix = "https://h/";
    let fill = MAX_URL_BYTES - prefix.len();
    let at = format!("{prefix}{}", "é".repeat(fill / 2));
    assert_eq!(at.len(), MAX_URL_BYTES);
    assert_eq!(code(FetchRequest::new("GET", &at).validate()), "ok");
    let past = format!("{at}a");
    assert_eq!(past.len(), MAX_URL_BYTES + 1);
    let err = FetchRequest::new("GET", &past).validate().unwrap_err();
    assert_eq!(err.code(), "host_request_too_large");
    assert_eq!(err.wire().code, "request_too_large");
    assert_eq!(err.wire().status, 413);
    for bad in ["", "x", "ftp://h/", "/a b", "/a\u{7}", "/a\u{85}"] {
        let err = FetchRequest::new("GET", bad).validate().unwrap_err();
        assert_eq!(err.code(), "host_invalid_request", "{bad:?}");
        assert_eq!(
            (err.wire().status, err.wire().code.as_str()),
            (400, "invalid_request")
        );
    }
}

#[test]
fn at_most_128_header_entries() {
    let with = |n: usize| (0..n).fold(get(), |r, i| r.header(&format!("h{i}"), "v"));
    assert_eq!(code(with(MAX_HEADERS).validate()), "ok");
    assert_eq!(
        code(with(MAX_HEADERS + 1).validate()),
        "host_request_too_large"
    );
}

#[test]
fn at_most_128_kib_of_names_and_values_combined() {
    // Two headers, names of 2 bytes: the values fill the budget exactly.
    let value = |len: usize| "v".repeat(len);
    let half = (MAX_HEADER_BYTES - 4) / 2;
    let at = get()
        .header("aa", &value(half))
        .header("bb", &value(MAX_HEADER_BYTES - 4 - half));
    assert_eq!(code(at.validate()), "ok");
    let past = get()
        .header("aa", &value(half))
        .header("bb", &value(MAX_HEADER_BYTES - 4 - half + 1));
    assert_eq!(code(past.validate()), "host_request_too_large");
    // No smaller per-value cap: one value may take nearly all of it.
    let one = get().header("a", &value(MAX_HEADER_BYTES - 1));
    assert_eq!(code(one.validate()), "ok");
}

#[test]
fn header_names_are_tokens_of_at_most_128_bytes() {
    let at = "n".repeat(MAX_HEADER_NAME_BYTES);
    assert_eq!(code(get().header(&at, "v").validate()), "ok");
    let past = "n".repeat(MAX_HEADER_NAME_BYTES + 1);
    assert_eq!(
        code(get().header(&past, "v").validate()),
        "host_invalid_request"
    );
    for bad in ["", "a b", "a:b", "ä", "a\n"] {
        assert_eq!(
            code(get().header(bad, "v").validate()),
            "host_invalid_request",
            "{bad:?}"
        );
    }
}

#[test]
fn header_values_hold_no_control_characters() {
    assert_eq!(
        code(get().header("a", "plain, ünïcode ok").validate()),
        "ok"
    );
    for bad in ["a\r\nx-injected: 1", "a\u{0}", "\t", "a\u{7f}", "a\u{9b}"] {
        assert_eq!(
            code(get().header("a", bad).validate()),
            "host_invalid_request",
            "{bad:?}"
        );
    }
}

#[test]
fn the_body_is_at_most_1_mib() {
    let at = get().body(vec![b'x'; MAX_BODY_BYTES]);
    assert_eq!(code(at.validate()), "ok");
    let past = get().body(vec![b'x'; MAX_BODY_BYTES + 1]);
    assert_eq!(code(past.validate()), "host_request_too_large");
}

#[test]
fn control_headers_are_stripped_in_any_case_and_names_lowercased() {
    let r = get()
        .header("X-Durability-Internal-Auth", "forged")
        .header("x-durability-route-task", "task-z")
        .header("X-DURABILITY-OWNERSHIP-ERROR", "stale_owner")
        .header("x-durability-owner-task", "evil")
        .header("X-Request-Id", "r1")
        .header("Accept", "text/plain")
        .validate()
        .unwrap();
    assert_eq!(
        r.headers,
        vec![
            ("x-request-id".to_owned(), "r1".to_owned()),
            ("accept".to_owned(), "text/plain".to_owned()),
        ]
    );
    assert_eq!(r.header_value("ACCEPT"), Some("text/plain"));
    // Stripped headers still counted against the limits the tenant sent.
    let many = (0..MAX_HEADERS).fold(get().header("x-durability-a", "v"), |r, i| {
        r.header(&format!("h{i}"), "v")
    });
    assert_eq!(code(many.validate()), "host_request_too_large");
}

#[test]
fn responses_are_checked_the_same_way() {
    let ok = FetchResponse::new(503, "busy")
        .header("Retry-After", "1")
        .header("x-durability-owner-task", "forged")
        .validate()
        .unwrap();
    assert_eq!(ok.status, 503);
    assert_eq!(ok.headers, vec![("retry-after".to_owned(), "1".to_owned())]);
    for status in [0, 101, 199, 600] {
        let err = FetchResponse::new(status, "").validate().unwrap_err();
        assert_eq!(err.code(), "host_invalid_request", "{status}");
    }
    assert!(
        FetchResponse::new(200, vec![0u8; MAX_BODY_BYTES])
            .validate()
            .is_ok()
    );
    let err = FetchResponse::new(200, vec![0u8; MAX_BODY_BYTES + 1])
        .validate()
        .unwrap_err();
    assert_eq!(err.code(), "host_request_too_large");
    let err = FetchResponse::new(200, "")
        .header("a", "b\nc")
        .validate()
        .unwrap_err();
    assert_eq!(err.code(), "host_invalid_request");
}

#[test]
fn only_get_and_head_are_safe() {
    assert!(FetchRequest::new("GET", "/").is_safe());
    assert!(FetchRequest::new("HEAD", "/").is_safe());
    for m in ["POST", "PUT", "DELETE", "PATCH", "get", "OPTIONS"] {
        assert!(!FetchRequest::new(m, "/").is_safe(), "{m}");
    }
}
