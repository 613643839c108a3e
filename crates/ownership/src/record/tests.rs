//! Tests of the owner record encoding.

use super::*;

fn scope(s: &str) -> OwnerScope {
    OwnerScope::parse(s, ShardCount::default()).expect("valid scope")
}

fn record() -> OwnerRecord {
    OwnerRecord::new(
        scope("st1:Room:shard3"),
        LifecycleId::new("ns:w").expect("lifecycle"),
        TaskId::new("task-a").expect("task"),
        Generation::new(7).expect("generation"),
    )
}

#[test]
fn encoding_is_pinned_and_round_trips() {
    let r = record();
    assert_eq!(
        r.encoded(),
        r#"{"v":1,"ownerKey":"st1:Room:shard3","hostId":"st1:Room:shard3","storageId":"st1","class":"Room","shard":3,"lifecycle":"ns:w","taskId":"task-a","generation":7}"#
    );
    let back = OwnerRecord::decode(r.encoded().as_bytes(), r.scope(), ShardCount::default())
        .expect("decodes");
    assert_eq!(back, r);
    let t = RecordTemplate::new(r.scope(), r.lifecycle(), r.task(), None);
    assert_eq!(format!("{}7{}", t.prefix, t.suffix), r.encoded());
    assert_eq!(r.endpoint(), None);
}

fn with_endpoint(endpoint: &str) -> OwnerRecord {
    OwnerRecord::with_endpoint(
        scope("st1:Room:shard3"),
        LifecycleId::new("ns:w").expect("lifecycle"),
        TaskId::new("task-a").expect("task"),
        Some(OwnerEndpoint::new(endpoint).expect("endpoint")),
        Generation::new(7).expect("generation"),
    )
}

#[test]
fn an_advertised_endpoint_follows_the_generation_and_round_trips() {
    let r = with_endpoint("http://10.0.0.7:8080");
    assert_eq!(
        r.encoded(),
        r#"{"v":1,"ownerKey":"st1:Room:shard3","hostId":"st1:Room:shard3","storageId":"st1","class":"Room","shard":3,"lifecycle":"ns:w","taskId":"task-a","generation":7,"endpoint":"http://10.0.0.7:8080"}"#
    );
    let back = OwnerRecord::decode(r.encoded().as_bytes(), r.scope(), ShardCount::default())
        .expect("decodes");
    assert_eq!(back, r);
    assert_eq!(
        back.endpoint().map(OwnerEndpoint::as_str),
        Some("http://10.0.0.7:8080")
    );
    let t = RecordTemplate::new(r.scope(), r.lifecycle(), r.task(), r.endpoint());
    assert_eq!(format!("{}7{}", t.prefix, t.suffix), r.encoded());
    // Records differing only in the endpoint are different records.
    assert_ne!(r, record());
}

#[test]
fn hostile_endpoints_are_refused_on_write_and_fail_closed_on_read() {
    let long = format!("http://{}", "a".repeat(MAX_OWNER_ENDPOINT_BYTES));
    for bad in [
        "",
        "http://",
        "https://10.0.0.7:1",
        "10.0.0.7:1",
        "http://10.0.0.7:1 x",
        "http://10.0.0.7:1\"",
        "http://10.0.0.7:1\\",
        "http://10.0.0.7:1\n",
        "http://h\u{e9}:1",
        long.as_str(),
    ] {
        assert_eq!(
            OwnerEndpoint::new(bad).expect_err(bad).code(),
            "invalid_input",
            "{bad:?}"
        );
    }
    let good = with_endpoint("http://10.0.0.7:8080").encoded().to_owned();
    let (url, field) = (
        "http://10.0.0.7:8080",
        "\"endpoint\":\"http://10.0.0.7:8080\"",
    );
    let edits = [
        (url, "ftp://10.0.0.7:8080", "scheme"),
        (url, "", "empty"),
        (url, "http://10.0.0.7:8080\\u0000", "escaped control"),
        (field, "\"endpoint\":null", "null"),
        (field, "\"endpoint\":7", "number"),
    ];
    assert_edits_fail_closed(&good, &scope("st1:Room:shard3"), &edits);
}

/// Decodes `good` with each `(from, to, what)` edit made and asserts that
/// it fails closed as an invalid owner record.
fn assert_edits_fail_closed(good: &str, scope: &OwnerScope, edits: &[(&str, &str, &str)]) {
    for (from, to, what) in edits {
        let raw = good.replace(from, to);
        let err =
            OwnerRecord::decode(raw.as_bytes(), scope, ShardCount::default()).expect_err(what);
        assert_eq!(err.code(), "invalid_owner_record", "{what}: {raw}");
    }
}

#[test]
fn malformed_records_fail_closed() {
    let r = record();
    let good = r.encoded().to_owned();
    let g7 = "\"generation\":7";
    let edits = [
        (good.as_str(), "", "empty"),
        (good.as_str(), "not json", "garbage"),
        ("\"v\":1", "\"v\":2", "version"),
        ("shard\":3", "shard\":4", "other shard"),
        (
            "\"storageId\":\"st1\"",
            "\"storageId\":\"st2\"",
            "other storage",
        ),
        ("\"class\":\"Room\"", "\"class\":\"Hall\"", "other class"),
        (
            "\"ownerKey\":\"st1:Room:shard3\"",
            "\"ownerKey\":\"x\"",
            "owner key",
        ),
        (g7, "\"generation\":0", "generation zero"),
        (g7, "\"generation\":9007199254740992", "generation unsafe"),
        (
            "\"taskId\":\"task-a\"",
            "\"taskId\":\"a b\"",
            "task grammar",
        ),
        ("{", "{ ", "non canonical"),
        ("}", ",\"x\":1}", "unknown field"),
    ];
    assert_edits_fail_closed(&good, r.scope(), &edits);
    assert!(OwnerRecord::decode(&[0xff, 0xfe], r.scope(), ShardCount::default()).is_err());
}

#[test]
fn generation_bounds() {
    assert!(Generation::new(0).is_err());
    assert!(Generation::new(MAX_SAFE_INTEGER).is_ok());
    assert!(Generation::new(MAX_SAFE_INTEGER + 1).is_err());
}
