//! PostgreSQL object storage: every object-level conformance suite
//! (scheduler, outbox, alarms object side, topology), the application's own
//! tables, failures and hostile names.

use durability_scheduler::{SchedulerTx, Storage, StorageError, StorageErrorKind};
use durability_storage_postgres::object::{PostgresObjectOptions, PostgresObjects};

use crate::object_support::TestDeployment;

#[test]
fn scheduler_conformance_on_postgres() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    for case in durability_scheduler::conformance::CASES {
        durability_scheduler::conformance::run_case(case, || d.fresh());
    }
    eprintln!(
        "scheduler conformance on PostgreSQL: {} cases",
        durability_scheduler::conformance::CASES.len()
    );
}

#[test]
fn outbox_conformance_on_postgres() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    for case in durability_outbox::conformance::CASES {
        durability_outbox::conformance::run_case(case, || d.fresh());
    }
}

#[test]
fn alarm_rows_conformance_on_postgres() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    for case in durability_alarms::conformance::TX_CASES {
        durability_alarms::conformance::run_tx_case(case, || d.fresh());
    }
}

#[test]
fn topology_conformance_on_postgres() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    for case in durability_topology::conformance::TX_CASES {
        durability_topology::conformance::run_tx_case(case, || d.fresh());
    }
}
