//! Typed channel handles over the JSON storage: a [`ChannelKey<V>`] names a
//! state channel and the type of its value, so drafts, reads and deliveries
//! are type-checked and a misspelt channel is a compile error, while values
//! are stored and delivered as JSON exactly as before.
//!
//! ```
//! use durability_topology::{ChannelKey, Draft, MemberInput};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Limits {
//!     rps: u32,
//! }
//! const LIMITS: ChannelKey<Limits> = ChannelKey::new("limits");
//!
//! let draft = Draft::new()
//!     .members([MemberInput::active("s0")])
//!     .set(&LIMITS, &Limits { rps: 10 });
//! assert!(draft.states.contains_key("limits"));
//! ```
//!
//! A misspelt handle does not compile:
//!
//! ```compile_fail
//! use durability_topology::{ChannelKey, Draft};
//! const LIMITS: ChannelKey<u32> = ChannelKey::new("limits");
//! let draft = Draft::new().set(&LIMTS, &10);
//! ```
//!
//! nor does a value of the wrong type:
//!
//! ```compile_fail
//! use durability_topology::{ChannelKey, Draft};
//! const LIMITS: ChannelKey<u32> = ChannelKey::new("limits");
//! let draft = Draft::new().set(&LIMITS, &"ten");
//! ```
//!
//! Member metadata is typed the same way: a [`MetaKey<M>`] names the type
//! of the members' metadata, [`MemberInput::with_meta`] stores a value of
//! it and [`MetaKey::get`] reads it back (still JSON underneath, so readers
//! through `durability-topology-client` see the same metadata).
//!
//! ```
//! use durability_topology::{MemberInput, MetaKey};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct ShardMeta {
//!     weight: u32,
//! }
//! const SHARD: MetaKey<ShardMeta> = MetaKey::new();
//!
//! let input = MemberInput::active("s0").with_meta(&SHARD, &ShardMeta { weight: 3 });
//! assert_eq!(input.meta, Some(serde_json::json!({"weight": 3})));
//! ```
//!
//! Metadata of another type does not compile:
//!
//! ```compile_fail
//! use durability_topology::{MemberInput, MetaKey};
//! const WEIGHT: MetaKey<u32> = MetaKey::new();
//! let input = MemberInput::active("s0").with_meta(&WEIGHT, &"heavy");
//! ```

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use durability_topology_client::{BoxError, Member};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::coordinator::{Current, Draft, MemberInput, StateChannel, StateUpdate};
use crate::error::TopologyError;

/// A state channel's name and value type.
pub struct ChannelKey<V> {
    name: &'static str,
    value: PhantomData<fn() -> V>,
}

impl<V> ChannelKey<V> {
    /// The handle of the channel `name` (validated when the channel is
    /// attached).
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            value: PhantomData,
        }
    }

    /// The channel's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<V> Clone for ChannelKey<V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V> Copy for ChannelKey<V> {}

impl<V> std::fmt::Debug for ChannelKey<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ChannelKey").field(&self.name).finish()
    }
}

/// One typed state update sent to a member.
#[derive(Debug, Clone, PartialEq)]
pub struct TypedUpdate<V> {
    /// The group.
    pub group: String,
    /// The state channel.
    pub channel: String,
    /// The outbox version: apply only versions newer than the last applied.
    pub version: u64,
    /// The group's membership version when the update was staged.
    pub topology_version: u64,
    /// The value.
    pub value: V,
}

impl StateChannel {
    /// A `write` channel delivering values of `key`'s type: each stored
    /// JSON value is decoded into `V` before `deliver` sees it. A value that
    /// does not decode (one set untyped) is a failed delivery, retried until
    /// a new value is set; its failure event is `TOPOLOGY_DELIVERY_FAILED`
    /// with the decode error as its source.
    pub fn typed<V, F, Fut>(_key: &ChannelKey<V>, deliver: F) -> Self
    where
        V: DeserializeOwned + Send + 'static,
        F: Fn(Member, TypedUpdate<V>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        let deliver = Arc::new(deliver);
        Self::new(Arc::new(move |member: Member, update: StateUpdate| {
            let deliver = Arc::clone(&deliver);
            Box::pin(async move {
                let value: V = serde_json::from_value(update.value).map_err(|e| {
                    BoxError::from(TopologyError::Corrupt {
                        reason: format!(
                            "value of channel {:?} does not decode: {e}",
                            update.channel
                        ),
                    })
                })?;
                deliver(
                    member,
                    TypedUpdate {
                        group: update.group,
                        channel: update.channel,
                        version: update.version,
                        topology_version: update.topology_version,
                        value,
                    },
                )
                .await
            })
        }))
    }
}

impl Draft {
    /// Sets the typed channel `key` to `value` (stored as JSON). A value
    /// that does not encode as JSON (a map with non-string keys, say) makes
    /// `update` fail with `TOPOLOGY_INVALID_STATE` before anything is
    /// written.
    #[must_use]
    pub fn set<V: Serialize>(mut self, key: &ChannelKey<V>, value: &V) -> Self {
        match serde_json::to_value(value) {
            Ok(v) => {
                self.states.insert(key.name.to_owned(), v);
            }
            Err(e) => self.refuse(key.name, e.to_string()),
        }
        self
    }
}

impl Current {
    /// The typed channel's current value.
    ///
    /// # Errors
    /// `TOPOLOGY_CORRUPT` when the stored value does not decode as `V`.
    pub fn get<V: DeserializeOwned>(
        &self,
        key: &ChannelKey<V>,
    ) -> Result<Option<V>, TopologyError> {
        self.states
            .get(key.name)
            .map(|v| {
                serde_json::from_value(v.clone()).map_err(|e| TopologyError::Corrupt {
                    reason: format!("state {:?} does not decode: {e}", key.name),
                })
            })
            .transpose()
    }
}

/// The type of the members' metadata: a typed view of the JSON metadata
/// (`MemberInput::meta`, `Member::meta`).
pub struct MetaKey<M> {
    meta: PhantomData<fn() -> M>,
}

impl<M> MetaKey<M> {
    /// The handle of metadata of type `M`.
    pub const fn new() -> Self {
        Self { meta: PhantomData }
    }
}

impl<M> Default for MetaKey<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M> Clone for MetaKey<M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for MetaKey<M> {}

impl<M> std::fmt::Debug for MetaKey<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("MetaKey")
            .field(&std::any::type_name::<M>())
            .finish()
    }
}

impl<M: DeserializeOwned> MetaKey<M> {
    /// The member's metadata as `M` (`None` when it has none).
    ///
    /// # Errors
    /// `TOPOLOGY_CORRUPT` when the stored metadata does not decode as `M`
    /// (set untyped, or with another type).
    pub fn get(&self, member: &Member) -> Result<Option<M>, TopologyError> {
        member
            .meta
            .as_ref()
            .map(|v| {
                M::deserialize(v).map_err(|e| TopologyError::Corrupt {
                    reason: format!("metadata of member {:?} does not decode: {e}", member.id),
                })
            })
            .transpose()
    }
}

impl MemberInput {
    /// With typed metadata (stored as JSON). A value that does not encode
    /// as JSON (a map with non-string keys, say) makes `update` fail with
    /// `TOPOLOGY_INVALID_METADATA` before anything is written.
    #[must_use]
    pub fn with_meta<M: Serialize>(mut self, _key: &MetaKey<M>, meta: &M) -> Self {
        match serde_json::to_value(meta) {
            Ok(v) => {
                self.meta = Some(v);
                self.refused = None;
            }
            Err(e) => {
                self.meta = None;
                self.refused = Some(e.to_string());
            }
        }
        self
    }
}
