//! [`RpcClient`]: a thin client that is not a host. It sends a call to an
//! entry host's router, learns the owner hint from the owner's trusted
//! headers (the endpoint checked against the client's [`EndpointPolicy`]),
//! and calls the owner directly with the route fence next time, under the
//! same replay rules as a host's own router (see [`crate::routing`]'s
//! docs on [`crate::Host::object`]).

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use durability_ownership::{
    ClassName, DEFAULT_HINT_CAPACITY, ObjectName, OwnerScope, ShardCount, StorageId,
};
use serde_json::Value;

use crate::error::HostError;
use crate::rpc::{RpcArgs, validate_method};
use crate::transport::{
    Endpoint, EndpointPolicy, HttpTransport, InternalToken, InvokeRequest, REDISCOVERY_CODES,
    Reply, RouteFence, Transport,
};

/// What a [`RpcClient`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Calls sent to the entry host's router.
    pub routed: u64,
    /// Calls sent straight to a hinted owner.
    pub direct: u64,
    /// Rediscoveries after a trusted pre-dispatch ownership answer.
    pub rediscoveries: u64,
    /// Hints evicted.
    pub hint_evictions: u64,
}

#[derive(Debug, Clone)]
struct Hint {
    task: String,
    generation: u64,
    endpoint: Endpoint,
}

/// A client of a deployment's hosts (for tools, benchmarks and services
/// that do not host objects themselves).
pub struct RpcClient {
    entry: Endpoint,
    token: InternalToken,
    storage: StorageId,
    count: ShardCount,
    policy: EndpointPolicy,
    transport: Arc<dyn Transport>,
    hints: Mutex<lru::LruCache<OwnerScope, Hint>>,
    routed: AtomicU64,
    direct: AtomicU64,
    rediscoveries: AtomicU64,
    evictions: AtomicU64,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("entry", &self.entry)
            .field("storage", &self.storage)
            .finish_non_exhaustive()
    }
}

impl RpcClient {
    /// A client entering through `entry` (any host), with the deployment's
    /// internal token, storage id and shard count, over HTTP/1.1 and the
    /// default endpoint policy.
    ///
    /// # Errors
    /// [`HostError::InvalidSetting`] when the entry endpoint fails the
    /// policy, the token is malformed or the storage id is invalid.
    pub fn new(
        entry: &str,
        token: &str,
        storage_id: &str,
        shard_count: ShardCount,
    ) -> Result<Self, HostError> {
        Self::with(
            entry,
            token,
            storage_id,
            shard_count,
            EndpointPolicy::default(),
            Arc::new(HttpTransport::default()),
        )
    }

