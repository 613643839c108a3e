//! Schema name grammar, without a server.

use super::*;

#[test]
fn schema_names_follow_the_grammar() {
    for ok in ["a", "_x", "tenant_42", "durability", &"a".repeat(63)] {
        assert_eq!(
            SchemaName::new(ok).map(|s| s.quoted()),
            Ok(format!("\"{ok}\""))
        );
    }
    let refused = [
        ("", "must not be empty"),
        (&*"a".repeat(64), "must be at most 63 bytes"),
        ("x; DROP TABLE t", "allowed characters are [a-z0-9_]"),
        ("a\"b", "allowed characters are [a-z0-9_]"),
        ("Upper", "allowed characters are [a-z0-9_]"),
        ("émoji", "allowed characters are [a-z0-9_]"),
        ("a-b", "allowed characters are [a-z0-9_]"),
        ("a\0b", "allowed characters are [a-z0-9_]"),
        ("1abc", "must not start with a digit"),
        ("pg_catalog", "names starting with pg_ are reserved"),
    ];
    for (raw, reason) in refused {
        let e = SchemaName::new(raw).expect_err(raw);
        assert_eq!(e.reason, reason, "{raw:?}");
    }
}
