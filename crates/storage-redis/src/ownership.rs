//! Redis owner lease store.
