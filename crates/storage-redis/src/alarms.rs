//! Redis alarm job index: [`RedisAlarmIndex`] implements
//! `durability_alarms::AlarmIndex` with sorted sets, hashes and one Lua
//! script per transition (atomic on the server, one round trip each).
//!
//! | key (after the prefix) | type | meaning |
//! |---|---|---|
//! | `wf:internal:do-alarm:due` | ZSET | due jobs by due/retry time, running jobs by lease expiry |
//! | `wf:internal:do-alarm:ready` | ZSET | promoted jobs by due time, claimed earliest first |
//! | `wf:internal:do-alarm:job:<object>` | HASH | `token`, `due_at`, `state`, `tries`, `run` |
//! | `wf:internal:do-alarm:quarantine` | SET | objects whose job failed validation at claim time (hash kept, state `quarantined`) |
//!
//! Leases and retry times use the server's `TIME` ([`IndexTime::Server`],
//! the default), never the caller's clock. Tests that drive a manual clock
//! select [`IndexTime::Caller`] so the `now` the dispatcher passes is used.
//! Scripts touch the job hash of the object they name, so the index targets
//! a single Redis (or a proxy), not Redis Cluster.

use durability_alarms::{
    AlarmError, AlarmIndex, Claim, ClaimReady, IndexCounts, JobPage, JobPageRequest, JobState,
    JobView, ObjectId, RetryJob, Token, validate_time,
};

use redis::aio::ConnectionManager;
use redis::{RedisError, Script};

/// Which clock the index's lease and retry times run on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IndexTime {
    /// Redis server `TIME` (production).
    #[default]
    Server,
    /// The `now` the caller passes (tests with an injected clock).
    Caller,
}

const NOW: &str = "
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
";

