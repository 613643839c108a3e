//! Tidy checks, run as ordinary tests so `cargo xtask test` enforces them.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Capability crates: logic only, never a storage driver.
const CAPABILITY_CRATES: &[&str] = &[
    "durability-time",
    "durability-scheduler",
    "durability-outbox",
    "durability-ownership",
    "durability-migration",
    "durability-topology",
    "durability-topology-client",
    "durability-alarms",
    "durability-semaphore",
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
    for dir in ["crates", "demo", "examples", "tests", "xtask"] {
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

/// The tracing macros that emit an event.
const EVENT_MACROS: &[&str] = &["trace", "debug", "info", "warn", "error", "event"];

/// Every tracing event invocation in `text`: its 1-based line and its text,
/// from the macro name to the matching closing delimiter.
fn event_invocations(text: &str) -> Vec<(usize, String)> {
    let bytes = text.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        // Line comments can mention a macro without invoking it.
        if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if i > 0 && is_ident(bytes[i - 1]) {
            i += 1;
            continue;
        }
        let Some(name) = EVENT_MACROS.iter().find(|m| {
            let end = i + m.len();
            bytes[i..].starts_with(m.as_bytes()) && bytes.get(end) == Some(&b'!')
        }) else {
            i += 1;
            continue;
        };
        let mut j = i + name.len() + 1;
        while j < bytes.len() && bytes[j].is_ascii_whitespace() {
            j += 1;
        }
        let (open, close) = match bytes.get(j) {
            Some(b'(') => (b'(', b')'),
            Some(b'[') => (b'[', b']'),
            Some(b'{') => (b'{', b'}'),
            _ => {
                i += 1;
                continue;
            }
        };
        // Scan to the matching delimiter, skipping string literals.
        let mut depth = 0usize;
        let mut in_str = false;
        let mut k = j;
        while k < bytes.len() {
            let b = bytes[k];
            if in_str {
                if b == b'\\' {
                    k += 1;
                } else if b == b'"' {
                    in_str = false;
                }
            } else if b == b'"' {
                in_str = true;
            } else if b == open {
                depth += 1;
            } else if b == close {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            k += 1;
        }
        let start = text[..i]
            .rfind("tracing::")
            .filter(|&s| s + 9 == i)
            .unwrap_or(i);
        let line = text[..i].matches('\n').count() + 1;
        let end = (k + 1).min(text.len());
        found.push((line, text[start..end].to_owned()));
        i = end;
    }
    found
}

/// Functions that log one event named by their first argument (a string
/// literal at every call) with their last as the message; the invocation
/// inside forwards it as `event`. Each call is checked as the invocation
/// `warn!(event = <first>, <last>)` would be.
const EVENT_FORWARDERS: [(&str, &str); 1] = [("crates/ownership/src/manager.rs", "scope_failed")];

/// The calls of forwarder `name` in `text` (not its definition), each as the
/// event invocation it stands for, with its line.
fn forwarder_calls(text: &str, name: &str) -> Vec<(usize, String)> {
    let call = format!("{name}(");
    let mut found = Vec::new();
    for (at, _) in text.match_indices(&call) {
        let before = text[..at].trim_end();
        if before.ends_with("fn") || before.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let mut depth = 0usize;
        let mut end = at;
        for (i, c) in text[at..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = at + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        let args = top_level_args(&text[at..end]);
        let (Some(first), Some(last)) = (args.first(), args.last()) else {
            continue;
        };
        let line = text[..at].matches('\n').count() + 1;
        found.push((
            line,
            format!("warn!(event = {}, {})", first.trim(), last.trim()),
        ));
    }
    found
}

/// Why an event invocation breaks the naming convention, if it does: it
/// must carry `event = "durability.<crate>.<what>"`, `<crate>` being the
/// crate's directory name with `-` as `_` and `<what>` snake_case.
fn event_name_problem(invocation: &str, crate_dir: &str) -> Option<String> {
    let squeezed: String = invocation.chars().filter(|c| !c.is_whitespace()).collect();
    let prefix = format!("durability.{}.", crate_dir.replace('-', "_"));
    let field = format!("event=\"{prefix}");
    let Some(at) = squeezed.find(&field) else {
        if squeezed.contains("event=\"") {
            return Some(format!("its `event` field does not start with `{prefix}`"));
        }
        return Some(format!("no `event = \"{prefix}<what>\"` field"));
    };
    if !matches!(squeezed[..at].chars().last(), Some('(' | ',' | '[' | '{')) {
        return Some(format!("no `event = \"{prefix}<what>\"` field"));
    }
    let rest = &squeezed[at + field.len()..];
    let what = rest.split('"').next().unwrap_or_default();
    let snake = !what.is_empty()
        && what.starts_with(|c: char| c.is_ascii_lowercase())
        && what
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !snake {
        return Some(format!(
            "`{prefix}{what}`: the name after the crate is not snake_case"
        ));
    }
    let has_message = top_level_args(invocation)
        .iter()
        .any(|a| a.trim_start().starts_with('"'));
    (!has_message).then(|| "no human message after the fields".to_owned())
}

/// The top-level, comma-separated arguments of a macro invocation (the text
/// between its first opening delimiter and its last character).
fn top_level_args(invocation: &str) -> Vec<&str> {
    let Some(open) = invocation.find(['(', '[', '{']) else {
        return Vec::new();
    };
    let inner = &invocation[open + 1..invocation.len().saturating_sub(1).max(open + 1)];
    let mut args = Vec::new();
    let (mut depth, mut in_str, mut escaped, mut start) = (0usize, false, false, 0);
    for (i, c) in inner.char_indices() {
        if in_str {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                args.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !inner[start..].trim().is_empty() {
        args.push(&inner[start..]);
    }
    args
}

#[test]
fn every_tracing_event_names_its_crate() {
    let mut checked = 0;
    let mut forwarded = 0;
    let mut offenders = Vec::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .expect("crates/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    crates.sort();
    for dir in crates {
        let crate_dir = dir
            .file_name()
            .expect("a crate directory has a name")
            .to_string_lossy()
            .into_owned();
        let mut files = Vec::new();
        rust_files(&dir.join("src"), &mut files);
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("source file reads");
            let rel = file
                .strip_prefix(root())
                .unwrap_or(&file)
                .display()
                .to_string();
            let forwarder = EVENT_FORWARDERS
                .iter()
                .find(|(path, _)| *path == rel)
                .map(|(_, name)| *name);
            let mut invocations = event_invocations(&text);
            if let Some(name) = forwarder {
                // The forwarder's own invocation passes `event` on; each
                // call of it is checked in its place.
                invocations.retain(|(_, inv)| {
                    !inv.split_whitespace()
                        .collect::<String>()
                        .contains("!(event,")
                });
                let calls = forwarder_calls(&text, name);
                forwarded += calls.len();
                invocations.extend(calls);
            }
            for (line, invocation) in invocations {
                checked += 1;
                if let Some(problem) = event_name_problem(&invocation, &crate_dir) {
                    let shown: String = invocation.split_whitespace().collect::<Vec<_>>().join(" ");
                    offenders.push(format!("{rel}:{line}: {problem}: {shown}"));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "the tidy check found the tracing events ({checked})"
    );
    assert!(
        forwarded >= EVENT_FORWARDERS.len(),
        "every event forwarder is called ({forwarded} calls found)"
    );
    assert!(
        offenders.is_empty(),
        "tracing events must carry `event = \"durability.<crate>.<what>\"` (crate = directory name, `-` as `_`; what = snake_case) and, after the fields, a human message:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn event_scanner_handles_multi_line_invocations() {
    let text = "fn f() {\n    // warn!(not an event)\n    tracing::warn!(\n        error = %e,\n        \"durability.migration.moved (x)\"\n    );\n    info!(event = \"durability.migration.moved\", \"ok\");\n    debug_assert!(true);\n}\n";
    let found = event_invocations(text);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].0, 3);
    assert!(found[0].1.starts_with("tracing::warn!(") && found[0].1.ends_with(')'));
    assert!(event_name_problem(&found[0].1, "migration").is_some());
    assert_eq!(found[1].0, 7);
    assert_eq!(event_name_problem(&found[1].1, "migration"), None);
    assert!(event_name_problem(&found[1].1, "storage-sqlite").is_some());
    let bad_case = "warn!(event = \"durability.topology_client.Fallback\", \"m\")";
    assert!(event_name_problem(bad_case, "topology-client").is_some());
    let silent =
        "warn!(event = \"durability.alarms.tick_failed\", text = \"a, \\\"b\\\"\", %error)";
    assert_eq!(
        top_level_args(silent).len(),
        3,
        "{:?}",
        top_level_args(silent)
    );
    assert!(event_name_problem(silent, "alarms").is_some());
    let formatted = "warn!(event = \"durability.alarms.tick_failed\", \"tick {} failed\", n)";
    assert_eq!(event_name_problem(formatted, "alarms"), None);
}

/// The heading of the crate graph section in ARCHITECTURE.md.
const CRATE_GRAPH_HEADING: &str = "## Crate graph";

/// One documented line per package under `crates/` that depends on another,
/// naming every normal dependency between them as `cargo metadata` declares
/// them: `- from → to; to (feature a, b)`, each optional dependency with the
/// features that enable it (with `dep:`, or its implicit feature), the
/// targets sorted.
fn crate_graph_lines(meta: &Value) -> Vec<String> {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let crates_dir = canonical(&root().join("crates"));
    let packages = meta["packages"].as_array().expect("packages");
    let members: Vec<&str> = meta["workspace_members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let in_crates = |manifest: &str| canonical(Path::new(manifest)).starts_with(&crates_dir);
    let library: Vec<&Value> = packages
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(&id)))
        .filter(|p| p["manifest_path"].as_str().is_some_and(in_crates))
        .collect();
    let names: Vec<&str> = library.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut lines = Vec::new();
    for p in &library {
        let from = p["name"].as_str().unwrap_or_default();
        let mut targets = Vec::new();
        let mut edges: Vec<(String, bool)> = Vec::new();
        for dep in p["dependencies"].as_array().into_iter().flatten() {
            let to = dep["name"].as_str().unwrap_or_default();
            if !dep["kind"].is_null() || !names.contains(&to) || to == from {
                continue;
            }
            let optional = dep["optional"].as_bool().unwrap_or(false);
            match edges.iter_mut().find(|(n, _)| n == to) {
                Some(edge) => edge.1 &= optional,
                None => edges.push((to.to_owned(), optional)),
            }
        }
        for (to, optional) in edges {
            if !optional {
                targets.push(to);
                continue;
            }
            let key = dep_key(p, &to);
            let mut features: Vec<&str> = p["features"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, enables)| {
                    enables
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|e| e.as_str() == Some(&format!("dep:{key}")))
                })
                .map(|(f, _)| f.as_str())
                .collect();
            if features.is_empty() {
                // No `dep:` entry: cargo's implicit feature named after it.
                features.push(&key);
            }
            features.sort_unstable();
            targets.push(format!("{to} (feature {})", features.join(", ")));
        }
        targets.sort();
        if !targets.is_empty() {
            lines.push(format!("- {from} → {}", targets.join("; ")));
        }
    }
    lines.sort();
    lines
}

/// The name a package's manifest uses for its dependency on `to` (its
/// rename, if any).
fn dep_key(package: &Value, to: &str) -> String {
    package["dependencies"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == to && d["kind"].is_null())
        .and_then(|d| d["rename"].as_str())
        .unwrap_or(to)
        .to_owned()
}

/// The `- ` lines of the crate graph section of ARCHITECTURE.md.
fn documented_crate_graph(arch: &str) -> Vec<String> {
    let start = arch
        .lines()
        .position(|l| l.trim_end() == CRATE_GRAPH_HEADING)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has a `{CRATE_GRAPH_HEADING}` section"));
    arch.lines()
        .skip(start + 1)
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("- "))
        .map(|l| l.trim_end().to_owned())
        .collect()
}

#[test]
fn crate_graph_in_architecture_md_matches_cargo_metadata() {
    let actual = crate_graph_lines(&metadata());
    assert!(actual.len() > 5, "the tidy check found the crate graph");
    let arch =
        std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md exists");
    let documented = documented_crate_graph(&arch);
    let add: Vec<&String> = actual.iter().filter(|l| !documented.contains(l)).collect();
    let mut remove: Vec<&String> = documented.iter().filter(|l| !actual.contains(l)).collect();
    let mut seen = Vec::new();
    for line in &documented {
        if seen.contains(&line) && actual.contains(line) {
            remove.push(line);
        }
        seen.push(line);
    }
    let list = |lines: &[&String]| {
        lines
            .iter()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    assert!(
        add.is_empty() && remove.is_empty(),
        "ARCHITECTURE.md `{CRATE_GRAPH_HEADING}` differs from cargo metadata (normal dependencies between the packages under crates/).\nadd these lines:\n{}remove these lines:\n{}the whole section should read:\n{}",
        list(&add),
        list(&remove),
        list(&actual.iter().collect::<Vec<_>>()),
    );
}

/// What only `crates/time` may define: a second clock, backoff, jitter
/// source or safe-integer limit anywhere else is a finding. Built from parts
/// so this file does not trip its own check.
fn time_owned_definitions() -> Vec<String> {
    [
        ("trait", " Clock"),
        ("impl Clock", " for"),
        ("struct", " ManualClock"),
        ("struct", " SystemClock"),
        ("struct", " Backoff"),
        ("enum", " Jitter"),
        ("Jitter", "Fn"),
        ("const MAX_SAFE", "_INTEGER"),
        ("const MAX_SAFE", "_UNSIGNED"),
        ("fn default", "_backoff"),
    ]
    .iter()
    .map(|(a, b)| format!("{a}{b}"))
    .collect()
}

/// Whether a line of library code draws randomness other than an
/// identifier (`rand::random::<u64>()` / `<u128>()` name schemas and tokens;
/// jitter draws from `durability_time::Random`).
fn draws_jitter(line: &str) -> bool {
    let uses_rand =
        line.contains("rand::") || line.contains("Rng") || line.contains("random_range");
    let identifier =
        line.contains("rand::random::<u64>()") || line.contains("rand::random::<u128>()");
    uses_rand && !identifier && !line.trim_start().starts_with("//")
}

#[test]
fn only_the_time_crate_keeps_time() {
    let root = root();
    let mut files = Vec::new();
    for dir in ["crates", "demo", "examples", "tests", "xtask/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    let time_crate = root.join("crates/time");
    let this_file = root.join("xtask/src/tidy.rs");
    let owned = time_owned_definitions();
    let select = [format!("select{}", "!"), format!("select{}", "(")];
    let mut findings = Vec::new();
    let mut library_files = 0;
    for file in files
        .iter()
        .filter(|f| !f.starts_with(&time_crate) && **f != this_file)
    {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let rel = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        let library = rel.starts_with("crates/") && rel.contains("/src/");
        library_files += usize::from(library);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            for def in &owned {
                if line.contains(def.as_str()) {
                    findings.push(format!("{rel}:{}: `{def}` belongs in crates/time", i + 1));
                }
            }
            if !library {
                continue;
            }
            if draws_jitter(line) {
                findings.push(format!(
                    "{rel}:{}: draw jitter from durability_time::Random, not `{}`",
                    i + 1,
                    line.trim()
                ));
            }
            let races_a_sleep = select.iter().any(|s| line.contains(s.as_str()))
                && lines[i..lines.len().min(i + 12)]
                    .iter()
                    .any(|l| l.contains("sleep"));
            if races_a_sleep {
                findings.push(format!(
                    "{rel}:{}: a deadline raced by hand; use durability_time::timeout_at",
                    i + 1
                ));
            }
        }
    }
    assert!(library_files > 50, "the check found the library sources");
    assert!(
        findings.is_empty(),
        "time outside crates/time:\n{}",
        findings.join("\n")
    );
}

#[test]
fn the_time_check_recognises_what_it_forbids() {
    assert!(draws_jitter("let r = rand::random::<f64>();"));
    assert!(draws_jitter("let mut rng = StdRng::seed_from_u64(1);"));
    assert!(!draws_jitter(
        "Self(format!(\"{:032x}\", rand::random::<u128>()))"
    ));
    assert!(!draws_jitter("// rand::random::<f64>() is not used"));
    let owned = time_owned_definitions();
    assert!(
        owned
            .iter()
            .any(|d| "pub trait Clock: Send".contains(d.as_str()))
    );
    assert!(
        owned
            .iter()
            .any(|d| "pub const MAX_SAFE_INTEGER: u64 = 1;".contains(d.as_str()))
    );
}

/// `[[package]]` entries of a Cargo.lock as `name version`.
fn locked_packages(lock: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_owned());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            out.push(format!("{n} {}", v.trim_matches('"')));
        }
    }
    out
}

/// `cargo xtask bench peers` lives in `bench/peers/`: two workspaces of
/// their own that never join the main lock or build (apalis-sqlite links
/// another SQLite than rusqlite). Nothing of it is built here; this checks
/// that it stays apart, that our side resolves with exactly the main lock's
/// versions (a lock subset, so `cargo fetch` of the main lock has them),
/// and that our side still resolves against the current crates (`cargo
/// metadata --locked --offline`, no build).
#[test]
fn bench_peers_stays_out_of_the_main_workspace() {
    let root = root();
    let peers = root.join("bench/peers");
    let meta = metadata();
    let packages = meta["packages"].as_array().expect("packages");
    let inside: Vec<&str> = packages
        .iter()
        .filter(|p| {
            p["manifest_path"]
                .as_str()
                .is_some_and(|m| Path::new(m).starts_with(&peers))
                || p["name"].as_str().is_some_and(|n| {
                    n.starts_with("durability-bench-peers") || n.starts_with("apalis")
                })
        })
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert!(
        inside.is_empty(),
        "bench/peers must stay outside the main workspace and lock, found {inside:?}"
    );
    let main_lock = std::fs::read_to_string(root.join("Cargo.lock")).expect("Cargo.lock");
    let main_packages = locked_packages(&main_lock);
    for (dir, bin) in crate::PEER_BINARIES {
        let manifest = std::fs::read_to_string(peers.join(dir).join("Cargo.toml"))
            .expect("bench/peers/<dir>/Cargo.toml");
        assert!(
            manifest.lines().any(|l| l.trim() == "[workspace]"),
            "bench/peers/{dir} is a workspace of its own"
        );
        assert!(
            manifest.contains(&format!("name = \"{bin}\"")),
            "bench/peers/{dir} builds {bin}"
        );
        let lock = std::fs::read_to_string(peers.join(dir).join("Cargo.lock"))
            .expect("bench/peers/<dir>/Cargo.lock is committed");
        assert!(
            locked_packages(&lock).contains(&format!("{bin} 0.1.0")),
            "bench/peers/{dir}/Cargo.lock locks {bin}"
        );
    }
    let ours = peers.join("ours");
    let ours_lock = std::fs::read_to_string(ours.join("Cargo.lock")).expect("ours lock");
    let extra: Vec<String> = locked_packages(&ours_lock)
        .into_iter()
        .filter(|p| !p.starts_with("durability-bench-peers-ours ") && !main_packages.contains(p))
        .collect();
    assert!(
        extra.is_empty(),
        "bench/peers/ours/Cargo.lock must use the main lock's versions; not in it: {extra:?}"
    );
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--offline",
            "--manifest-path",
        ])
        .arg(ours.join("Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "bench/peers/ours no longer resolves with its lock against the current crates; \
         refresh it: copy Cargo.lock to bench/peers/ours/ and run `cargo tree --manifest-path bench/peers/ours/Cargo.toml`: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let apalis = std::fs::read_to_string(peers.join("apalis/Cargo.lock")).expect("apalis lock");
    assert!(
        locked_packages(&apalis)
            .iter()
            .any(|p| p.starts_with("apalis-sqlite 1.0.")),
        "the apalis peer is apalis-sqlite 1.0"
    );
}

const METRICS_HEADING: &str = "## Metrics";

/// The metric names of ARCHITECTURE.md's "Metrics" table with their kind:
/// every backticked name of a row's first cell.
fn documented_metrics(arch: &str) -> Vec<(String, String)> {
    let start = arch
        .lines()
        .position(|l| l.trim_end() == METRICS_HEADING)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has a `{METRICS_HEADING}` section"));
    let mut out = Vec::new();
    for line in arch
        .lines()
        .skip(start + 1)
        .take_while(|l| !l.starts_with("## "))
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "| name | kind | labels | what |" splits into 6 cells.
        if cells.len() < 4 || !cells[1].starts_with('`') {
            continue;
        }
        for name in cells[1].split('`').skip(1).step_by(2) {
            out.push((name.to_owned(), cells[2].to_owned()));
        }
    }
    out
}

