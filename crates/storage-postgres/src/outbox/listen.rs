//! The delivery loop: wakes on `LISTEN/NOTIFY`, on the next due time and on
//! a fallback poll; reconnects its listener after the server restarts.

use std::future::Future;

use durability_outbox::Sink;
use durability_time::{Backoff, Jitter, Random, timeout_at};
use futures::{FutureExt as _, StreamExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

use super::deliver::PgDeliverer;
use super::error::PgOutboxError;

/// The pause after a failed run or connection: 100 ms doubling to 5 s,
/// jittered.
const RECONNECT: Backoff = Backoff::new(100, 5_000).jitter(Jitter::Under(0.5));

/// A live `LISTEN` connection: a message per wake-up; `None` once the
/// connection is gone.
struct Listener {
    wakes: mpsc::Receiver<()>,
    _client: tokio_postgres::Client,
}

impl<T, K> PgDeliverer<T, K>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    K: Sink<T>,
{
    async fn listen(&self) -> Result<Listener, PgOutboxError> {
        let (client, mut connection) = self
            .config
            .connect(NoTls)
            .await
            .map_err(|e| PgOutboxError::Unavailable(Box::new(e)))?;
        let (tx, wakes) = mpsc::channel(1);
        let channel = self.publisher.name().to_owned();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                // A full channel already holds a wake-up.
                if let AsyncMessage::Notification(n) = message
                    && n.payload() == channel
                {
                    let _ = tx.try_send(());
                }
            }
        });
        client
            .batch_execute(&self.outbox.sql.listen)
            .await
            .map_err(PgOutboxError::statement)?;
        Ok(Listener {
            wakes,
            _client: client,
        })
    }

    /// Delivers until `shutdown` completes: at once, then whenever a stage
    /// commits on the channel (`NOTIFY`), when the next entry falls due, or
    /// at the fallback poll. A lost connection is retried with backoff and
    /// a full run follows every reconnection, so nothing staged while the
    /// server was away waits for the poll. Failures are logged
    /// (`durability.storage_postgres.outbox_deliver_failed`), never fatal.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown.fuse());
        let clock = std::sync::Arc::clone(self.publisher.clock());
        let random = Random::os();
        let mut failures = 0_u32;
        let mut listener: Option<Listener> = None;
        loop {
            if listener.is_none() {
                match self.listen().await {
                    Ok(l) => listener = Some(l),
                    Err(error) => self.report(&error, "listener connection failed"),
                }
            }
            let ran = self.deliver_due().await;
            let now = clock.now_ms();
            let wake_at = match (&ran, self.next_due().await) {
                (Ok(_), Ok(next)) if listener.is_some() => {
                    failures = 0;
                    let poll = now.saturating_add(self.poll_ms);
                    next.map_or(poll, |at| at.max(now).min(poll))
                }
                (ran, next) => {
                    if let Some(error) = ran.as_ref().err().or(next.as_ref().err()) {
                        self.report(error, "delivery run failed; entries stay pending");
                    }
                    failures = failures.saturating_add(1);
                    now.saturating_add(RECONNECT.delay_ms(failures, &random))
                }
            };
            let woke = async {
                match listener.as_mut() {
                    Some(l) => l.wakes.recv().await.is_some(),
                    None => std::future::pending().await,
                }
            };
            // Woken by a notification, or the wake-up time passed.
            let waited = timeout_at(&*clock, wake_at, woke).fuse();
            let alive = {
                futures::pin_mut!(waited);
                futures::select! {
                    () = shutdown => return,
                    woke = waited => woke.unwrap_or(true),
                }
            };
            if !alive {
                listener = None;
            }
        }
    }

    fn report(&self, error: &PgOutboxError, what: &str) {
        tracing::warn!(
            event = "durability.storage_postgres.outbox_deliver_failed",
            channel = %self.publisher.name(),
            %error,
            code = error.code(),
            "{what}"
        );
    }
}
