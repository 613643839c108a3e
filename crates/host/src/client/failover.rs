//! [`FailoverClient`]: a client for non-hosts that enters a deployment
//! through any of several entry hosts and survives the death of some of
//! them, under the replay rules of the one router ([`crate::routing`]).
//!
//! It is an [`RpcClient`] (owner hints, route fences, the rules) whose
//! router is a list of entries instead of one:
//!
//! - A request that goes through a router tries the entries in turn,
//!   starting at the preferred one and skipping those in backoff (all of
//!   them are tried when every one is in backoff: the client never
//!   refuses to try). An entry whose connection could not be made
//!   (`Reply::NotSent`: nothing was sent, so nothing ran) is put in
//!   backoff and the **same attempt** goes on to the next entry, for every
//!   kind of request.
//! - An entry that answered without a trusted answer (a connection reset
//!   or a timeout after the request was sent, a `502/503/504` without the
//!   marker, an unreadable success) is not tried again for that attempt:
//!   the rules decide ([`crate::routing`]). RPC is never replayed (the
//!   owner may have run it: `owner_unavailable` or
//!   `do_rpc_result_unknown`, see [`FailoverClient::outcome_unknown`]); a
//!   `GET`/`HEAD` fetch replays once, through the next entry. Either way the
//!   preferred entry moves on to the next one, so a hung entry host does
//!   not hold later calls.
//! - An entry that answers the trusted `draining` refusal (it, or the
//!   owner it forwarded to, is shutting down; nothing ran) ends that call
//!   with that refusal, as the rules say, and is put in backoff, so later
//!   calls go to the other entries instead of meeting it again.
//! - Backoff is counted on the client's [`Clock`] (injected; no sleeps):
//!   the `n`-th consecutive failure of an entry keeps it out for
//!   `base * 2^(n-1)` ms, at most `max` ([`EntryBackoff`]); an answer from
//!   the entry clears it.
//! - A call whose owner could not be reached at all
//!   ([`HostError::OwnerUnreachable`]: nothing ran, e.g. a hinted owner
//!   that died, whose hint the router evicted) is sent once more through
//!   the entries.
//! - [`FailoverClient::call_idempotent`] carries an [`IdempotencyKey`] in
//!   the call's arguments ([`crate::idempotency`]); the method records the
//!   key with its result in the object's own transaction, so the client
//!   may re-send a call whose outcome is unknown (at most once per entry)
//!   and it still runs at most once.
//!
//! Limits: [`crate::transport::HttpTransport`] cannot tell a connect that
//! hangs from a request that hangs after it was sent; both are reported
//! (after the transport's timeout) as an unknown outcome, so a blackholed
//! entry costs the calls that hit it one timeout each and is then left for
//! the next entry. Only a refused or failed connection fails over within
//! the same call.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use durability_ownership::OwnerScope;
use durability_time::{Clock, SystemClock};
use serde_json::Value;

use super::{Hint, RpcClient};
use crate::error::HostError;
use crate::fetch::{FetchRequest, FetchResponse};
use crate::idempotency::{self, IdempotencyKey};
use crate::protocol::{
    Endpoint, EndpointPolicy, FetchInvoke, HttpTransport, InvokeRequest, OwnerHeaders, Reply,
    RequestId, Transport,
};
use crate::routing::{Answer, Attempt, Kind, Make, Routes, Step};

/// How long an entry that could not be reached is left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryBackoff {
    /// After the first failure, in milliseconds (doubled per further
    /// consecutive failure).
    pub base_ms: u64,
    /// The longest, in milliseconds.
    pub max_ms: u64,
}

impl Default for EntryBackoff {
    /// 500 ms, doubling to at most 30 s.
    fn default() -> Self {
        Self {
            base_ms: 500,
            max_ms: 30_000,
        }
    }
}

impl EntryBackoff {
    /// The backoff after `failures` consecutive failures (at least one).
    fn after(self, failures: u32) -> u64 {
        let doublings = failures.saturating_sub(1).min(63);
        self.base_ms
            .saturating_mul(1_u64 << doublings)
            .min(self.max_ms)
    }
}

/// One entry host and what the client knows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryState {
    /// Its endpoint.
    pub endpoint: String,
    /// Consecutive failures to reach it (0: it answered last time).
    pub failures: u32,
    /// Until when (client clock, Unix ms) it is skipped, if it is.
    pub down_until_ms: Option<i64>,
}

