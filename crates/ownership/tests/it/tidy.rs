//! The ownership crate holds logic only: no storage client in its normal
//! dependency graph (checked over `cargo metadata`, transitively).

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use serde_json::Value;

const FORBIDDEN: &[&str] = &[
    "rusqlite",
    "libsqlite3-sys",
    "redis",
    "tokio-postgres",
    "sqlx",
    "mysql_async",
];

#[test]
fn ownership_depends_on_no_storage_client() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    // Offline, the packages of this platform only: a fresh machine holds
    // no sources of other platforms' dependencies (and storage clients are
    // not platform-specific).
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
            &host_triple(),
            "--manifest-path",
            manifest,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes: HashMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let root = names
        .iter()
        .find(|(_, n)| **n == "durability-ownership")
        .map(|(id, _)| *id)
        .unwrap();
    // Walk normal (non-dev, non-build) edges from the crate.
    let mut seen = BTreeSet::new();
    let mut stack = vec![root];
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null());
            if normal {
                stack.push(dep["pkg"].as_str().unwrap());
            }
        }
    }
    let reached: BTreeSet<&str> = seen.iter().map(|id| names[id]).collect();
    assert!(
        reached.contains("lru"),
        "the walk must reach real dependencies: {reached:?}"
    );
    for f in FORBIDDEN {
        assert!(
            !reached.contains(f),
            "durability-ownership must not depend on {f}"
        );
    }
}

/// The target triple of the toolchain running the tests (`rustc -vV`).
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let out = Command::new(rustc).arg("-vV").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names its host")
        .to_owned()
}
