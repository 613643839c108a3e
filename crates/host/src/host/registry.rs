//! The registry of open objects: an object's address (validated once,
//! cached), its slot, and opening it fenced at its scope's claim on first
//! use; closing objects when their scope is lost.

use super::*;

/// The open objects (by object id, each in a slot its opening and closing
/// lock) and the advisory cache of validated addresses: the registry's own
/// state.
pub(super) struct Registry<I, D> {
    open: Mutex<HashMap<ObjectId, Slot<I, D>>>,
    addresses: Mutex<lru::LruCache<(String, String), Arc<Address>>>,
}

impl<I, D> Registry<I, D> {
    pub(super) fn new() -> Self {
        Self {
            open: Mutex::new(HashMap::new()),
            addresses: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(ADVISORY_CACHE_ENTRIES).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }

    /// Every slot now.
    pub(super) fn slots(&self) -> Vec<Slot<I, D>> {
        lock(&self.open).values().cloned().collect()
    }

    /// The slot of `address` (made empty when new).
    fn slot(&self, address: &Address) -> Slot<I, D> {
        let mut objects = lock(&self.open);
        if let Some(slot) = objects.get(&address.id) {
            return Arc::clone(slot);
        }
        Arc::clone(objects.entry(address.id.clone()).or_default())
    }

    /// Forgets slots that hold no open object and that nobody is using, so
    /// the registry stays as large as the set of open objects.
    fn prune(&self) {
        lock(&self.open).retain(|_, slot| {
            Arc::strong_count(slot) > 1 || slot.try_lock().map_or(true, |g| g.is_some())
        });
    }

    /// Open objects, and registry entries (open, opening or closing).
    pub(super) fn counts(&self) -> (usize, usize) {
        let objects = lock(&self.open);
        let open = objects
            .values()
            .filter(|slot| slot.try_lock().map_or(true, |g| g.is_some()))
            .count();
        (open, objects.len())
    }

    fn cached(&self, key: &(String, String)) -> Option<Arc<Address>> {
        lock(&self.addresses).get(key).cloned()
    }

    fn remember(&self, key: (String, String), address: Arc<Address>) {
        lock(&self.addresses).put(key, address);
    }
}

impl<S, I, O: ObjectStore> Host<S, I, O>
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
{
    /// The validated address of `class`'s object `name`, through the
    /// advisory cache.
    pub(super) fn address(&self, class: &str, name: &str) -> Result<Arc<Address>, HostError> {
        let key = (class.to_owned(), name.to_owned());
        if let Some(a) = self.inner.registry.cached(&key) {
            return Ok(a);
        }
        let address = Arc::new(self.make_address(class, name)?);
        self.inner.registry.remember(key, Arc::clone(&address));
        Ok(address)
    }

    /// Validates and builds an address, leaving the advisory cache alone
    /// (the takeover sweep's many one-off objects would evict the hot
    /// ones).
    pub(super) fn make_address(&self, class: &str, name: &str) -> Result<Address, HostError> {
        let (class_name, _) =
            self.inner
                .classes
                .get(class)
                .ok_or_else(|| HostError::UnknownClass {
                    class: class.to_owned(),
                })?;
        crate::object::validate_object_name(name)?;
        let id = ObjectId::new(format!("{}:{class}:{name}", self.inner.storage_id.as_str()))
            .map_err(|e| HostError::InvalidObjectName {
                reason: e.to_string(),
            })?;
        let scope = OwnerScope::for_object(
            self.inner.storage_id.clone(),
            class_name.clone(),
            &ObjectName::new(name),
            self.inner.settings.ownership.shard_count,
        )?;
        Ok(Address {
            key: ObjectKey {
                class: class.to_owned(),
                name: name.to_owned(),
            },
            scope,
            id,
        })
    }

    /// The object store's admission of this host's storage id, held by a
    /// call or an alarm delivery for its whole run, opening and creating
    /// its object included (see [`ObjectStore::admit`]): it waits while a
    /// storage deletion runs, and a tombstoned storage id refuses
    /// (`storage_inactive`), so a deletion waits out every call admitted
    /// before it and no object file is created after it.
    pub(super) async fn store_admission(&self) -> Result<O::Admission, HostError> {
        let inner = &self.inner;
        match inner.objects.admit(&inner.storage_id).await {
            Ok(Some(admission)) => Ok(admission),
            Ok(None) => Err(HostError::Ownership(OwnershipError::StorageInactive {
                storage_id: inner.storage_id.as_str().to_owned(),
            })),
            Err(e) => Err(HostError::from_storage(e)),
        }
    }

    pub(super) fn slot(&self, address: &Address) -> Slot<I, O::Storage> {
        self.inner.registry.slot(address)
    }

    /// Forgets registry slots that hold no open object and that nobody is
    /// using, so the registry stays as large as the set of open objects.
    pub(super) fn prune_slots(&self) {
        self.inner.registry.prune();
    }

    pub(super) async fn close_where(&self, matches: impl Fn(&Address) -> bool) -> usize {
        let slots = self.inner.registry.slots();
        let mut closed = 0;
        for slot in slots {
            let mut guard = slot.lock().await;
            if guard.as_ref().is_some_and(|o| matches(&o.address))
                && let Some(o) = guard.take()
            {
                o.close();
                closed += 1;
            }
        }
        self.prune_slots();
        closed
    }

    /// Resolves the object's owner and opens it (fenced) if needed.
    pub(super) async fn resolve_open(
        &self,
        address: &Address,
    ) -> Result<(Arc<OpenObject<I, O::Storage>>, CancellationToken), HostError> {
        let inner = &self.inner;
        let generation = match inner
            .ownership
            .resolve(&address.scope, &inner.lifecycle)
            .await?
        {
            Resolution::Local(g) => g,
            Resolution::Remote {
                task, generation, ..
            } => {
                tracing::debug!(
                    event = "durability.host.owner_resolved",
                    scope = %address.scope,
                    owner = task.as_str(),
                    generation = generation.get(),
                    "object owned by another task"
                );
                return Err(HostError::NotOwner {
                    owner: task.as_str().to_owned(),
                    generation: generation.get(),
                });
            }
        };
        let slot = self.slot(address);
        let mut guard = slot.lock().await;
        if let Some(open) = guard.as_ref()
            && !open.closed.load(Ordering::SeqCst)
            && open.generation == generation
        {
            let open = Arc::clone(open);
            drop(guard);
            let token = self.note_scope(&address.scope, open.generation);
            return Ok((open, token));
        }
        if let Some(old) = guard.take() {
            old.close();
        }
        drop(self.admit_to_open(&address.scope, generation).await?);
        let open = Arc::new(self.open(address).await?);
        *guard = Some(Arc::clone(&open));
        drop(guard);
        inner.counters.cold.bump();
        tracing::info!(
            event = "durability.host.residency_selected",
            object = %address.id,
            residency = inner.settings.residency.as_str(),
            generation = open.generation.get(),
            dispatch = "cold",
            "object opened"
        );
        let token = self.note_scope(&address.scope, open.generation);
        Ok((open, token))
    }

    /// The admission an object is opened under: nothing is created for a
    /// scope the store no longer grants (an inactive or deleted storage
    /// id): admission before the file, and never under a tombstone (the
    /// callers hold the object store's admission, so no deletion runs
    /// between this check and the file).
    pub(super) async fn admit_to_open(
        &self,
        scope: &OwnerScope,
        generation: Generation,
    ) -> Result<AdmissionPermit, HostError> {
        let inner = &self.inner;
        let permit = inner.ownership.admit(scope, generation).await?;
        if inner.objects.tombstone(&inner.storage_id).is_some() {
            return Err(HostError::Ownership(OwnershipError::StorageInactive {
                storage_id: inner.storage_id.as_str().to_owned(),
            }));
        }
        Ok(permit)
    }

    /// Opens an object: its storage in the object store, fenced at the scope's claim
    /// (through the generation floor), its scheduler, alarm and bridge.
    pub(super) async fn open(
        &self,
        address: &Address,
    ) -> Result<OpenObject<I, O::Storage>, HostError> {
        let inner = &self.inner;
        let storage = inner.objects.open(&inner.storage_id, &address.key).await?;
        let fenced = inner
            .ownership
            .open_fenced(
                &address.scope,
                &inner.lifecycle,
                storage.as_ref(),
                Arc::clone(&inner.clock),
            )
            .await?;
        let scheduler = Scheduler::new(ObjectContext::with_clock(
            address.id.clone(),
            Arc::clone(&storage),
            Arc::clone(&inner.clock),
        ))
        .map_err(HostError::from_scheduler)?;
        let alarms =
            Alarms::new(&scheduler, Arc::clone(&inner.index)).map_err(HostError::from_alarm)?;
        let bridge = SchedulerAlarm::new(&scheduler, alarms.clone());
        let ctx = ObjectCtx {
            class: address.key.class.clone(),
            name: address.key.name.clone(),
            id: address.id.clone(),
            scheduler: scheduler.clone(),
            alarms: alarms.clone(),
            generation: fenced.lease.record.generation().get(),
        };
        let (_, factory) =
            inner
                .classes
                .get(&address.key.class)
                .ok_or_else(|| HostError::UnknownClass {
                    class: address.key.class.clone(),
                })?;
        let instance = factory(&ctx)
            .map_err(|source| HostError::from_factory(address.id.to_string(), source))?;
        // Keep the alarm row (and the index job) at the scheduler's alarm.
        let watcher = tokio::spawn(bridge.clone().watch());
        Ok(OpenObject {
            address: address.clone(),
            generation: fenced.lease.record.generation(),
            record: fenced.lease.record.clone(),
            budget: fenced.budget,
            scheduler,
            alarms,
            bridge,
            instance,
            watcher,
            last_used: AtomicI64::new(inner.clock.now_ms()),
            in_flight: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        })
    }
}
