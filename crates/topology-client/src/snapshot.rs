//! The published snapshot: types, limits, and the strict decoder.
//!
//! The format is a JSON envelope (UTF-8), fields in this order:
//!
//! ```text
//! {"format":1,"group":"tenant-a","version":3,"coordinator":"coord-1",
//!  "members":[{"id":"tenant-a-0","state":"active","joinedAt":1700000000000,
//!              "locationHint":"weur","meta":{"weight":2}}]}
//! ```
//!
//! `locationHint` and `meta` are omitted when absent. Members are sorted by
//! ID, IDs are unique, and there is at least one member (a deleted group is
//! not published, it is removed). Only `durability-topology` encodes it.

use durability_time::{MAX_SAFE_UNSIGNED, check_name, is_safe_non_negative};
use serde::Deserialize;

/// The format version this crate reads.
pub const FORMAT_VERSION: u64 = 1;
/// Largest encoded snapshot accepted: 1 MiB.
pub const MAX_SNAPSHOT_BYTES: usize = 1 << 20;
/// Longest group name, in bytes.
pub const MAX_GROUP_BYTES: usize = 256;
/// Longest member ID, in bytes.
pub const MAX_MEMBER_ID_BYTES: usize = 256;
/// Longest location hint, in bytes.
pub const MAX_LOCATION_HINT_BYTES: usize = 64;
/// Largest member metadata, in bytes of canonical JSON.
pub const MAX_META_BYTES: usize = 512;
/// Most members in one group.
pub const MAX_MEMBERS: usize = 1_000;
/// Longest coordinator ID, in bytes.
pub const MAX_COORDINATOR_BYTES: usize = 256;

/// Whether a member takes new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemberState {
    /// In the write set and the read set.
    Active,
    /// Only in the read set: no new work, but it still holds data.
    Draining,
}

impl MemberState {
    /// `"active"` or `"draining"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Draining => "draining",
        }
    }

    /// Parses `"active"` or `"draining"`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "active" => Some(Self::Active),
            "draining" => Some(Self::Draining),
            _ => None,
        }
    }
}

/// One member of a group as published.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Unique within the group; non-empty.
    pub id: String,
    /// Active or draining.
    pub state: MemberState,
    /// Where the member runs, if the coordinator was told.
    pub location_hint: Option<String>,
    /// Application metadata (JSON).
    pub meta: Option<serde_json::Value>,
    /// When the member first joined the group (Unix ms), kept across updates.
    pub joined_at: i64,
}

/// One group's membership as published by its coordinator.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The group.
    pub group: String,
    /// Increases with every membership change; compares only within one
    /// coordinator.
    pub version: u64,
    /// The ID of the coordinator object that published it.
    pub coordinator: String,
    /// Members sorted by ID.
    pub members: Vec<Member>,
}

impl Snapshot {
    /// Active members: the write set.
    pub fn writable(&self) -> impl Iterator<Item = &Member> {
        self.members
            .iter()
            .filter(|m| m.state == MemberState::Active)
    }
}

/// Checks a group name: non-empty, at most [`MAX_GROUP_BYTES`] bytes, no
/// control characters.
///
/// # Errors
/// The reason the name is refused.
pub fn check_group(group: &str) -> Result<(), &'static str> {
    check_name(group, MAX_GROUP_BYTES, "must be at most 256 bytes")
}

/// Checks a member ID: non-empty, at most [`MAX_MEMBER_ID_BYTES`] bytes, no
/// control characters.
///
/// # Errors
/// The reason the ID is refused.
pub fn check_member_id(id: &str) -> Result<(), &'static str> {
    check_name(id, MAX_MEMBER_ID_BYTES, "must be at most 256 bytes")
}

/// Checks a location hint: non-empty, at most [`MAX_LOCATION_HINT_BYTES`]
/// bytes, no control characters.
///
/// # Errors
/// The reason the hint is refused.
pub fn check_location_hint(hint: &str) -> Result<(), &'static str> {
    check_name(hint, MAX_LOCATION_HINT_BYTES, "must be at most 64 bytes")
}

