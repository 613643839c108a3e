//! Dispatch and admission: every call, transaction, delete-all, session
//! and alarm delivery is resolved to this host, admitted (task,
//! generation, lease budget, lifecycle), counted in flight and run under
//! the watchdog.

use super::*;
use crate::object::downcast;
use crate::protocol::RequestId;

impl<S, I, O: ObjectStore> Host<S, I, O>
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
{
    /// Runs `work` on the object under admission and the watchdog.
    pub(super) async fn dispatch<R, Fut>(
        &self,
        class: &str,
        name: &str,
        work: impl FnOnce(Arc<OpenObject<I, O::Storage>>, Generation) -> Fut,
    ) -> Result<R, HostError>
    where
        Fut: Future<Output = Result<R, HostError>>,
    {
        self.dispatch_with(class, name, None, work).await
    }

    /// [`Self::dispatch`], refusing with [`HostError::StaleFence`] unless
    /// the object is owned here at `expect` (a route fence).
    pub(super) async fn dispatch_with<R, Fut>(
        &self,
        class: &str,
        name: &str,
        expect: Option<u64>,
        work: impl FnOnce(Arc<OpenObject<I, O::Storage>>, Generation) -> Fut,
    ) -> Result<R, HostError>
    where
        Fut: Future<Output = Result<R, HostError>>,
    {
        // The work runs with the request's context id (a new one for a
        // call that entered without one), so its nested calls carry it.
        let id = RequestId::current_or_new();
        let span = tracing::debug_span!(
            "durability.host.dispatch",
            class,
            object = name,
            request_id = %id
        );
        let admitted = async {
            if !self.running() {
                return Err(self.refuse_draining(class, name, expect));
            }
            let address = self.address(class, name)?;
            // Held to the end of the call: a storage deletion waits for it.
            let store_admission = self.store_admission().await?;
            let (open, token) = self.resolve_open(&address).await?;
            if let Some(g) = expect
                && open.generation.get() != g
            {
                return Err(HostError::StaleFence { generation: g });
            }
            let permit: AdmissionPermit = self
                .inner
                .ownership
                .admit(&address.scope, open.generation)
                .await?;
            open.in_flight.fetch_add(1, Ordering::SeqCst);
            let _busy = Busy(open.as_ref());
            let result = self.run_admitted(&address.scope, &open, &token, work).await;
            drop(permit);
            drop(store_admission);
            result
        };
        let result = id.scope(admitted.instrument(span)).await;
        self.settle(class, name, expect, result).await
    }

    /// What a draining host answers a call: [`HostError::Draining`], or
    /// [`HostError::StaleFence`] for a fence of a scope it no longer holds
    /// at that generation (the caller rediscovers once), or the error of
    /// an object that has no address.
    fn refuse_draining(&self, class: &str, name: &str, expect: Option<u64>) -> HostError {
        let Some(g) = expect else {
            return HostError::Draining;
        };
        let address = match self.address(class, name) {
            Ok(address) => address,
            Err(e) => return e,
        };
        let held = self
            .inner
            .ownership
            .probe()
            .scopes
            .iter()
            .any(|s| s.scope == address.scope.host_id() && s.generation == g);
        if held {
            HostError::Draining
        } else {
            HostError::StaleFence { generation: g }
        }
    }

    /// Runs an admitted call's `work` on `open` under the watchdog,
    /// stamping the object's last use before and after; a call that moved
    /// the object's alarm returns once the alarm index holds the matching
    /// job.
    async fn run_admitted<R, Fut>(
        &self,
        scope: &OwnerScope,
        open: &Arc<OpenObject<I, O::Storage>>,
        token: &CancellationToken,
        work: impl FnOnce(Arc<OpenObject<I, O::Storage>>, Generation) -> Fut,
    ) -> Result<R, HostError>
    where
        Fut: Future<Output = Result<R, HostError>>,
    {
        open.last_used
            .store(self.inner.clock.now_ms(), Ordering::SeqCst);
        let generation = open.generation;
        let alarm_before = open.scheduler.alarm_at();
        let mut result = self
            .watched(scope, generation, token, work(Arc::clone(open), generation))
            .await;
        // A call that moved the object's alarm returns once the alarm index
        // holds the matching job (the seed's setAlarm contract): a crash
        // right after the call cannot lose the pending alarm.
        if open.scheduler.alarm_at() != alarm_before
            && let Err(e) = open.bridge.sync().await
            && result.is_ok()
        {
            result = Err(HostError::Alarm(e));
        }
        open.last_used
            .store(self.inner.clock.now_ms(), Ordering::SeqCst);
        result
    }

    /// A dispatch's end: counts and logs its outcome, drops a scope the
    /// admission proved gone, and turns a refusal of a fenced call for a
    /// generation this task does not own into [`HostError::StaleFence`].
    async fn settle<R>(
        &self,
        class: &str,
        name: &str,
        expect: Option<u64>,
        result: Result<R, HostError>,
    ) -> Result<R, HostError> {
        self.inner.counters.count(&result);
        tracing::debug!(
            event = "durability.host.dispatch",
            class,
            object = name,
            outcome = match &result {
                Ok(_) => "ok",
                Err(e) => e.code(),
            },
            "call dispatched"
        );
        // An admission that proved the scope gone drops it here at once
        // (its objects close), not only at the next renew.
        let code = match &result {
            Err(HostError::Ownership(
                e @ (OwnershipError::StaleOwner { .. }
                | OwnershipError::LeaseExpired { .. }
                | OwnershipError::StorageInactive { .. }
                | OwnershipError::DeleteLocked { .. }),
            )) => Some(e.code()),
            // Another task owns a scope this host still counted as its own.
            Err(HostError::NotOwner { .. }) => Some("stale_owner"),
            _ => None,
        };
        let lost = code.and_then(|code| {
            self.scope_for(class, name)
                .ok()
                .filter(|scope| lock(&self.inner.scopes).contains_key(scope))
                .map(|scope| (scope, code))
        });
        if let Some((scope, code)) = lost {
            self.drop_scope(&scope, code).await;
        }
        // Sent to this task at a generation it does not own: the route
        // fence is stale (a trusted pre-dispatch `stale_owner`).
        match (result, expect) {
            (Err(HostError::NotOwner { .. }), Some(generation)) => {
                Err(HostError::StaleFence { generation })
            }
            (result, _) => result,
        }
    }

    /// Runs `fut` while the watchdog watches the scope; cancels it (drops
    /// it) when ownership moves or the scope is dropped.
    pub(super) async fn watched<R>(
        &self,
        scope: &OwnerScope,
        generation: Generation,
        scope_token: &CancellationToken,
        fut: impl Future<Output = Result<R, HostError>>,
    ) -> Result<R, HostError> {
        let token = scope_token.child_token();
        let watch = self.inner.ownership.watch(scope, generation, token.clone());
        let fut = std::pin::pin!(fut);
        let watch = std::pin::pin!(watch);
        match select(fut, watch).await {
            Either::Left((result, _)) => {
                token.cancel();
                result
            }
            Either::Right((_, _)) => Err(HostError::OwnershipLost {
                scope: scope.to_string(),
            }),
        }
    }

    /// Calls an object of `class` named `name` on this host: resolves its
    /// owner (claiming a free scope), opens it on first use fenced at the
    /// scope's generation, admits the call (task, generation, lease budget,
    /// lifecycle), counts it in flight and runs `body` under the watchdog.
    /// Transactions inside commit through the storage fence.
    ///
    /// # Errors
    /// [`HostError::Draining`], [`HostError::NotOwner`],
    /// [`HostError::Ownership`] (refused before it started),
    /// [`HostError::OwnershipLost`] (cancelled while running),
    /// [`HostError::Fenced`] (the body returned a fence refusal),
    /// [`HostError::Handler`] (the body's own error), and the name, class
    /// and open errors.
    pub async fn call<T, R, F, Fut>(&self, class: &str, name: &str, body: F) -> Result<R, HostError>
    where
        T: Send + Sync + 'static,
        F: FnOnce(Handle<T, I, O::Storage>) -> Fut,
        Fut: Future<Output = Result<R, BoxError>>,
    {
        self.dispatch(class, name, |open, generation| async move {
            let handle = open
                .input(generation)
                .handle::<T>(&open.address.key.class)?;
            body(handle).await.map_err(HostError::from_handler)
        })
        .await
    }

    /// Runs a registered method's body under dispatch (see
    /// [`Self::dispatch_with`]); returns its value and the generation it
    /// ran under.
    pub(crate) async fn dispatch_expect<R, F, Fut>(
        &self,
        class: &str,
        name: &str,
        expect: Option<u64>,
        body: F,
    ) -> Result<(R, u64), HostError>
    where
        F: FnOnce(MethodInput<I, O::Storage>) -> Fut,
        Fut: Future<Output = Result<R, HostError>>,
    {
        self.dispatch_with(class, name, expect, |open, generation| async move {
            let input = open.input(generation);
            let value = body(input).await.map_err(|e| match e {
                HostError::Handler(e) => HostError::from_handler(e),
                other => other,
            })?;
            Ok((value, generation.get()))
        })
        .await
    }

    /// Admits a WebSocket session on an object (see [`crate::connect`]):
    /// the checks of a dispatch ([`Self::dispatch_with`]: running host,
    /// owner at `expect`, admission), then the object's input and a hold
    /// that marks the object busy until the session ends.
    pub(crate) async fn admit_session(
        &self,
        class: &str,
        name: &str,
        expect: Option<u64>,
    ) -> Result<(MethodInput<I, O::Storage>, SessionHold<I, O::Storage>), HostError> {
        let scope = self.scope_for(class, name)?;
        self.dispatch_with(class, name, expect, |open, generation| async move {
            let ended = lock(&self.inner.scopes)
                .get(&scope)
                .filter(|e| e.generation == generation)
                .map(|e| e.token.child_token())
                .ok_or_else(|| HostError::StaleFence {
                    generation: generation.get(),
                })?;
            open.in_flight.fetch_add(1, Ordering::SeqCst);
            let input = open.input(generation);
            let hold = SessionHold {
                open,
                ended,
                stop: self.inner.stop.clone(),
            };
            Ok((input, hold))
        })
        .await
    }

    /// Runs one transaction on an object through the host (admission,
    /// fence, watchdog), like [`Host::call`] with a synchronous body.
    ///
    /// # Errors
    /// As [`Host::call`]; a storage error from the body or the commit is
    /// [`HostError::Fenced`] when the fence refused it, else
    /// [`HostError::Storage`].
    pub async fn transaction<T, R, F>(
        &self,
        class: &str,
        name: &str,
        body: F,
    ) -> Result<R, HostError>
    where
        T: Send + Sync + 'static,
        F: FnOnce(&T, &mut Transaction<'_, '_, O::Storage>) -> Result<R, StorageError>,
    {
        self.dispatch(class, name, |open, _| async move {
            let object = downcast::<T>(&open.instance, &open.address.key.class)?;
            open.scheduler
                .transaction(|tx| body(&object, tx))
                .map_err(HostError::from_storage)
        })
        .await
    }

    /// Deletes one object's storage (Durable Objects' `deleteAll`): the object's
    /// own tables, views and triggers (every name not starting with the
    /// reserved `durability_` or `sqlite_`) are dropped in pages of at most
    /// [`DELETE_PAGE`], each page one transaction through the storage fence;
    /// then, unless [`DeleteAll::keep_alarm`], the due times of the
    /// object's own capabilities are cleared (the outbox's stay: committed
    /// entries are acknowledged work and still deliver), which moves or
    /// removes its alarm and the alarm index job; then the object is closed,
    /// so the next call reopens it (its factory runs on the emptied
    /// storage).
    ///
    /// It is admitted, counted in flight and watched like a call, so a
    /// stale host's delete fails closed at admission or at the first
    /// page's commit, and a drain waits for it.
    ///
    /// Not atomic and best-effort: a failure (or a lost
    /// ownership) leaves the pages already dropped; calling it again
    /// finishes the job. It does not exclude concurrent calls on the same
    /// object, which may write between pages: do not race it with other
    /// writes of the object. Capability state is kept: pending outbox
    /// entries, topology groups, schema versions and the storage fence.
    ///
    /// # Errors
    /// As [`Host::call`]; [`HostError::Fenced`] when a page's commit was
    /// refused, [`HostError::Storage`] when a page failed.
    pub async fn delete_all(
        &self,
        class: &str,
        name: &str,
        options: DeleteAll,
    ) -> Result<DeleteAllReport, HostError> {
        let (report, open) = self
            .dispatch(class, name, |open, _| async move {
                let mut report = DeleteAllReport::default();
                loop {
                    let (page, more) = open
                        .scheduler
                        .transaction(|tx| O::drop_own_page(tx.storage_tx(), DELETE_PAGE))
                        .map_err(HostError::from_storage)?;
                    report.pages += 1;
                    report.dropped.extend(page);
                    if !more {
                        break;
                    }
                    // Between pages the watchdog may cancel the delete.
                    tokio::task::yield_now().await;
                }
                if !options.keep_alarm {
                    report.cancelled_due = open
                        .scheduler
                        .transaction(|tx| {
                            let mut cleared = Vec::new();
                            for capability in O::due_capabilities(tx.storage_tx())? {
                                if !capability.starts_with("outbox:") {
                                    tx.set_due(&capability, None)?;
                                    cleared.push(capability);
                                }
                            }
                            Ok::<_, StorageError>(cleared)
                        })
                        .map_err(HostError::from_storage)?;
                }
                Ok((report, open))
            })
            .await?;
        // Close the object (when the registry still holds this opening), so
        // its instance is rebuilt on the emptied storage.
        let slot = self.slot(&open.address);
        {
            let mut guard = slot.lock().await;
            if guard.as_ref().is_some_and(|o| Arc::ptr_eq(o, &open))
                && let Some(o) = guard.take()
            {
                o.close();
            }
        }
        drop(slot);
        self.prune_slots();
        tracing::info!(
            event = "durability.host.storage_delete_all",
            object = %open.address.id,
            dropped = report.dropped.len(),
            pages = report.pages,
            cancelled_due = report.cancelled_due.len(),
            "object storage deleted"
        );
        Ok(report)
    }

    /// Delivers an alarm on this host (the local side of the owner-routed
    /// dispatch: already admitted there).
    pub(super) async fn deliver(&self, delivery: Delivery) -> DispatchOutcome {
        let id = RequestId::current_or_new();
        let span = tracing::debug_span!(
            "durability.host.alarm_delivery",
            object = %delivery.object,
            attempt = delivery.attempt,
            request_id = %id
        );
        id.scope(self.deliver_inner(delivery).instrument(span))
            .await
    }

    pub(super) async fn deliver_inner(&self, delivery: Delivery) -> DispatchOutcome {
        let object = delivery.object.to_string();
        let Some((storage, (class, name))) = object
            .split_once(':')
            .and_then(|(storage, rest)| Some((storage, rest.split_once(':')?)))
        else {
            return DispatchOutcome::Failed {
                reason: format!("object id {object} is not <storage>:<class>:<name>"),
            };
        };
        if storage != self.inner.storage_id.as_str() {
            // Another storage id's job (an old deployment's): this host never
            // opens its objects; the owner path found it admitted, so its
            // storage cannot be the active one for long. Discard it.
            return DispatchOutcome::Gone;
        }
        // Held to the end of the delivery, as a call's (a deletion waits
        // for it; a tombstoned storage id's job is gone).
        let store_admission = match self.store_admission().await {
            Ok(admission) => admission,
            Err(HostError::Ownership(OwnershipError::StorageInactive { .. })) => {
                return DispatchOutcome::Gone;
            }
            Err(e) => {
                return DispatchOutcome::NeverStarted {
                    reason: e.to_string(),
                };
            }
        };
        let outcome = match self.address(class, name) {
            Err(e) => DispatchOutcome::Failed {
                reason: e.to_string(),
            },
            Ok(address) => match self.resolve_open(&address).await {
                Err(HostError::Ownership(
                    OwnershipError::StorageInactive { .. } | OwnershipError::DeleteLocked { .. },
                )) => DispatchOutcome::Gone,
                Err(e @ HostError::Factory { .. }) => DispatchOutcome::Failed {
                    reason: e.to_string(),
                },
                Err(e) => DispatchOutcome::NeverStarted {
                    reason: e.to_string(),
                },
                Ok((open, token)) => {
                    open.in_flight.fetch_add(1, Ordering::SeqCst);
                    let _busy = Busy(open.as_ref());
                    open.last_used
                        .store(self.inner.clock.now_ms(), Ordering::SeqCst);
                    let run = async {
                        Ok::<_, HostError>(open.alarms.deliver(&delivery, &open.bridge).await)
                    };
                    match self
                        .watched(&address.scope, open.generation, &token, run)
                        .await
                    {
                        Ok(outcome) => outcome,
                        Err(e) => DispatchOutcome::Unknown {
                            reason: e.to_string(),
                        },
                    }
                }
            },
        };
        drop(store_admission);
        tracing::debug!(
            event = "durability.host.alarm_executed",
            object = %delivery.object,
            attempt = delivery.attempt,
            outcome = ?outcome,
            "alarm delivery ran on this host"
        );
        outcome
    }
}

impl<I, D> OpenObject<I, D> {
    /// What a registered handler gets of this object, admitted at
    /// `generation`.
    fn input(&self, generation: Generation) -> MethodInput<I, D> {
        MethodInput {
            instance: Arc::clone(&self.instance),
            scheduler: self.scheduler.clone(),
            alarms: self.alarms.clone(),
            generation: generation.get(),
        }
    }
}