/// The metric names `text` records, with their kind: the literal first
/// argument of every `counter!`, `gauge!` and `histogram!` invocation, and
/// of the host's `Figure::new` / `Figure::untasked` (counters). A name
/// that is not a literal is returned as `Err(line)`.
fn recorded_metrics(text: &str) -> Vec<Result<(String, String), usize>> {
    const SITES: &[(&str, &str)] = &[
        ("counter!(", "counter"),
        ("gauge!(", "gauge"),
        ("histogram!(", "histogram"),
        ("Figure::new(", "counter"),
        ("Figure::untasked(", "counter"),
    ];
    let mut out = Vec::new();
    let mut offset = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let code = line.trim_start();
        if !code.starts_with("//") {
            for (site, kind) in SITES {
                for (at, _) in line.match_indices(site) {
                    // `Figure::new(` inside `…Figure::new(`: only whole words.
                    let before = line[..at].chars().next_back();
                    if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                        continue;
                    }
                    let rest = text[offset + at + site.len()..].trim_start();
                    let name = rest
                        .strip_prefix('"')
                        .and_then(|r| r.split_once('"'))
                        .map(|(name, _)| name.to_owned());
                    out.push(name.map(|n| (n, (*kind).to_owned())).ok_or(index + 1));
                }
            }
        }
        offset += line.len();
    }
    out
}

