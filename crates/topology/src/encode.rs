//! The only encoder of the published snapshot format.
//!
//! [`EncodedSnapshot`] has a private field and no public constructor, so a
//! value of it can only come from this crate's coordinator: publishers store
//! it as is, and `durability_topology_client::decode` reads it. The wire
//! structs here are private; the format is pinned by an `insta` snapshot.

use durability_topology_client::{FORMAT_VERSION, Member, MemberState, Snapshot};
use serde::{Deserialize, Serialize};

/// A snapshot in the published format. Store [`EncodedSnapshot::as_str`] as
/// is: it is what the client reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedSnapshot(String);

impl EncodedSnapshot {
    /// The encoded text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The encoded size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true for a real snapshot.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn from_trusted(text: String) -> Self {
        Self(text)
    }
}

/// A member as stored in the groups table and published: the wire form.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct WireMember {
    pub(crate) id: String,
    pub(crate) state: String,
    pub(crate) joined_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) location_hint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) meta: Option<serde_json::Value>,
}

#[derive(Serialize)]
struct Envelope<'a> {
    format: u64,
    group: &'a str,
    version: u64,
    coordinator: &'a str,
    members: Vec<WireMember>,
}

pub(crate) fn to_wire(m: &Member) -> WireMember {
    WireMember {
        id: m.id.clone(),
        state: m.state.as_str().to_owned(),
        joined_at: m.joined_at,
        location_hint: m.location_hint.clone(),
        meta: m.meta.clone(),
    }
}

pub(crate) fn from_wire(w: WireMember) -> Result<Member, String> {
    let state = MemberState::parse(&w.state)
        .ok_or_else(|| format!("member {:?} has unknown state {:?}", w.id, w.state))?;
    Ok(Member {
        id: w.id,
        state,
        location_hint: w.location_hint,
        meta: w.meta,
        joined_at: w.joined_at,
    })
}

/// Members as stored in the groups table (JSON array of wire members).
pub(crate) fn members_json(members: &[Member]) -> String {
    let wire: Vec<WireMember> = members.iter().map(to_wire).collect();
    serde_json::to_string(&wire).unwrap_or_else(|_| unreachable!("wire members always encode"))
}

pub(crate) fn parse_members(text: &str) -> Result<Vec<Member>, String> {
    let wire: Vec<WireMember> =
        serde_json::from_str(text).map_err(|e| format!("stored members: {e}"))?;
    wire.into_iter().map(from_wire).collect()
}

/// Encodes a snapshot in the published format.
pub(crate) fn encode(snapshot: &Snapshot) -> EncodedSnapshot {
    let envelope = Envelope {
        format: FORMAT_VERSION,
        group: &snapshot.group,
        version: snapshot.version,
        coordinator: &snapshot.coordinator,
        members: snapshot.members.iter().map(to_wire).collect(),
    };
    EncodedSnapshot(
        serde_json::to_string(&envelope)
            .unwrap_or_else(|_| unreachable!("the envelope always encodes")),
    )
}

/// Whether two JSON values are the same value, numbers compared as numbers
/// (`1` and `1.0` are one number; serde_json keeps them apart).
pub(crate) fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => same_number(x, y),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

fn same_number(x: &serde_json::Number, y: &serde_json::Number) -> bool {
    if let (Some(a), Some(b)) = (x.as_i64(), y.as_i64()) {
        return a == b;
    }
    if let (Some(a), Some(b)) = (x.as_u64(), y.as_u64()) {
        return a == b;
    }
    matches!((x.as_f64(), y.as_f64()), (Some(a), Some(b)) if a == b)
}

/// Whether two memberships are the same, metadata compared as JSON values.
pub(crate) fn same_members(a: &[Member], b: &[Member]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.id == y.id
                && x.state == y.state
                && x.location_hint == y.location_hint
                && x.joined_at == y.joined_at
                && match (&x.meta, &y.meta) {
                    (Some(m), Some(n)) => same_json(m, n),
                    (None, None) => true,
                    _ => false,
                }
        })
}
