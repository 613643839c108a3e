//! The object context and the scheduler that multiplexes its one alarm.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use durability_time::{Clock, SystemClock};

use crate::error::SchedulerError;
use crate::schema::{SchemaTarget, migrate_within};
use crate::storage::{SchedulerTx, Storage, StorageError};

/// Longest object ID accepted, in bytes: room for a host's
/// `<storage id>:<class>:<name>` at their limits (128 + 1 + 468 + 1 + 512).
pub const MAX_OBJECT_ID_BYTES: usize = 1110;
/// Longest capability name accepted, in bytes.
pub const MAX_CAPABILITY_NAME_BYTES: usize = 256;

/// The ID of one object (one coordinator, one shard owner …).
///
/// Non-empty, at most [`MAX_OBJECT_ID_BYTES`] bytes of well-formed Unicode
/// (a Rust string), without NUL (PostgreSQL text cannot hold it). Other
/// control characters are allowed: object names are any well-formed
/// Unicode; print an ID with `{:?}` where a log line must stay one line.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(String);

impl ObjectId {
    /// Validates and wraps an object ID.
    ///
    /// # Errors
    /// [`SchedulerError::InvalidObjectId`] when the ID is empty, too long or
    /// holds NUL.
    pub fn new(id: impl Into<String>) -> Result<Self, SchedulerError> {
        let id = id.into();
        let reason = if id.is_empty() {
            Some("must not be empty")
        } else if id.len() > MAX_OBJECT_ID_BYTES {
            Some("must be at most 1110 bytes")
        } else if id.contains('\0') {
            Some("must not contain NUL")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(SchedulerError::InvalidObjectId { reason }),
            None => Ok(Self(id)),
        }
    }

    /// The ID as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Everything an object offers its capabilities: ID, storage and clock.
pub struct ObjectContext<S> {
    id: ObjectId,
    storage: Arc<S>,
    clock: Arc<dyn Clock>,
}

impl<S> fmt::Debug for ObjectContext<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectContext")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl<S> Clone for ObjectContext<S> {
    fn clone(&self) -> Self {
        Self {
            id: self.id.clone(),
            storage: Arc::clone(&self.storage),
            clock: Arc::clone(&self.clock),
        }
    }
}

impl<S: Storage> ObjectContext<S> {
    /// A context on the system clock.
    pub fn new(id: ObjectId, storage: Arc<S>) -> Self {
        Self::with_clock(id, storage, Arc::new(SystemClock))
    }

    /// A context on an injected clock.
    pub fn with_clock(id: ObjectId, storage: Arc<S>, clock: Arc<dyn Clock>) -> Self {
        Self { id, storage, clock }
    }

    /// The object's ID.
    pub fn id(&self) -> &ObjectId {
        &self.id
    }

    /// The object's storage.
    pub fn storage(&self) -> &Arc<S> {
        &self.storage
    }

    /// The object's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }
}

/// Something attached to a scheduler that has work due at stored times.
///
/// A capability records its earliest due time with [`Transaction::set_due`]
/// inside the transaction that changed it; the scheduler keeps the object's
/// alarm at the minimum over all capabilities and calls [`Capability::run`]
/// when the capability's time has come.
pub trait Capability: Send + Sync + 'static {
    /// Runs the work due at `now_ms`. Failures are the capability's to report
    /// and to reschedule; the scheduler only calls.
    fn run(&self, now_ms: i64) -> BoxFuture<'_, ()>;
}

type AfterCommit = Box<dyn FnOnce() + Send>;

/// One transaction of an object, handed to the closure of
/// [`Scheduler::transaction`].
///
/// It dereferences to the backend's transaction (so `tx.sql()`, or any
/// capability's transaction trait, is called on it directly) and owns what
/// the transaction changes beyond its rows: the alarm move to publish to the
/// driver and the callbacks to run after the commit. Both are published only
/// when this transaction commits; when the closure returns an error or
/// panics, they are dropped with the handle, so nothing of a rolled-back
/// transaction is ever published or run, and nothing leaks into the next
/// transaction. Due times can only be set through a handle, so a due time
/// can never be written outside the transaction that owns its alarm.
///
/// ```
/// use durability_scheduler::{Scheduler, Storage, StorageError};
///
/// fn schedule<S: Storage>(scheduler: &Scheduler<S>) -> Result<(), StorageError> {
///     scheduler.transaction(|tx| {
///         tx.set_due("reports", Some(60_000))?;
///         tx.after_commit(|| println!("committed"));
///         Ok(())
///     })
/// }
/// ```
///
/// A raw storage transaction has no way to move the alarm:
///
/// ```compile_fail
/// use durability_scheduler::{Storage, StorageError};
///
/// fn misuse<S: Storage>(storage: &S) -> Result<(), StorageError> {
///     storage.transaction(|tx| tx.set_due("reports", Some(60_000)))
/// }
/// ```
pub struct Transaction<'a, 't, S: Storage + 't> {
    tx: &'a mut S::Tx<'t>,
    /// The alarm this transaction stored, if it moved it.
    alarm: Option<Option<i64>>,
    /// Callbacks to run once this transaction commits.
    after_commit: Vec<AfterCommit>,
    /// Due times read or written through this handle, so staging many
    /// entries in one transaction reads each capability's due time once.
    /// Due times are only written through a handle, so this is exact.
    known_due: Vec<(String, Option<i64>)>,
}