/// The one wrapper allowed to pass a metric name through a variable: the
/// host's `Figure`, whose constructors are checked at their call sites.
const METRIC_NAME_WRAPPERS: &[&str] = &["crates/host/src/metrics.rs"];

#[test]
fn the_metrics_table_names_exactly_the_recorded_metrics() {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let documented = documented_metrics(&arch);
    assert!(
        documented.len() > 20,
        "the tidy check found the metrics table ({})",
        documented.len()
    );
    let mut files = Vec::new();
    rust_files(&root().join("crates"), &mut files);
    files.sort();
    let mut recorded: Vec<(String, String, String)> = Vec::new();
    let mut offenders = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        // Library code only: tests read metrics back, they do not record.
        if !rel.contains("/src/")
            || rel.ends_with("/tests.rs")
            || rel.contains("/tests/")
            || rel.starts_with("crates/bench")
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("source file reads");
        for found in recorded_metrics(&text) {
            match found {
                Ok((name, kind)) => recorded.push((name, kind, rel.clone())),
                Err(line) if !METRIC_NAME_WRAPPERS.contains(&rel.as_str()) => {
                    offenders.push(format!("{rel}:{line}: a metric name that is not a literal"));
                }
                Err(_) => {}
            }
        }
    }
    for (name, kind, rel) in &recorded {
        match documented.iter().find(|(n, _)| n == name) {
            None => offenders.push(format!(
                "{rel}: `{name}` is recorded but not in ARCHITECTURE.md's metrics table"
            )),
            Some((_, k)) if k != kind => offenders.push(format!(
                "{rel}: `{name}` is recorded as a {kind}, the table says {k}"
            )),
            Some(_) => {}
        }
    }
    for (name, _) in &documented {
        if !recorded.iter().any(|(n, _, _)| n == name) {
            offenders.push(format!(
                "`{name}` is in ARCHITECTURE.md's metrics table but recorded nowhere"
            ));
        }
    }
    assert!(
        offenders.is_empty(),
        "the metrics table and the recording sites disagree:\n{}",
        offenders.join("\n")
    );
}

