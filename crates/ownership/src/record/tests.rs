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
    for (raw, what) in [
        (
            good.replace("http://10.0.0.7:8080", "ftp://10.0.0.7:8080"),
            "scheme",
        ),
        (good.replace("http://10.0.0.7:8080", ""), "empty"),
        (
            good.replace("http://10.0.0.7:8080", "http://10.0.0.7:8080\\u0000"),
            "escaped control",
        ),
        (
            good.replace("\"endpoint\":\"http://10.0.0.7:8080\"", "\"endpoint\":null"),
            "null",
        ),
        (
            good.replace("\"endpoint\":\"http://10.0.0.7:8080\"", "\"endpoint\":7"),
            "number",
        ),
    ] {
        let scope = scope("st1:Room:shard3");
        let err =
            OwnerRecord::decode(raw.as_bytes(), &scope, ShardCount::default()).expect_err(what);
        assert_eq!(err.code(), "invalid_owner_record", "{what}: {raw}");
    }
}

#[test]
fn malformed_records_fail_closed() {
    let r = record();
    let good = r.encoded().to_owned();
    let cases: Vec<(String, &str)> = vec![
        ("".into(), "empty"),
        ("not json".into(), "garbage"),
        (good.replace("\"v\":1", "\"v\":2"), "version"),
        (good.replace("shard\":3", "shard\":4"), "other shard"),
        (
            good.replace("\"storageId\":\"st1\"", "\"storageId\":\"st2\""),
            "other storage",
        ),
        (
            good.replace("\"class\":\"Room\"", "\"class\":\"Hall\""),
            "other class",
        ),
        (
            good.replace("\"ownerKey\":\"st1:Room:shard3\"", "\"ownerKey\":\"x\""),
            "owner key",
        ),
        (
            good.replace("\"generation\":7", "\"generation\":0"),
            "generation zero",
        ),
        (
            good.replace("\"generation\":7", "\"generation\":9007199254740992"),
            "generation unsafe",
        ),
        (
            good.replace("\"taskId\":\"task-a\"", "\"taskId\":\"a b\""),
            "task grammar",
        ),
        (good.replace("{", "{ "), "non canonical"),
        (good.replace("}", ",\"x\":1}"), "unknown field"),
    ];
    for (raw, what) in cases {
        let err =
            OwnerRecord::decode(raw.as_bytes(), r.scope(), ShardCount::default()).expect_err(what);
        assert_eq!(err.code(), "invalid_owner_record", "{what}");
    }
    assert!(OwnerRecord::decode(&[0xff, 0xfe], r.scope(), ShardCount::default()).is_err());
}

#[test]
fn generation_bounds() {
    assert!(Generation::new(0).is_err());
    assert!(Generation::new(MAX_SAFE_INTEGER).is_ok());
    assert!(Generation::new(MAX_SAFE_INTEGER + 1).is_err());
}
