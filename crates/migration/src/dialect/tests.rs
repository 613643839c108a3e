//! The crate's SQL text lives in `dialect`: no other source file of the crate
//! builds a statement or holds SQL in a string literal.

use std::path::{Path, PathBuf};

/// Files outside `dialect` that may hold SQL: the conformance suites'
/// fixture tables and rows (test-only, built with the `conformance`
/// feature), which are not statements the router issues.
const ALLOWED: &[&str] = &["conformance.rs", "conformance/harness.rs"];

/// What marks SQL text: a string literal starting with a statement keyword
/// (either case), or the statement builder.
const NEEDLES: &[&str] = &[
    "\"SELECT ",
    "\"INSERT ",
    "\"UPDATE ",
    "\"DELETE ",
    "\"CREATE ",
    "\"ALTER ",
    "\"DROP ",
    "\"select ",
    "\"insert ",
    "\"update ",
    "\"delete ",
    "\"create ",
    "\"alter ",
    "\"drop ",
    "Sql::new(",
];

/// Every `.rs` file under `dir`, as paths relative to `root` with `/`.
fn sources(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
        if path.is_dir() {
            sources(root, &path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let rel = path
                .strip_prefix(root)
                .unwrap_or_else(|e| panic!("{e}"))
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((rel, path));
        }
    }
}

/// The SQL-looking lines of `text` (`line: text`), comments excluded (a
/// doc example's fixture table is the user's SQL, not the crate's).
fn sql_lines(text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| NEEDLES.iter().any(|n| l.contains(n)))
        .map(|(i, l)| format!("{}: {}", i + 1, l.trim()))
        .collect()
}

/// Whether `rel` is a unit-test module (`tests.rs`), whose literals are the
/// expected text of generated statements or a fake shard's parsing.
fn is_test_module(rel: &str) -> bool {
    rel == "tests.rs" || rel.ends_with("/tests.rs")
}

#[test]
fn no_sql_outside_the_dialect_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    let names: Vec<&str> = files.iter().map(|(r, _)| r.as_str()).collect();
    for expected in [
        "router.rs",
        "journal.rs",
        "dialect/mod.rs",
        "conformance.rs",
    ] {
        assert!(names.contains(&expected), "{expected} not read: {names:?}");
    }
    let mut offenders = Vec::new();
    let mut allowed_with_sql = Vec::new();
    for (rel, path) in &files {
        if rel.starts_with("dialect/") || is_test_module(rel) {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let hits = sql_lines(&text);
        if ALLOWED.contains(&rel.as_str()) {
            if !hits.is_empty() {
                allowed_with_sql.push(rel.clone());
            }
            continue;
        }
        offenders.extend(hits.into_iter().map(|h| format!("{rel}:{h}")));
    }
    assert!(
        offenders.is_empty(),
        "SQL outside `dialect` (move it into a `dialect` submodule):\n{}",
        offenders.join("\n")
    );
    let mut stale: Vec<&str> = ALLOWED
        .iter()
        .copied()
        .filter(|a| !allowed_with_sql.iter().any(|h| h == a))
        .collect();
    stale.sort_unstable();
    assert!(
        stale.is_empty(),
        "allowlisted files without SQL (drop them from ALLOWED): {stale:?}"
    );
}

#[test]
fn the_check_sees_sql_in_literals_and_not_in_comments() {
    let src = "let a = 1;\n    s.raw(\"SELECT x FROM \")\n/// \"CREATE TABLE t\"\nq(\"delete from t\");\nlet s = Sql::new(&d);\n";
    assert_eq!(
        sql_lines(src),
        vec![
            "2: s.raw(\"SELECT x FROM \")".to_owned(),
            "4: q(\"delete from t\");".to_owned(),
            "5: let s = Sql::new(&d);".to_owned(),
        ]
    );
    assert!(is_test_module("tests.rs") && is_test_module("status/tests.rs"));
    assert!(!is_test_module("router.rs"));
}