const UPSERT: &str = "
local jk = ARGV[2] .. ARGV[3]
local cur = redis.call('HMGET', jk, 'token', 'due_at')
if cur[1] == ARGV[4] and cur[2] == ARGV[5] then return 0 end
redis.call('ZREM', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('DEL', jk)
redis.call('HSET', jk, 'token', ARGV[4], 'due_at', ARGV[5], 'state', 'due', 'tries', '0')
redis.call('ZADD', KEYS[1], ARGV[5], ARGV[3])
return 1
";

const DELETE: &str = "
local jk = ARGV[2] .. ARGV[3]
if redis.call('HGET', jk, 'token') ~= ARGV[4] then return 0 end
redis.call('DEL', jk)
redis.call('ZREM', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
";

const PROMOTE: &str = "
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now), 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local jk = ARGV[2] .. id
  local d = redis.call('HGET', jk, 'due_at')
  if d then
    redis.call('HSET', jk, 'state', 'ready')
    redis.call('HDEL', jk, 'run')
    redis.call('ZADD', KEYS[2], d, id)
  end
end
return #ids
";

/// Claims the earliest ready jobs, up to ARGV[5] of them, one run token
/// each (ARGV[6..]). A job whose stored token, due time or try count does not
/// decode is moved to the quarantine set instead (state `quarantined`, out of
/// due and ready) and the next job is taken, so a corrupt job never blocks
/// healthy ones. Replies `{claims, quarantined ids}`.
const CLAIM: &str = "
local want = tonumber(ARGV[5])
local out = {}
local bad = {}
local lease = string.format('%d', now + tonumber(ARGV[3]))
while #out < want do
  local r = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #r == 0 then break end
  local id = r[1]
  redis.call('ZREM', KEYS[2], id)
  local jk = ARGV[2] .. id
  local j = redis.call('HMGET', jk, 'token', 'due_at', 'tries')
  if j[1] or j[2] then
    local ok = type(j[1]) == 'string' and #j[1] >= 1 and #j[1] <= 64 and not string.find(j[1], '[^0-9A-Za-z_%-]')
      and type(j[2]) == 'string' and string.find(j[2], '^%d+$') ~= nil and #j[2] <= 16
      and (not j[3] or (string.find(j[3], '^%d+$') ~= nil and #j[3] <= 10))
    if ok then
      local tries = tonumber(j[3] or '0') + 1
      local run = ARGV[6 + #out]
      redis.call('HSET', jk, 'state', 'running', 'run', run, 'tries', string.format('%d', tries))
      redis.call('ZADD', KEYS[1], lease, id)
      out[#out + 1] = {id, j[1], j[2], tries, lease, run}
    else
      redis.call('HSET', jk, 'state', 'quarantined')
      redis.call('ZREM', KEYS[1], id)
      redis.call('SADD', ARGV[4], id)
      bad[#bad + 1] = id
    end
  end
end
return {out, bad}
";

/// Gives a claim back unused: ready again at its due time, one try fewer
/// (ARGV[3] id, ARGV[4] run).
const RELEASE: &str = "
local jk = ARGV[2] .. ARGV[3]
local j = redis.call('HMGET', jk, 'state', 'run', 'due_at', 'tries')
if j[1] ~= 'running' or j[2] ~= ARGV[4] then return 0 end
local tries = math.max((tonumber(j[4] or '0') or 1) - 1, 0)
redis.call('HSET', jk, 'state', 'ready', 'tries', string.format('%d', tries))
redis.call('HDEL', jk, 'run')
redis.call('ZREM', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], j[3], ARGV[3])
return 1
";

/// The fence every settlement of a claim starts with: the job `ARGV[3]`
/// (hash `ARGV[2] .. ARGV[3]`, in `jk`) is running under the run token
/// `ARGV[4]`, or the script changes nothing and returns 0.
const OURS: &str = "
local jk = ARGV[2] .. ARGV[3]
local j = redis.call('HMGET', jk, 'state', 'run')
if j[1] ~= 'running' or j[2] ~= ARGV[4] then return 0 end
";

/// Moves one claimed job whose object id failed validation to quarantine
/// (after [`OURS`]): ARGV[5] quarantine key.
const QUARANTINE: &str = "
redis.call('HSET', jk, 'state', 'quarantined')
redis.call('HDEL', jk, 'run')
redis.call('ZREM', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('SADD', ARGV[5], ARGV[3])
return 1
";

/// Deletes a finished job (after [`OURS`]).
const FINISH: &str = "
redis.call('DEL', jk)
redis.call('ZREM', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
";

/// Makes a job due again after ARGV[5] ms with ARGV[6] tries (after [`NOW`]
/// and [`OURS`]).
const RETRY: &str = "
redis.call('HSET', jk, 'state', 'due', 'tries', ARGV[6])
redis.call('HDEL', jk, 'run')
redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[5])), ARGV[3])
return 1
";

/// A refused connection never reached the server: nothing changed. Any
/// other failure may have been applied.
fn redis_error(e: RedisError) -> AlarmError {
    if e.is_connection_refusal() {
        AlarmError::unavailable(e)
    } else {
        AlarmError::unknown(e)
    }
}

fn bad(reason: impl std::fmt::Display) -> AlarmError {
    AlarmError::Corrupt {
        reason: format!("alarm index reply: {reason}"),
    }
}

/// The alarm job index on Redis.
#[derive(Clone)]
pub struct RedisAlarmIndex {
    conn: ConnectionManager,
    prefix: String,
    time: IndexTime,
    upsert: Script,
    delete: Script,
    promote: Script,
    claim: Script,
    quarantine: Script,
    release: Script,
    finish: Script,
    retry: Script,
}

durability_time::debug_fields!(RedisAlarmIndex { prefix, time });

impl RedisAlarmIndex {
    /// An index on `conn` whose keys all start with `prefix` (may be empty).
    pub fn new(conn: ConnectionManager, prefix: &str, time: IndexTime) -> Self {
        let with_now = |body: &str| Script::new(&format!("{NOW}{body}"));
        let ours = |body: &str| Script::new(&format!("{OURS}{body}"));
        Self {
            conn,
            prefix: prefix.to_owned(),
            time,
            upsert: Script::new(UPSERT),
            delete: Script::new(DELETE),
            promote: with_now(PROMOTE),
            claim: with_now(CLAIM),
            quarantine: ours(QUARANTINE),
            release: Script::new(RELEASE),
            finish: ours(FINISH),
            retry: Script::new(&format!("{NOW}{OURS}{RETRY}")),
        }
    }

    /// Connects to `url` and builds an index with `prefix`.
    ///
    /// # Errors
    /// [`AlarmError::BackendUnavailable`] when Redis cannot be reached.
    pub async fn connect(url: &str, prefix: &str, time: IndexTime) -> Result<Self, AlarmError> {
        let client = redis::Client::open(url).map_err(AlarmError::unavailable)?;
        let conn = ConnectionManager::new(client)
            .await
            .map_err(AlarmError::unavailable)?;
        Ok(Self::new(conn, prefix, time))
    }

    /// The connection (shared with clones of this index).
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The due sorted set's key.
    pub fn due_key(&self) -> String {
        format!("{}wf:internal:do-alarm:due", self.prefix)
    }

    /// The ready sorted set's key.
    pub fn ready_key(&self) -> String {
        format!("{}wf:internal:do-alarm:ready", self.prefix)
    }

    /// The quarantine set's key: objects whose stored job failed
    /// validation at claim time (their hashes are kept, out of due and ready).
    pub fn quarantine_key(&self) -> String {
        format!("{}wf:internal:do-alarm:quarantine", self.prefix)
    }

    fn job_prefix(&self) -> String {
        format!("{}wf:internal:do-alarm:job:", self.prefix)
    }

    /// The job hash key of `object`.
    pub fn job_key(&self, object: &ObjectId) -> String {
        format!("{}{}", self.job_prefix(), object.as_str())
    }

    /// Claims up to `runs.len()` ready jobs in one script call (one round
    /// trip). Jobs whose stored fields fail validation are quarantined by
    /// the script; a claimed job whose object id fails validation here is
    /// quarantined under its run token. Both emit an event and never block
    /// the other jobs.
    async fn claim_many(
        &self,
        now: i64,
        lease_ms: i64,
        runs: &[Token],
    ) -> Result<Vec<Claim>, AlarmError> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        let mut inv = self.invocation(&self.claim, now);
        inv.arg(lease_ms.max(0))
            .arg(self.quarantine_key())
            .arg(runs.len());
        for run in runs {
            inv.arg(run.as_str());
        }
        type Row = (Vec<u8>, String, i64, i64, i64, String);
        let (rows, quarantined): (Vec<Row>, Vec<Vec<u8>>) =
            inv.invoke_async(&mut conn).await.map_err(redis_error)?;
        for id in &quarantined {
            tracing::warn!(
                event = "durability.storage_redis.alarm_job_quarantined",
                object = %String::from_utf8_lossy(id),
                "corrupt alarm job moved to quarantine instead of being claimed"
            );
        }
        let mut claims = Vec::with_capacity(rows.len());
        for (id, token, due_at, tries, lease_until, run) in rows {
            let decoded = String::from_utf8(id.clone())
                .map_err(|_| bad("object id is not UTF-8"))
                .and_then(|s| ObjectId::new(s).map_err(bad))
                .and_then(|o| Ok((o, Token::new(token).map_err(bad)?)))
                .and_then(|(o, t)| Ok((o, t, Token::new(run.clone()).map_err(bad)?)))
                .and_then(|(o, t, r)| Ok((o, t, r, validate_time(due_at).map_err(bad)?)));
            match decoded {
                Ok((object, token, run, due_at)) => claims.push(Claim {
                    object,
                    token,
                    due_at,
                    run,
                    tries: tries_of(tries),
                    lease_until,
                }),
                Err(error) => {
                    let moved = self
                        .run(
                            self.invocation(&self.quarantine, 0)
                                .arg(id.as_slice())
                                .arg(run.as_str())
                                .arg(self.quarantine_key()),
                        )
                        .await;
                    tracing::warn!(
                        event = "durability.storage_redis.alarm_job_quarantined",
                        object = %String::from_utf8_lossy(&id),
                        %error,
                        moved = moved.is_ok(),
                        "claimed alarm job has a corrupt object id; quarantined"
                    );
                }
            }
        }
        Ok(claims)
    }

    fn now_arg(&self, now: i64) -> i64 {
        match self.time {
            IndexTime::Server => -1,
            IndexTime::Caller => now.max(0),
        }
    }

    fn invocation<'s>(&self, script: &'s Script, now: i64) -> redis::ScriptInvocation<'s> {
        let mut inv = script.key(self.due_key());
        inv.key(self.ready_key())
            .arg(self.now_arg(now))
            .arg(self.job_prefix());
        inv
    }

    /// Runs one script invocation and reads its integer reply.
    async fn run(&self, inv: &redis::ScriptInvocation<'_>) -> Result<i64, AlarmError> {
        let mut conn = self.conn.clone();
        inv.invoke_async(&mut conn).await.map_err(redis_error)
    }

    /// Runs a script that takes `(object, token)` and replies 1 when it acted.
    async fn run_on_job(
        &self,
        script: &Script,
        object: &ObjectId,
        token: &Token,
    ) -> Result<bool, AlarmError> {
        let n = self
            .run(
                self.invocation(script, 0)
                    .arg(object.as_str())
                    .arg(token.as_str()),
            )
            .await?;
        Ok(n == 1)
    }
}

fn parse_state(s: &str) -> Result<JobState, AlarmError> {
    match s {
        "due" => Ok(JobState::Due),
        "ready" => Ok(JobState::Ready),
        "running" => Ok(JobState::Running),
        other => Err(bad(format!("unknown state {other:?}"))),
    }
}

/// A `ZRANGE … WITHSCORES` reply.
type Scored = Vec<(String, f64)>;

fn tries_of(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// One job hash's fields as stored: `None` when the hash is gone; a field
/// that does not decode is corrupt data (`do_alarm_corrupt`).
fn decode_job(
    token: Option<Vec<u8>>,
    due_at: Option<Vec<u8>>,
    state: Option<Vec<u8>>,
    tries: Option<Vec<u8>>,
) -> Result<Option<JobView>, AlarmError> {
    if token.is_none() && due_at.is_none() && state.is_none() && tries.is_none() {
        return Ok(None);
    }
    let text = |what: &str, v: Option<Vec<u8>>| {
        let v = v.ok_or_else(|| bad(format!("job without {what}")))?;
        String::from_utf8(v).map_err(|_| bad(format!("{what} is not UTF-8")))
    };
    let int = |what: &str, v: String| {
        if v.is_empty() || v.len() > 16 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!("{what} {v:?} is not a non-negative integer")));
        }
        v.parse::<i64>()
            .map_err(|e| bad(format!("{what} {v:?}: {e}")))
    };
    let token = Token::new(text("token", token)?).map_err(bad)?;
    let due_at = validate_time(int("due_at", text("due_at", due_at)?)?).map_err(bad)?;
    let state = parse_state(&text("state", state)?)?;
    let tries = match tries {
        None => 0,
        Some(t) => {
            let t = int(
                "tries",
                String::from_utf8(t).map_err(|_| bad("tries is not UTF-8"))?,
            )?;
            u32::try_from(t).map_err(|_| bad(format!("tries {t} out of range")))?
        }
    };
    Ok(Some(JobView {
        token,
        due_at,
        state,
        tries,
    }))
}

