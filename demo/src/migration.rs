//! `cargo xtask demo` (migration scene) and `cargo xtask bench migration`.
//!
//! The demo rebalances a few thousand keys between shards under a live
//! writer, crashes the rebalancing process in the middle, recovers and
//! verifies. The shards are SQLite files by default; `demo --postgres` and
//! `demo --mariadb` run the same scene on PostgreSQL schemas or MariaDB
//! databases created for the run (the mapping store in one more) and dropped
//! at the end. The bench compares journaled moves with a naive copy /
//! delete / remap baseline, with and without a concurrent writer, on each
//! backend, and measures that rebalance, verification and purge stream in
//! pages (SQLite).

#![allow(clippy::print_stdout)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use durability_migration::conformance::{FaultMappingStore, FaultMode, FaultPlan, FaultShard};
use durability_migration::{
    Clock, DEFAULT_CUTOVER_HOLD_MS, Ident, MOVE_LIVENESS_MS, ManualClock, MappingStore,
    MigrationConfig, RebalanceOptions, Router, Shard, Sql, Statement, SystemClock, Value,
    VerifyOptions, row,
};
use durability_storage_mysql::{MysqlMappingStore, MysqlShard};
use durability_storage_postgres::{PostgresMappingStore, PostgresShard};
use durability_storage_sqlite::migration::{SqliteMappingStore, SqliteShard};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[allow(clippy::disallowed_methods)] // wall-clock timing of a benchmark
fn instant() -> Instant {
    Instant::now()
}

/// Where the migration scene and bench run their shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// SQLite files in a temporary directory.
    Sqlite,
    /// Schemas on the PostgreSQL server of `DURABILITY_POSTGRES_URL`.
    Postgres,
    /// Databases on the MariaDB server of `DURABILITY_MYSQL_URL`.
    MariaDb,
}

impl Backend {
    /// The name in JSON lines and figure names.
    fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::MariaDb => "mariadb",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Sqlite => "SQLite",
            Self::Postgres => "PostgreSQL",
            Self::MariaDb => "MariaDB",
        }
    }

    /// A figure's name: SQLite keeps the plain name, servers add theirs.
    fn figure(self, name: &str) -> String {
        match self {
            Self::Sqlite => name.to_owned(),
            _ => format!("{name}.{}", self.name()),
        }
    }

    /// The JSON fields naming the backend (and SQLite's durability setting).
    fn json_fields(self) -> String {
        match self {
            Self::Sqlite => ",\"backend\":\"sqlite\",\"synchronous\":\"NORMAL\"".to_owned(),
            _ => format!(",\"backend\":\"{}\"", self.name()),
        }
    }

    fn users_ddl(self) -> &'static str {
        match self {
            Self::Sqlite => {
                "CREATE TABLE IF NOT EXISTS users (id TEXT PRIMARY KEY, name TEXT, n INTEGER)"
            }
            Self::Postgres => "CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT, n BIGINT)",
            Self::MariaDb => {
                "CREATE TABLE users (id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin PRIMARY KEY, name LONGTEXT, n BIGINT)"
            }
        }
    }
}

/// Where an environment's shards live, and what to drop at the end.
enum Place {
    /// SQLite files in a directory of the caller's temporary directory.
    Files(PathBuf),
    /// Schemas or databases `<prefix>_<name>` created on a server.
    Server {
        url: String,
        admin: Admin,
        prefix: String,
        created: Vec<String>,
    },
}

/// A server connection that creates and drops the run's schemas or
/// databases.
enum Admin {
    Postgres(PostgresShard),
    MariaDb(MysqlShard),
}

impl Admin {
    async fn connect(backend: Backend, url: &str) -> Result<Self, BoxError> {
        Ok(match backend {
            Backend::Sqlite => return Err("SQLite has no server".into()),
            Backend::Postgres => Self::Postgres(PostgresShard::connect(url, None).await?),
            Backend::MariaDb => Self::MariaDb(MysqlShard::connect(url).await?),
        })
    }

    async fn run(&self, sql: &str) -> Result<(), BoxError> {
        match self {
            Self::Postgres(a) => a.batch_execute(sql).await,
            Self::MariaDb(a) => a.query_drop(sql).await,
        }
    }

    /// What one shard lives in on this server.
    fn container(&self) -> &'static str {
        match self {
            Self::Postgres(_) => "schema",
            Self::MariaDb(_) => "database",
        }
    }

    /// A connection to the schema or database `name`.
    async fn open(&self, url: &str, name: &str) -> Result<Space, BoxError> {
        Ok(match self {
            Self::Postgres(_) => Space::Postgres(PostgresShard::connect(url, Some(name)).await?),
            Self::MariaDb(_) => {
                Space::MariaDb(MysqlShard::connect(&with_database(url, name)).await?)
            }
        })
    }

    async fn drop_all(self, created: &[String]) -> Result<(), BoxError> {
        let cascade = match self {
            Self::Postgres(_) => " CASCADE",
            Self::MariaDb(_) => "",
        };
        for name in created {
            let what = self.container();
            self.run(&format!("DROP {what} IF EXISTS {name}{cascade}"))
                .await
                .map_err(|e| format!("could not drop {what} {name}: {e}"))?;
        }
        if let Self::MariaDb(a) = self {
            a.disconnect().await?;
        }
        Ok(())
    }
}

/// One shard's (or the mapping store's) database.
enum Space {
    Sqlite(PathBuf),
    Postgres(PostgresShard),
    MariaDb(MysqlShard),
}

