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
    let t = RecordTemplate::new(r.scope(), r.lifecycle(), r.task());
    assert_eq!(format!("{}7{}", t.prefix, t.suffix), r.encoded());
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