/// The host's own `/metrics` endpoint and the metrics facade speak one
/// vocabulary: every `durability_*` family the endpoint writes
/// (`crates/host/src/wire.rs`' `metric_families`) is in the table, with its
/// kind.
#[test]
fn the_hosts_metrics_endpoint_uses_the_tables_names() {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let documented = documented_metrics(&arch);
    let wire = std::fs::read_to_string(root().join("crates/host/src/wire.rs")).expect("wire.rs");
    let body = wire
        .split_once("fn metric_families(")
        .expect("the host's metric families")
        .1;
    let body = &body[..body.find("\n}\n").expect("its end")];
    // The string literals in order: a `durability_*` name, then its kind.
    let literals: Vec<&str> = body.split('"').skip(1).step_by(2).collect();
    let written: Vec<(String, String)> = literals
        .windows(2)
        .filter(|w| w[0].starts_with("durability_"))
        .map(|w| (w[0].to_owned(), w[1].to_owned()))
        .collect();
    assert!(
        written.len() >= 10,
        "the tidy check found the endpoint's families ({written:?})"
    );
    let offenders: Vec<String> = written
        .iter()
        .filter(|(name, kind)| !documented.iter().any(|(n, k)| n == name && k == kind))
        .map(|(name, kind)| format!("`{name}` ({kind})"))
        .collect();
    assert!(
        offenders.is_empty(),
        "the host's /metrics writes families the metrics table does not name with that kind: {}",
        offenders.join(", ")
    );
}