impl Space {
    fn shard(&self) -> Result<Arc<dyn Shard>, BoxError> {
        Ok(match self {
            Self::Sqlite(path) => Arc::new(SqliteShard::open(path)?),
            Self::Postgres(s) => Arc::new(s.clone()),
            Self::MariaDb(s) => Arc::new(s.clone()),
        })
    }

    async fn mapping(&self) -> Result<Arc<dyn MappingStore>, BoxError> {
        Ok(match self {
            Self::Sqlite(path) => Arc::new(SqliteMappingStore::open(path)?),
            Self::Postgres(s) => Arc::new(PostgresMappingStore::new(s.clone()).await?),
            Self::MariaDb(s) => Arc::new(MysqlMappingStore::new(s.clone()).await?),
        })
    }
}

/// `url` with its database (the path) replaced by `db`.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, ""), |(b, q)| (b, q));
    let host = base.find("://").map_or(0, |i| i + 3);
    let end = base[host..].find('/').map_or(base.len(), |i| host + i);
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    format!("{}/{db}{query}", &base[..end])
}

impl Place {
    /// Connects to the backend's server (a clear error when unreachable).
    async fn connect(backend: Backend, dir: &Path) -> Result<Self, BoxError> {
        let (url, var) = match backend {
            Backend::Sqlite => {
                let _ = std::fs::remove_dir_all(dir);
                std::fs::create_dir_all(dir)?;
                return Ok(Self::Files(dir.to_owned()));
            }
            Backend::Postgres => (crate::postgres_url(), "DURABILITY_POSTGRES_URL"),
            Backend::MariaDb => (crate::mysql_url(), "DURABILITY_MYSQL_URL"),
        };
        let admin = Admin::connect(backend, &url).await.map_err(|e| {
            format!(
                "{} at {url} is unreachable: {e} (start it, or point {var} at one)",
                backend.label()
            )
        })?;
        Ok(Self::Server {
            url,
            admin,
            prefix: format!("xtask_{:012x}", rand::random::<u64>() >> 16),
            created: Vec::new(),
        })
    }

    /// A new database for `name`: a file, a schema or a database.
    async fn space(&mut self, name: &str) -> Result<Space, BoxError> {
        match self {
            Self::Files(dir) => Ok(Space::Sqlite(dir.join(format!("{name}.db")))),
            Self::Server {
                url,
                admin,
                prefix,
                created,
            } => {
                let name = format!("{prefix}_{name}");
                admin
                    .run(&format!("CREATE {} {name}", admin.container()))
                    .await?;
                created.push(name.clone());
                admin.open(url, &name).await
            }
        }
    }

    /// What the environment lives in, for the reader.
    fn describe(&self) -> String {
        match self {
            Self::Files(dir) => format!("files in {}", dir.display()),
            Self::Server {
                url,
                admin,
                created,
                ..
            } => format!("{}s {} at {url}", admin.container(), created.join(", ")),
        }
    }

    /// Drops every schema or database created for the run.
    async fn teardown(self) -> Result<(), BoxError> {
        match self {
            Self::Files(_) => Ok(()),
            Self::Server { admin, created, .. } => admin.drop_all(&created).await,
        }
    }
}

/// Checks that the backend's server answers, before a long run.
///
/// # Errors
/// The backend is a server that cannot be reached.
pub(crate) async fn probe(backend: Backend) -> Result<(), Box<dyn std::error::Error>> {
    if backend == Backend::Sqlite {
        return Ok(());
    }
    let place = Place::connect(backend, Path::new(""))
        .await
        .map_err(|e| -> Box<dyn std::error::Error> { e })?;
    place
        .teardown()
        .await
        .map_err(|e| -> Box<dyn std::error::Error> { e })
}

fn key(k: usize) -> String {
    format!("user-{k:06}")
}

/// Inserts `count` rows made by `make` into `table`, many per statement.
/// `table` and `cols` are constants of this file (the mapping table's name
/// is reserved, so not an `Ident`); every value is bound.
async fn seed(
    shard: &dyn Shard,
    table: &str,
    cols: &[&str],
    count: usize,
    make: impl Fn(usize) -> Vec<Value>,
) -> Result<(), BoxError> {
    const PER_STATEMENT: usize = 500;
    let d = shard.dialect();
    for start in (0..count).step_by(PER_STATEMENT) {
        let mut s = Sql::new(&d);
        s.raw(&format!(
            "INSERT INTO {table} ({}) VALUES ",
            cols.join(", ")
        ));
        for k in start..(start + PER_STATEMENT).min(count) {
            s.raw(if k == start { "(" } else { ", (" });
            for (i, v) in make(k).into_iter().enumerate() {
                s.raw(if i == 0 { "" } else { ", " }).bind(v);
            }
            s.raw(")");
        }
        shard.execute(&s.finish()).await?;
    }
    Ok(())
}

type Shards = Arc<Vec<(String, Arc<dyn Shard>)>>;

/// Shards `s0`, `s1`, … with a `users` table, the first holding every key,
/// and a mapping store pointing every key at `s0`.
struct Env {
    shards: Shards,
    mapping: Arc<dyn MappingStore>,
    place: Place,
}

/// Creates the shards' tables and rows, and the mapping.
async fn populate(
    place: &mut Place,
    backend: Backend,
    count: usize,
    keys: usize,
) -> Result<(Vec<(String, Arc<dyn Shard>)>, Arc<dyn MappingStore>), BoxError> {
    let mut shards = Vec::new();
    for i in 0..count {
        let name = format!("s{i}");
        let shard = place.space(&name).await?.shard()?;
        shard.execute(&Statement::new(backend.users_ddl())).await?;
        if i == 0 {
            seed(&*shard, "users", &["id", "name", "n"], keys, |k| {
                vec![key(k).into(), format!("user {k}").into(), Value::Integer(0)]
            })
            .await?;
        }
        shards.push((name, shard));
    }
    let space = place.space("map").await?;
    let mapping = space.mapping().await?;
    seed(
        &*space.shard()?,
        "durability_mapping",
        &["mkey", "shard"],
        keys,
        |k| vec![key(k).into(), "s0".into()],
    )
    .await?;
    Ok((shards, mapping))
}

