//! `durability migrations status|recover|verify|purge|rebalance|abort`
//! against real SQLite shard files (and one PostgreSQL and one MariaDB
//! shard set), with
//! the moves made through the migration crate's API.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use durability_migration::conformance::{FaultMode, FaultPlan, FaultShard};
use durability_migration::{
    ManualClock, MappingStore, MigrationConfig, MoveOptions, Retire, Router, Shard, Statement,
    Value, row,
};
use durability_storage_sqlite::migration::{SqliteMappingStore, SqliteShard};

use crate::support::{START, cli, fails, fingerprint, ok, strings};

const KEYS: [&str; 4] = ["k1", "k2", "k3", "k4"];

/// Three SQLite files (shards `east`, `west`, the mapping store) and the
/// config file naming them, in a temporary directory.
struct ShardSet {
    dir: tempfile::TempDir,
    config: PathBuf,
    mapping: Arc<SqliteMappingStore>,
    /// The router the fixture moved keys with (clock at [`START`]).
    router: Router,
    /// The id of `k1`'s finished move (east → west, archive purgeable now).
    moved: String,
    /// The id of `k2`'s interrupted move (east → west), if one was made.
    crashed: Option<String>,
}

fn shard_file(path: &Path) -> Arc<dyn Shard> {
    let s = SqliteShard::open(path).unwrap();
    s.execute_sync("CREATE TABLE IF NOT EXISTS users (id TEXT PRIMARY KEY, name TEXT)")
        .unwrap();
    Arc::new(s)
}

fn router_over(
    mapping: Arc<SqliteMappingStore>,
    east: Arc<dyn Shard>,
    west: Arc<dyn Shard>,
) -> Router {
    Router::new(
        MigrationConfig::new(mapping)
            .shard("east", east)
            .shard("west", west)
            .journal_shard("east")
            .table("users")
            .mapping_cache_ttl_ms(0)
            .clock(Arc::new(ManualClock::new(START)))
            // The CLI's config names the same clock: the test's.
            .clock_domain("test-host"),
    )
    .unwrap()
}

/// Writes the shard-set config `json` to the file `name` in `dir`; its path.
fn write_config(dir: &Path, name: &str, json: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, json).unwrap();
    path
}

/// [`router_over`] with both shards behind one fault plan, and the plan.
fn faulty_router_over(
    mapping: Arc<SqliteMappingStore>,
    east: Arc<dyn Shard>,
    west: Arc<dyn Shard>,
) -> (Router, Arc<FaultPlan>) {
    let plan = FaultPlan::new();
    let router = router_over(
        mapping,
        Arc::new(FaultShard::new(east, plan.clone())),
        Arc::new(FaultShard::new(west, plan.clone())),
    );
    (router, plan)
}

/// Every key on `east`; `k1` moved to `west`; with `crash`, a move of `k2`
/// interrupted after its journal row (the mover "died" at its copy).
async fn shard_set(crash: bool) -> ShardSet {
    let dir = tempfile::tempdir().unwrap();
    let (east, west) = (dir.path().join("east.db"), dir.path().join("west.db"));
    let mapping = Arc::new(SqliteMappingStore::open(dir.path().join("mapping.db")).unwrap());
    let (e, w) = (shard_file(&east), shard_file(&west));
    let router = router_over(mapping.clone(), e.clone(), w.clone());
    seed_on_east(&router, &*mapping).await;
    let moved = router
        .reassign_shard_with(
            "k1",
            "west",
            "users",
            MoveOptions {
                retire: Retire::Immediate,
            },
        )
        .await
        .unwrap()
        .op_id;
    let crashed = if crash {
        let (faulty, plan) = faulty_router_over(mapping.clone(), e, w);
        // Write 1 journals `prepared`; write 2 (the copy) never lands.
        plan.arm(2, FaultMode::Before);
        faulty
            .reassign_shard("k2", "west", "users")
            .await
            .unwrap_err();
        assert!(plan.tripped());
        let op = router.get_migration_status("k2", "users").await.unwrap();
        Some(op.unwrap().op_id)
    } else {
        None
    };
    let config = write_config(
        dir.path(),
        "shards.json",
        r#"{
  "shards": { "east": "east.db", "west": "sqlite:west.db" },
  "mapping": "mapping.db",
  "journal_shard": "east",
  "tables": { "users": "id" },
  "clock_domain": "test-host"
}"#,
    );
    ShardSet {
        dir,
        config,
        mapping,
        router,
        moved,
        crashed,
    }
}

