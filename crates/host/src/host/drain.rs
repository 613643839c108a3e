//! Drain: stop new ownership, reject new work, stop the dispatcher, wait
//! for admitted work, release the leases, within the drain budgets.

use super::*;

impl<S, I, O: ObjectStore> Host<S, I, O>
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
{
    /// Drains: stops new ownership (the owner loop ends), rejects new work,
    /// stops the alarm dispatcher (its held claims are released at once),
    /// waits up to `DO_DRAIN_IN_FLIGHT_TIMEOUT_MS` for admitted work, then
    /// releases the leases of matching generations so another host can
    /// claim them at once, all within `DO_DRAIN_TIMEOUT_MS`. A drain that
    /// runs out of time keeps its leases (failover waits for their expiry).
    /// Objects are closed afterwards. Calling it again returns an empty
    /// report.
    pub async fn shutdown(&self) -> DrainReport {
        let inner = &self.inner;
        let started = inner.clock.now_ms();
        let _ = inner
            .state
            .compare_exchange(RUNNING, DRAINING, Ordering::SeqCst, Ordering::SeqCst);
        tracing::info!(
            event = "durability.host.drain_started",
            in_flight = inner.ownership.in_flight(),
            "drain started"
        );
        inner.stop.cancel();
        if let Some(d) = inner.dispatcher.get() {
            d.stop();
        }
        let report = inner.ownership.drain().await;
        self.withdraw_presence().await;
        let deadline = started.saturating_add(
            i64::try_from(inner.settings.ownership.drain_timeout_ms).unwrap_or(i64::MAX),
        );
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&inner.tasks));
        for task in tasks {
            let abort = task.abort_handle();
            if timeout_at(&inner.clock, deadline, task).await.is_err() {
                abort.abort();
            }
        }
        self.close_where(|_| true).await;
        let released: Vec<(OwnerScope, Generation)> = match &report {
            DrainReport::Drained { released, .. }
            | DrainReport::ReleaseTimedOut { released, .. } => released.clone(),
            _ => Vec::new(),
        };
        {
            let mut scopes = lock(&inner.scopes);
            for (scope, _) in &released {
                if let Some(e) = scopes.remove(scope) {
                    e.token.cancel();
                }
            }
        }
        for (scope, generation) in &released {
            let _ = inner.events.send(OwnerEvent::Released {
                scope: scope.to_string(),
                generation: generation.get(),
            });
        }
        inner.state.store(STOPPED, Ordering::SeqCst);
        tracing::info!(
            event = "durability.host.drained",
            released = released.len(),
            timed_out = report.timed_out(),
            "drain finished"
        );
        report
    }

    /// Removes this host's presence records (balanced classes), so the
    /// other hosts count it gone at once and take the shards its drain
    /// released. A store error leaves them to expire.
    async fn withdraw_presence(&self) {
        let inner = &self.inner;
        for (balanced, scopes) in self.target_classes().into_values() {
            let Some(scope) = scopes.first().filter(|_| balanced) else {
                continue;
            };
            let group = durability_ownership::PresenceGroup::of(scope);
            if let Err(e) = inner
                .ownership
                .store()
                .withdraw(&group, inner.ownership.task())
                .await
            {
                tracing::debug!(
                    event = "durability.host.presence_failed",
                    class = %scope.class().as_str(),
                    code = e.code(),
                    "withdrawing the presence record failed; it expires"
                );
            }
        }
    }

    /// Waits for SIGTERM or ctrl-c, then drains ([`Host::shutdown`]).
    pub async fn run_until_signal(&self) -> DrainReport {
        tokio::select! {
            () = shutdown_signal() => {}
            () = self.inner.fatal.cancelled() => {}
        }
        self.shutdown().await
    }

    /// Why this host stopped on its own, if it did: another live process
    /// runs under its task id (`duplicate_task_id`, found by the owner
    /// loop). The host then claims and renews nothing more, and
    /// [`Host::run_until_signal`] drains it at once; check this after it
    /// returns to exit with the error.
    pub fn failed(&self) -> Option<HostError> {
        self.inner
            .ownership
            .duplicate_task()
            .map(HostError::Ownership)
    }
}

/// Resolves when the process gets SIGTERM or ctrl-c (SIGINT).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                return;
            }
            Err(error) => tracing::warn!(
                event = "durability.host.signal_unavailable",
                %error,
                "cannot listen for SIGTERM; waiting for ctrl-c only"
            ),
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
