//! Fencing an object at a claim, whatever the lease store lost.
//!
//! A lease store that loses its data (a Redis `FLUSHALL`, a restart of a
//! Redis without persistence, a restored backup) starts its generation
//! counters again from zero, so claims hand out generations that object
//! fences have already accepted. An object fence records *who* holds its
//! generation (the exact owner record bytes), so an equal generation from
//! another claim is refused, and [`fence_with_floor`] turns that refusal into
//! a fresh claim above the fence: it raises the store's generation floor to
//! the fenced generation, gives the claim up and claims again. Every object
//! opened through it therefore gets a generation above every generation its
//! fence accepted; an object never opened again keeps its fence, which
//! refuses every stale writer.
//!
//! [`LeaseBudget`] is the local half: a deadline on the local monotonic
//! clock that the object storage reads through [`BudgetCheck`] right before
//! it commits, so a holder paused inside a transaction past its lease rolls
//! back instead of committing late.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use durability_time::Clock;

use crate::error::OwnershipError;
use crate::manager::{Ownership, Resolution};
use crate::record::{Generation, OwnerRecord};
use crate::scope::{LifecycleId, OwnerScope};
use crate::store::{ClaimOutcome, Lease, LeaseStore};

/// How many times [`fence_with_floor`] raises the floor and claims again
/// before giving up with [`OwnershipError::OwnerRace`].
pub const MAX_FLOOR_ROUNDS: usize = 4;

/// An object storage that fences its commits to one claim.
pub trait ObjectFence {
    /// Records `record` as the holder of the object's fence for its scope
    /// (the fence only rises), and from then on refuses every commit not
    /// made under exactly this claim. `budget`, when given, is checked right
    /// before every commit.
    ///
    /// # Errors
    /// [`OwnershipError::StaleGeneration`] (nothing written) when the fence
    /// holds a higher generation, or the same generation from another
    /// claim; `stored` names the fenced generation. Other errors as the
    /// backend reports them ([`OwnershipError::OwnerRace`] when the object
    /// database is locked by another writer past its busy timeout).
    fn fence_claim(
        &self,
        record: &OwnerRecord,
        budget: Option<Arc<dyn BudgetCheck>>,
    ) -> Result<(), OwnershipError>;
}

/// A check an object storage runs right before its commit system call.
pub trait BudgetCheck: Send + Sync + 'static {
    /// Whether the lease budget is spent: the storage then rolls back.
    fn spent(&self) -> bool;
}

/// A lease deadline on the local monotonic clock.
///
/// Built from a [`Lease`] and the local time read *before* the store was
/// asked (so network delay only shortens it), minus a guard. Renewals move
/// the deadline with [`LeaseBudget::renewed`].
pub struct LeaseBudget {
    clock: Arc<dyn Clock>,
    deadline_ms: AtomicI64,
    guard_ms: i64,
}

impl std::fmt::Debug for LeaseBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseBudget")
            .field("deadline_ms", &self.deadline_ms.load(Ordering::Acquire))
            .field("guard_ms", &self.guard_ms)
            .finish_non_exhaustive()
    }
}

fn deadline(asked_at_ms: i64, lease: &Lease, guard_ms: i64) -> i64 {
    let remaining = i64::try_from(lease.remaining_ms).unwrap_or(i64::MAX);
    asked_at_ms
        .saturating_add(remaining)
        .saturating_sub(guard_ms)
}

impl LeaseBudget {
    /// The budget of `lease`, asked for at local time `asked_at_ms`, spent
    /// `guard_ms` before the lease ends.
    pub fn new(clock: Arc<dyn Clock>, asked_at_ms: i64, lease: &Lease, guard_ms: u64) -> Self {
        let guard_ms = i64::try_from(guard_ms).unwrap_or(i64::MAX);
        Self {
            clock,
            deadline_ms: AtomicI64::new(deadline(asked_at_ms, lease, guard_ms)),
            guard_ms,
        }
    }

    /// Moves the deadline after a renew asked for at local time
    /// `asked_at_ms` (never backwards).
    pub fn renewed(&self, asked_at_ms: i64, lease: &Lease) {
        self.deadline_ms.fetch_max(
            deadline(asked_at_ms, lease, self.guard_ms),
            Ordering::AcqRel,
        );
    }

    /// Milliseconds left before the budget is spent (0 when spent).
    pub fn remaining_ms(&self) -> u64 {
        let left = self.deadline_ms.load(Ordering::Acquire) - self.clock.now_ms();
        u64::try_from(left).unwrap_or(0)
    }
}

impl BudgetCheck for LeaseBudget {
    fn spent(&self) -> bool {
        self.remaining_ms() == 0
    }
}

/// What [`fence_with_floor`] needs besides the store and the fence.
#[derive(Clone)]
pub struct FloorSettings {
    /// The local clock the lease budget runs on.
    pub clock: Arc<dyn Clock>,
    /// The lease of a claim made again, in milliseconds.
    pub ttl_ms: u64,
    /// How long before the lease ends the budget is spent
    /// (`DO_OWNER_LEASE_GUARD_MS`, default 1000).
    pub guard_ms: u64,
}

durability_time::debug_fields!(FloorSettings { ttl_ms, guard_ms });

/// An object fenced at a claim.
#[derive(Debug, Clone)]
pub struct Fenced {
    /// The claim the object is fenced at (possibly a new claim: use it).
    pub lease: Lease,
    /// Its budget, checked by the object storage before every commit; move
    /// it with [`LeaseBudget::renewed`] after each renew.
    pub budget: Arc<LeaseBudget>,
}

