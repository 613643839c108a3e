//! SQLite owner lease store and object storage fence.
