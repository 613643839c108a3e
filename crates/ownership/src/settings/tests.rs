//! Tests of settings parsing.

use super::*;

#[test]
fn owner_ttl_edge_cases() {
    assert_eq!(owner_ttl_ms(None), 120_000);
    assert_eq!(owner_ttl_ms(Some("1")), 1000);
    assert_eq!(owner_ttl_ms(Some("30")), 30_000);
    assert_eq!(owner_ttl_ms(Some("9007199254740")), 9_007_199_254_740_000);
    for bad in [
        "",
        "0",
        "-1",
        "+5",
        "05",
        "1.5",
        "1e3",
        " 30",
        "30 ",
        "9007199254741",
        "99999999999999999999",
        "٣",
    ] {
        assert_eq!(owner_ttl_ms(Some(bad)), 120_000, "{bad:?}");
    }
}

#[test]
fn drain_timeout_edge_cases() {
    assert_eq!(drain_timeout_ms(None), 10_000);
    assert_eq!(drain_timeout_ms(Some("1")), 1);
    assert_eq!(
        drain_timeout_ms(Some("9007199254740991")),
        9_007_199_254_740_991
    );
    for bad in ["", "0", "9007199254740992", "010", "1_000", "abc"] {
        assert_eq!(drain_timeout_ms(Some(bad)), 10_000, "{bad:?}");
    }
}

#[test]
fn settings_from_lookup() {
    let s = OwnershipSettings::from_lookup(|_| None);
    assert_eq!(s, OwnershipSettings::default());
    assert_eq!(s.lease_guard_ms, 1000);
    assert_eq!(s.drain_in_flight_timeout_ms, 8000);
    let s = OwnershipSettings::from_lookup(|k| match k {
        ENV_OWNER_TTL_SECONDS => Some("2".into()),
        ENV_OWNER_LEASE_GUARD_MS => Some("5000".into()),
        ENV_DRAIN_IN_FLIGHT_TIMEOUT_MS => Some("0".into()),
        _ => None,
    });
    assert_eq!(s.owner_ttl_ms, 2000);
    assert_eq!(s.lease_guard_ms, 1000, "guard clamped to half the TTL");
    assert_eq!(s.drain_in_flight_timeout_ms, 8000);
}
