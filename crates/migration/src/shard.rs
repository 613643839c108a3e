//! The `Shard` trait: one database holding rows of keyed tables.

use std::future::Future;
use std::pin::Pin;

use crate::dialect::Dialect;
use crate::error::BackendError;
use crate::value::{Row, Value};

/// A boxed, sendable future (the shard and mapping traits are used as
/// `dyn`, because one router holds shards of several backends).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a call on a backend (a shard, the mapping store, the allocation
/// ledger) returns: a [`BoxFuture`] of its result.
pub type BackendFuture<'a, T> = BoxFuture<'a, Result<T, BackendError>>;

/// One SQL statement with its bound parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    /// The SQL text, with the dialect's placeholders.
    pub sql: String,
    /// The values bound to the placeholders, in order.
    pub params: Vec<Value>,
}

impl Statement {
    /// A statement without parameters.
    pub fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    /// A statement with parameters.
    pub fn with_params(sql: impl Into<String>, params: Vec<Value>) -> Self {
        Self {
            sql: sql.into(),
            params,
        }
    }
}

/// What a shard's batch guarantees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchSupport {
    /// The shard has no batch: moves refuse it with `MIGRATION_NO_BATCH`.
    None,
    /// A batch exists but is not declared atomic: moves refuse it with
    /// `MIGRATION_NO_ATOMIC_BATCH`.
    NonAtomic,
    /// The batch rolls the whole group back when one statement fails.
    Atomic,
}

/// One database of the shard set.
///
/// Implementations execute statements generated for their [`Dialect`].
/// A batch is isolated from the shard's other statements: a statement
/// issued through the same shard while a batch is open is never part of it
/// (an adapter on one connection holds it until the batch ends; a pooled
/// adapter runs it on another connection). The conformance suite checks
/// this (a failing batch raced with an insert leaves the insert).
pub trait Shard: Send + Sync {
    /// The dialect statements must be generated for.
    fn dialect(&self) -> Dialect;

    /// What [`Shard::batch`] guarantees.
    fn batch_support(&self) -> BatchSupport;

    /// Executes one statement and returns the number of rows it changed.
    fn execute<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, u64>;

    /// Runs one query and returns its rows (column name → value).
    fn query<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, Vec<Row>>;

    /// Runs statements as one batch, returning each statement's changed-row
    /// count. With [`BatchSupport::Atomic`], a failing statement rolls the
    /// whole group back.
    fn batch<'a>(&'a self, stmts: &'a [Statement]) -> BackendFuture<'a, Vec<u64>>;
}
