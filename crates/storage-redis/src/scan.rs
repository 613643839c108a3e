//! `SCAN MATCH` patterns: the listings (leases, alarm jobs) scan the keys
//! under a prefix, and a prefix may hold glob characters.

/// The `SCAN MATCH` pattern of exactly the keys that start with `prefix`:
/// its glob characters (`*`, `?`, `[`, `]`, `\`) escaped, then `*`.
pub(crate) fn prefix_pattern(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

#[cfg(test)]
mod tests {
    use super::prefix_pattern;

    #[test]
    fn a_prefix_matches_only_itself() {
        assert_eq!(prefix_pattern("do:owner:"), "do:owner:*");
        assert_eq!(prefix_pattern(r"s*?[x]\:"), r"s\*\?\[x\]\\:*");
    }
}
