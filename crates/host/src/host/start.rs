//! Starting a host: [`validate`] the configuration (nothing touched),
//! [`check_records`] (the lifecycle records, the tombstone, the object
//! store), then `Host::build` and `Host::spawn`.

use std::collections::BTreeMap;
use std::sync::Arc;

use durability_alarms::{AlarmIndex, DispatcherConfig};
use durability_ownership::{
    ClassName, LeaseStore, LifecycleAdmin, LifecycleId, OwnerEndpoint, OwnerScope, OwnershipError,
    ShardCount, StorageId, TaskId,
};

use crate::config::{Factory, HostConfig, HostForward, HostIds, OwnPolicy};
use crate::error::HostError;
use crate::protocol::{EndpointPolicy, EndpointRefused, InternalToken};
use crate::rpc::validate_method;
use crate::settings::HostSettings;
use crate::store::ObjectStore;

/// The configured classes by name.
pub(super) type Classes<I, D> = BTreeMap<String, (ClassName, Factory<I, D>)>;

/// A configuration that passed every check.
pub(super) struct Validated<I, D> {
    pub(super) settings: HostSettings,
    pub(super) storage_id: StorageId,
    pub(super) lifecycle: LifecycleId,
    pub(super) task: TaskId,
    pub(super) token: Option<InternalToken>,
    pub(super) advertised: Option<OwnerEndpoint>,
    pub(super) policy: EndpointPolicy,
    pub(super) classes: Classes<I, D>,
    pub(super) targets: Vec<OwnerScope>,
    pub(super) dispatcher: DispatcherConfig,
}

/// What `Host::spawn` starts the alarm dispatcher with.
pub(super) struct Spawn<I> {
    pub(super) index: Arc<I>,
    pub(super) forward: Option<Arc<dyn HostForward>>,
    pub(super) dispatcher: DispatcherConfig,
    pub(super) run_dispatcher: bool,
    pub(super) permits: Option<Arc<dyn durability_scheduler::Permits>>,
}

fn bad(setting: &'static str) -> impl Fn(OwnershipError) -> HostError {
    move |e| HostError::setting(setting, e.to_string())
}

/// Checks every setting (it takes the classes out of `config`).
///
/// # Errors
/// [`HostError::InvalidSetting`] naming the first bad setting.
pub(super) fn validate<S: 'static, I: 'static, O: ObjectStore>(
    config: &mut HostConfig<S, I, O>,
) -> Result<Validated<I, O::Storage>, HostError> {
    let settings = config.settings;
    settings.validate()?;
    let HostIds {
        storage: storage_id,
        lifecycle,
        task,
    } = config.ids.clone();
    let (token, advertised, policy) = endpoint(config)?;
    handlers(config)?;
    let count = settings.ownership.shard_count;
    let classes = classes(std::mem::take(&mut config.classes), &storage_id, count)?;
    let targets = targets(&config.own, &classes, &storage_id, count)?;
    let mut dispatcher = settings.alarms;
    dispatcher.stop_grace_ms = dispatcher
        .stop_grace_ms
        .min(i64::try_from(settings.ownership.drain_in_flight_timeout_ms).unwrap_or(i64::MAX));
    dispatcher
        .validate()
        .map_err(|e| HostError::setting("dispatcher", e.to_string()))?;
    config
        .objects
        .validate()
        .map_err(|(setting, reason)| HostError::setting(setting, reason))?;
    config.check_placement_with(crate::store::sqlite::check_local)?;
    Ok(Validated {
        settings,
        storage_id,
        lifecycle,
        task,
        token,
        advertised,
        policy,
        classes,
        targets,
        dispatcher,
    })
}