/// Fences `fence` at the claim `lease` (asked for at local time
/// `asked_at_ms`), raising the lease store's generation floor first when
/// the fence is ahead of the store.
///
/// Call it when an object is opened for a claim, before anything is
/// dispatched to it. When the fence holds a generation `f` at least the
/// claimed one from another claim, it raises the store's floor to `f`
/// ([`LeaseStore::raise_generation_floor`]), releases exactly the claimed
/// record, claims again (so the new claim's generation is above `f`) and
/// fences again, at most [`MAX_FLOOR_ROUNDS`] times. The fence gets the
/// claim's [`LeaseBudget`] to check before every commit.
///
/// # Errors
/// [`OwnershipError::StaleOwner`] when another task claimed the scope while
/// the claim was given up; [`OwnershipError::OwnerRace`] after
/// [`MAX_FLOOR_ROUNDS`]; any error of the fence or the store.
pub async fn fence_with_floor<S, F>(
    store: &S,
    fence: &F,
    settings: &FloorSettings,
    mut lease: Lease,
    mut asked_at_ms: i64,
) -> Result<Fenced, OwnershipError>
where
    S: LeaseStore,
    F: ObjectFence + Sync + ?Sized,
{
    for _ in 0..MAX_FLOOR_ROUNDS {
        let record = lease.record.clone();
        let scope = record.scope();
        let budget = Arc::new(LeaseBudget::new(
            Arc::clone(&settings.clock),
            asked_at_ms,
            &lease,
            settings.guard_ms,
        ));
        let check: Arc<dyn BudgetCheck> = budget.clone();
        match fence.fence_claim(&record, Some(check)) {
            Ok(()) => return Ok(Fenced { lease, budget }),
            Err(OwnershipError::StaleGeneration { stored, .. }) => {
                let floor = Generation::new(stored)?;
                let counter = store.raise_generation_floor(scope, floor).await?;
                tracing::warn!(
                    event = "durability.ownership.generation_floor_raised",
                    scope = %scope,
                    claimed = record.generation().get(),
                    fenced = stored,
                    counter,
                    "object fence is ahead of the lease store: raised the generation floor and claiming again"
                );
                store.release(&record).await?;
                asked_at_ms = settings.clock.now_ms();
                match store
                    .claim(scope, record.lifecycle(), record.task(), settings.ttl_ms)
                    .await?
                {
                    ClaimOutcome::Claimed(next) => lease = next,
                    ClaimOutcome::Held(_) => {
                        return Err(OwnershipError::StaleOwner {
                            scope: scope.to_string(),
                        });
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(OwnershipError::OwnerRace {
        scope: lease.record.scope().to_string(),
    })
}

/// The host's hook: open an object of a locally owned scope through the
/// floor procedure (a separate `impl` block over the public API of
/// [`Ownership`]).
impl<S: LeaseStore, C: Clock> Ownership<S, C> {
    /// Resolves `scope` to a local claim (claiming it if free), then fences
    /// `fence` at that claim through [`fence_with_floor`], before anything
    /// is dispatched to the object. When the procedure ended at a new claim
    /// (the fence was ahead of the store), the local lease is replaced by it,
    /// so [`Ownership::resolve`] and [`Ownership::admit`] use the new
    /// generation from then on. `clock` is the clock the budget runs on
    /// (give the one this `Ownership` was built with).
    ///
    /// # Errors
    /// [`OwnershipError::StaleOwner`] when another task owns the scope (or
    /// took it while the claim was given up); the errors of
    /// [`Ownership::resolve`] and [`fence_with_floor`].
    pub async fn open_fenced<F>(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
        fence: &F,
        clock: Arc<dyn Clock>,
    ) -> Result<Fenced, OwnershipError>
    where
        F: ObjectFence + Sync + ?Sized,
    {
        let stale = || OwnershipError::StaleOwner {
            scope: scope.to_string(),
        };
        let Resolution::Local(generation) = self.resolve(scope, lifecycle).await? else {
            return Err(stale());
        };
        // The lease as the store reports it now, asked for at `asked_at`.
        let asked_at = clock.now_ms();
        let lease = self
            .store()
            .snapshot(scope, lifecycle)
            .await?
            .owner
            .filter(|l| l.record.task() == self.task() && l.record.generation() == generation)
            .ok_or_else(stale)?;
        let settings = FloorSettings {
            clock,
            ttl_ms: self.settings().owner_ttl_ms,
            // The guard admission uses: never more than half the TTL.
            guard_ms: self
                .settings()
                .lease_guard_ms
                .min(self.settings().owner_ttl_ms / 2),
        };
        let result = fence_with_floor(self.store(), fence, &settings, lease, asked_at).await;
        let moved = match &result {
            Ok(f) => f.lease.record.generation() != generation,
            Err(_) => true,
        };
        if moved {
            // The local lease names a record the procedure gave up: take the
            // store's word again (a claim of this task is adopted).
            self.forget(scope);
            if let Ok(f) = &result {
                // The procedure's claim is this process's record.
                self.wrote(&f.lease.record);
                match self.resolve(scope, lifecycle).await? {
                    Resolution::Local(g) if g == f.lease.record.generation() => {}
                    _ => return Err(stale()),
                }
            }
        }
        result
    }
}
