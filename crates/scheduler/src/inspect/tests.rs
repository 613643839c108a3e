//! Tests of the object report.

use super::*;

#[test]
fn report_merges_rows_by_capability_and_marks_what_is_due() {
    let report = ObjectReport::new(
        100,
        Some(50),
        [("outbox".to_owned(), 2), ("app".to_owned(), 1)],
        [("outbox".to_owned(), 50), ("alarms".to_owned(), 101)],
    );
    assert_eq!(report.earliest_due, Some(50));
    assert_eq!(report.alarm, Some(50));
    let names: Vec<_> = report
        .capabilities
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["alarms", "app", "outbox"]);
    assert_eq!(report.capabilities[0].schema_version, None);
    assert!(!report.capabilities[0].is_due, "101 is after now (100)");
    assert_eq!(report.capabilities[1].due, None);
    assert!(!report.capabilities[1].is_due);
    assert_eq!(report.capabilities[2].schema_version, Some(2));
    assert!(report.capabilities[2].is_due);
    assert_eq!(report.due_capabilities().collect::<Vec<_>>(), ["outbox"]);
}

#[test]
fn a_due_time_equal_to_now_is_due() {
    let report = ObjectReport::new(7, Some(7), [], [("a".to_owned(), 7)]);
    assert!(report.capabilities[0].is_due);
    let empty = ObjectReport::new(7, None, [], []);
    assert_eq!(empty.earliest_due, None);
    assert!(empty.capabilities.is_empty());
}
