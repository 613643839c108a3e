//! Balanced shard ownership: presence records and the balancing decision.
//!
//! Every host of a class keeps a *presence record* on the lease store
//! ([`LeaseStore::announce`](crate::LeaseStore::announce)): its task id, the
//! shards of the class it holds ([`encode_presence`]), and a lease on the
//! store's clock, renewed every owner cycle. The unexpired records are the
//! live hosts ([`LeaseStore::live_tasks`](crate::LeaseStore::live_tasks)):
//! no coordinator but the store.
//!
//! [`decide`] is a pure function from one host's observations to what it
//! does this cycle: which free shards it claims and which of its own it
//! hands off. [`Balancer`] keeps the little state the rules need between
//! cycles (how long the live set was stable, how long each shard was held).
//!
//! The rules, and the invariants they keep:
//!
//! - **Share.** With `n` live hosts (sorted by task id) and `t` shards, the
//!   host of rank `i` has a share of `t / n`, plus one when `i < t % n`:
//!   shares differ by at most one and sum to `t`.
//! - **Claim.** A host below its share claims shards no live host announces,
//!   up to its share (a dead host's shards look free once its presence
//!   expired; the claim itself fails until its lease expired too, so fences
//!   and generations work exactly as for any claim). Shards are tried from an
//!   offset that depends on the rank, so joiners rarely contend.
//! - **Hand off.** A host above its share hands off its excess only when
//!   (a) the live set was unchanged for [`BalanceRules::stable_cycles`]
//!   cycles, (b) some live host is below its share by more than the free
//!   shards can cover, and (c) the shard was held for at least
//!   [`BalanceRules::min_hold_cycles`] cycles. Over-share hosts cover the
//!   deficit in rank order, so two of them never both hand off for one gap.
//! - **No flapping.** A handed-off shard is only claimed by a host below its
//!   share, which then keeps it for the minimum hold; a host never hands off
//!   to rise above nor claims to rise above its share, so once every host
//!   holds its share nothing moves until the live set changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::OwnershipError;
use crate::scope::{ShardCount, TaskId};

/// The presence record format's version (its first byte).
pub const PRESENCE_VERSION: u8 = b'1';

/// The largest presence value a store accepts, in bytes.
pub const MAX_PRESENCE_BYTES: usize = 8_192;

/// Encodes the held shards of a presence record: `1;` then the shard
/// numbers, ascending, comma-separated.
pub fn encode_presence(held: &[u32]) -> Vec<u8> {
    let mut sorted: Vec<u32> = held.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let list: Vec<String> = sorted.iter().map(u32::to_string).collect();
    format!("{};{}", PRESENCE_VERSION as char, list.join(",")).into_bytes()
}

/// Decodes a presence value strictly: the version, then ascending distinct
/// shard numbers below `count`.
///
/// # Errors
/// [`OwnershipError::InvalidInput`] (`presence record`) for anything else.
pub fn decode_presence(raw: &[u8], count: ShardCount) -> Result<Vec<u32>, OwnershipError> {
    let bad = |reason: &str| OwnershipError::invalid("presence record", reason);
    let text = std::str::from_utf8(raw).map_err(|_| bad("not UTF-8"))?;
    let list = text
        .strip_prefix(&format!("{};", PRESENCE_VERSION as char))
        .ok_or_else(|| bad("unknown version"))?;
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let mut out: Vec<u32> = Vec::new();
    for part in list.split(',') {
        let shard = part
            .parse::<u32>()
            .ok()
            .filter(|s| *s < count.get() && (part == "0" || !part.starts_with('0')))
            .ok_or_else(|| bad("shard number out of range or not canonical"))?;
        if out.last().is_some_and(|last| *last >= shard) {
            return Err(bad("shard numbers not ascending"));
        }
        out.push(shard);
    }
    Ok(out)
}

/// The share of `me` among `live` (sorted, deduplicated by the caller or
/// not: this sorts) over `total` shards: `total / n`, plus one for the first
/// `total % n` task ids in order. `None` when `me` is not in `live`.
pub fn share_of(me: &TaskId, live: &[TaskId], total: usize) -> Option<usize> {
    let sorted: BTreeSet<&TaskId> = live.iter().collect();
    let rank = sorted.iter().position(|t| *t == me)?;
    Some(share_at(rank, sorted.len(), total))
}

fn share_at(rank: usize, n: usize, total: usize) -> usize {
    total / n + usize::from(rank < total % n)
}

/// The anti-flapping rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalanceRules {
    /// Cycles the live set must stay unchanged before anything is handed off.
    pub stable_cycles: u32,
    /// Cycles a shard must have been held before it is handed off.
    pub min_hold_cycles: u32,
}

impl Default for BalanceRules {
    /// Two stable cycles, two cycles held.
    fn default() -> Self {
        Self {
            stable_cycles: 2,
            min_hold_cycles: 2,
        }
    }
}

/// One shard this host holds, with the cycles it has been held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldShard {
    /// The shard number.
    pub shard: u32,
    /// Owner cycles since this host acquired it.
    pub held_cycles: u32,
}

/// Another live host as its presence record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its task id.
    pub task: TaskId,
    /// The shards it announced, or `None` when its record could not be
    /// decoded (it counts as live; its shards and needs are unknown).
    pub held: Option<Vec<u32>>,
}

