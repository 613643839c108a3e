//! Redis implementations of the durability storage traits.
//!
//! Feature flags select which capability's traits are implemented
//! (`default` enables all of them):
//!
//! - `ownership`: the `ownership` module, the owner lease store of `durability-ownership`.

#[cfg(feature = "ownership")]
pub mod ownership;