#[test]
fn the_metrics_scanner_reads_literal_names_and_flags_the_rest() {
    let text = "// counter!(\"durability_x_comment_total\")\nlet a = metrics::counter!(\"durability_x_a_total\", \"k\" => v);\nlet b = gauge!(\n    \"durability_x_b\",\n    &label,\n);\nlet c = counter!(name, &all);\nFigure::untasked(\"durability_x_c_total\", &[]);\nMyFigure::new(\"durability_x_d_total\");\n";
    let found = recorded_metrics(text);
    assert_eq!(
        found,
        vec![
            Ok(("durability_x_a_total".to_owned(), "counter".to_owned())),
            Ok(("durability_x_b".to_owned(), "gauge".to_owned())),
            Err(7),
            Ok(("durability_x_c_total".to_owned(), "counter".to_owned())),
        ]
    );
    let arch = "## Metrics\n\n| name | kind | labels | what |\n|---|---|---|---|\n| `a_total`, `b_total` | counter | | x |\n| `c` | gauge | `channel` | y |\n\n## Limits\n| `d` | counter | | z |\n";
    assert_eq!(
        documented_metrics(arch),
        vec![
            ("a_total".to_owned(), "counter".to_owned()),
            ("b_total".to_owned(), "counter".to_owned()),
            ("c".to_owned(), "gauge".to_owned()),
        ]
    );
}

/// The line budget of ARCHITECTURE.md: a map read first, not a manual
/// (protocol prose lives in the crate docs, figures in `results/`).
const ARCHITECTURE_MAX_LINES: usize = 500;

#[test]
fn architecture_md_stays_within_its_line_budget() {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let lines = arch.lines().count();
    assert!(
        lines <= ARCHITECTURE_MAX_LINES,
        "ARCHITECTURE.md has {lines} lines, over its budget of {ARCHITECTURE_MAX_LINES}: \
         move protocol prose into the crate's docs (crates/<crate>/docs/*.md, included into \
         rustdoc) and keep one paragraph and the invariants per crate here"
    );
}

/// The first thing in `line` that reads like a measured figure pasted by
/// hand: a number followed by a ratio sign (`0.25×`, `1.18x`), a time below
/// a millisecond (`7.4 µs`, `72 us`, `300 ns`), a rate (`2,966 keys/s`,
/// `4,239 pairs/s`) or a fraction of a millisecond (`48.5 ms`). Limits and
/// defaults (`30 s`, `1 MiB`, `5,000 ms`, `2^53-1`, `±20 %`) are not
/// figures: they name no sub-millisecond time, no rate, no ratio and no
/// fractional millisecond.
fn pasted_figure(line: &str) -> Option<String> {
    if let Some(row) = figure_table_row(line) {
        return Some(row);
    }
    let chars: Vec<char> = line.chars().collect();
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit()
            && (i == 0 || !(word(chars[i - 1]) || chars[i - 1] == '.' || chars[i - 1] == '^'));
        if !starts {
            i += 1;
            continue;
        }
        let start = i;
        let mut fractional = false;
        while i < chars.len()
            && (chars[i].is_ascii_digit()
                || ((chars[i] == ',' || chars[i] == '.')
                    && chars.get(i + 1).is_some_and(char::is_ascii_digit)))
        {
            fractional |= chars[i] == '.';
            i += 1;
        }
        let mut j = i;
        if chars
            .get(j)
            .is_some_and(|c| [' ', '\u{a0}', '\u{202f}'].contains(c))
        {
            j += 1;
        }
        let rest: String = chars[j..].iter().take(24).collect();
        let unit_end = rest
            .find(|c: char| !(word(c) || c == '/'))
            .unwrap_or(rest.len());
        let unit = &rest[..unit_end];
        let ratio = rest.starts_with('×') || (unit == "x" && j == i);
        let small_time = ["µs", "us", "ns"].contains(&unit);
        let rate = unit.ends_with("/s") && unit.len() > 2;
        let fractional_ms = fractional && unit == "ms";
        if ratio || small_time || rate || fractional_ms {
            let shown: String = chars[start..j].iter().collect();
            return Some(format!(
                "{shown}{}",
                if ratio {
                    &rest[..rest.chars().next().map_or(0, char::len_utf8)]
                } else {
                    unit
                }
            ));
        }
    }
    None
}