/// Runs `scene` in a fresh environment of `shards` shards and `keys` keys,
/// then drops the environment's schemas or databases, whatever the outcome.
async fn with_env<T>(
    backend: Backend,
    dir: &Path,
    shards: usize,
    keys: usize,
    scene: impl AsyncFnOnce(&Env) -> Result<T, BoxError>,
) -> Result<T, BoxError> {
    let mut place = Place::connect(backend, dir).await?;
    let env = match populate(&mut place, backend, shards, keys).await {
        Ok((shards, mapping)) => Env {
            shards: Arc::new(shards),
            mapping,
            place,
        },
        Err(e) => {
            if let Err(t) = place.teardown().await {
                eprintln!("migration: {t}");
            }
            return Err(e);
        }
    };
    let out = scene(&env).await;
    let Env {
        shards,
        mapping,
        place,
    } = env;
    drop((shards, mapping));
    match (out, place.teardown().await) {
        (Ok(v), Ok(())) => Ok(v),
        (Ok(_), Err(t)) => Err(t),
        (Err(e), t) => {
            if let Err(t) = t {
                eprintln!("migration: {t}");
            }
            Err(e)
        }
    }
}

impl Env {
    fn config(&self, clock: Arc<dyn Clock>, plan: Option<&Arc<FaultPlan>>) -> MigrationConfig {
        let mapping: Arc<dyn MappingStore> = match plan {
            Some(p) => Arc::new(FaultMappingStore::new(self.mapping.clone(), Arc::clone(p))),
            None => self.mapping.clone(),
        };
        // The demo's processes run on one host: one clock, one domain.
        let mut c = MigrationConfig::new(mapping)
            .journal_shard("s0")
            .table("users")
            .clock(clock)
            .clock_domain("demo-host");
        for (name, s) in self.shards.iter() {
            let shard: Arc<dyn Shard> = match plan {
                Some(p) => Arc::new(FaultShard::new(Arc::clone(s), Arc::clone(p))),
                None => Arc::clone(s),
            };
            c = c.shard(name.clone(), shard);
        }
        c
    }

    /// A router over the environment, its tables created.
    async fn router(
        &self,
        clock: Arc<dyn Clock>,
        plan: Option<&Arc<FaultPlan>>,
        ttl_ms: Option<u64>,
    ) -> Result<Router, BoxError> {
        let mut c = self.config(clock, plan);
        if let Some(ms) = ttl_ms {
            c = c.mapping_cache_ttl_ms(ms);
        }
        let r = Router::new(c)?;
        r.init().await?;
        Ok(r)
    }

    /// How many live rows `k` has over every shard, and the last one's `n`.
    async fn count_live(&self, k: &str) -> Result<(usize, Option<i64>), BoxError> {
        let (users, id) = (Ident::new("users")?, Ident::new("id")?);
        let mut n = 0;
        let mut val = None;
        for (_, s) in self.shards.iter() {
            for r in s.query(&s.dialect().select_row(&users, &id, k)).await? {
                n += 1;
                val = r.get("n").and_then(Value::as_integer);
            }
        }
        Ok((n, val))
    }

    /// How many acknowledged writes are not what their key holds now.
    async fn lost(&self, acked: &HashMap<String, i64>) -> Result<usize, BoxError> {
        let mut lost = 0;
        for (k, v) in acked {
            if self.count_live(k).await?.1 != Some(*v) {
                lost += 1;
            }
        }
        Ok(lost)
    }
}

/// A stop flag raised when dropped, so that a writer never outlives a run
/// that failed half-way.
struct Stop(Arc<AtomicBool>);

impl Stop {
    fn new() -> Self {
        Self(Arc::new(AtomicBool::new(false)))
    }
    fn raise(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        self.raise();
    }
}

/// What one write of a writer came to.
enum Outcome {
    Acked,
    Missed,
    Refused,
}

/// Live writer: bumps `n` of keys in turn through `write`, remembering the
/// last acknowledged value per key and counting refusals.
fn spawn_writer<F, Fut>(
    keys: usize,
    stop: &Stop,
    cursor: Option<Arc<AtomicUsize>>,
    write: F,
) -> tokio::task::JoinHandle<(HashMap<String, i64>, u64)>
where
    F: Fn(String, i64) -> Fut + Send + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let stop = Arc::clone(&stop.0);
    tokio::spawn(async move {
        let mut acked = HashMap::new();
        let mut refused = 0u64;
        let mut i: usize = 0;
        let mut v: i64 = 0;
        while !stop.load(Ordering::SeqCst) {
            i = match &cursor {
                // Follow the mover: write the key being moved or the next few.
                Some(c) => (c.load(Ordering::SeqCst) + (v as usize % 8)) % keys,
                None => (i + 7919) % keys,
            };
            v += 1;
            let k = key(i);
            match write(k.clone(), v).await {
                Outcome::Acked => {
                    acked.insert(k, v);
                }
                Outcome::Missed => {}
                Outcome::Refused => refused += 1,
            }
            if cursor.is_some() {
                tokio::time::sleep(Duration::from_micros(500)).await;
            } else {
                tokio::task::yield_now().await;
            }
        }
        (acked, refused)
    })
}

