//! Seed 000's own example on the host: a coordinator object whose state
//! channel `limits` delivers a [`Limits`] value to member objects by name.
//!
//! - `LimitsCoordinator.set_limits` sets a group's members and limits in
//!   one transaction of the coordinator (the topology's group row, the
//!   state value and one staged delivery per active member, each its own
//!   outbox key retried on its own).
//! - A delivery is a call of `LimitsMember.apply_limits` through the host,
//!   wherever the member is owned; a failed or unknown delivery is
//!   retried with the same or a newer version.
//! - A member applies a delivery only when its version is newer than the
//!   one it applied (in the same transaction as the value), so a late or
//!   repeated delivery never rolls it back: members converge to the
//!   coordinator's latest value.

use std::sync::Arc;

use durability_host::{BoxError, Class, ObjectCtx, validate_object_name};
use durability_scheduler::{Scheduler, StorageError, Transaction};
use durability_topology::{
    ChannelKey, Draft, Member, MemberInput, StateChannel, Topology, TopologyConfig, TypedUpdate,
};

use crate::HostSlot;
use crate::api::{AppliedLimits, ApplyLimits, Limits, LimitsSet, SetLimits, refuse};
use crate::order::{Db, MAX_CENTS, pg};

/// The coordinator's class name.
pub const COORDINATOR: &str = "LimitsCoordinator";
/// The members' class name.
pub const MEMBER: &str = "LimitsMember";
/// The state channel.
pub const LIMITS: ChannelKey<Limits> = ChannelKey::new("limits");
/// The most members of a group.
pub const MAX_MEMBERS: usize = 64;

/// A coordinator object.
pub struct LimitsCoordinator {
    topology: Topology<Db>,
}

impl Class for LimitsCoordinator {
    const NAME: &'static str = COORDINATOR;
}

impl LimitsCoordinator {
    /// The class factory: the topology attached to the object's scheduler,
    /// its `limits` channel delivering through the host.
    ///
    /// # Errors
    /// A storage or topology error.
    pub fn open<I>(ctx: &ObjectCtx<I, Db>, host: HostSlot) -> Result<Self, BoxError> {
        let deliver = move |member: Member, update: TypedUpdate<Limits>| {
            let host = Arc::clone(&host);
            async move {
                let host = host.get().ok_or("the host is not started yet")?;
                let apply = ApplyLimits {
                    group: update.group,
                    version: update.version,
                    limits: update.value,
                };
                let _: AppliedLimits = host.object::<LimitsMember>(&member.id).call(apply).await?;
                Ok::<(), BoxError>(())
            }
        };
        let channel = StateChannel::typed(&LIMITS, deliver)
            .attempt_timeout_ms(10_000)
            .retry_delay(Arc::new(|attempt| {
                f64::from(200_u32.saturating_mul(attempt.min(10)))
            }));
        let topology = Topology::attach(
            &ctx.scheduler,
            TopologyConfig::new().channel(&LIMITS, channel),
        )?;
        Ok(Self { topology })
    }

    /// Sets the group's members and limits (see [`SetLimits`]); a bad
    /// value is `invalid_limits` and writes nothing.
    ///
    /// # Errors
    /// A refusal, a topology or storage error (nothing committed).
    pub async fn set_limits(&self, args: SetLimits) -> Result<LimitsSet, BoxError> {
        let bad = |why: String| Err(refuse("invalid_limits", why));
        if args.limits.rps == 0 || !(1..=MAX_CENTS).contains(&args.limits.max_order_cents) {
            return bad(format!(
                "rps must be positive and max_order_cents in 1..={MAX_CENTS}"
            ));
        }
        if args.members.is_empty() || args.members.len() > MAX_MEMBERS {
            return bad(format!("1..={MAX_MEMBERS} members"));
        }
        if let Some(e) = args
            .members
            .iter()
            .find_map(|m| validate_object_name(m).err())
        {
            return bad(e.to_string());
        }
        let members = args.members.clone();
        let limits = args.limits.clone();
        let out = self
            .topology
            .update(&args.group, move |_| {
                Draft::new()
                    .members(members.into_iter().map(MemberInput::active))
                    .set(&LIMITS, &limits)
            })
            .await?;
        Ok(LimitsSet {
            topology_version: out.snapshot.version,
        })
    }

    /// Deliveries not yet acknowledged by their member.
    ///
    /// # Errors
    /// A storage error.
    pub fn pending(&self) -> Result<u64, BoxError> {
        Ok(self.topology.pending()?)
    }
}

/// A member object: the limits it applied, per group.
pub struct LimitsMember {
    scheduler: Scheduler<Db>,
}

impl Class for LimitsMember {
    const NAME: &'static str = MEMBER;
}

impl LimitsMember {
    /// The class factory: the member's table.
    ///
    /// # Errors
    /// A storage error.
    pub fn open<I>(ctx: &ObjectCtx<I, Db>) -> Result<Self, BoxError> {
        ctx.scheduler.transaction(|tx| {
            tx.sql().batch_execute(
                "CREATE TABLE IF NOT EXISTS member_limits (
                     grp TEXT PRIMARY KEY,
                     version BIGINT NOT NULL,
                     limits TEXT NOT NULL
                 )",
            )
        })?;
        Ok(Self {
            scheduler: ctx.scheduler.clone(),
        })
    }

    /// Applies `args` if its version is newer than the group's applied one;
    /// answers what is applied after the call.
    ///
    /// # Errors
    /// A storage error (nothing applied); a stored row that does not
    /// decode is `Corrupt`.
    pub fn apply(&self, args: &ApplyLimits) -> Result<AppliedLimits, BoxError> {
        let version = i64::try_from(args.version)
            .map_err(|_| refuse("invalid_limits", "version out of range"))?;
        let text = serde_json::to_string(&args.limits)?;
        self.scheduler.transaction(|tx| {
            let changed = tx.sql().execute(
                "INSERT INTO member_limits (grp, version, limits) VALUES ($1, $2, $3)
                 ON CONFLICT (grp) DO UPDATE SET version = excluded.version, limits = excluded.limits
                 WHERE member_limits.version < excluded.version",
                &[&args.group, &version, &text],
            )?;
            let mut now = read(tx)?
                .into_iter()
                .find(|a| a.group == args.group)
                .ok_or_else(|| StorageError::corrupt("the applied limits vanished"))?;
            now.applied = changed == 1;
            Ok(now)
        })
    }

    /// The limits applied, per group.
    ///
    /// # Errors
    /// A storage error; a row that does not decode is `Corrupt`.
    pub fn applied(&self) -> Result<Vec<AppliedLimits>, BoxError> {
        self.scheduler
            .transaction(|tx| read(tx).map_err(BoxError::from))
    }
}

fn read(tx: &mut Transaction<'_, '_, Db>) -> Result<Vec<AppliedLimits>, StorageError> {
    let rows = tx.sql().query(
        "SELECT grp, version, limits FROM member_limits ORDER BY grp",
        &[],
    )?;
    rows.iter()
        .map(|row| {
            let version: i64 = row.try_get(1).map_err(pg("member version"))?;
            let text: String = row.try_get(2).map_err(pg("member limits"))?;
            Ok(AppliedLimits {
                group: row.try_get(0).map_err(pg("member group"))?,
                version: u64::try_from(version)
                    .map_err(|_| StorageError::corrupt(format!("member version {version}")))?,
                limits: serde_json::from_str(&text)
                    .map_err(|e| StorageError::corrupt(format!("member limits: {e}")))?,
                applied: false,
            })
        })
        .collect()
}
