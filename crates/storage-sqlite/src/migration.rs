//! SQLite shards and mapping store.