impl AlarmIndex for RedisAlarmIndex {
    async fn upsert(
        &self,
        object: &ObjectId,
        token: &Token,
        due_at: i64,
    ) -> Result<bool, AlarmError> {
        validate_time(due_at)?;
        let n = self
            .run(
                self.invocation(&self.upsert, 0)
                    .arg(object.as_str())
                    .arg(token.as_str())
                    .arg(due_at.to_string()),
            )
            .await?;
        Ok(n == 1)
    }

    async fn delete(&self, object: &ObjectId, token: &Token) -> Result<bool, AlarmError> {
        self.run_on_job(&self.delete, object, token).await
    }

    async fn job(&self, object: &ObjectId) -> Result<Option<JobView>, AlarmError> {
        let mut conn = self.conn.clone();
        // Read raw bytes and decode here: a stored field that does not decode
        // is corrupt data (`do_alarm_corrupt`), not an unreadable reply.
        type Raw = Option<Vec<u8>>;
        let (token, due_at, state, tries): (Raw, Raw, Raw, Raw) = redis::cmd("HMGET")
            .arg(self.job_key(object))
            .arg("token")
            .arg("due_at")
            .arg("state")
            .arg("tries")
            .query_async(&mut conn)
            .await
            .map_err(redis_error)?;
        decode_job(token, due_at, state, tries)
    }

