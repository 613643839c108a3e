//! Every crate's error codes in one place: each list is free of duplicates,
//! every code matches its family's spelling, no two crates use one code
//! (except the host wire codes it shares with ownership on purpose), and the
//! whole list is snapshotted so a renamed or removed code shows in review.
//!
//! That each variant's `code()` is in its type's list is checked inside each
//! crate (its error enums are `#[non_exhaustive]`, so only the defining
//! crate can match them exhaustively).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// How a family spells its codes.
#[derive(Debug, Clone, Copy)]
enum Style {
    /// `PREFIX_WORDS` in upper case.
    Screaming(&'static str),
    /// Upper case words without a crate prefix (the migration
    /// specification's spelling).
    ScreamingUnprefixed,
    /// `prefix_words` in lower case.
    Snake(&'static str),
}

/// One public error type's list.
struct Family {
    owner: &'static str,
    style: Style,
    codes: &'static [&'static str],
    /// Codes of this list spelled outside its style by a wire contract.
    wire: &'static [&'static str],
}

/// One [`Family`] an entry: `owner => style, codes;`, with `[wire: ..]`
/// after the owner where a wire contract spells codes outside the style.
macro_rules! families {
    ($($owner:literal $([wire: $($wire:literal),*])? => $style:expr, $codes:expr;)*) => {
        vec![$(Family {
            owner: $owner,
            style: $style,
            codes: $codes,
            wire: &[$($($wire),*)?],
        }),*]
    };
}

fn families() -> Vec<Family> {
    use Style::{Screaming, ScreamingUnprefixed, Snake};
    use durability_scheduler::{PermitError, SchedulerError, StorageError, image::ImageError};
    families![
        "durability-time::Elapsed" => Screaming("TIME_"), durability_time::Elapsed::CODES;
        "durability-scheduler::SchedulerError" => Screaming("SCHEDULER_"), SchedulerError::CODES;
        "durability-scheduler::StorageError" => Screaming("STORAGE_"), StorageError::CODES;
        "durability-scheduler::PermitError" => Screaming("SCHEDULER_"), PermitError::CODES;
        "durability-scheduler::ImageError" => Screaming("IMAGE_"), ImageError::CODES;
        "durability-outbox::OutboxError" =>
            Screaming("OUTBOX_"), durability_outbox::OutboxError::CODES;
        "durability-topology::TopologyError" =>
            Screaming("TOPOLOGY_"), durability_topology::TopologyError::CODES;
        "durability-topology-client::TopologyClientError" =>
            Screaming("TOPOLOGY_"), durability_topology_client::TopologyClientError::CODES;
        "durability-migration::MigrationError" =>
            ScreamingUnprefixed, durability_migration::MigrationError::CODES;
        "durability-ownership::OwnershipError" =>
            Snake(""), durability_ownership::OwnershipError::CODES;
        "durability-alarms::AlarmError" => Snake("do_alarm_"), durability_alarms::AlarmError::CODES;
        "durability-semaphore::SemaphoreError" =>
            Screaming("SEMAPHORE_"), durability_semaphore::SemaphoreError::CODES;
        "durability-host::MoveError" => Snake("move_"), durability_host::store::MoveError::CODES;
        "durability-host::HostError" [wire: "owner_unavailable", "do_rpc_result_unknown"] =>
            Snake("host_"), durability_host::HostError::CODES;
        "durability-storage-sqlite::connection::OpenError" =>
            Screaming("SQLITE_"), durability_storage_sqlite::connection::OpenError::CODES;
    ]
}

/// Codes two crates share on purpose: the host reports an ownership
/// failure to remote callers with ownership's own wire code.
const SHARED: &[(&str, &[&str])] = &[(
    "owner_unavailable",
    &[
        "durability-ownership::OwnershipError",
        "durability-host::HostError",
    ],
)];

fn words(rest: &str, upper: bool) -> bool {
    !rest.is_empty()
        && rest.split('_').all(|w| {
            !w.is_empty()
                && w.chars().all(|c| {
                    c.is_ascii_digit()
                        || if upper {
                            c.is_ascii_uppercase()
                        } else {
                            c.is_ascii_lowercase()
                        }
                })
        })
}

fn matches(style: Style, code: &str) -> bool {
    match style {
        Style::Screaming(prefix) => code.strip_prefix(prefix).is_some_and(|r| words(r, true)),
        Style::ScreamingUnprefixed => words(code, true),
        Style::Snake(prefix) => code.strip_prefix(prefix).is_some_and(|r| words(r, false)),
    }
}

#[test]
fn the_checks_reject_bad_spellings() {
    assert!(matches(Style::Screaming("OUTBOX_"), "OUTBOX_CORRUPT"));
    assert!(!matches(Style::Screaming("OUTBOX_"), "OUTBOX_corrupt"));
    assert!(!matches(Style::Screaming("OUTBOX_"), "TOPOLOGY_CORRUPT"));
    assert!(!matches(Style::Screaming("OUTBOX_"), "OUTBOX__X"));
    assert!(matches(Style::Snake("do_alarm_"), "do_alarm_corrupt"));
    assert!(!matches(Style::Snake("do_alarm_"), "do_alarm_"));
    assert!(!matches(Style::Snake(""), "Stale_owner"));
    assert!(!matches(Style::ScreamingUnprefixed, "Mapping_not_found"));
}

#[test]
fn every_code_is_unique_spelled_by_its_family_and_snapshotted() {
    let mut owners: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut listing = String::new();
    for fam in families() {
        assert!(!fam.codes.is_empty(), "{} lists no codes", fam.owner);
        let unique: BTreeSet<&str> = fam.codes.iter().copied().collect();
        assert_eq!(
            unique.len(),
            fam.codes.len(),
            "{} lists a code twice: {:?}",
            fam.owner,
            fam.codes
        );
        for code in fam.wire {
            assert!(
                fam.codes.contains(code),
                "{}: wire code {code} is not listed",
                fam.owner
            );
        }
        writeln!(listing, "{} ({:?}):", fam.owner, fam.style).unwrap();
        for code in fam.codes {
            assert!(
                fam.wire.contains(code) || matches(fam.style, code),
                "{}: {code} is not spelled {:?}",
                fam.owner,
                fam.style
            );
            owners.entry(code).or_default().insert(fam.owner);
            writeln!(listing, "  {code}").unwrap();
        }
    }
    for (code, by) in &owners {
        if by.len() > 1 {
            let allowed = SHARED
                .iter()
                .find(|(c, _)| c == code)
                .map(|(_, o)| o.iter().copied().collect::<BTreeSet<&str>>());
            assert_eq!(allowed.as_ref(), Some(by), "{code} is used by {by:?}");
        }
    }
    insta::assert_snapshot!("error_codes", listing);
}