/// A Markdown table row of measurements: one cell is a unit alone (`ms`,
/// `us`, `µs`, `ns`, or a rate such as `entries/s`) and another a bare
/// number, as in `| enqueue | entries/s | 26,837 | 40,563 |`.
fn figure_table_row(line: &str) -> Option<String> {
    let cells: Vec<&str> = line
        .trim()
        .strip_prefix('|')?
        .split('|')
        .map(str::trim)
        .collect();
    let unit = cells.iter().find(|c| {
        ["ms", "us", "µs", "ns"].contains(c)
            || (c.len() > 2
                && c.ends_with("/s")
                && c.chars().all(|ch| ch.is_alphanumeric() || ch == '/'))
    })?;
    let number = cells.iter().find(|c| {
        c.starts_with(|ch: char| ch.is_ascii_digit())
            && c.chars()
                .all(|ch| ch.is_ascii_digit() || ch == ',' || ch == '.')
    })?;
    Some(format!("{number} {unit}"))
}

#[test]
fn the_figure_rule_catches_pasted_figures_and_spares_limits() {
    for pasted in [
        "SQLite 0.243× / 0.228× and 0.257×",
        "ratio 1.18x of the baseline",
        "about 2x slower",
        "a local call costs 7.4 µs more",
        "bare 135–137 us, routed",
        "(2,966 against 12,212 keys/s alone)",
        "| lock + unlock | pairs/s | 4,239 | 4,637 |",
        "p99 4.1 ms SQLite",
        "4,239 pairs/s",
        "10,148 calls/s with eight in flight",
    ] {
        assert!(pasted_figure(pasted).is_some(), "missed {pasted:?}");
    }
    for fine in [
        "TTL 30 s with ±20 % jitter, a 1 s read timeout",
        "at most `MAX_CUTOVER_HOLD_MS` = 5,000 ms, default 300 ms",
        "versions at most 2^53-1; values at most 1 MiB + 8 KiB",
        "a hex byte 0x1f, a 3x3 grid, v0.24, metrics 0.24, 2 x 3",
        "| outbox key | 1..=1024 bytes, no control characters |",
        "| attempt timeout | 1..=2^31-1 ms, default 30 s |",
        "| figure | unit | ours | peer |",
        "retry backoff 1 s · 2^(n-1), scaled by a uniform factor in [0.5, 1)",
        "`cargo xtask bench host` writes `results/bench-host.jsonl`",
        "a 5-minute tour; 16 shards; 120 s owner lease",
    ] {
        assert_eq!(pasted_figure(fine), None, "flagged {fine:?}");
    }
}

#[test]
fn architecture_md_and_readme_hold_no_pasted_figure() {
    let mut found = Vec::new();
    for file in ["ARCHITECTURE.md", "README.md"] {
        let text = std::fs::read_to_string(root().join(file)).expect("the file reads");
        for (n, line) in text.lines().enumerate() {
            if let Some(figure) = pasted_figure(line) {
                found.push(format!("{file}:{}: `{figure}`", n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "measured figures pasted by hand (run `cargo xtask bench [AREA]` / `cargo xtask verify`, \
         which write results/, and link there):\n{}",
        found.join("\n")
    );
}

/// The Markdown design notes next to the code (`crates/*/docs/*.md`).
fn crate_doc_pages() -> Vec<PathBuf> {
    let mut pages = Vec::new();
    for entry in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let docs = entry.expect("dir entry").path().join("docs");
        for page in std::fs::read_dir(&docs).into_iter().flatten().flatten() {
            if page.path().extension().is_some_and(|e| e == "md") {
                pages.push(page.path());
            }
        }
    }
    pages.sort();
    pages
}

/// The opening fences of `text` (```` ``` ```` lines outside a block) that
/// name no language: rustdoc would compile those as Rust doctests.
fn untagged_fences(text: &str) -> Vec<usize> {
    let mut open = false;
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        if !open && info.trim().is_empty() {
            found.push(n + 1);
        }
        open = !open;
    }
    found
}

#[test]
fn crate_doc_pages_tag_every_code_block() {
    let pages = crate_doc_pages();
    assert!(pages.len() > 10, "the tidy check found the pages");
    let mut found = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).expect("the page reads");
        for line in untagged_fences(&text) {
            found.push(format!("{}:{line}", page.display()));
        }
    }
    assert!(
        found.is_empty(),
        "code blocks without a language (write ```text for anything that is not Rust, \
         or rustdoc runs it as a doctest):\n{}",
        found.join("\n")
    );
    assert_eq!(untagged_fences("```text\na\n```\n```\nb\n```\n"), [4]);
}

