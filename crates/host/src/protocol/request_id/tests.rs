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
