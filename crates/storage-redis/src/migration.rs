//! Redis key → shard mapping store.