#[test]
fn results_files_hold_stamped_json_figures() {
    let mut checked = 0;
    for entry in std::fs::read_dir(root().join("results")).expect("results/") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("the results file reads");
        for (n, line) in text.lines().enumerate() {
            let where_ = format!("{}:{}", path.display(), n + 1);
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{where_}: not a JSON line: {e}"));
            for field in ["run", "commit", "name"] {
                assert!(
                    value[field].as_str().is_some_and(|s| !s.is_empty()),
                    "{where_}: no `{field}`"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 0, "the tidy check found the results files");
}

/// The host's one module that may know SQLite (its object store).
const HOST_SQLITE_MODULE: &str = "store/sqlite";

/// Lines of `text` (1-based) that name SQLite in code: the SQLite crates
/// or an object file name. Comments and doc comments (doctests need a
/// concrete store) do not count.
fn sqlite_mentions(text: &str) -> Vec<usize> {
    code_mentions(
        text,
        &["rusqlite", "durability_storage_sqlite", ".sqlite\""],
    )
}

/// Lines of `text` (1-based) that name one of `names` in code (not in a
/// comment or doc comment).
fn code_mentions(text: &str, names: &[&str]) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| names.iter().any(|n| line.contains(n)))
        .map(|(i, _)| i + 1)
        .collect()
}

/// The module of the host's PostgreSQL object store.
const HOST_POSTGRES_MODULE: &str = "store/postgres";

/// Lines of `text` (1-based) that name the PostgreSQL crates in code.
fn postgres_mentions(text: &str) -> Vec<usize> {
    code_mentions(
        text,
        &[
            "tokio_postgres",
            "deadpool_postgres",
            "durability_storage_postgres",
        ],
    )
}

/// `file:line` of every host source line outside `module` that `mentions`
/// finds.
fn host_backend_mentions(module: &str, mentions: fn(&str) -> Vec<usize>) -> Vec<String> {
    let src = root().join("crates/host/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 5, "the tidy check found the host's sources");
    files
        .iter()
        .filter(|f| {
            let relative = f.strip_prefix(&src).expect("under src");
            !relative.with_extension("").starts_with(module)
        })
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            mentions(&text)
                .into_iter()
                .map(move |line| format!("{}:{line}", f.display()))
        })
        .collect()
}

/// Lines of `text` (1-based) that hold SQL in code (not in a comment or
/// doc comment).
fn sql_mentions(text: &str) -> Vec<usize> {
    code_mentions(
        text,
        &[
            "SELECT ",
            "INSERT INTO",
            "UPDATE ",
            "DELETE FROM",
            "CREATE TABLE",
            "CREATE SCHEMA",
            "ALTER TABLE",
            "DROP TABLE",
            "DROP SCHEMA",
        ],
    )
}

#[test]
fn the_sql_rule_finds_sql_in_code_and_spares_comments() {
    let text = "let a = 1;\n// SELECT x FROM t\nc.execute(\"INSERT INTO t VALUES (1)\")?;\n/// DELETE FROM t\n";
    assert_eq!(sql_mentions(text), [3]);
}

#[test]
fn the_host_holds_no_sql() {
    // The SQL of every object store is its storage crate's; a unit-test
    // file (`tests.rs`) may set up a table of its own.
    let src = root().join("crates/host/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 5, "the tidy check found the host's sources");
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "tests.rs"))
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            sql_mentions(&text)
                .into_iter()
                .map(move |line| format!("{}:{line}", f.display()))
        })
        .collect();
    assert!(offenders.is_empty(), "SQL in the host: {offenders:?}");
}

#[test]
fn only_the_hosts_object_store_module_names_sqlite() {
    let offenders = host_backend_mentions(HOST_SQLITE_MODULE, sqlite_mentions);
    assert!(
        offenders.is_empty(),
        "SQLite named outside crates/host/src/{HOST_SQLITE_MODULE}: {offenders:?}"
    );
}

#[test]
fn only_the_hosts_object_store_module_names_postgres() {
    let offenders = host_backend_mentions(HOST_POSTGRES_MODULE, postgres_mentions);
    assert!(
        offenders.is_empty(),
        "PostgreSQL named outside crates/host/src/{HOST_POSTGRES_MODULE}: {offenders:?}"
    );
    assert_eq!(
        postgres_mentions("//! tokio_postgres\nuse durability_storage_postgres::object;\n"),
        vec![2]
    );
}

#[test]
fn the_sqlite_scan_sees_code_and_skips_comments() {
    let text = "//! uses rusqlite\nuse durability_storage_sqlite::SqliteStorage;\n/// rusqlite in docs\nlet p = format!(\"{n}.sqlite\");\n    let c = rusqlite::Connection::open(p);\n";
    assert_eq!(sqlite_mentions(text), vec![2, 4, 5]);
}

/// The top-level modules a crate's `src` files name through `crate::`
/// paths (`use crate::a::…`, `use crate::{a, b}`, `crate::a::f()`), as
/// edges between top-level modules. Comments and unit-test files
/// (`tests.rs`, `tests/`) do not count.
fn module_edges(
    src: &Path,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    for file in files {
        let relative = file.strip_prefix(src).expect("under src");
        if relative.iter().any(|p| p == "tests" || p == "tests.rs") {
            continue;
        }
        let first = relative
            .iter()
            .next()
            .and_then(|p| p.to_str())
            .unwrap_or("");
        let from = first.trim_end_matches(".rs").to_owned();
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let targets = edges.entry(from.clone()).or_default();
        for to in crate_references(&text) {
            if to != from {
                targets.insert(to);
            }
        }
    }
    edges
}

/// The first path segment after each `crate::` in code (a group
/// `crate::{a::x, b}` names each of its members).
fn crate_references(text: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            if let Some(group) = after.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                out.extend(inner.split(',').map(|m| ident(m.trim())));
            } else {
                out.push(ident(after));
            }
            rest = after;
        }
    }
    // A multi-line group: `use crate::{` with members on the next lines.
    let mut in_group = false;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        if code.ends_with("crate::{") {
            in_group = true;
            continue;
        }
        if in_group {
            if code.starts_with('}') {
                in_group = false;
                continue;
            }
            out.extend(code.split(',').map(|m| ident(m.trim())));
        }
    }
    out.retain(|m| !m.is_empty() && m != "self");
    out
}