/// What a [`FailoverClient`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverStats {
    /// The calls, as an [`RpcClient`] counts them.
    pub client: super::ClientStats,
    /// Entries skipped to another one within an attempt after their
    /// connection could not be made.
    pub failovers: u64,
    /// Calls re-sent: after an unreachable owner (nothing ran), or with an
    /// idempotency key after an unknown outcome.
    pub resends: u64,
    /// The entries, in the order given.
    pub entries: Vec<EntryState>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Health {
    failures: u32,
    down_until_ms: Option<i64>,
}

/// A client of a deployment's hosts entering through any of several entry
/// hosts (module docs: failover, backoff, replay rules, idempotency keys).
pub struct FailoverClient {
    client: RpcClient,
    entries: Vec<(Endpoint, Mutex<Health>)>,
    preferred: AtomicUsize,
    clock: Arc<dyn Clock>,
    backoff: EntryBackoff,
    failovers: AtomicU64,
    resends: AtomicU64,
}

impl std::fmt::Debug for FailoverClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries: Vec<String> = self.entries.iter().map(|(e, _)| e.url()).collect();
        f.debug_struct("FailoverClient")
            .field("entries", &entries)
            .field("storage", &self.client.storage)
            .finish_non_exhaustive()
    }
}

impl FailoverClient {
    /// A client entering through `entries` (any hosts of the deployment),
    /// with the deployment's internal token, storage id and shard count,
    /// over HTTP/1.1, the default endpoint policy, the system clock and
    /// the default [`EntryBackoff`].
    ///
    /// # Errors
    /// [`HostError::InvalidSetting`] when there is no entry, an entry
    /// fails the policy, the token is malformed or the storage id is
    /// invalid.
    pub fn new(
        entries: &[&str],
        token: &str,
        storage_id: &str,
        shard_count: durability_ownership::ShardCount,
    ) -> Result<Self, HostError> {
        Self::with(
            entries,
            token,
            storage_id,
            shard_count,
            EndpointPolicy::default(),
            Arc::new(HttpTransport::default()),
        )
    }

