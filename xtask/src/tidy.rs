//! Tidy checks, run as ordinary tests so `cargo xtask test` enforces them.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Capability crates: logic only, never a storage driver.
const CAPABILITY_CRATES: &[&str] = &[
    "durability-scheduler",
    "durability-outbox",
    "durability-ownership",
    "durability-migration",
    "durability-topology",
    "durability-topology-client",
    "durability-alarms",
];

/// Drivers a capability crate must not reach through normal dependencies.
const FORBIDDEN: &[&str] = &[
    "rusqlite",
    "libsqlite3-sys",
    "redis",
    "tokio-postgres",
    "postgres",
    "sqlx",
    "mysql_async",
    "mysql",
];

/// The only packages `xtask` may depend on (normal dependencies, direct):
/// xtask orchestrates `cargo`, so building it must not build the stack.
const XTASK_ALLOWED_DEPS: &[&str] = &["serde_json"];

/// Packages that must never be in xtask's normal dependency closure.
const XTASK_HEAVY: &[&str] = &[
    "tokio",
    "rusqlite",
    "libsqlite3-sys",
    "redis",
    "tokio-postgres",
    "mysql_async",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

fn metadata() -> Value {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// Names of every package reachable from `id` through normal dependencies.
fn normal_closure(meta: &Value, id: &str) -> Vec<String> {
    let nodes = meta["resolve"]["nodes"].as_array().expect("resolve nodes");
    let name_of = |id: &str| -> String {
        meta["packages"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["id"] == id))
            .and_then(|p| p["name"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let mut seen = vec![id.to_owned()];
    let mut stack = vec![id.to_owned()];
    while let Some(cur) = stack.pop() {
        let Some(node) = nodes.iter().find(|n| n["id"] == cur.as_str()) else {
            continue;
        };
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            let pkg = dep["pkg"].as_str().unwrap_or_default().to_owned();
            if normal && !seen.contains(&pkg) {
                seen.push(pkg.clone());
                stack.push(pkg);
            }
        }
    }
    seen.iter().map(|id| name_of(id)).collect()
}

/// The id of the workspace member named `name`.
fn member_id<'m>(meta: &'m Value, name: &str) -> &'m str {
    meta["workspace_members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(Value::as_str)
        .find(|id| {
            meta["packages"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["id"] == *id))
                .is_some_and(|p| p["name"] == name)
        })
        .unwrap_or_else(|| panic!("{name} is a workspace member"))
}

/// Names of the direct normal dependencies of `id`.
fn normal_deps(meta: &Value, id: &str) -> Vec<String> {
    let nodes = meta["resolve"]["nodes"].as_array().expect("resolve nodes");
    let node = nodes
        .iter()
        .find(|n| n["id"] == id)
        .expect("the package is in the resolve graph");
    node["deps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|dep| {
            dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null())
        })
        .filter_map(|dep| {
            let pkg = dep["pkg"].as_str()?;
            meta["packages"]
                .as_array()?
                .iter()
                .find(|p| p["id"] == pkg)?["name"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[test]
fn xtask_depends_only_on_its_allowlist() {
    let meta = metadata();
    let id = member_id(&meta, "xtask");
    let extra: Vec<String> = normal_deps(&meta, id)
        .into_iter()
        .filter(|n| !XTASK_ALLOWED_DEPS.contains(&n.as_str()))
        .collect();
    assert!(
        extra.is_empty(),
        "xtask depends on {extra:?}: xtask only orchestrates cargo (allowed: {XTASK_ALLOWED_DEPS:?}); \
         demo and bench code belongs in the durability-demo package"
    );
    let closure = normal_closure(&meta, id);
    let heavy: Vec<&String> = closure
        .iter()
        .skip(1) // xtask itself
        .filter(|n| n.starts_with("durability") || XTASK_HEAVY.contains(&n.as_str()))
        .collect();
    assert!(
        heavy.is_empty(),
        "xtask reaches {heavy:?} through its normal dependencies"
    );
}

#[test]
fn xtask_knows_the_demo_bench_areas() {
    let bench = std::fs::read_to_string(root().join("demo/src/bench.rs"))
        .expect("demo/src/bench.rs exists");
    let line = bench
        .lines()
        .find(|l| l.starts_with("pub(crate) const AREAS: &[&str] = &["))
        .expect("demo/src/bench.rs declares AREAS");
    let listed: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
    assert_eq!(
        listed,
        crate::BENCH_AREAS,
        "xtask's BENCH_AREAS must list the areas of demo/src/bench.rs"
    );
}

#[test]
fn capability_crates_depend_on_no_storage_driver() {
    let meta = metadata();
    let members = meta["workspace_members"].as_array().expect("members");
    let mut checked = 0;
    for id in members.iter().filter_map(Value::as_str) {
        let name = meta["packages"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["id"] == id))
            .and_then(|p| p["name"].as_str())
            .unwrap_or_default();
        if !CAPABILITY_CRATES.contains(&name) {
            continue;
        }
        checked += 1;
        let closure = normal_closure(&meta, id);
        for bad in FORBIDDEN {
            assert!(
                !closure.iter().any(|n| n == bad),
                "{name} depends on {bad}: capability crates hold logic only; drivers live in storage-* crates"
            );
        }
    }
    assert!(checked >= 2, "the tidy check found the capability crates");
}

#[test]
fn every_crate_directory_is_in_architecture_md() {
    let arch =
        std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md exists");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let entry = entry.expect("dir entry");
        if !entry.path().join("Cargo.toml").exists() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if !arch.contains(&format!("crates/{name}")) {
            missing.push(name);
        }
    }
    // The packages outside crates/ (demo, tests, xtask) have a section each.
    for entry in std::fs::read_dir(root()).expect("workspace root") {
        let entry = entry.expect("dir entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "crates" || !entry.path().join("Cargo.toml").exists() {
            continue;
        }
        if !arch.contains(&format!("### `{name}`")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "crates missing from ARCHITECTURE.md: {missing:?}"
    );
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_test_is_ignored() {
    let mut files = Vec::new();
    for dir in ["crates", "demo", "tests", "xtask"] {
        rust_files(&root().join(dir), &mut files);
    }
    assert!(files.len() > 10, "the tidy check found the sources");
    // Built from parts so this file does not trip its own check.
    let patterns = [format!("#[{}", "ignore"), format!("#[{}", "should_panic")];
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            patterns.iter().any(|p| text.contains(p.as_str()))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "ignored or should_panic tests: {offenders:?}"
    );
}
