//! The private cluster of the crate's testkit (`testkit::cluster`).

pub(crate) use durability_storage_postgres::testkit::cluster::{Cluster, signal};
