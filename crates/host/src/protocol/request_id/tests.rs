//! Request id sanitizing, generation and the task-local context.

use super::*;

#[test]
fn sanitize_keeps_well_formed_ids_and_refuses_the_rest() {
    for good in [
        "abc",
        "req-1.2_3:4/5+6=7@8",
        &"a".repeat(MAX_REQUEST_ID_BYTES),
    ] {
        assert_eq!(
            RequestId::sanitize(good).map(|id| id.as_str().to_owned()),
            Some(good.to_owned()),
            "{good:?}"
        );
    }
    let oversized = "a".repeat(MAX_REQUEST_ID_BYTES + 1);
    for bad in [
        "",
        oversized.as_str(),
        "a\tb",
        "a\u{1}b",
        "line\nbreak",
        "a b",
        "caf\u{e9}",
        "x\"y",
    ] {
        assert!(RequestId::sanitize(bad).is_none(), "{bad:?} accepted");
    }
}

#[test]
fn accept_replaces_a_bad_id_with_a_fresh_sanitized_one() {
    let forged = "evil\r\ninjected";
    let id = RequestId::accept(Some(forged));
    assert_ne!(id.as_str(), forged);
    assert!(RequestId::sanitize(id.as_str()).is_some());
    let a = RequestId::accept(None);
    let b = RequestId::accept(None);
    assert_ne!(a, b, "generated ids are unique");
    assert_eq!(RequestId::accept(Some("ok-1")).as_str(), "ok-1");
}

#[tokio::test]
async fn edge_takes_the_tenant_id_outside_a_context_and_the_context_id_inside() {
    let mut headers = vec![
        ("x-request-id".to_owned(), "tenant-1".to_owned()),
        ("accept".to_owned(), "*/*".to_owned()),
        ("X-Request-Id".to_owned(), "tenant-2".to_owned()),
    ];
    let outside = edge_id(&mut headers.clone());
    assert_eq!(outside.as_str(), "tenant-1");
    let context = RequestId::sanitize("ctx-9").expect("valid");
    let inside = context.clone().scope(async { edge_id(&mut headers) }).await;
    assert_eq!(inside, context, "a nested call carries the context id");
    assert_eq!(headers, vec![("accept".to_owned(), "*/*".to_owned())]);
    assert!(
        RequestId::current().is_none(),
        "the context ends with its scope"
    );
}

#[test]
fn a_generated_id_is_the_prefix_and_the_sequence_in_hex() {
    let a = RequestId::generate();
    let b = RequestId::generate();
    for id in [&a, &b] {
        let (prefix, seq) = id.as_str().split_once('-').expect("<prefix>-<seq>");
        assert_eq!(prefix.len(), 16, "{id}: a 16-digit prefix");
        assert!(u64::from_str_radix(prefix, 16).is_ok(), "{id}");
        assert!(!seq.is_empty() && seq.len() <= 16, "{id}");
        assert!(seq == "0" || !seq.starts_with('0'), "{id}: no leading zero");
        assert!(
            seq.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{id}"
        );
    }
    let (pa, sa) = a.as_str().split_once('-').expect("a");
    let (pb, sb) = b.as_str().split_once('-').expect("b");
    assert_eq!(pa, pb, "one prefix per process");
    let (sa, sb) = (
        u64::from_str_radix(sa, 16).expect("hex"),
        u64::from_str_radix(sb, 16).expect("hex"),
    );
    assert!(sb > sa, "the sequence grows");
    assert_eq!(hex_of(0xabc), "abc");
    assert_eq!(hex_of(0), "0");
    assert_eq!(hex_of(u64::MAX), "ffffffffffffffff");
}

fn hex_of(v: u64) -> String {
    let mut buf = [0_u8; 16];
    let digits = (64 - v.leading_zeros()).div_ceil(4).max(1) as usize;
    let end = hex(&mut buf, 0, v, digits);
    String::from_utf8(buf[..end].to_vec()).expect("ascii")
}