#[derive(Deserialize)]
struct Probe {
    format: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    #[allow(dead_code)] // Checked by the probe.
    format: u64,
    group: String,
    version: u64,
    coordinator: String,
    members: Vec<WireMember>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WireMember {
    id: String,
    state: String,
    joined_at: i64,
    #[serde(default)]
    location_hint: Option<String>,
    #[serde(default)]
    meta: Option<serde_json::Value>,
}

fn invalid(reason: impl Into<String>) -> String {
    reason.into()
}

/// Decodes and validates a published snapshot.
///
/// # Errors
/// A reason when the bytes are oversized, not UTF-8 JSON, truncated, of an
/// unknown format version, or break any rule of the format.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, String> {
    if bytes.len() > MAX_SNAPSHOT_BYTES {
        return Err(format!(
            "oversized: {} bytes exceeds {MAX_SNAPSHOT_BYTES}",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let probe: Probe =
        serde_json::from_str(text).map_err(|e| format!("malformed or truncated: {e}"))?;
    match probe.format {
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(FORMAT_VERSION) => {}
        Some(other) => return Err(format!("unknown format version {other}")),
        None => return Err(invalid("missing format version")),
    }
    let wire: Wire = serde_json::from_str(text).map_err(|e| format!("malformed: {e}"))?;
    check_group(&wire.group).map_err(|r| format!("group {r}"))?;
    if wire.version == 0 || wire.version > MAX_SAFE_UNSIGNED {
        return Err(format!("version {} is not in 1..=2^53-1", wire.version));
    }
    check_name(
        &wire.coordinator,
        MAX_COORDINATOR_BYTES,
        "must be at most 256 bytes",
    )
    .map_err(|r| format!("coordinator {r}"))?;
    if wire.members.is_empty() {
        return Err(invalid("a published group has at least one member"));
    }
    if wire.members.len() > MAX_MEMBERS {
        return Err(format!(
            "{} members exceeds {MAX_MEMBERS}",
            wire.members.len()
        ));
    }
    let mut members = Vec::with_capacity(wire.members.len());
    for m in wire.members {
        check_member_id(&m.id).map_err(|r| format!("member id {r}"))?;
        if let Some(prev) = members.last().map(|p: &Member| p.id.as_str())
            && prev >= m.id.as_str()
        {
            return Err(format!(
                "members must be sorted by unique id ({prev:?} before {:?})",
                m.id
            ));
        }
        let state = MemberState::parse(&m.state)
            .ok_or_else(|| format!("member {:?} has unknown state {:?}", m.id, m.state))?;
        if let Some(hint) = &m.location_hint {
            check_location_hint(hint).map_err(|r| format!("location hint {r}"))?;
        }
        if let Some(meta) = &m.meta {
            let size = serde_json::to_string(meta).map(|s| s.len()).unwrap_or(0);
            if size > MAX_META_BYTES {
                return Err(format!(
                    "metadata of {:?} is {size} bytes, over {MAX_META_BYTES}",
                    m.id
                ));
            }
        }
        if !is_safe_non_negative(m.joined_at) {
            return Err(format!("joinedAt of {:?} is out of range", m.id));
        }
        members.push(Member {
            id: m.id,
            state,
            location_hint: m.location_hint,
            meta: m.meta,
            joined_at: m.joined_at,
        });
    }
    Ok(Snapshot {
        group: wire.group,
        version: wire.version,
        coordinator: wire.coordinator,
        members,
    })
}

/// [`decode`], and checks that the snapshot is of `group`.
///
/// # Errors
/// As [`decode`], or when the snapshot names another group.
pub fn decode_for(group: &str, bytes: &[u8]) -> Result<Snapshot, String> {
    let snapshot = decode(bytes)?;
    if snapshot.group != group {
        return Err(format!(
            "snapshot is of group {:?}, not {group:?}",
            snapshot.group
        ));
    }
    Ok(snapshot)
}