    /// [`FailoverClient::new`] with a policy and a transport.
    ///
    /// # Errors
    /// As [`FailoverClient::new`].
    pub fn with(
        entries: &[&str],
        token: &str,
        storage_id: &str,
        shard_count: durability_ownership::ShardCount,
        policy: EndpointPolicy,
        transport: Arc<dyn Transport>,
    ) -> Result<Self, HostError> {
        let first = entries
            .first()
            .ok_or_else(|| HostError::setting("entries", "at least one entry host"))?;
        let checked = entries
            .iter()
            .map(|e| {
                policy
                    .check(e)
                    .map(|e| (e, Mutex::new(Health::default())))
                    .map_err(|r| HostError::setting("entries", r.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let client = RpcClient::with(first, token, storage_id, shard_count, policy, transport)?;
        Ok(Self {
            client,
            entries: checked,
            preferred: AtomicUsize::new(0),
            clock: Arc::new(SystemClock::new()),
            backoff: EntryBackoff::default(),
            failovers: AtomicU64::new(0),
            resends: AtomicU64::new(0),
        })
    }

    /// Counts backoff on `clock` instead of the system clock.
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets the backoff of unreachable entries.
    #[must_use]
    pub fn backoff(mut self, backoff: EntryBackoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Whether `error` leaves the outcome unknown: the request may have
    /// run (`owner_unavailable` after it was sent, `do_rpc_result_unknown`).
    /// Never a definite failure: retry only with an idempotency key.
    pub fn outcome_unknown(error: &HostError) -> bool {
        matches!(
            error,
            HostError::OwnerUnavailable { .. } | HostError::RpcResultUnknown { .. }
        )
    }

    /// What the client did so far.
    pub fn stats(&self) -> FailoverStats {
        FailoverStats {
            client: self.client.stats(),
            failovers: self.failovers.load(Ordering::Relaxed),
            resends: self.resends.load(Ordering::Relaxed),
            entries: self
                .entries
                .iter()
                .map(|(endpoint, health)| {
                    let h = *lock(health);
                    EntryState {
                        endpoint: endpoint.url(),
                        failures: h.failures,
                        down_until_ms: h.down_until_ms,
                    }
                })
                .collect(),
        }
    }

    /// The underlying single-entry view (owner hints, [`RpcClient::hint`]).
    pub fn rpc(&self) -> &RpcClient {
        &self.client
    }

    /// Calls `method` on the object of `class` named `name`, wherever it is
    /// owned, through the first entry that can be reached (module docs).
    /// Never replayed after the request may have reached the owner.
    ///
    /// # Errors
    /// As [`RpcClient::call`]; an unknown outcome is
    /// [`HostError::OwnerUnavailable`] or [`HostError::RpcResultUnknown`]
    /// ([`FailoverClient::outcome_unknown`]), never a definite failure.
    pub async fn call(
        &self,
        class: &str,
        name: &str,
        method: &str,
        args: Value,
    ) -> Result<Value, HostError> {
        self.made::<InvokeRequest>(class, name, (method.to_owned(), args))
            .await
    }

    /// Calls the typed method `M` on object `name` of its class (see
    /// [`crate::typed`]) as [`FailoverClient::call`] does, with the same
    /// JSON on the wire.
    ///
    /// # Errors
    /// [`crate::CallError::Method`]: the method's own error, decoded;
    /// [`crate::CallError::Host`]: as [`FailoverClient::call`].
    pub async fn call_typed<M: crate::Method>(
        &self,
        name: &str,
        args: M,
    ) -> Result<M::Out, crate::CallError<M::Error>> {
        let class = <M::Class as crate::Class>::NAME;
        crate::typed::call_with(&args, |args| self.call(class, name, M::NAME, args)).await
    }

    /// [`FailoverClient::call`] carrying `key`: the method reads it with
    /// [`idempotency::split`] and runs its body under
    /// [`idempotency::once`], so the call runs at most once however often
    /// it is sent. After an unknown outcome the client sends it again (the
    /// same key and arguments) through the next entry, at most once per
    /// entry; the last unknown outcome is returned if none answers.
    ///
    /// # Errors
    /// As [`FailoverClient::call`].
    pub async fn call_idempotent(
        &self,
        class: &str,
        name: &str,
        method: &str,
        key: &IdempotencyKey,
        args: Value,
    ) -> Result<Value, HostError> {
        let args = idempotency::wrap(key, args);
        let request = match InvokeRequest::make(class, name, (method.to_owned(), args)) {
            Ok(request) => request,
            Err(e) => return self.invalid::<InvokeRequest>(class, name, e).await,
        };
        let mut result = self.resend_unreachable(class, name, &request).await;
        for _ in 1..self.entries.len() {
            match &result {
                Err(e) if Self::outcome_unknown(e) => {
                    self.resends.fetch_add(1, Ordering::Relaxed);
                    result = self.resend_unreachable(class, name, &request).await;
                }
                _ => break,
            }
        }
        result
    }

    /// Sends a tenant fetch to the fetch handler of the object of `class`
    /// named `name` (as [`RpcClient::fetch`]): a `GET`/`HEAD` whose entry
    /// gave no trusted answer replays once through the next entry; other
    /// methods do not.
    ///
    /// # Errors
    /// As [`RpcClient::fetch`].
    pub async fn fetch(
        &self,
        class: &str,
        name: &str,
        request: FetchRequest,
    ) -> Result<FetchResponse, HostError> {
        self.made::<FetchInvoke>(class, name, request).await
    }

    /// Makes a request of kind `K` ([`Make`]) and routes it through the
    /// entries ([`FailoverClient::resend_unreachable`]); one refused before
    /// anything was sent is counted `invalid`.
    async fn made<K: Make>(
        &self,
        class: &str,
        name: &str,
        input: K::Input,
    ) -> Result<K::Out, HostError> {
        match K::make(class, name, input) {
            Ok(request) => self.resend_unreachable(class, name, &request).await,
            Err(e) => self.invalid::<K>(class, name, e).await,
        }
    }

    /// A request refused before anything was sent (counted `invalid`).
    async fn invalid<K: Kind>(
        &self,
        class: &str,
        name: &str,
        error: HostError,
    ) -> Result<K::Out, HostError> {
        self.client
            .send::<K, Self>(self, class, name, Err(error))
            .await
    }

    /// Routes `request` through the entries; once more if the owner could
    /// not be reached at all (nothing ran).
    async fn resend_unreachable<K: Kind>(
        &self,
        class: &str,
        name: &str,
        request: &(K, Option<RequestId>),
    ) -> Result<K::Out, HostError> {
        let first = self
            .client
            .send(self, class, name, Ok(request.clone()))
            .await;
        if let Err(HostError::OwnerUnreachable { .. }) = &first {
            self.resends.fetch_add(1, Ordering::Relaxed);
            return self
                .client
                .send(self, class, name, Ok(request.clone()))
                .await;
        }
        first
    }

    /// The entries to try, in order: from the preferred one, those not in
    /// backoff first, then those in backoff.
    fn order(&self) -> Vec<usize> {
        let n = self.entries.len();
        let start = self.preferred.load(Ordering::Relaxed) % n;
        let now = self.clock.now_ms();
        let (mut up, down): (Vec<usize>, Vec<usize>) =
            (0..n).map(|i| (start + i) % n).partition(|&i| {
                lock(&self.entries[i].1)
                    .down_until_ms
                    .is_none_or(|t| t <= now)
            });
        up.extend(down);
        up
    }

    /// Entry `i` could not be reached: back off.
    fn unreachable(&self, i: usize) {
        let mut h = lock(&self.entries[i].1);
        h.failures = h.failures.saturating_add(1);
        let wait = i64::try_from(self.backoff.after(h.failures)).unwrap_or(i64::MAX);
        h.down_until_ms = Some(self.clock.now_ms().saturating_add(wait));
    }

    /// Entry `i` answered.
    fn answered(&self, i: usize) {
        *lock(&self.entries[i].1) = Health::default();
    }
}

/// The trusted refusal of a draining host.
const DRAINING: &str = "draining";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The failover client's router is its list of entries; owners, hints and
/// steps are the [`RpcClient`]'s.
impl<K: Kind> Routes<K> for FailoverClient {
    type Owner = Hint;

    fn hint(&self, scope: &OwnerScope) -> Option<Hint> {
        <RpcClient as Routes<K>>::hint(&self.client, scope)
    }

    fn via_router<'a>(
        &'a self,
        scope: &'a OwnerScope,
        request: &'a K,
    ) -> impl Future<Output = Attempt<K::Out, Hint>> + Send + 'a {
        self.client.figures.entry.bump();
        async move {
            let mut last = None;
            for i in self.order() {
                let to = self.client.target(&self.entries[i].0, scope);
                let answer = request.send(to).await;
                if let Answer::Reply(Reply::NotSent { .. }) = &answer {
                    // Nothing was sent: the next entry, in this attempt.
                    self.unreachable(i);
                    self.failovers.fetch_add(1, Ordering::Relaxed);
                    last = Some(answer);
                    continue;
                }
                if let Answer::Reply(Reply::Ownership { code }) = &answer
                    && code == DRAINING
                {
                    // A trusted refusal before dispatch: this call ends as
                    // the rules say (RPC is not re-sent after a broad
                    // ownership refusal), later calls skip the entry.
                    self.unreachable(i);
                    self.preferred.store(i + 1, Ordering::Relaxed);
                    return Attempt::Answered { answer, to: None };
                }
                self.answered(i);
                if matches!(
                    &answer,
                    Answer::Reply(Reply::Unmarked { .. } | Reply::ResultUnknown { .. })
                ) {
                    // No trusted answer: later attempts start elsewhere.
                    self.preferred.store(i + 1, Ordering::Relaxed);
                }
                return Attempt::Answered { answer, to: None };
            }
            let answer = last.unwrap_or_else(|| {
                Answer::Reply(Reply::NotSent {
                    reason: "no entry host".to_owned(),
                })
            });
            Attempt::Answered { answer, to: None }
        }
    }

    fn to_owner<'a>(
        &'a self,
        scope: &'a OwnerScope,
        request: &'a K,
        owner: Hint,
    ) -> impl Future<Output = Attempt<K::Out, Hint>> + Send + 'a {
        <RpcClient as Routes<K>>::to_owner(&self.client, scope, request, owner)
    }

    fn follow(&self, owner: OwnerHeaders) -> Result<Hint, HostError> {
        <RpcClient as Routes<K>>::follow(&self.client, owner)
    }

    fn learn(&self, scope: &OwnerScope, to: Option<Hint>, owner: Option<&OwnerHeaders>) {
        <RpcClient as Routes<K>>::learn(&self.client, scope, to, owner);
    }

    fn evict(&self, scope: &OwnerScope) {
        <RpcClient as Routes<K>>::evict(&self.client, scope);
    }

    fn note(&self, scope: &OwnerScope, step: Step<'_>) {
        <RpcClient as Routes<K>>::note(&self.client, scope, step);
    }
}