/// The modules of each cycle (strongly connected component of more than
/// one module), sorted.
fn module_cycles(
    edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    let reaches = |from: &str| {
        let mut seen = std::collections::BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(m) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: std::collections::BTreeMap<&String, _> =
        edges.keys().map(|m| (m, reaches(m))).collect();
    let mut cycles: Vec<Vec<String>> = Vec::new();
    for (m, r) in &reach {
        if !r.contains(*m) || cycles.iter().any(|c| c.contains(m)) {
            continue;
        }
        let cycle: Vec<String> = reach
            .iter()
            .filter(|(n, rn)| r.contains(**n) && rn.contains(*m))
            .map(|(n, _)| (*n).clone())
            .collect();
        cycles.push(cycle);
    }
    cycles
}

#[test]
fn the_host_has_no_module_cycle() {
    let edges = module_edges(&root().join("crates/host/src"));
    assert!(edges.len() > 5, "the tidy check found the host's modules");
    let cycles = module_cycles(&edges);
    assert!(
        cycles.is_empty(),
        "module cycles in crates/host: {cycles:?}"
    );
}

/// Modules of `crates/migration` that sit in a cycle today; the number
/// may only shrink.
const MIGRATION_CYCLE_BUDGET: usize = 9;

#[test]
fn the_migration_crate_stays_within_its_cycle_budget() {
    let edges = module_edges(&root().join("crates/migration/src"));
    let cycles = module_cycles(&edges);
    let in_cycles: usize = cycles.iter().map(Vec::len).sum();
    eprintln!("migration: {in_cycles} modules in cycles: {cycles:?}");
    assert!(
        in_cycles <= MIGRATION_CYCLE_BUDGET,
        "crates/migration has {in_cycles} modules in cycles (budget {MIGRATION_CYCLE_BUDGET}): {cycles:?}"
    );
}

#[test]
fn the_cycle_scan_reads_use_paths_and_finds_cycles() {
    let text = "use crate::a::X;\nuse crate::{b::Y, c};\n// use crate::z;\nlet v = crate::d::f();\nuse crate::{\n    e::Z,\n    f,\n};\n";
    assert_eq!(crate_references(text), ["a", "b", "c", "d", "e", "f"]);
    let edges = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e")]
        .into_iter()
        .fold(std::collections::BTreeMap::new(), |mut m, (f, t)| {
            m.entry(f.to_owned())
                .or_insert_with(std::collections::BTreeSet::new)
                .insert(t.to_owned());
            m
        });
    assert_eq!(module_cycles(&edges), vec![vec!["a", "b", "c"]]);
}

/// The longest a library function of the host may be, in lines.
const HOST_FUNCTION_LINES: usize = 80;

/// Every function in `text` with its first line (1-based), name and
/// length in lines, from its `fn` line to its closing brace at the same
/// indentation. Declarations without a body do not count.
fn function_lengths(text: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let signature = trimmed
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("const ")
            .trim_start_matches("async ");
        let Some(rest) = signature.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = lines[i..].iter().position(|l| {
            let l = l.trim_end();
            l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
        }) else {
            continue;
        };
        let open_line = lines[i + open].trim_end();
        if open_line.ends_with(';') || open_line.ends_with('}') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = lines[i + open..].iter().position(|l| l.trim_end() == close) {
            out.push((i + 1, name, open + end + 1));
        }
    }
    out
}

#[test]
fn no_host_library_function_is_over_80_lines() {
    let src = root().join("crates/host/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 5, "the tidy check found the host's sources");
    let long: Vec<String> = files
        .iter()
        .filter(|f| {
            let relative = f.strip_prefix(&src).expect("under src");
            !relative.iter().any(|p| p == "tests" || p == "tests.rs")
        })
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            function_lengths(&text)
                .into_iter()
                .filter(|(_, _, n)| *n > HOST_FUNCTION_LINES)
                .map(move |(line, name, n)| format!("{}:{line} {name}: {n} lines", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "host functions over {HOST_FUNCTION_LINES} lines: {long:?}"
    );
}

#[test]
fn the_function_scan_measures_bodies_and_skips_declarations() {
    let text = "fn a() {\n    x();\n}\n\ntrait T {\n    fn decl(\n        &self,\n    ) -> u8;\n    fn one(&self) -> u8 { 1 }\n}\n\n    pub(crate) async fn b<'a>(\n        s: &'a str,\n    ) -> u8 {\n        if s.is_empty() {\n            0\n        }\n        1\n    }\n";
    assert_eq!(
        function_lengths(text),
        vec![(1, "a".to_owned(), 3), (12, "b".to_owned(), 8)]
    );
}

/// The `durability.host.*` events named in `text` after `marker` up to the
/// next blank line (the host notes' event list).
fn listed_host_events(text: &str, marker: &str) -> Vec<String> {
    let start = text.find(marker).expect("the host notes list their events");
    let list = &text[start..];
    let list = &list[..list.find("\n\n").unwrap_or(list.len())];
    let mut names: Vec<String> = list
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_host_event_list_names_every_emitted_event() {
    let mut files = Vec::new();
    rust_files(&root().join("crates/host/src"), &mut files);
    let mut emitted: Vec<String> = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("host source reads");
        for part in text.split("event = \"durability.host.").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            emitted.push(name);
        }
    }
    emitted.sort();
    emitted.dedup();
    assert!(emitted.len() > 10, "the tidy check found the host's events");
    let notes = std::fs::read_to_string(root().join("crates/host/docs/runtime.md"))
        .expect("the host's runtime notes exist");
    let listed = listed_host_events(&notes, "keeps this list exact):");
    assert_eq!(
        listed, emitted,
        "crates/host/docs/runtime.md's event list differs from the events the host emits"
    );
}