/// The internal token, the endpoint this host advertises and the policy
/// it forwards by: with calls between hosts on, the endpoint must pass
/// that policy, and every owner record it writes advertises it. Without an
/// explicit policy, a host with a token forwards only to its own internal
/// port ([`EndpointPolicy::internal_port`] of its endpoint), and a host
/// with a token but no endpoint has no internal port to derive: refused.
fn endpoint<S, I, O: ObjectStore>(
    config: &HostConfig<S, I, O>,
) -> Result<(Option<InternalToken>, Option<OwnerEndpoint>, EndpointPolicy), HostError> {
    if let Some(e) = &config.endpoint
        && (e.is_empty() || e.len() > 512 || e.chars().any(char::is_control))
    {
        return Err(HostError::setting(
            "endpoint",
            "must be 1..=512 bytes without control characters",
        ));
    }
    let token = config
        .internal_token
        .as_deref()
        .map(InternalToken::new)
        .transpose()?;
    let (advertised, policy) = match (&config.endpoint, &token, &config.endpoint_policy) {
        (Some(e), Some(_), explicit) => {
            let refused = |e: EndpointRefused| HostError::setting("endpoint", e.to_string());
            let policy = match explicit {
                Some(policy) => policy.clone(),
                None => EndpointPolicy::internal_port(
                    EndpointPolicy::default().check(e).map_err(refused)?.port(),
                ),
            };
            let checked = policy.check(e).map_err(refused)?;
            let advertised = OwnerEndpoint::new(&checked.url()).map_err(bad("endpoint"))?;
            (Some(advertised), policy)
        }
        (None, Some(_), None) => {
            return Err(HostError::setting(
                "endpoint_policy",
                "a host with an internal token and no endpoint has no internal port to \
                 forward to: set an endpoint or an explicit endpoint policy",
            ));
        }
        (_, _, explicit) => (None, explicit.clone().unwrap_or_default()),
    };
    Ok((token, advertised, policy))
}

/// Every method, fetch and connect handler names a configured class (and
/// a method a valid name); at least one class.
fn handlers<S, I, O: ObjectStore>(config: &HostConfig<S, I, O>) -> Result<(), HostError> {
    let unknown = |setting: &'static str, what: String| Err(HostError::setting(setting, what));
    for (class, method) in &config.method_names {
        if !config.classes.contains_key(class) {
            return unknown(
                "methods",
                format!("method {method} names class {class}, which is not configured"),
            );
        }
        validate_method(method).map_err(|e| HostError::setting("methods", e.to_string()))?;
    }
    let unconfigured = |class: &&String| !config.classes.contains_key(*class);
    for (setting, class) in [
        ("fetch", config.fetchers.keys().find(unconfigured)),
        ("connect", config.connectors.keys().find(unconfigured)),
    ] {
        if let Some(class) = class {
            return unknown(
                setting,
                format!("a {setting} handler names class {class}, which is not configured"),
            );
        }
    }
    if config.classes.is_empty() {
        return unknown("classes", "at least one object class".to_owned());
    }
    Ok(())
}

/// The classes by name, each checked against the host-id limit.
fn classes<I, D>(
    configured: BTreeMap<String, Factory<I, D>>,
    storage: &StorageId,
    count: ShardCount,
) -> Result<Classes<I, D>, HostError> {
    let mut classes = BTreeMap::new();
    for (name, factory) in configured {
        let class = ClassName::new(&name).map_err(bad("classes"))?;
        // Every scope of the class must fit the host-id limit.
        OwnerScope::new(storage.clone(), class.clone(), count.get() - 1, count)
            .map_err(bad("classes"))?;
        classes.insert(name, (class, factory));
    }
    Ok(classes)
}

/// The scopes the owner loop claims ([`OwnPolicy`]).
fn targets<I, D>(
    own: &OwnPolicy,
    classes: &Classes<I, D>,
    storage: &StorageId,
    count: ShardCount,
) -> Result<Vec<OwnerScope>, HostError> {
    match own {
        OwnPolicy::OnDemand => Ok(Vec::new()),
        OwnPolicy::AllShards => Ok(classes
            .values()
            .flat_map(|(class, _)| {
                (0..count.get()).filter_map(|shard| {
                    OwnerScope::new(storage.clone(), class.clone(), shard, count).ok()
                })
            })
            .collect()),
        OwnPolicy::Shards(list) => list
            .iter()
            .map(|(class, shard)| {
                let (class, _) = classes.get(class).ok_or_else(|| {
                    HostError::setting("own", format!("class {class} is not configured"))
                })?;
                OwnerScope::new(storage.clone(), class.clone(), *shard, count).map_err(bad("own"))
            })
            .collect(),
    }
}

