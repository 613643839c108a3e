//! What a host routes calls with: the handlers its classes registered, the
//! internal token, how owners are reached (peers, endpoint policy,
//! transport), the owner hints, and the routing figures. The router
//! (`routing`) reads it; the host builds it at start.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};

use durability_ownership::OwnerHintCache;

use crate::metrics::{self, Figure};
use crate::protocol::{
    Endpoint, EndpointPolicy, EndpointRefused, InternalToken, PeerDirectory, Transport,
};
use crate::rpc::Methods;

/// How many raw owner endpoints [`Endpoints`] remembers as checked.
const CHECKED_ENDPOINTS: usize = 256;

/// Routing outcome counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoutingStats {
    /// Calls run on this host (owned here).
    pub local: u64,
    /// Calls forwarded by this host's router to another owner.
    pub forwarded: u64,
    /// Calls sent straight to a hinted owner.
    pub direct: u64,
    /// Rediscoveries after a trusted pre-dispatch ownership answer.
    pub rediscoveries: u64,
    /// Hints evicted (stale answers, unmarked failures).
    pub hint_evictions: u64,
    /// Owner endpoints refused by the allowlist (or unknown).
    pub endpoint_refusals: u64,
    /// Internal requests refused for a missing or wrong token.
    pub auth_refusals: u64,
    /// Invokes this host served over the transport.
    pub served: u64,
    /// WebSocket connects this host's router handed off to another owner
    /// (the caller connects to the owner directly).
    pub handoffs: u64,
    /// WebSocket sessions this host admitted as the owner.
    pub upgrades: u64,
    /// Alarm deliveries this host's dispatcher sent to their owner.
    pub alarms_forwarded: u64,
    /// Alarm deliveries this host served for another host's dispatcher.
    pub alarms_served: u64,
}

/// The routing figures (plain numbers and facade counters, see
/// [`crate::metrics`]).
#[derive(Debug)]
pub(crate) struct RoutingCounters {
    pub(crate) local: Figure,
    pub(crate) forwarded: Figure,
    pub(crate) direct: Figure,
    pub(crate) rediscoveries: Figure,
    pub(crate) hint_evictions: Figure,
    pub(crate) endpoint_refusals: Figure,
    pub(crate) auth_refusals: Figure,
    pub(crate) served: Figure,
    pub(crate) handoffs: Figure,
    pub(crate) upgrades: Figure,
    pub(crate) alarms_forwarded: Figure,
    pub(crate) alarms_served: Figure,
}

impl RoutingCounters {
    pub(crate) fn new(task: &str) -> Self {
        Self {
            local: metrics::routed(task, "local"),
            forwarded: metrics::routed(task, "forwarded"),
            direct: metrics::routed(task, "direct"),
            rediscoveries: Figure::new("durability_host_rediscoveries_total", task, &[]),
            hint_evictions: Figure::new("durability_host_hint_evictions_total", task, &[]),
            endpoint_refusals: metrics::refusal(task, "endpoint"),
            auth_refusals: metrics::refusal(task, "auth"),
            served: Figure::new("durability_host_invokes_served_total", task, &[]),
            handoffs: metrics::routed(task, "handoff"),
            upgrades: metrics::routed(task, "upgraded"),
            alarms_forwarded: metrics::alarm_forward(task, "sent"),
            alarms_served: metrics::alarm_forward(task, "served"),
        }
    }

    pub(crate) fn snapshot(&self) -> RoutingStats {
        RoutingStats {
            local: self.local.get(),
            forwarded: self.forwarded.get(),
            direct: self.direct.get(),
            rediscoveries: self.rediscoveries.get(),
            hint_evictions: self.hint_evictions.get(),
            endpoint_refusals: self.endpoint_refusals.get(),
            auth_refusals: self.auth_refusals.get(),
            served: self.served.get(),
            handoffs: self.handoffs.get(),
            upgrades: self.upgrades.get(),
            alarms_forwarded: self.alarms_forwarded.get(),
            alarms_served: self.alarms_served.get(),
        }
    }
}

pub(crate) fn bump(figure: &Figure) {
    figure.bump();
}

/// What a host routes with.
pub(crate) struct RoutingState<I, D> {
    pub(crate) methods: Methods<I, D>,
    pub(crate) fetchers: crate::fetch::Fetchers<I, D>,
    pub(crate) connectors: crate::connect::Connectors<I, D>,
    pub(crate) token: Option<InternalToken>,
    pub(crate) peers: Arc<dyn PeerDirectory>,
    pub(crate) policy: Endpoints,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) hints: OwnerHintCache,
    pub(crate) counters: RoutingCounters,
}

/// The endpoint policy, and the raw owner endpoints it passed (it does
/// not change, so a send to a known owner does not parse its endpoint
/// again).
pub(crate) struct Endpoints {
    policy: EndpointPolicy,
    passed: Mutex<lru::LruCache<String, Endpoint>>,
}

impl Endpoints {
    pub(crate) fn new(policy: EndpointPolicy) -> Self {
        Self {
            policy,
            passed: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(CHECKED_ENDPOINTS).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }

    /// Parses `raw` and checks it against the policy
    /// ([`EndpointPolicy::check`]).
    ///
    /// # Errors
    /// [`EndpointRefused`] naming the broken rule.
    pub(crate) fn check(&self, raw: &str) -> Result<Endpoint, EndpointRefused> {
        let passed = || self.passed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(endpoint) = passed().get(raw) {
            return Ok(endpoint.clone());
        }
        let endpoint = self.policy.check(raw)?;
        passed().put(raw.to_owned(), endpoint.clone());
        Ok(endpoint)
    }
}
