//! The bounds a host's backends meet once it serves and routes requests:
//! one home for them, so an `impl` over a running host names
//! `S: HostLeases, I: HostAlarms` instead of repeating the traits.

use durability_alarms::AlarmIndex;
use durability_ownership::{LeaseStore, LifecycleAdmin};

/// A lease store a running host shares with its spawned tasks (the owner
/// loop, the wire, the router): [`LeaseStore`] and [`LifecycleAdmin`],
/// sendable and owned. Implemented for every such type.
pub trait HostLeases: LeaseStore + LifecycleAdmin + Send + Sync + 'static {}

impl<T: LeaseStore + LifecycleAdmin + Send + Sync + 'static> HostLeases for T {}

/// An alarm index a running host shares with its spawned tasks:
/// [`AlarmIndex`], sendable and owned. Implemented for every such type.
pub trait HostAlarms: AlarmIndex + Send + Sync + 'static {}

impl<T: AlarmIndex + Send + Sync + 'static> HostAlarms for T {}