/// The records a host needs before it runs: no tombstone, the lifecycle's
/// active storage pointer naming this storage id (created when asked) and
/// no whole-delete lock; then the object store is made ready.
///
/// # Errors
/// [`HostError::LifecycleRecord`] naming the record and how to fix it;
/// [`HostError::Ownership`] when the lease store cannot be read;
/// [`HostError::InvalidSetting`] when the object store cannot hold the
/// storage id.
pub(super) async fn check_records<S, I, O: ObjectStore>(
    config: &HostConfig<S, I, O>,
    v: &Validated<I, O::Storage>,
) -> Result<(), HostError>
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
{
    let (storage_id, lifecycle) = (&v.storage_id, &v.lifecycle);
    // Lifecycle records, read through a scope of the first class.
    let (first, _) = v
        .classes
        .values()
        .next()
        .ok_or_else(|| HostError::setting("classes", "at least one object class"))?;
    let count = v.settings.ownership.shard_count;
    let probe_scope = OwnerScope::new(storage_id.clone(), first.clone(), 0, count)?;
    if let Some(tombstone) = config.objects.tombstone(storage_id) {
        return Err(HostError::LifecycleRecord {
            lifecycle: lifecycle.as_str().to_owned(),
            storage_id: storage_id.as_str().to_owned(),
            found: format!(
                "tombstoned: storage {} was deleted ({tombstone})",
                storage_id.as_str()
            ),
            how_to_fix: "a deleted storage id is never served again; deploy with a new storage id"
                .to_owned(),
        });
    }
    check_lifecycle_records(
        config.lease_store.as_ref(),
        &probe_scope,
        lifecycle,
        storage_id,
        config.create_active_storage,
    )
    .await?;
    config
        .objects
        .prepare(storage_id)
        .map_err(|(setting, reason)| HostError::setting(setting, reason))
}

/// Checks the lifecycle's active storage pointer, delete lock and the storage
/// id's shard count (recording it when none is) before
/// the host starts (creating the pointer when asked and absent).
async fn check_lifecycle_records<S: LeaseStore + LifecycleAdmin>(
    store: &S,
    scope: &OwnerScope,
    lifecycle: &LifecycleId,
    storage: &StorageId,
    create: bool,
) -> Result<(), HostError> {
    let how = format!(
        "point it at this storage with LifecycleAdmin::set_active_storage({:?}, Some({:?})) \
         on the lease store (the control plane's step), or start the host with \
         HostConfig::create_active_storage_if_absent(true)",
        lifecycle.as_str(),
        storage.as_str()
    );
    let record = |found: String, how_to_fix: String| HostError::LifecycleRecord {
        lifecycle: lifecycle.as_str().to_owned(),
        storage_id: storage.as_str().to_owned(),
        found,
        how_to_fix,
    };
    let mut snapshot = store.snapshot(scope, lifecycle).await?;
    if snapshot.active_storage.is_none() && create {
        store.set_active_storage(lifecycle, Some(storage)).await?;
        tracing::info!(
            event = "durability.host.active_storage_created",
            lifecycle = lifecycle.as_str(),
            storage_id = storage.as_str(),
            "created the active storage pointer"
        );
        snapshot = store.snapshot(scope, lifecycle).await?;
    }
    if snapshot.delete_lock == Some(durability_ownership::DeleteLock::Whole) {
        return Err(record(
            "whole-delete locked".to_owned(),
            "the lifecycle is being deleted; wait for the delete to finish and redeploy with a new storage id".to_owned(),
        ));
    }
    match snapshot.active_storage {
        None => Err(record("missing".to_owned(), how)),
        Some(active) if &active != storage => Err(record(
            format!("{:?}", active.as_str()),
            "this host serves another storage id than the active one; start it with the active storage id".to_owned(),
        )),
        Some(_) => {
            // The storage id's shard count: recorded by the first host,
            // refused (`shard_count_mismatch`) for a host with another.
            store.record_shard_count(scope, lifecycle).await?;
            Ok(())
        }
    }
}
