//! Small macros the durability crates share (this is the one crate they
//! all depend on).

/// Implements `Debug` for a struct by printing only the named fields and
/// ending with `..` ([`std::fmt::DebugStruct::finish_non_exhaustive`]): for
/// a type holding a connection, a pool, scripts or callbacks that have no
/// useful (or no) `Debug` of their own.
///
/// ```
/// struct Store {
///     prefix: String,
///     shards: u32,
///     _conn: std::sync::Mutex<()>,
/// }
/// durability_time::debug_fields!(Store { prefix, shards });
///
/// let store = Store { prefix: "p:".into(), shards: 4, _conn: Default::default() };
/// assert_eq!(format!("{store:?}"), r#"Store { prefix: "p:", shards: 4, .. }"#);
/// ```
#[macro_export]
macro_rules! debug_fields {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl ::std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    $(.field(stringify!($field), &self.$field))*
                    .finish_non_exhaustive()
            }
        }
    };
}