/// A routed (fenced) update through the router.
async fn routed_write(r: &Router, k: &str, v: i64) -> Outcome {
    match r.update(k, "users", row([("n", v)])).await {
        Ok(1) => Outcome::Acked,
        Ok(_) => Outcome::Missed,
        Err(e) if e.code() == "MIGRATION_CUTOVER_PENDING" => Outcome::Refused,
        Err(e) => {
            eprintln!("writer: {e}");
            Outcome::Missed
        }
    }
}

/// The naive writer: routes by the mapping and updates with no fence.
async fn unfenced_write(
    shards: &[(String, Arc<dyn Shard>)],
    mapping: &dyn MappingStore,
    k: &str,
    v: i64,
) -> Result<Outcome, BoxError> {
    let Some(s) = mapping.get(k).await? else {
        return Ok(Outcome::Missed);
    };
    let Some((_, shard)) = shards.iter().find(|(name, _)| *name == s) else {
        return Ok(Outcome::Missed);
    };
    let d = shard.dialect();
    let mut st = Sql::new(&d);
    st.raw("UPDATE ")
        .ident(&Ident::new("users")?)
        .raw(" SET ")
        .ident(&Ident::new("n")?)
        .raw(" = ")
        .bind(v)
        .raw(" WHERE ")
        .ident(&Ident::new("id")?)
        .raw(" = ")
        .bind(k);
    Ok(match shard.execute(&st.finish()).await? {
        1 => Outcome::Acked,
        _ => Outcome::Missed,
    })
}

/// The migration demo scene on `backend`.
///
/// # Errors
/// Any failure of the scene, an unreachable server, or a broken invariant.
pub(crate) async fn demo(backend: Backend, dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    const KEYS: usize = 3000;
    with_env(backend, &dir.join("migration-demo"), 3, KEYS, async |env| {
        demo_scene(env, backend, KEYS).await
    })
    .await
    .map_err(|e| -> Box<dyn std::error::Error> { e })
}

async fn demo_scene(env: &Env, backend: Backend, keys: usize) -> Result<(), BoxError> {
    println!(
        "== migration: rebalance {keys} keys from 1 to 3 {} shards under a live writer ==",
        backend.label()
    );
    println!(
        "shards and mapping: {} {}",
        backend.label(),
        env.place.describe()
    );
    let clock = ManualClock::new(SystemClock.now_ms());
    let writer_router = Arc::new(env.router(Arc::new(clock.clone()), None, Some(0)).await?);
    let stop = Stop::new();
    let writer = spawn_writer(keys, &stop, None, move |k, v| {
        let r = Arc::clone(&writer_router);
        async move { routed_write(&r, &k, v).await }
    });

    let plan = FaultPlan::new();
    let crashing = env
        .router(Arc::new(clock.clone()), Some(&plan), None)
        .await?;
    let crash_at = 3 * 1000 + 5;
    plan.arm(crash_at, FaultMode::After);
    println!(
        "process A: rebalancing; it will crash at its write #{crash_at} (after the write lands)"
    );
    let opts = RebalanceOptions {
        page_size: 200,
        ..RebalanceOptions::default()
    };
    match crashing.rebalance(opts.clone()).await {
        Ok(rep) => println!(
            "process A: rebalance returned: moved {}, failed {}",
            rep.moved,
            rep.failed.len()
        ),
        Err(e) => println!("process A: crashed: {e}"),
    }
    println!(
        "process A: crashed = {}, after {} writes",
        plan.tripped(),
        plan.writes()
    );
    drop(crashing);

    clock.advance(31_000);
    let b = env.router(Arc::new(clock.clone()), None, None).await?;
    let rep = b.recover_migrations().await?;
    println!(
        "process B: recovery examined {}, committed {}, aborted {}, released {}, skipped {}, failed {}",
        rep.examined.len(),
        rep.committed.len(),
        rep.aborted.len(),
        rep.released.len(),
        rep.skipped.len(),
        rep.failed.len()
    );
    if rep.examined.is_empty() {
        // The live writer makes some moves start over, which shifts the
        // write count: the crash can land on a move's last write.
        println!("process B: the crash left no move unfinished");
    }
    let rep = b.rebalance(opts).await?;
    println!(
        "process B: rebalance finished: {} planned, {} moved, {} failed",
        rep.planned,
        rep.moved,
        rep.failed.len()
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.raise();
    let (acked, refused) = writer.await?;
    println!(
        "writer: {} keys with acknowledged writes, {refused} writes refused with MIGRATION_CUTOVER_PENDING (not acknowledged)",
        acked.len()
    );
    let v = b
        .verify_migrations(VerifyOptions {
            repair: true,
            ..VerifyOptions::default()
        })
        .await?;
    println!(
        "verify (repair): clean = {}, repaired {}",
        v.clean,
        v.repaired.len()
    );
    let mut per_shard: HashMap<String, usize> = HashMap::new();
    let mut lost = 0;
    for k in 0..keys {
        let k = key(k);
        let (n, val) = env.count_live(&k).await?;
        if n != 1 {
            return Err(format!("key {k} has {n} live rows").into());
        }
        if let Some(a) = acked.get(&k)
            && val != Some(*a)
        {
            lost += 1;
        }
        let shard = b.route(&k).await?.unwrap_or_default();
        *per_shard.entry(shard).or_default() += 1;
        if b.get(&k, "users").await?.is_none() {
            return Err(format!("key {k} unreadable").into());
        }
    }
    let mut dist: Vec<_> = per_shard.into_iter().collect();
    dist.sort();
    println!("keys per shard: {dist:?}");
    println!("every key readable, exactly one live row each, acknowledged writes lost: {lost}");
    if lost != 0 || !v.clean {
        return Err("migration demo invariant broken".into());
    }
    if let Place::Server { admin, .. } = &env.place {
        println!("dropping the {}s made for the run", admin.container());
    }
    Ok(())
}

/// How keys move in a bench run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mover {
    /// `reassign_shard`: journal, fence, verification.
    Journaled,
    /// Copy, delete the source, update the mapping; no journal, no fence.
    Naive,
}

