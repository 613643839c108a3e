//! Tests of names, grammars, limits and the pinned stable hash.

use super::*;

#[test]
fn stable_hash_is_pinned() {
    // Vectors computed independently (FNV-1a 64 over UTF-8). Changing any of
    // them moves objects to another owner scope: never change them.
    let vectors: &[(&str, u64, u32)] = &[
        ("", 0xcbf2_9ce4_8422_2325, 5),
        ("a", 0xaf63_dc4c_8601_ec8c, 12),
        ("room-1", 0xbf93_a624_f82d_974c, 12),
        ("h\u{e9}llo", 0xa35f_f71f_9602_40e0, 0),
        ("user:42", 0x6c15_1ea4_dcd2_21c2, 2),
        ("\u{1f980}", 0xff9c_5b38_7588_86e6, 6),
    ];
    for &(name, hash, shard) in vectors {
        let n = ObjectName::new(name);
        assert_eq!(stable_hash(&n), hash, "hash of {name:?}");
        assert_eq!(
            ShardCount::default().shard_of(&n),
            shard,
            "shard of {name:?}"
        );
    }
}

#[test]
fn shard_suffix_is_canonical() {
    let c = ShardCount::default();
    assert_eq!(parse_shard("shard0", c).ok(), Some(0));
    assert_eq!(parse_shard("shard15", c).ok(), Some(15));
    for bad in [
        "shard16", "shard01", "shard00", "shard", "shard-1", "shard+1", "Shard1", "shard1 ", "1",
        "shard٣",
    ] {
        assert_eq!(
            parse_shard(bad, c).map_err(|e| e.code()),
            Err("invalid_input"),
            "{bad:?}"
        );
    }
    assert!(ShardCount::new(0).is_err());
    assert!(ShardCount::new(1025).is_err());
    assert_eq!(ShardCount::new(1024).map(ShardCount::get).ok(), Some(1024));
}

#[test]
fn class_name_grammar_and_limit() {
    for ok in ["Room", "_x", "$", "A1$_", &"a".repeat(468)] {
        assert!(ClassName::new(ok).is_ok(), "{ok:?}");
    }
    for bad in [
        "",
        "1Room",
        "Ro-om",
        "Röom",
        "class",
        "let",
        "a b",
        &"a".repeat(469),
    ] {
        assert!(ClassName::new(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn ids_grammar_and_limits() {
    assert!(StorageId::new("st-1.a_b").is_ok());
    for bad in ["", "a:b", "a b", "é", &"s".repeat(129)] {
        assert!(StorageId::new(bad).is_err(), "{bad:?}");
    }
    assert!(TaskId::new("arn:aws:ecs:us-east-1:1:task/x/abc").is_ok());
    assert!(TaskId::new(&"t".repeat(512)).is_ok());
    for bad in ["", "a b", "a\"b", "a\\b", "é", &"t".repeat(513)] {
        assert!(TaskId::new(bad).is_err(), "{bad:?}");
    }
    assert!(LifecycleId::new("ns:worker").is_ok());
    for bad in ["", "ns/worker", &"l".repeat(257)] {
        assert!(LifecycleId::new(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn object_names_reject_lone_surrogates() {
    assert!(ObjectName::from_utf16(&[0x61, 0xD83E, 0xDD80]).is_ok());
    assert!(ObjectName::from_utf16(&[0x61, 0xD83E]).is_err());
    assert!(ObjectName::from_utf16(&[0xDD80, 0x61]).is_err());
}

#[test]
fn host_id_is_capped_at_512_bytes() {
    let class = ClassName::new(&"C".repeat(468)).expect("valid class");
    let c = ShardCount::new(1024).expect("valid count");
    // 468 + 2 colons + "shard1023" (9) = 479, leaving 33 bytes for the storage id.
    let fits = StorageId::new(&"s".repeat(33)).expect("valid id");
    let scope = OwnerScope::new(fits, class.clone(), 1023, c).expect("fits");
    assert_eq!(scope.host_id().len(), 512);
    let too_long = StorageId::new(&"s".repeat(34)).expect("valid id");
    assert!(OwnerScope::new(too_long, class, 1023, c).is_err());
}

#[test]
fn scope_round_trips_through_its_host_id() {
    let c = ShardCount::default();
    let scope = OwnerScope::parse("st1:Room:shard7", c).expect("valid");
    assert_eq!(scope.storage_id().as_str(), "st1");
    assert_eq!(scope.class().as_str(), "Room");
    assert_eq!(scope.shard(), 7);
    assert_eq!(scope.to_string(), "st1:Room:shard7");
    for bad in [
        "st1:Room",
        "st1:Room:shard7:x",
        "st1:Room:shard07",
        "st1:1Room:shard1",
        ":Room:shard1",
    ] {
        assert!(OwnerScope::parse(bad, c).is_err(), "{bad:?}");
    }
    let obj = ObjectName::new("room-1");
    let s = OwnerScope::for_object(
        StorageId::new("st1").expect("id"),
        ClassName::new("Room").expect("c"),
        &obj,
        c,
    )
    .expect("scope");
    assert_eq!(s.shard(), c.shard_of(&obj));
}