    /// [`RpcClient::new`] with a policy and a transport.
    ///
    /// # Errors
    /// As [`RpcClient::new`].
    pub fn with(
        entry: &str,
        token: &str,
        storage_id: &str,
        shard_count: ShardCount,
        policy: EndpointPolicy,
        transport: Arc<dyn Transport>,
    ) -> Result<Self, HostError> {
        let entry = policy
            .check(entry)
            .map_err(|e| HostError::setting("entry", e.to_string()))?;
        let storage = StorageId::new(storage_id)
            .map_err(|e| HostError::setting("storage_id", e.to_string()))?;
        Ok(Self {
            entry,
            token: InternalToken::new(token)?,
            storage,
            count: shard_count,
            policy,
            transport,
            hints: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(DEFAULT_HINT_CAPACITY).unwrap_or(NonZeroUsize::MIN),
            )),
            routed: AtomicU64::new(0),
            direct: AtomicU64::new(0),
            rediscoveries: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        })
    }

    fn hints(&self) -> MutexGuard<'_, lru::LruCache<OwnerScope, Hint>> {
        self.hints.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn evict(&self, scope: &OwnerScope) {
        if self.hints().pop(scope).is_some() {
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What the client did so far.
    pub fn stats(&self) -> ClientStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClientStats {
            routed: g(&self.routed),
            direct: g(&self.direct),
            rediscoveries: g(&self.rediscoveries),
            hint_evictions: g(&self.evictions),
        }
    }

    /// The hinted owner of an object's scope: (task, generation, endpoint).
    ///
    /// # Errors
    /// [`HostError::UnknownClass`] / [`HostError::InvalidObjectName`] for a
    /// class or name that cannot form a scope.
    pub fn hint(
        &self,
        class: &str,
        name: &str,
    ) -> Result<Option<(String, u64, String)>, HostError> {
        let scope = self.scope(class, name)?;
        Ok(self
            .hints()
            .peek(&scope)
            .map(|h| (h.task.clone(), h.generation, h.endpoint.url())))
    }

    fn scope(&self, class: &str, name: &str) -> Result<OwnerScope, HostError> {
        let class_name = ClassName::new(class).map_err(|_| HostError::UnknownClass {
            class: class.to_owned(),
        })?;
        if name.is_empty() {
            return Err(HostError::InvalidObjectName {
                reason: "the name is empty".to_owned(),
            });
        }
        OwnerScope::for_object(
            self.storage.clone(),
            class_name,
            &ObjectName::new(name),
            self.count,
        )
        .map_err(|e| HostError::InvalidObjectName {
            reason: e.to_string(),
        })
    }

    /// Calls `method` on the object of `class` named `name`, wherever it is
    /// owned.
    ///
    /// # Errors
    /// As [`crate::ObjectRef::call`].
    pub async fn call(
        &self,
        class: &str,
        name: &str,
        method: &str,
        args: Value,
    ) -> Result<Value, HostError> {
        validate_method(method)?;
        let args = RpcArgs::new(args)?;
        let scope = self.scope(class, name)?;
        let mut request = InvokeRequest {
            class: class.to_owned(),
            name: name.to_owned(),
            method: method.to_owned(),
            args,
            fence: None,
        };
        let mut rediscoveries = 1;
        let hint = self.hints().get(&scope).cloned();
        if let Some(hint) = hint {
            self.direct.fetch_add(1, Ordering::Relaxed);
            request.fence = Some(RouteFence {
                task: hint.task.clone(),
                generation: hint.generation,
            });
            let reply = self
                .transport
                .invoke(&hint.endpoint, &self.token, &request)
                .await;
            match self.settle(&scope, reply)? {
                Some(value) => return Ok(value),
                None => {
                    rediscoveries = 0;
                    self.rediscoveries.fetch_add(1, Ordering::Relaxed);
                }
            }
            request.fence = None;
        }
        loop {
            self.routed.fetch_add(1, Ordering::Relaxed);
            let reply = self
                .transport
                .invoke(&self.entry, &self.token, &request)
                .await;
            if let Reply::Ok {
                owner: Some(owner), ..
            } = &reply
                && owner.key == scope.host_id()
                && let Some(endpoint) = owner
                    .endpoint
                    .as_deref()
                    .and_then(|e| self.policy.check(e).ok())
            {
                self.hints().put(
                    scope.clone(),
                    Hint {
                        task: owner.task.clone(),
                        generation: owner.generation,
                        endpoint,
                    },
                );
            }
            match self.settle(&scope, reply) {
                Ok(Some(value)) => return Ok(value),
                Ok(None) if rediscoveries > 0 => {
                    rediscoveries -= 1;
                    self.rediscoveries.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None) => return Err(HostError::remote_ownership("stale_owner")),
                Err(e) => return Err(e),
            }
        }
    }

    /// `Some(value)` on success, `None` when one rediscovery is allowed,
    /// else the error.
    fn settle(&self, scope: &OwnerScope, reply: Reply) -> Result<Option<Value>, HostError> {
        match reply {
            Reply::Ok { result, .. } => Ok(Some(result)),
            Reply::Ownership { code } if REDISCOVERY_CODES.contains(&code.as_str()) => {
                self.evict(scope);
                Ok(None)
            }
            Reply::Ownership { code } => {
                self.evict(scope);
                Err(HostError::remote_ownership(&code))
            }
            Reply::Failed {
                status,
                code,
                message,
                details,
            } => Err(HostError::Remote {
                status,
                code,
                message,
                details,
            }),
            Reply::NotSent { reason } => {
                self.evict(scope);
                Err(HostError::OwnerUnreachable { reason })
            }
            Reply::Unmarked { reason } => {
                self.evict(scope);
                Err(HostError::OwnerUnavailable { reason })
            }
            Reply::ResultUnknown { reason } => Err(HostError::RpcResultUnknown { reason }),
        }
    }
}