impl<'t, S: Storage> Deref for Transaction<'_, 't, S> {
    type Target = S::Tx<'t>;

    fn deref(&self) -> &Self::Target {
        self.tx
    }
}

impl<S: Storage> DerefMut for Transaction<'_, '_, S> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.tx
    }
}

impl<S: Storage> fmt::Debug for Transaction<'_, '_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transaction")
            .field("alarm", &self.alarm)
            .field("after_commit", &self.after_commit.len())
            .finish_non_exhaustive()
    }
}

impl<'t, S: Storage> Transaction<'_, 't, S> {
    /// The backend transaction, for code that takes it by type.
    pub fn storage_tx(&mut self) -> &mut S::Tx<'t> {
        self.tx
    }

    /// Sets `capability`'s earliest due time and moves the object's alarm,
    /// in this transaction, to the earliest due time over all capabilities.
    /// Writes nothing when the due time is unchanged.
    ///
    /// # Errors
    /// A storage failure; the transaction should roll back.
    pub fn set_due(&mut self, capability: &str, due: Option<i64>) -> Result<(), StorageError> {
        if self.due_of(capability)? == due {
            return Ok(());
        }
        self.tx.set_capability_due(capability, due)?;
        self.remember_due(capability, due);
        self.sync_alarm()
    }

    /// Lowers `capability`'s due time to `due` if that is earlier (a staged
    /// entry due now, say); a no-op otherwise. One read when nothing moves.
    ///
    /// # Errors
    /// A storage failure; the transaction should roll back.
    pub fn lower_due(&mut self, capability: &str, due: i64) -> Result<(), StorageError> {
        match self.due_of(capability)? {
            Some(current) if current <= due => Ok(()),
            _ => {
                self.tx.set_capability_due(capability, Some(due))?;
                self.remember_due(capability, Some(due));
                self.sync_alarm()
            }
        }
    }

    /// A capability's due time: read once per transaction, then known.
    fn due_of(&mut self, capability: &str) -> Result<Option<i64>, StorageError> {
        if let Some((_, due)) = self.known_due.iter().find(|(c, _)| c == capability) {
            return Ok(*due);
        }
        let due = self.tx.capability_due(capability)?;
        self.known_due.push((capability.to_owned(), due));
        Ok(due)
    }

    fn remember_due(&mut self, capability: &str, due: Option<i64>) {
        match self.known_due.iter_mut().find(|(c, _)| c == capability) {
            Some(known) => known.1 = due,
            None => self.known_due.push((capability.to_owned(), due)),
        }
    }

    /// Queues `f` to run once this transaction commits; it is dropped if
    /// the transaction rolls back. Callbacks run in the order queued.
    pub fn after_commit(&mut self, f: impl FnOnce() + Send + 'static) {
        self.after_commit.push(Box::new(f));
    }

    fn sync_alarm(&mut self) -> Result<(), StorageError> {
        let earliest = self.tx.earliest_capability_due()?;
        if self.tx.alarm()? != earliest {
            self.tx.set_alarm(earliest)?;
            self.alarm = Some(earliest);
        }
        Ok(())
    }
}

struct Inner<S> {
    ctx: ObjectContext<S>,
    capabilities: Mutex<BTreeMap<String, Arc<dyn Capability>>>,
    alarm: watch::Sender<Option<i64>>,
    background: Mutex<Vec<JoinHandle<()>>>,
}

/// The object's scheduler: capabilities, the one alarm, background work.
///
/// Cloning shares the same scheduler.
pub struct Scheduler<S> {
    inner: Arc<Inner<S>>,
}

impl<S> fmt::Debug for Scheduler<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("object", &self.inner.ctx.id)
            .finish_non_exhaustive()
    }
}