struct MoveRun {
    keys_per_s: f64,
    lost: usize,
}

/// Moves every key from `s0` to `s1` with `mover`, optionally under a
/// writer that follows the mover; counts the acknowledged writes lost.
async fn run_moves(
    env: &Env,
    n: usize,
    with_writer: bool,
    mover: Mover,
) -> Result<MoveRun, BoxError> {
    let router = match mover {
        Mover::Journaled => Some(Arc::new(
            env.router(Arc::new(SystemClock), None, None).await?,
        )),
        Mover::Naive => None,
    };
    let stop = Stop::new();
    let cursor = Arc::new(AtomicUsize::new(0));
    let follow = Some(Arc::clone(&cursor));
    let writer = with_writer.then(|| match &router {
        Some(r) => {
            let r = Arc::clone(r);
            spawn_writer(n, &stop, follow, move |k, v| {
                let r = Arc::clone(&r);
                async move { routed_write(&r, &k, v).await }
            })
        }
        None => {
            let (shards, mapping) = (Arc::clone(&env.shards), Arc::clone(&env.mapping));
            spawn_writer(n, &stop, follow, move |k, v| {
                let (shards, mapping) = (Arc::clone(&shards), Arc::clone(&mapping));
                async move {
                    unfenced_write(&shards, &*mapping, &k, v)
                        .await
                        .unwrap_or(Outcome::Missed)
                }
            })
        }
    });
    let mut retries = BTreeMap::new();
    let t = instant();
    for k in 0..n {
        cursor.store(k, Ordering::SeqCst);
        let k = key(k);
        match &router {
            Some(r) => journaled_move(r, &k, &mut retries).await?,
            None => naive_move(env, &k).await?,
        }
    }
    let secs = t.elapsed().as_secs_f64();
    if !retries.is_empty() {
        eprintln!("  retried moves, by error: {retries:?}");
    }
    stop.raise();
    let lost = match writer {
        Some(w) => env.lost(&w.await?.0).await?,
        None => 0,
    };
    Ok(MoveRun {
        keys_per_s: n as f64 / secs,
        lost,
    })
}