/// What one host observed this cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceView<'a> {
    /// This host.
    pub me: &'a TaskId,
    /// Every shard of the class this host may own.
    pub shards: &'a [u32],
    /// The other live hosts (this host is added if missing).
    pub peers: &'a [Peer],
    /// The shards this host holds.
    pub held: &'a [HeldShard],
    /// Consecutive cycles the live set has been what it is now (1: it
    /// changed this cycle).
    pub stable_cycles: u32,
}

/// What a host does this cycle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BalanceDecision {
    /// This host's share of the shards.
    pub share: usize,
    /// Free shards to claim, in the order to try them.
    pub claim: Vec<u32>,
    /// Held shards to hand off (drain, then release).
    pub hand_off: Vec<u32>,
}

/// The balancing decision of one host for one cycle (see the module docs).
pub fn decide(view: &BalanceView<'_>, rules: BalanceRules) -> BalanceDecision {
    let mut live: BTreeMap<&TaskId, Option<usize>> = view
        .peers
        .iter()
        .filter(|p| &p.task != view.me)
        .map(|p| (&p.task, p.held.as_ref().map(Vec::len)))
        .collect();
    live.insert(view.me, Some(view.held.len()));
    let n = live.len();
    let total = view.shards.len();
    let rank = live.keys().position(|t| *t == view.me).unwrap_or(0);
    let share = share_at(rank, n, total);
    let mine: BTreeSet<u32> = view.held.iter().map(|h| h.shard).collect();
    let announced: BTreeSet<u32> = view
        .peers
        .iter()
        .filter(|p| &p.task != view.me)
        .filter_map(|p| p.held.as_ref())
        .flatten()
        .copied()
        .collect();
    let free: Vec<u32> = view
        .shards
        .iter()
        .copied()
        .filter(|s| !mine.contains(s) && !announced.contains(s))
        .collect();
    let mut decision = BalanceDecision {
        share,
        ..BalanceDecision::default()
    };
    let held = view.held.len();
    if held < share {
        let offset = if free.is_empty() {
            0
        } else {
            rank * free.len() / n
        };
        decision.claim = free
            .iter()
            .cycle()
            .skip(offset)
            .take(free.len().min(share - held))
            .copied()
            .collect();
        return decision;
    }
    if held == share || view.stable_cycles < rules.stable_cycles {
        return decision;
    }
    // The gap the free shards cannot fill, covered by over-share hosts in
    // rank order: this host hands off what is left of it after the hosts
    // ranked before it.
    let counts: Vec<(usize, Option<usize>)> = live
        .values()
        .enumerate()
        .map(|(i, c)| (share_at(i, n, total), *c))
        .collect();
    let deficit: usize = counts
        .iter()
        .filter_map(|(s, c)| c.map(|c| s.saturating_sub(c)))
        .sum();
    let mut gap = deficit.saturating_sub(free.len());
    for (s, c) in counts.iter().take(rank) {
        gap = gap.saturating_sub(c.map_or(0, |c| c.saturating_sub(*s)));
    }
    let excess = (held - share).min(gap);
    let mut eligible: Vec<u32> = view
        .held
        .iter()
        .filter(|h| h.held_cycles >= rules.min_hold_cycles)
        .map(|h| h.shard)
        .collect();
    eligible.sort_unstable_by(|a, b| b.cmp(a));
    decision.hand_off = eligible.into_iter().take(excess).collect();
    decision
}

/// The state [`decide`] needs between cycles, for the classes of one host.
#[derive(Debug, Default)]
pub struct Balancer {
    rules: BalanceRules,
    classes: HashMap<String, ClassState>,
}

#[derive(Debug, Default)]
struct ClassState {
    live: Vec<TaskId>,
    stable: u32,
    /// Cycles held, by shard.
    held: BTreeMap<u32, u32>,
}

impl Balancer {
    /// A balancer with these rules.
    pub fn new(rules: BalanceRules) -> Self {
        Self {
            rules,
            classes: HashMap::new(),
        }
    }

    /// The rules.
    pub fn rules(&self) -> BalanceRules {
        self.rules
    }

    /// One cycle of `class`: records what this host holds now and who is
    /// live, then [`decide`]s.
    pub fn cycle(
        &mut self,
        class: &str,
        me: &TaskId,
        shards: &[u32],
        peers: &[Peer],
        held_now: &[u32],
    ) -> BalanceDecision {
        let state = self.classes.entry(class.to_owned()).or_default();
        let mut live: Vec<TaskId> = peers.iter().map(|p| p.task.clone()).collect();
        live.push(me.clone());
        live.sort();
        live.dedup();
        if live == state.live {
            state.stable = state.stable.saturating_add(1);
        } else {
            state.live = live;
            state.stable = 1;
        }
        let now: BTreeSet<u32> = held_now.iter().copied().collect();
        state.held.retain(|s, _| now.contains(s));
        for s in &now {
            let c = state.held.entry(*s).or_insert(0);
            *c = c.saturating_add(1);
        }
        let held: Vec<HeldShard> = state
            .held
            .iter()
            .map(|(s, c)| HeldShard {
                shard: *s,
                held_cycles: *c,
            })
            .collect();
        decide(
            &BalanceView {
                me,
                shards,
                peers,
                held: &held,
                stable_cycles: state.stable,
            },
            self.rules,
        )
    }
}

#[cfg(test)]
mod tests;
