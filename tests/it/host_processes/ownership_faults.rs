//! Issue 32, items 1 and 4, with real `object-host` processes: a host
//! configured with another shard count than its storage id's, and a second
//! process started with a task id already running.

use super::{Proc, TTL_S, counter, field};

/// The object names a 16-shard and an 8-shard host place on different
/// shards (before the fix both owned them and both committed).
fn split_names() -> Vec<String> {
    use durability_ownership::{ObjectName, ShardCount};
    let (sixteen, eight) = (ShardCount::default(), ShardCount::new(8).unwrap());
    (0..64)
        .map(|i| format!("obj-{i}"))
        .filter(|n| {
            let name = ObjectName::new(n);
            sixteen.shard_of(&name) != eight.shard_of(&name)
        })
        .take(3)
        .collect()
}

fn fenced_scopes(dir: &std::path::Path, name: &str) -> Vec<String> {
    let path = dir
        .join("objects/st1/Counter")
        .join(format!("{name}.sqlite"));
    let c = rusqlite::Connection::open(path).unwrap();
    let mut st = c
        .prepare("SELECT scope FROM durability_owner_fence ORDER BY scope")
        .unwrap();
    st.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The `refused <code> <message>` line of a process that refused to run.
fn refusal(p: &Proc) -> String {
    p.lines()
        .into_iter()
        .map(|(_, l)| l)
        .find(|l| l.starts_with("refused "))
        .unwrap_or_else(|| panic!("no refusal: {:#?}", p.lines()))
}

#[test]
fn a_host_with_another_shard_count_refuses_to_start_and_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = super::spawn("a", dir.path(), TTL_S, &["own=all", "create=1"], &[]);
    a.wait_line("ready");
    a.wait_n("acquired ", 16);
    let names = split_names();
    assert!(!names.is_empty());
    for n in &names {
        let answer = a.run_ok(&format!("incr {n}"));
        assert!(answer.starts_with("ok "), "{answer}");
    }
    let mut b = super::spawn("b", dir.path(), TTL_S, &["own=all", "shards=8"], &[]);
    let status = b.wait_exit();
    assert_eq!(status.code(), Some(2), "{:#?}", b.lines());
    let refusal = refusal(&b);
    assert!(
        refusal.starts_with("refused shard_count_mismatch ")
            && refusal.contains("16")
            && refusal.contains(" 8"),
        "{refusal}"
    );
    assert_eq!(b.count("acquired "), 0, "{:#?}", b.lines());
    // a still owns and commits every object, each under its one scope.
    for n in &names {
        let answer = a.run_ok(&format!("incr {n}"));
        assert!(answer.starts_with("ok "), "{answer}");
        assert_eq!(field(&answer, "value"), "2", "{answer}");
        assert_eq!(counter(dir.path(), n), 2);
        let scopes = fenced_scopes(dir.path(), n);
        assert_eq!(scopes.len(), 1, "{n}: one scope: {scopes:?}");
    }
    assert_eq!(a.count("lost "), 0, "{:#?}", a.lines());
}

#[test]
fn a_second_process_with_the_same_task_id_stops_and_takes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = super::spawn("t-1", dir.path(), TTL_S, &["own=all", "create=1"], &[]);
    first.wait_line("ready");
    let acquired = first.wait_n("acquired ", 16);
    let before = first.run_ok("incr x");
    assert!(before.starts_with("ok "), "{before}");
    let mut second = super::spawn("t-1", dir.path(), TTL_S, &["own=all"], &[]);
    let status = second.wait_exit();
    assert_eq!(status.code(), Some(2), "{:#?}", second.lines());
    let refusal = refusal(&second);
    assert!(
        refusal.starts_with("refused duplicate_task_id ") && refusal.contains("t-1"),
        "{refusal}"
    );
    assert_eq!(second.count("acquired "), 0, "{:#?}", second.lines());
    // No ping-pong: the first kept every scope at its generation.
    assert_eq!(first.count("lost "), 0, "{:#?}", first.lines());
    assert_eq!(first.count("acquired "), acquired.len());
    let after = first.run_ok("incr x");
    assert!(after.starts_with("ok "), "{after}");
    assert_eq!(field(&after, "gen"), field(&before, "gen"), "{after}");
    assert_eq!(field(&after, "value"), "2", "{after}");
}