/// One journaled move, retried on retryable errors; counts the retries by
/// error code. A retry after an attempt that failed half-way resumes that
/// attempt's operation (the same router started it); should it still be
/// active (`MIGRATION_ALREADY_ACTIVE`), recovery settles it once its
/// liveness lapses, as it would for any mover. A key the settled move
/// already put on `s1` (`MIGRATION_SAME_SHARD` on a retry) is moved.
async fn journaled_move(
    r: &Router,
    k: &str,
    retries: &mut BTreeMap<&'static str, usize>,
) -> Result<(), BoxError> {
    let mut first = None;
    for _ in 0..=50 {
        match r.reassign_shard(k, "s1", "users").await {
            Ok(_) => return Ok(()),
            Err(e) if e.code() == "MIGRATION_SAME_SHARD" && first.is_some() => return Ok(()),
            Err(e) if e.is_retryable() => {
                *retries.entry(e.code()).or_default() += 1;
                if e.code() == "MIGRATION_ALREADY_ACTIVE" {
                    eprintln!(
                        "  {k}: an earlier attempt left its move active (first error: {}); recovering",
                        first.as_deref().unwrap_or("none")
                    );
                    tokio::time::sleep(Duration::from_millis(MOVE_LIVENESS_MS / 10)).await;
                    r.recover_migrations().await?;
                }
                first.get_or_insert_with(|| {
                    format!("{}: {}", e.code(), durability_migration::error_chain(&e))
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(format!(
        "the move of {k} still fails after 50 retries; first error: {}",
        first.as_deref().unwrap_or("none")
    )
    .into())
}

/// The naive baseline's move of one key from `s0` to `s1`: read the source
/// row, insert it on the destination, delete the source, update the mapping.
async fn naive_move(env: &Env, k: &str) -> Result<(), BoxError> {
    let (src, dst) = (&env.shards[0].1, &env.shards[1].1);
    let (users, id) = (Ident::new("users")?, Ident::new("id")?);
    let rows = src.query(&src.dialect().select_row(&users, &id, k)).await?;
    let Some(r) = rows.into_iter().next() else {
        return Ok(());
    };
    let cols: Vec<(Ident, Value)> = r
        .iter()
        .map(|(c, v)| Ok((Ident::new(c)?, v.clone())))
        .collect::<Result<_, BoxError>>()?;
    dst.execute(&dst.dialect().insert_row(&users, &cols))
        .await?;
    // The I/O boundaries a networked mover has between its steps.
    tokio::task::yield_now().await;
    src.execute(&src.dialect().delete_key(&users, &id, k))
        .await?;
    tokio::task::yield_now().await;
    env.mapping.put(k, "s1").await?;
    Ok(())
}

fn rss_reset() {
    // Resets the peak RSS (VmHWM) of this process (Linux).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Writes `n` finished moves straight into the journal's shard (`s0.db` in
/// `dir`), in one transaction: operation `op-{k}` with `op_sql`
/// (parameters: the operation id and `keys(k).0`) and its tombstone in
/// `durability_retired` (of key `keys(k).1`, moved to `s1`).
fn insert_history(
    dir: &Path,
    n: usize,
    op_sql: &str,
    keys: impl Fn(usize) -> (String, String),
) -> rusqlite::Result<()> {
    let mut c = rusqlite::Connection::open(dir.join("s0.db"))?;
    let tx = c.transaction()?;
    {
        let mut op = tx.prepare(op_sql)?;
        let mut tomb = tx.prepare(
            "INSERT INTO durability_retired (op_id, tname, mkey, scope, moved_to, payload, digest, retired_ms) VALUES (?1, 'users', ?2, 'default', 's1', x'00', '-', 0)",
        )?;
        for k in 0..n {
            let id = format!("op-{k:08}");
            let (mkey, tomb_key) = keys(k);
            op.execute(rusqlite::params![id, mkey])?;
            tomb.execute(rusqlite::params![id, tomb_key])?;
        }
    }
    tx.commit()
}

/// Sets up `n` mapped keys whose moves are journaled and archived (bulk),
/// then measures the peak RSS of a rebalance dry run, a verification and a
/// purge over them (SQLite files).
async fn stream_rss(dir: &Path, n: usize) -> Result<u64, BoxError> {
    with_env(Backend::Sqlite, dir, 2, n, async |env| {
        // Journal and archive rows as n finished moves would leave them.
        drop(env.router(Arc::new(SystemClock), None, None).await?);
        insert_history(
            dir,
            n,
            "INSERT INTO durability_migration_ops (op_id, scope, mkey, tables, source, target, state, attempts, digests, owner, live_until_ms, retain_ms, retire_at_ms, created_ms, updated_ms, finished_ms, purged) \
             VALUES (?1, 'default', ?2, 'users', 's1', 's0', 'retired', 0, 'users=-', 'bench', 0, 0, 0, 0, 0, 0, 0)",
            |k| (key(k), format!("gone-{k}")),
        )?;
        let r = Router::new(env.config(Arc::new(SystemClock), None))?;
        rss_reset();
        let base = peak_rss_kib();
        let plan = r
            .rebalance(RebalanceOptions {
                dry_run: true,
                page_size: 500,
                ..RebalanceOptions::default()
            })
            .await?;
        let v = r.verify_migrations(VerifyOptions::default()).await?;
        let p = r.purge_retired().await?;
        let peak = peak_rss_kib();
        eprintln!(
            "  n={n}: planned {} moves, verify clean={}, purged {}, peak RSS {peak} KiB (start {base} KiB)",
            plan.planned, v.clean, p.purged_count
        );
        Ok(peak)
    })
    .await
}

/// New moves a verification pass examines in `bench_history`.
const HISTORY_NEW_MOVES: usize = 500;
/// Rounds of each history size in `bench_history`.
const HISTORY_ROUNDS: usize = 3;

/// The verification pass after history (part `history`, SQLite files): a
/// journal holding `n` moves a pass already examined (each with its
/// tombstone), then [`HISTORY_NEW_MOVES`] real moves; the time of the next
/// pass, which examines only the new ones, after 100,000 against after
/// 10,000 (rounds interleaved; medians).
async fn bench_history(dir: &Path) -> Result<(), BoxError> {
    eprintln!(
        "migration bench: verification after history, {HISTORY_NEW_MOVES} new moves, SQLite files"
    );
    let (mut small, mut large) = (Vec::new(), Vec::new());
    for round in 0..HISTORY_ROUNDS {
        small.push(verify_after_history(&dir.join(format!("10k-{round}")), 10_000).await?);
        large.push(verify_after_history(&dir.join(format!("100k-{round}")), 100_000).await?);
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (small, large) = (med(small), med(large));
    eprintln!("  pass after 10,000 examined moves {small:.1} ms, after 100,000 {large:.1} ms");
    json_line(
        "migration.verify_after_history",
        (large, small),
        "ms",
        "<=1.5",
        100_000,
        Backend::Sqlite,
        &format!(
            ",\"baseline_n\":10000,\"new_moves\":{HISTORY_NEW_MOVES},\"rounds\":{HISTORY_ROUNDS}"
        ),
    );
    Ok(())
}

/// One round of [`bench_history`]: the pass's time in ms.
async fn verify_after_history(dir: &Path, n: usize) -> Result<f64, BoxError> {
    with_env(Backend::Sqlite, dir, 2, HISTORY_NEW_MOVES, async |env| {
        let r = env.router(Arc::new(SystemClock), None, None).await?;
        // n finished moves of other keys, examined by an earlier pass, each
        // with its tombstone on the journal's shard.
        insert_history(
            dir,
            n,
            "INSERT INTO durability_migration_ops (op_id, scope, mkey, tables, source, target, state, attempts, digests, owner, live_until_ms, retain_ms, retire_at_ms, created_ms, updated_ms, finished_ms, purged, verified) \
             VALUES (?1, 'default', ?2, 'users', 's0', 's1', 'retired', 0, 'users=-', 'bench', 0, 0, 0, 0, 0, 0, 0, 1)",
            |k| {
                let mkey = format!("hist-{k:08}");
                (mkey.clone(), mkey)
            },
        )?;
        for k in 0..HISTORY_NEW_MOVES {
            let from = r.route(&key(k)).await?.ok_or("a bench key has no mapping")?;
            let to = if from == "s0" { "s1" } else { "s0" };
            r.reassign_shard(&key(k), to, "users").await?;
        }
        let t = instant();
        let v = r.verify_migrations(VerifyOptions::default()).await?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if !v.clean {
            return Err(format!("the pass after {n} moves is not clean: {v:?}").into());
        }
        eprintln!("  n={n}: pass {ms:.1} ms");
        Ok(ms)
    })
    .await
}

/// Prints one JSON line: a figure, its baseline from the same run, and
/// their ratio.
fn json_line(
    name: &str,
    (value, baseline): (f64, f64),
    unit: &str,
    target: &str,
    n: usize,
    backend: Backend,
    extra: &str,
) {
    let ratio = if baseline > 0.0 {
        value / baseline
    } else {
        0.0
    };
    let fields = backend.json_fields();
    println!(
        "{{\"name\":\"{name}\",\"value\":{value:.1},\"baseline\":{baseline:.1},\"unit\":\"{unit}\",\"ratio\":{ratio:.3},\"target\":\"{target}\",\"n\":{n}{fields}{extra}}}"
    );
}

/// `cargo xtask bench migration`: JSON lines on stdout, commentary on stderr.
///
/// # Errors
/// Any failure of a run, an unreachable server, or lost acknowledged writes
/// on the journaled path.
pub(crate) async fn bench(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    bench_inner(dir)
        .await
        .map_err(|e| -> Box<dyn std::error::Error> { e })
}

/// Keys moved per run on SQLite files, and on a server (each move there is
/// a few dozen round trips).
const BENCH_KEYS: [(Backend, usize); 3] = [
    (Backend::Sqlite, 10_000),
    (Backend::Postgres, 2_000),
    (Backend::MariaDb, 2_000),
];

async fn bench_inner(dir: &Path) -> Result<(), BoxError> {
    let dir = dir.join("migration-bench");
    let _ = std::fs::remove_dir_all(&dir);
    let mut failed = Vec::new();
    // `DURABILITY_BENCH_MIGRATION=sqlite,mariadb` runs only the listed parts
    // (`sqlite`, `postgres`, `mariadb`, `hot`, `history`, `rss`); unset runs
    // them all.
    let parts = std::env::var("DURABILITY_BENCH_MIGRATION").ok();
    let wanted = |part: &str| {
        parts
            .as_deref()
            .is_none_or(|p| p.split(',').any(|x| x.trim() == part))
    };
    for (backend, n) in BENCH_KEYS {
        if !wanted(backend.name()) {
            continue;
        }
        if let Err(e) = bench_moves(backend, &dir.join(backend.name()), n).await {
            eprintln!("  {} failed: {e}", backend.label());
            failed.push(format!("{}: {e}", backend.name()));
        }
    }
    // The hot-key figures (part `hot`): every backend.
    if wanted("hot") {
        for (backend, _) in BENCH_KEYS {
            if let Err(e) = bench_hot(backend, &dir.join("hot").join(backend.name())).await {
                eprintln!("  {} hot key failed: {e}", backend.label());
                failed.push(format!("hot {}: {e}", backend.name()));
            }
        }
    }
    if wanted("history")
        && let Err(e) = bench_history(&dir.join("history")).await
    {
        eprintln!("  verify after history failed: {e}");
        failed.push(format!("history: {e}"));
    }
    if wanted("rss") {
        eprintln!("streaming (rebalance dry run + verify + purge):");
        let small = stream_rss(&dir.join("rss-10k"), 10_000).await?;
        let large = stream_rss(&dir.join("rss-100k"), 100_000).await?;
        json_line(
            "migration.stream_peak_rss",
            (large as f64, small as f64),
            "KiB",
            "<=1.2",
            100_000,
            Backend::Sqlite,
            ",\"baseline_n\":10000",
        );
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; ").into())
    }
}

/// One backend's pairs: journaled against naive moves of `n` keys, alone
/// and under a concurrent writer.
/// Rounds of each journaled / naive pair.
const BENCH_ROUNDS: usize = 3;

/// The median throughput of the runs, with the lost writes of all of them.
fn median_run(mut runs: Vec<MoveRun>) -> MoveRun {
    let lost = runs.iter().map(|r| r.lost).sum();
    runs.sort_by(|a, b| a.keys_per_s.total_cmp(&b.keys_per_s));
    let keys_per_s = runs.get(runs.len() / 2).map_or(0.0, |r| r.keys_per_s);
    MoveRun { keys_per_s, lost }
}

async fn bench_moves(backend: Backend, dir: &Path, n: usize) -> Result<(), BoxError> {
    let durability = if backend == Backend::Sqlite {
        ", synchronous=NORMAL"
    } else {
        ""
    };
    eprintln!(
        "migration bench: {n} keys, {} shards{durability}",
        backend.label()
    );
    let run = async |name: &str, with_writer: bool, mover: Mover| {
        with_env(backend, &dir.join(name), 2, n, async |env| {
            run_moves(env, n, with_writer, mover).await
        })
        .await
    };
    // Rounds alternate journaled and naive runs; each side reports its
    // median throughput and the lost writes of every round (a noisy moment
    // on this shared machine then skews one round, not the ratio).
    let pair = async |name: &str, with_writer: bool| -> Result<(MoveRun, MoveRun), BoxError> {
        let (mut ours, mut naive) = (Vec::new(), Vec::new());
        for round in 0..BENCH_ROUNDS {
            ours.push(
                run(
                    &format!("ours-{name}-{round}"),
                    with_writer,
                    Mover::Journaled,
                )
                .await?,
            );
            naive.push(run(&format!("naive-{name}-{round}"), with_writer, Mover::Naive).await?);
        }
        Ok((median_run(ours), median_run(naive)))
    };
    // A throughput figure: journaled against naive moves.
    let moves_line = |name: &str, (ours, naive): (&MoveRun, &MoveRun), extra: &str| {
        let keys_per_s = (ours.keys_per_s, naive.keys_per_s);
        json_line(
            &backend.figure(name),
            keys_per_s,
            "keys/s",
            ">=0.25",
            n,
            backend,
            extra,
        );
    };
    let (ours, naive) = pair("alone", false).await?;
    eprintln!(
        "  journaled {:.0} keys/s, naive {:.0} keys/s",
        ours.keys_per_s, naive.keys_per_s
    );
    moves_line(
        "migration.move",
        (&ours, &naive),
        &format!(",\"rounds\":{BENCH_ROUNDS}"),
    );
    let (ours_w, naive_w) = pair("writer", true).await?;
    eprintln!(
        "  with a concurrent writer: journaled {:.0} keys/s ({} lost writes), naive {:.0} keys/s ({} lost writes)",
        ours_w.keys_per_s, ours_w.lost, naive_w.keys_per_s, naive_w.lost
    );
    moves_line(
        "migration.move_concurrent_writer",
        (&ours_w, &naive_w),
        &format!(
            ",\"rounds\":{BENCH_ROUNDS},\"lost_writes\":{},\"baseline_lost_writes\":{}",
            ours_w.lost, naive_w.lost
        ),
    );
    no_lost_writes("journaled moves", ours.lost + ours_w.lost)
}

/// An error when `what` lost any acknowledged write.
fn no_lost_writes(what: &str, lost: usize) -> Result<(), BoxError> {
    if lost == 0 {
        Ok(())
    } else {
        Err(format!("{what} lost {lost} acknowledged writes").into())
    }
}

/// One backend's hot-key figures: [`HOT_MOVES`] moves of one key under a
/// writer every millisecond, with the default cutover hold and with the
/// hold off (the baseline), in the same run.
async fn bench_hot(backend: Backend, dir: &Path) -> Result<(), BoxError> {
    eprintln!("migration bench: hot key, {} shards", backend.label());
    let (held, plain) = (
        with_env(backend, &dir.join("held"), 2, 1, async |env| {
            hot_key_moves(env, None).await
        })
        .await?,
        with_env(backend, &dir.join("plain"), 2, 1, async |env| {
            hot_key_moves(env, Some(0)).await
        })
        .await?,
    );
    eprintln!(
        "  hot key (a write every ms): {}/{HOT_MOVES} moves committed with the cutover hold (p99 {:.1} ms, {} writes refused), {}/{HOT_MOVES} without (p99 {:.1} ms); {} + {} lost writes",
        held.committed,
        held.p99_ms,
        held.refused,
        plain.committed,
        plain.p99_ms,
        held.lost,
        plain.lost
    );
    json_line(
        &backend.figure("migration.hot_key_committed"),
        (held.fraction(), plain.fraction()),
        "fraction",
        ">=0.99",
        HOT_MOVES,
        backend,
        &format!(
            ",\"baseline_cutover_hold_ms\":0,\"cutover_hold_ms\":{DEFAULT_CUTOVER_HOLD_MS},\"refused_writes\":{}",
            held.refused
        ),
    );
    json_line(
        &backend.figure("migration.hot_key_move_p99"),
        (held.p99_ms, plain.p99_ms),
        "ms",
        "bounded",
        HOT_MOVES,
        backend,
        ",\"baseline_cutover_hold_ms\":0",
    );
    no_lost_writes("hot-key moves", held.lost + plain.lost)
}

/// Moves of the hot key per hot-key run.
const HOT_MOVES: usize = 50;

/// What a hot-key run measured.
struct HotRun {
    committed: usize,
    p99_ms: f64,
    refused: u64,
    lost: usize,
}

impl HotRun {
    fn fraction(&self) -> f64 {
        self.committed as f64 / HOT_MOVES as f64
    }
}

/// [`HOT_MOVES`] single-attempt moves of one key back and forth while a
/// writer updates it every millisecond, with the given cutover hold
/// (`None`: the default). Times every move attempt, committed or not.
async fn hot_key_moves(env: &Env, hold_ms: Option<u64>) -> Result<HotRun, BoxError> {
    let mut c = env.config(Arc::new(SystemClock), None);
    if let Some(ms) = hold_ms {
        c = c.cutover_hold_ms(ms);
    }
    let r = Arc::new(Router::new(c)?);
    r.init().await?;
    let k = key(0);
    let stop = Stop::new();
    let writer = {
        let (r, k, stop) = (Arc::clone(&r), k.clone(), Arc::clone(&stop.0));
        tokio::spawn(async move {
            let (mut acked, mut refused, mut v) = (None, 0u64, 0i64);
            while !stop.load(Ordering::SeqCst) {
                v += 1;
                match routed_write(&r, &k, v).await {
                    Outcome::Acked => acked = Some(v),
                    Outcome::Refused => refused += 1,
                    Outcome::Missed => {}
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (acked, refused)
        })
    };
    let mut times = Vec::with_capacity(HOT_MOVES);
    let mut committed = 0;
    for _ in 0..HOT_MOVES {
        let from = r.route(&k).await?.ok_or("the hot key has no mapping")?;
        let to = if from == "s0" { "s1" } else { "s0" };
        let t = instant();
        let res = r.reassign_shard(&k, to, "users").await;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        match res {
            Ok(_) => committed += 1,
            Err(e) if e.code() == "MIGRATION_ABORTED" => {}
            Err(e) => return Err(e.into()),
        }
    }
    stop.raise();
    let (acked, refused) = writer.await?;
    times.sort_by(f64::total_cmp);
    let p99_ms = times
        .get((times.len() * 99).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    let mut last = HashMap::new();
    if let Some(v) = acked {
        last.insert(k, v);
    }
    Ok(HotRun {
        committed,
        p99_ms,
        refused,
        lost: env.lost(&last).await?,
    })
}