impl<S> Clone for Scheduler<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<S: Storage> Scheduler<S> {
    /// A scheduler for the object; reads the stored alarm so a driver re-arms
    /// it after a restart.
    ///
    /// # Errors
    /// A storage failure reading the alarm.
    pub fn new(ctx: ObjectContext<S>) -> Result<Self, SchedulerError> {
        let stored = ctx
            .storage
            .transaction(|tx| tx.alarm().map_err(SchedulerError::from))?;
        let (alarm, _) = watch::channel(stored);
        Ok(Self {
            inner: Arc::new(Inner {
                ctx,
                capabilities: Mutex::new(BTreeMap::new()),
                alarm,
                background: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The object context.
    pub fn context(&self) -> &ObjectContext<S> {
        &self.inner.ctx
    }

    /// The current time on the object's clock.
    pub fn now_ms(&self) -> i64 {
        self.inner.ctx.clock.now_ms()
    }

    /// Attaches a capability under a unique name and, when `schema` names
    /// one, applies its schema migrations up to the newest version in one
    /// transaction.
    ///
    /// # Errors
    /// [`SchedulerError::DuplicateCapability`] when the name is taken,
    /// [`SchedulerError::InvalidCapabilityName`] for a bad name, and the
    /// errors of [`crate::migrate`]; nothing is attached or changed then.
    pub fn attach(
        &self,
        name: &str,
        schema: Option<&str>,
        capability: Arc<dyn Capability>,
    ) -> Result<(), SchedulerError> {
        validate_capability_name(name)?;
        let mut caps = lock(&self.inner.capabilities);
        if caps.contains_key(name) {
            return Err(SchedulerError::DuplicateCapability {
                name: name.to_owned(),
            });
        }
        if let Some(schema) = schema {
            let storage = &self.inner.ctx.storage;
            storage.transaction(|tx| {
                migrate_within(storage.as_ref(), tx, schema, &SchemaTarget::Latest)
            })?;
        }
        caps.insert(name.to_owned(), capability);
        Ok(())
    }

    /// Detaches the capability attached under `name`, if any. Its stored due
    /// time stays, so the alarm still wakes the object for its work.
    pub fn detach(&self, name: &str) {
        lock(&self.inner.capabilities).remove(name);
    }

    /// Whether a capability is attached under `name`.
    pub fn is_attached(&self, name: &str) -> bool {
        lock(&self.inner.capabilities).contains_key(name)
    }

    /// Runs `f` in one storage transaction, handing it a [`Transaction`].
    /// When `f` returns `Ok` and the storage commits, the alarm it moved
    /// reaches the driver and its [`Transaction::after_commit`] callbacks
    /// run, in that order; otherwise neither happens.
    ///
    /// # Errors
    /// `f`'s error, or a storage failure.
    pub fn transaction<R, E>(
        &self,
        f: impl FnOnce(&mut Transaction<'_, '_, S>) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<StorageError>,
    {
        let _span = tracing::debug_span!(
            "durability.scheduler.transaction",
            object = %self.inner.ctx.id()
        )
        .entered();
        let (value, alarm, hooks) = self.inner.ctx.storage.transaction(|tx| {
            let mut handle = Transaction {
                tx,
                alarm: None,
                after_commit: Vec::new(),
                known_due: Vec::new(),
            };
            let value = f(&mut handle)?;
            Ok::<_, E>((value, handle.alarm, handle.after_commit))
        })?;
        if let Some(alarm) = alarm {
            self.inner.alarm.send_replace(alarm);
        }
        for hook in hooks {
            hook();
        }
        Ok(value)
    }

    /// The stored alarm, as last committed through this scheduler.
    pub fn alarm_at(&self) -> Option<i64> {
        *self.inner.alarm.borrow()
    }

    /// A receiver that sees every committed alarm change.
    pub fn watch_alarm(&self) -> watch::Receiver<Option<i64>> {
        self.inner.alarm.subscribe()
    }

    /// The object's alarm handler: runs every attached capability whose due
    /// time has come, concurrently, and returns the alarm left afterwards.
    ///
    /// # Errors
    /// A storage failure reading the due times.
    pub async fn alarm(&self) -> Result<Option<i64>, SchedulerError> {
        let now = self.now_ms();
        let caps: Vec<(String, Arc<dyn Capability>)> = lock(&self.inner.capabilities)
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        let due: Vec<Arc<dyn Capability>> = self.transaction(|tx| {
            let mut due = Vec::new();
            for (name, cap) in &caps {
                if tx.capability_due(name)?.is_some_and(|at| at <= now) {
                    due.push(Arc::clone(cap));
                }
            }
            Ok::<_, SchedulerError>(due)
        })?;
        futures::future::join_all(due.iter().map(|cap| cap.run(now))).await;
        let alarm = self
            .inner
            .ctx
            .storage
            .transaction(|tx| tx.alarm().map_err(SchedulerError::from))?;
        Ok(alarm)
    }

    /// Runs `fut` in the background, like a Durable Object's `waitUntil`:
    /// it outlives the call that started it. [`Scheduler::settle`] awaits it.
    pub fn wait_until(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(fut);
        let mut bg = lock(&self.inner.background);
        bg.retain(|h| !h.is_finished());
        bg.push(handle);
    }

    /// Awaits every background task started so far.
    pub async fn settle(&self) {
        loop {
            let handles: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.inner.background));
            if handles.is_empty() {
                return;
            }
            for h in handles {
                let _ = h.await;
            }
        }
    }

    /// Aborts all background work: what an eviction does to in-memory tasks.
    pub fn abort_background(&self) {
        for h in std::mem::take(&mut *lock(&self.inner.background)) {
            h.abort();
        }
    }
}

fn validate_capability_name(name: &str) -> Result<(), SchedulerError> {
    let too_long = "must be at most 256 bytes";
    durability_time::check_name(name, MAX_CAPABILITY_NAME_BYTES, too_long).map_err(|reason| {
        SchedulerError::InvalidCapabilityName {
            name: name.to_owned(),
            reason,
        }
    })
}

impl<S: Storage> Scheduler<S> {
    /// Tells the driver about an alarm read from storage.
    pub(crate) fn publish_alarm(&self, alarm: Option<i64>) {
        self.inner.alarm.send_replace(alarm);
    }
}