impl ShardSet {
    fn config(&self) -> &str {
        self.config.to_str().unwrap()
    }

    /// `migrations <cmd> --config <this set> <args>..` (expecting success):
    /// its stdout.
    fn cli_ok(&self, cmd: &str, args: &[&str]) -> String {
        ok(&self.cli_args(cmd, args))
    }

    /// [`ShardSet::cli_ok`] with `--json`, parsed.
    fn cli_json(&self, cmd: &str, args: &[&str]) -> serde_json::Value {
        json(&self.cli_ok(cmd, &[args, &["--json"]].concat()))
    }

    /// [`ShardSet::cli_ok`] expecting a refusal: the one line on stderr.
    fn cli_fails(&self, cmd: &str, args: &[&str]) -> String {
        fails(&self.cli_args(cmd, args))
    }

    /// [`ShardSet::cli_ok`] expecting exit code 2 (see [`unsettled`]).
    fn cli_unsettled(&self, cmd: &str, args: &[&str]) -> (String, String) {
        unsettled(&self.cli_args(cmd, args))
    }

    fn cli_args<'a>(&'a self, cmd: &'a str, args: &[&'a str]) -> Vec<&'a str> {
        [&["migrations", cmd, "--config", self.config()][..], args].concat()
    }

    /// The shard `key` routes to, as the fixture's router reads it.
    async fn route(&self, key: &str) -> Option<String> {
        self.router.route(key).await.unwrap()
    }

    /// `status --json` as a value (the journal as the CLI reads it).
    fn status(&self) -> serde_json::Value {
        let mut v = self.cli_json("status", &[]);
        // Everything but the read time is stored state.
        v["now_ms"] = serde_json::Value::Null;
        v
    }

    /// Where each key's row lives, read from the files.
    async fn rows(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for shard in ["east", "west"] {
            let rows = self
                .router
                .raw_query(shard, &Statement::new("SELECT id FROM users ORDER BY id"))
                .await
                .unwrap();
            for r in rows {
                let Some(Value::Text(id)) = r.get("id") else {
                    panic!("{r:?}")
                };
                out.push((shard.to_owned(), id.clone()));
            }
        }
        out.sort();
        out
    }

    async fn mapped(&self) -> Vec<(String, String)> {
        self.mapping.scan(None, 100).await.unwrap()
    }

    /// Replaces the operation ids in `text` by placeholders as wide (so
    /// tables stay aligned).
    fn redact(&self, text: &str) -> String {
        let pad = |name: &str, id: &str| format!("{name:-<width$}", width = id.len());
        let mut t = text.replace(&self.moved, &pad("[MOVED]", &self.moved));
        if let Some(c) = &self.crashed {
            t = t.replace(c, &pad("[CRASHED]", c));
        }
        t
    }
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap()
}

/// Runs the binary expecting exit code 2 (ran, left something unsettled);
/// returns stdout and the one line on stderr.
fn unsettled(args: &[&str]) -> (String, String) {
    let out = cli().args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err:?}");
    (String::from_utf8(out.stdout).unwrap(), err)
}

