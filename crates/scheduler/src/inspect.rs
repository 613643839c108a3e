//! A read-only view of an object's scheduler rows, for operators.
//!
//! [`ObjectReport`] is what an inspection of an object database returns:
//! every capability with a stored schema version or due time, the object's
//! one stored alarm and which capabilities are due at the time of the
//! inspection. A backend reads the rows (without writing anything) and
//! builds the report with [`ObjectReport::new`].

use std::collections::BTreeMap;

use serde::Serialize;

/// One capability's rows in an object database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CapabilityReport {
    /// The capability's name.
    pub name: String,
    /// The schema version applied for it (`None`: no schema row).
    pub schema_version: Option<u32>,
    /// Its earliest due time in ms since the epoch (`None`: nothing due).
    pub due: Option<i64>,
    /// Whether `due` is at or before the report's `now_ms`: the next alarm
    /// runs this capability.
    pub is_due: bool,
}

/// What an object database holds for the scheduler, read at `now_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObjectReport {
    /// The time the report was read at, in ms since the epoch.
    pub now_ms: i64,
    /// The object's one stored alarm (`None`: no alarm is set).
    pub alarm: Option<i64>,
    /// The earliest due time over every capability. The scheduler keeps the
    /// alarm at this time in the same transaction that moves a due time, so
    /// the two differ only when the rows were written by something else.
    pub earliest_due: Option<i64>,
    /// Every capability with a schema version or a due time, by name.
    pub capabilities: Vec<CapabilityReport>,
}

impl ObjectReport {
    /// Builds the report from the stored rows: schema versions and due
    /// times per capability, and the stored alarm.
    pub fn new(
        now_ms: i64,
        alarm: Option<i64>,
        schema_versions: impl IntoIterator<Item = (String, u32)>,
        dues: impl IntoIterator<Item = (String, i64)>,
    ) -> Self {
        let mut rows: BTreeMap<String, (Option<u32>, Option<i64>)> = BTreeMap::new();
        for (name, version) in schema_versions {
            rows.entry(name).or_default().0 = Some(version);
        }
        for (name, due) in dues {
            rows.entry(name).or_default().1 = Some(due);
        }
        let earliest_due = rows.values().filter_map(|(_, due)| *due).min();
        let capabilities = rows
            .into_iter()
            .map(|(name, (schema_version, due))| CapabilityReport {
                name,
                schema_version,
                due,
                is_due: due.is_some_and(|due| due <= now_ms),
            })
            .collect();
        Self {
            now_ms,
            alarm,
            earliest_due,
            capabilities,
        }
    }

    /// The names of the capabilities due at `now_ms`.
    pub fn due_capabilities(&self) -> impl Iterator<Item = &str> {
        self.capabilities
            .iter()
            .filter(|c| c.is_due)
            .map(|c| c.name.as_str())
    }
}

#[cfg(test)]
mod tests;