    async fn promote(&self, now: i64, limit: usize) -> Result<usize, AlarmError> {
        let n = self
            .run(self.invocation(&self.promote, now).arg(limit))
            .await?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    async fn claim(&self, claim: ClaimReady<'_>) -> Result<Option<Claim>, AlarmError> {
        let ClaimReady { now, lease_ms, run } = claim;
        Ok(self
            .claim_many(now, lease_ms, std::slice::from_ref(run))
            .await?
            .pop())
    }

    async fn finish(&self, object: &ObjectId, run: &Token) -> Result<bool, AlarmError> {
        self.run_on_job(&self.finish, object, run).await
    }

    async fn retry(&self, retry: RetryJob<'_>) -> Result<bool, AlarmError> {
        let n = self
            .run(
                self.invocation(&self.retry, retry.now)
                    .arg(retry.object.as_str())
                    .arg(retry.run.as_str())
                    .arg(retry.delay_ms.max(0))
                    .arg(retry.tries),
            )
            .await?;
        Ok(n == 1)
    }

    async fn claim_batch(
        &self,
        now: i64,
        lease_ms: i64,
        runs: &[Token],
    ) -> Result<Vec<Claim>, AlarmError> {
        self.claim_many(now, lease_ms, runs).await
    }

    async fn release(&self, object: &ObjectId, run: &Token, _now: i64) -> Result<bool, AlarmError> {
        self.run_on_job(&self.release, object, run).await
    }

    async fn next_due(&self) -> Result<Option<i64>, AlarmError> {
        let mut conn = self.conn.clone();
        let (due, ready): (Scored, Scored) = redis::pipe()
            .cmd("ZRANGE")
            .arg(self.due_key())
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .cmd("ZRANGE")
            .arg(self.ready_key())
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await
            .map_err(redis_error)?;
        Ok(due
            .into_iter()
            .chain(ready)
            .map(|(_, score)| score as i64)
            .min())
    }

    async fn jobs_with_prefix(&self, page: JobPageRequest<'_>) -> Result<JobPage, AlarmError> {
        let (prefix, cursor, limit) = (page.prefix, page.cursor, page.checked_limit()?);
        let mut scan: u64 = match cursor {
            None => 0,
            Some(c) => {
                c.parse()
                    .ok()
                    .filter(|c| *c != 0)
                    .ok_or_else(|| AlarmError::InvalidConfig {
                        reason: format!("{c:?} is not a job page cursor"),
                    })?
            }
        };
        let job_prefix = self.job_prefix();
        let pattern = crate::scan::prefix_pattern(&format!("{job_prefix}{prefix}"));
        let count = limit.clamp(100, 10_000);
        let mut conn = self.conn.clone();
        let mut keys: Vec<String> = Vec::new();
        // SCAN until about `limit` keys matched or the scan is complete.
        loop {
            let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(scan)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(count)
                .query_async(&mut conn)
                .await
                .map_err(redis_error)?;
            keys.extend(found);
            scan = next;
            if scan == 0 || keys.len() >= limit {
                break;
            }
        }
        type Raw = Option<Vec<u8>>;
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("HMGET")
                .arg(key)
                .arg("token")
                .arg("due_at")
                .arg("state")
                .arg("tries");
        }
        let fields: Vec<(Raw, Raw, Raw, Raw)> = if keys.is_empty() {
            Vec::new()
        } else {
            pipe.query_async(&mut conn).await.map_err(redis_error)?
        };
        // A job that vanished meanwhile, is quarantined or does not decode
        // is left out; it never hides the healthy jobs of the page.
        let jobs = keys
            .iter()
            .zip(fields)
            .filter_map(|(key, (token, due_at, state, tries))| {
                let object = ObjectId::new(key.strip_prefix(&job_prefix)?).ok()?;
                let view = decode_job(token, due_at, state, tries).ok()??;
                Some((object, view))
            })
            .collect();
        Ok(JobPage {
            jobs,
            cursor: (scan != 0).then(|| scan.to_string()),
        })
    }

    async fn counts(&self) -> Result<IndexCounts, AlarmError> {
        let mut conn = self.conn.clone();
        let (scheduled, ready): (u64, u64) = redis::pipe()
            .cmd("ZCARD")
            .arg(self.due_key())
            .cmd("ZCARD")
            .arg(self.ready_key())
            .query_async(&mut conn)
            .await
            .map_err(redis_error)?;
        Ok(IndexCounts { scheduled, ready })
    }
}