#[tokio::test]
async fn status_lists_operations_with_state_key_source_target_and_counts() {
    let set = shard_set(true).await;
    let files: Vec<_> = ["east.db", "west.db", "mapping.db"]
        .map(|f| set.dir.path().join(f))
        .into_iter()
        .collect();
    let before: Vec<_> = files.iter().map(|f| fingerprint(f).0).collect();
    let now = (START + 1_000).to_string();
    let out = set.cli_ok("status", &["--now-ms", &now]);
    insta::assert_snapshot!(set.redact(&out));

    let v = set.cli_json("status", &[]);
    assert_eq!(
        (v["total"].as_u64(), v["active"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(v["counts"]["retired"], 1);
    assert_eq!(v["counts"]["prepared"], 1);
    let ops = v["operations"].as_array().unwrap();
    assert_eq!(ops.len(), 2);
    assert_eq!(ops[0]["op_id"], set.moved.as_str());
    assert_eq!(
        (&ops[0]["key"], &ops[0]["source"], &ops[0]["target"]),
        (&"k1".into(), &"east".into(), &"west".into())
    );
    assert_eq!(ops[1]["op_id"], set.crashed.as_deref().unwrap());
    assert_eq!(ops[1]["state"], "prepared");

    let active = set.cli_json("status", &["--active"]);
    let keys = strings(&active["operations"], "key");
    assert_eq!(keys, ["k2"]);
    let one = set.cli_json("status", &["--key", "k1", "--limit", "1"]);
    assert_eq!(one["operations"].as_array().unwrap().len(), 1);
    assert_eq!(one["truncated"], false);

    let after: Vec<_> = files.iter().map(|f| fingerprint(f).0).collect();
    assert_eq!(before, after, "status wrote nothing");
}

#[tokio::test]
async fn recover_needs_yes_off_a_terminal_then_finishes_the_interrupted_move() {
    let set = shard_set(true).await;
    let status = set.status();
    let rows = set.rows().await;
    let line = set.cli_fails("recover", &[]);
    assert!(line.contains("pass --yes"), "{line}");
    assert_eq!(set.status(), status, "the journal is unchanged");
    assert_eq!(set.rows().await, rows);

    // While the mover's liveness lasts, recovery leaves its move alone.
    let live = set.cli_json(
        "recover",
        &["--yes", "--now-ms", &(START + 1_000).to_string()],
    );
    let crashed = set.crashed.clone().unwrap();
    assert_eq!(live["skipped"], serde_json::json!([crashed]));
    assert_eq!(live["committed"], serde_json::json!([]));

    let after_liveness = (START + 60_000).to_string();
    let out = set.cli_ok("recover", &["--yes", "--now-ms", &after_liveness]);
    insta::assert_snapshot!(set.redact(&out));
    let v = set.status();
    assert_eq!(v["active"], 0);
    assert_eq!(v["counts"]["retired"], 2);
    assert_eq!(
        set.rows().await,
        [
            ("east", "k3"),
            ("east", "k4"),
            ("west", "k1"),
            ("west", "k2")
        ]
        .map(|(s, k)| (s.to_owned(), k.to_owned()))
    );
    assert_eq!(set.route("k2").await.as_deref(), Some("west"));
}

#[tokio::test]
async fn verify_reports_a_ghost_repair_needs_yes_and_purge_clears_covered_archives() {
    let set = shard_set(false).await;
    // A stale writer's ghost of `k1` on its old shard, equal to the
    // archived row.
    set.router
        .raw_execute(
            "east",
            &Statement::new("INSERT INTO users (id, name) VALUES ('k1', 'Ann')"),
        )
        .await
        .unwrap();
    let now = (START + 5_000).to_string();
    let (out, err) = set.cli_unsettled("verify", &["--now-ms", &now]);
    assert!(err.contains("not clean"), "{err}");
    insta::assert_snapshot!(set.redact(&out));
    let (out, _) = set.cli_unsettled("verify", &["--json", "--now-ms", &now]);
    let v = json(&out);
    assert_eq!(v["ghost_count"], 1);
    assert_eq!(v["ghosts"][0]["shard"], "east");
    assert_eq!(v["ghosts"][0]["op_id"], set.moved.as_str());
    assert_eq!(v["clean"], false);

    // Purge after an unclean pass: k1's archive is not covered.
    let purge = set.cli_json("purge", &["--yes", "--now-ms", &now]);
    assert_eq!(purge["purged_count"], 0);
    assert_eq!(purge["refused"][0]["error"]["code"], "NOT_VERIFIED");

    let rows = set.rows().await;
    let status = set.status();
    for (cmd, args) in [("verify", &["--repair"][..]), ("purge", &[])] {
        let line = set.cli_fails(cmd, args);
        assert!(line.contains("pass --yes"), "{cmd} {args:?}: {line}");
    }
    assert_eq!(set.rows().await, rows, "the ghost is still there");
    assert_eq!(set.status(), status);

    let later = (START + 6_000).to_string();
    let v = set.cli_json("verify", &["--repair", "--yes", "--now-ms", &later]);
    assert_eq!(v["clean"], true, "{v}");
    assert_eq!(v["repaired_count"], 1);
    assert!(
        !set.rows().await.contains(&("east".into(), "k1".into())),
        "the ghost was removed"
    );
    let out = set.cli_ok("purge", &["--yes", "--now-ms", &later]);
    assert_eq!(
        set.redact(&out),
        format!(
            "purge:\n  OUTCOME  COUNT  OPERATIONS\n  purged   1      {}\n  refused  0      -\n",
            set.redact(&set.moved)
        )
    );
    let v = set.status();
    assert_eq!(v["operations"][0]["purged"], true);
}

#[tokio::test]
async fn rebalance_plans_dry_refuses_without_yes_and_moves_keys_to_their_hash_owner() {
    let set = shard_set(false).await;
    let mapped = set.mapped().await;
    let dry = set.cli_json("rebalance", &["--dry-run"]);
    let names = ["east", "west"];
    let expected: Vec<&str> = KEYS
        .iter()
        .copied()
        .filter(|k| {
            let owner = durability_migration::hash_owner(k, &names).unwrap();
            let now = if *k == "k1" { "west" } else { "east" };
            owner != now
        })
        .collect();
    let planned = strings(&dry["plan"], "key");
    assert_eq!(planned, expected);
    assert_eq!(dry["examined"], 4);
    assert_eq!(dry["moved"], 0);
    assert_eq!(set.mapped().await, mapped, "a dry run changes nothing");

    let line = set.cli_fails("rebalance", &[]);
    assert!(line.contains("pass --yes"), "{line}");
    let line = set.cli_fails("rebalance", &["--to", "east, ghost", "--yes"]);
    assert!(line.contains("ghost"), "{line}");
    assert_eq!(set.mapped().await, mapped);

    let done = set.cli_json("rebalance", &["--yes"]);
    assert_eq!(done["moved"].as_u64(), Some(expected.len() as u64));
    for (key, shard) in set.mapped().await {
        assert_eq!(
            Some(shard.as_str()),
            durability_migration::hash_owner(&key, &names),
            "{key}"
        );
    }
    let again = set.cli_json("rebalance", &["--dry-run"]);
    assert_eq!(again["planned"], 0);
}

#[tokio::test]
async fn abort_drops_an_uncut_move_and_needs_yes() {
    let set = shard_set(true).await;
    let crashed = set.crashed.clone().unwrap();
    let status = set.status();
    let line = set.cli_fails("abort", &["--op", &crashed]);
    assert!(line.contains("pass --yes"), "{line}");
    assert_eq!(set.status(), status);
    let line = set.cli_fails("abort", &["--op", &set.moved, "--yes"]);
    assert!(
        line.contains("retired"),
        "a finished move is not abortable: {line}"
    );
    assert_eq!(set.status(), status);
    let out = set.cli_ok("abort", &["--op", &crashed, "--yes"]);
    assert_eq!(
        out,
        format!("aborted operation {crashed} (key \"k2\"); 0 destination copies dropped\n")
    );
    let v = set.status();
    assert_eq!(v["active"], 0);
    assert_eq!(v["counts"]["aborted"], 1);
    assert_eq!(set.route("k2").await.as_deref(), Some("east"));
}

#[tokio::test]
async fn bad_input_is_one_line_and_changes_nothing() {
    let set = shard_set(true).await;
    let status = set.status();
    let rows = set.rows().await;
    let dir = set.dir.path();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let missing = dir.join("missing.json");
    let line = fails(&[
        "migrations",
        "status",
        "--config",
        missing.to_str().unwrap(),
    ]);
    assert!(line.contains("No such file"), "{line}");

    let cases = [
        (
            "typo.json",
            r#"{"shards": {"east": "east.db"}, "mapping": "mapping.db", "jounal_shard": "east"}"#,
            "unknown field",
        ),
        (
            "nofile.json",
            r#"{"shards": {"east": "east.db", "south": "south.db"}, "mapping": "mapping.db", "journal_shard": "east"}"#,
            "no such file",
        ),
        (
            "scheme.json",
            r#"{"shards": {"east": "ftp://host/east"}, "mapping": "mapping.db"}"#,
            "unsupported URL",
        ),
        (
            "schema.json",
            r#"{"shards": {"east": {"url": "east.db", "schema": "s"}}, "mapping": "mapping.db"}"#,
            "only for a postgres",
        ),
        (
            "journal.json",
            r#"{"shards": {"east": "east.db"}, "mapping": "mapping.db", "journal_shard": "north"}"#,
            "north",
        ),
        (
            "pg.json",
            r#"{"shards": {"east": "postgres://nobody@127.0.0.1:1/none"}, "mapping": "mapping.db"}"#,
            "shard east",
        ),
    ];
    for (name, text, expect) in cases {
        let config = write(name, text);
        for command in [&["status"][..], &["recover", "--yes"], &["purge", "--yes"]] {
            let mut args = vec!["migrations"];
            args.extend_from_slice(command);
            args.extend_from_slice(&["--config", &config]);
            let line = fails(&args);
            assert!(line.contains(expect), "{name} {command:?}: {line}");
        }
    }
    assert!(
        !dir.join("south.db").exists(),
        "a missing shard file is never created"
    );
    let line = set.cli_fails("status", &["--key", ""]);
    assert!(
        line.contains("INVALID_KEY") || line.contains("invalid key"),
        "{line}"
    );
    let line = set.cli_fails("abort", &["--op", "no-such-op", "--yes"]);
    assert!(line.contains("no-such-op"), "{line}");
    let bad_state = cli()
        .args([
            "migrations",
            "status",
            "--config",
            set.config(),
            "--state",
            "done",
        ])
        .output()
        .unwrap();
    assert!(!bad_state.status.success());
    assert!(String::from_utf8_lossy(&bad_state.stderr).contains("unknown state"));

    assert_eq!(set.status(), status, "the journal is unchanged");
    assert_eq!(set.rows().await, rows, "no row moved");
}

/// One shard set on PostgreSQL (a schema per shard): rebalance and status
/// through the CLI.
#[tokio::test]
async fn a_postgres_shard_set_rebalances_and_lists_its_journal() {
    use durability_storage_postgres::PostgresMappingStore;
    use durability_storage_postgres::testkit::{TestSchema, url};
    let (Some(a), Some(b)) = (TestSchema::create().await, TestSchema::create().await) else {
        return; // no server, and services are not required
    };
    let (east, west) = (a.shard().await, b.shard().await);
    for s in [&east, &west] {
        s.batch_execute("CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT)")
            .await
            .unwrap();
    }
    let mapping: Arc<dyn MappingStore> =
        Arc::new(PostgresMappingStore::new(a.shard().await).await.unwrap());
    seeded_router(mapping.clone(), Arc::new(east), Arc::new(west)).await;
    let backend = |s: &TestSchema| serde_json::json!({ "url": url(), "schema": s.name() });
    let config = ConfigFile::new(serde_json::json!({
        "shards": { "east": backend(&a), "west": backend(&b) },
        "mapping": backend(&a),
        "journal_shard": "east",
        "tables": { "users": "id" },
    }));
    rebalance_through_cli(config.path(), &mapping).await;
}

/// One shard set on MariaDB (a database per shard, the mapping table on
/// the first): rebalance, status and verify through the CLI, by
/// `mysql://` URL.
#[tokio::test]
async fn a_mariadb_shard_set_rebalances_and_lists_its_journal() {
    use durability_storage_mysql::MysqlMappingStore;
    use durability_storage_mysql::testkit::TestDatabase;
    let (Some(a), Some(b)) = (TestDatabase::create().await, TestDatabase::create().await) else {
        return; // no server, and services are not required
    };
    let (east, west) = (a.shard(), b.shard());
    for s in [&east, &west] {
        s.query_drop(
            "CREATE TABLE users (id VARCHAR(255) CHARACTER SET utf8mb4 \
             COLLATE utf8mb4_nopad_bin PRIMARY KEY, name LONGTEXT)",
        )
        .await
        .unwrap();
    }
    let mapping: Arc<dyn MappingStore> = Arc::new(MysqlMappingStore::new(a.shard()).await.unwrap());
    let router = seeded_router(mapping.clone(), Arc::new(east), Arc::new(west)).await;
    let config = ConfigFile::new(serde_json::json!({
        "shards": { "east": a.url(), "west": b.url() },
        "mapping": a.url(),
        "journal_shard": "east",
        "tables": { "users": "id" },
    }));
    let before = json(&ok(&[
        "migrations",
        "status",
        "--config",
        config.path(),
        "--json",
    ]));
    assert_eq!(before["active"], 0, "{before}");
    let (moved, on_west) = rebalance_through_cli(config.path(), &mapping).await;
    assert_eq!(on_west, moved);
    // Every row reads back through a router where the mapping says.
    for k in KEYS {
        assert_eq!(
            router.get(k, "users").await.unwrap().unwrap().get("name"),
            Some(&Value::from("Ann")),
            "{k}"
        );
    }
}

/// A router over `east` and `west` (the journal on `east`), every key of
/// [`KEYS`] inserted on `east` and mapped there.
async fn seeded_router(
    mapping: Arc<dyn MappingStore>,
    east: Arc<dyn Shard>,
    west: Arc<dyn Shard>,
) -> Router {
    let router = Router::new(
        MigrationConfig::new(mapping.clone())
            .shard("east", east)
            .shard("west", west)
            .journal_shard("east")
            .table("users"),
    )
    .unwrap();
    seed_on_east(&router, &*mapping).await;
    router
}

/// Initializes `router`, then inserts every key of [`KEYS`] on `east`,
/// mapped there.
async fn seed_on_east(router: &Router, mapping: &dyn MappingStore) {
    router.init().await.unwrap();
    for k in KEYS {
        mapping.put(k, "east").await.unwrap();
        router
            .insert(k, "users", row([("id", k), ("name", "Ann")]))
            .await
            .unwrap();
    }
}

/// A CLI config file in a temporary directory (removed on drop).
struct ConfigFile {
    _dir: tempfile::TempDir,
    path: String,
}

impl ConfigFile {
    fn new(config: serde_json::Value) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, config.to_string()).unwrap();
        let path = path.to_str().unwrap().to_owned();
        Self { _dir: dir, path }
    }

    fn path(&self) -> &str {
        &self.path
    }
}

/// `migrations rebalance --yes` through the CLI over `config`, then
/// `status` and `verify`: every planned key moved, each now mapped to its
/// hash owner, the journal retired and nothing left over. Returns the keys
/// moved and those now mapped to `west`.
async fn rebalance_through_cli(config: &str, mapping: &Arc<dyn MappingStore>) -> (u64, u64) {
    let done = json(&ok(&[
        "migrations",
        "rebalance",
        "--config",
        config,
        "--yes",
        "--json",
    ]));
    let moved = done["moved"].as_u64().unwrap();
    assert_eq!(Some(moved), done["planned"].as_u64());
    assert!(moved > 0, "{done}");
    let v = json(&ok(&["migrations", "status", "--config", config, "--json"]));
    assert_eq!(v["counts"]["retired"].as_u64(), Some(moved));
    assert_eq!(v["active"], 0);
    let names = ["east", "west"];
    let mut on_west = 0;
    for (key, shard) in mapping.scan(None, 100).await.unwrap() {
        assert_eq!(
            Some(shard.as_str()),
            durability_migration::hash_owner(&key, &names)
        );
        on_west += u64::from(shard == "west");
    }
    let clean = json(&ok(&["migrations", "verify", "--config", config, "--json"]));
    assert_eq!(clean["clean"], true);
    (moved, on_west)
}

/// Issue 32 item 11: a recovery that crashed holding the lease, on another
/// clock domain, is taken over by the one-shot CLI, a fresh process on
/// every run (a cron job's config naming no clock domain). A run persists
/// in the journal when it first saw the lease (and the dead mover's
/// operation) as it is, on the journal database's own clock (for a SQLite
/// file, the machine's); a run after that sighting is a lease period old
/// takes the lease over at a higher generation, and the next settles the
/// move. The test ages the sighting by a period instead of waiting a
/// minute. Before, every run got `RECOVERY_IN_PROGRESS`: each process
/// remembered nothing and never saw a period pass.
#[tokio::test]
async fn a_fresh_cli_process_takes_a_crashed_recoverys_lease_over() {
    let set = shard_set(true).await;
    let crashed = set.crashed.clone().unwrap();
    let east = shard_file(&set.dir.path().join("east.db"));
    let west = shard_file(&set.dir.path().join("west.db"));
    // Host A's recovery writes its lease, then its process is gone.
    let (host_a, plan) = faulty_router_over(set.mapping.clone(), east.clone(), west);
    plan.arm(1, FaultMode::After);
    host_a.recover_migrations().await.unwrap_err();
    assert!(plan.tripped());
    let config = write_config(
        set.dir.path(),
        "cron.json",
        r#"{
  "shards": { "east": "east.db", "west": "west.db" },
  "mapping": "mapping.db",
  "journal_shard": "east",
  "tables": { "users": "id" }
}"#,
    );
    let config = config.to_str().unwrap();
    let recover = [
        "migrations",
        "recover",
        "--config",
        config,
        "--yes",
        "--json",
    ];
    for run in 0..3 {
        let line = fails(&recover);
        assert!(
            line.contains("another recovery holds the lease"),
            "run {run}: {line}"
        );
    }
    // A lease period passes on the journal's clock.
    let age =
        Statement::new("UPDATE durability_migration_sightings SET since_ms = since_ms - 60000");
    assert_eq!(
        east.execute(&age).await.unwrap(),
        1,
        "one sighting: the lease"
    );
    let taken = json(&ok(&recover));
    assert_eq!(taken["generation"], 2, "taken over at a higher generation");
    assert_eq!(
        taken["skipped"],
        serde_json::json!([crashed]),
        "first sight of the move"
    );
    // The mover's liveness period passes on the journal's clock too.
    assert_eq!(east.execute(&age).await.unwrap(), 2);
    let settled = json(&ok(&recover));
    assert_eq!(
        settled["generation"], 3,
        "the released lease is free at once"
    );
    assert_eq!(settled["committed"], serde_json::json!([crashed]));
    assert_eq!(set.status()["active"], 0);
    assert_eq!(set.route("k2").await.as_deref(), Some("west"));
}
