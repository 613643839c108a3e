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

/// Writes an error type's `code()` and `CODES` from one list of match arms,
/// so a code cannot be returned by `code()` and missing from `CODES` (or
/// listed and never returned).
///
/// Each arm is `PATTERN [if GUARD] => "CODE"` or, for a variant that wraps
/// another error of the workspace and passes its code through,
/// `PATTERN [if GUARD] => EXPRESSION`. Patterns match on `self` (use
/// `Self { field: .., .. }` for a struct). The generated items are:
///
/// - `pub fn code(&self) -> &'static str`: the arms as one `match`, in the
///   order written;
/// - `pub const CODES: &'static [&'static str]`: every string-literal code
///   of the arms in the order written, each once (a code two arms return is
///   listed at its first arm); codes passed through are not listed (they
///   are the wrapped type's).
///
/// ```
/// #[derive(Debug)]
/// enum Inner { Broken }
/// durability_time::error_codes! { Inner { Self::Broken => "INNER_BROKEN" } }
///
/// #[derive(Debug)]
/// enum Error { Invalid { name: String }, Gone, Lost, Inner(Inner), Io(u8) }
/// durability_time::error_codes! {
///     Error {
///         Self::Invalid { .. } => "MY_INVALID",
///         Self::Gone | Self::Lost => "MY_GONE",
///         Self::Inner(e) => e.code(),
///         Self::Io(n) if *n == 0 => "MY_CORRUPT",
///         Self::Io(_) => "MY_IO",
///     }
/// }
///
/// assert_eq!(Error::CODES, ["MY_INVALID", "MY_GONE", "MY_CORRUPT", "MY_IO"]);
/// assert_eq!(Error::Lost.code(), "MY_GONE");
/// assert_eq!(Error::Inner(Inner::Broken).code(), "INNER_BROKEN");
/// assert_eq!(Error::Io(0).code(), "MY_CORRUPT");
/// ```
#[macro_export]
macro_rules! error_codes {
    ($ty:ident { $($arms:tt)* }) => {
        $crate::error_codes!(@arms $ty [] [] $($arms)*);
    };
    (@arms $ty:ident [$($arm:tt)*] [$($code:literal)*]
        $p:pat $(if $g:expr)? => $c:literal $(, $($rest:tt)*)?) => {
        $crate::error_codes!(@arms $ty [$($arm)* $p $(if $g)? => $c,] [$($code)* $c] $($($rest)*)?);
    };
    (@arms $ty:ident [$($arm:tt)*] [$($code:literal)*]
        $p:pat $(if $g:expr)? => $e:expr $(, $($rest:tt)*)?) => {
        $crate::error_codes!(@arms $ty [$($arm)* $p $(if $g)? => $e,] [$($code)*] $($($rest)*)?);
    };
    (@arms $ty:ident [$($arm:tt)*] [$($code:literal)*]) => {
        impl $ty {
            /// Every stable code this type returns itself, in the order its
            /// variants declare them, each once (a code passed through from
            /// a wrapped error is that error's and not listed here): for
            /// documentation and uniqueness tests.
            pub const CODES: &'static [&'static str] = {
                const ALL: &[&str] = &[$($code),*];
                const UNIQUE: [&str; $crate::__codes::unique_count(ALL)] =
                    $crate::__codes::unique(ALL);
                &UNIQUE
            };

            /// The stable machine-readable code of this error: one of
            /// [`Self::CODES`], or the code of a wrapped error it passes
            /// through.
            pub fn code(&self) -> &'static str {
                match self {
                    $($arm)*
                }
            }
        }
    };
}

/// The `const` helpers of [`error_codes!`]; not a public API.
#[doc(hidden)]
pub mod __codes {
    const fn same(a: &str, b: &str) -> bool {
        let (a, b) = (a.as_bytes(), b.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }

    const fn seen_before(all: &[&str], i: usize) -> bool {
        let mut j = 0;
        while j < i {
            if same(all[j], all[i]) {
                return true;
            }
            j += 1;
        }
        false
    }

    /// How many distinct codes `all` holds.
    pub const fn unique_count(all: &[&str]) -> usize {
        let (mut n, mut i) = (0, 0);
        while i < all.len() {
            if !seen_before(all, i) {
                n += 1;
            }
            i += 1;
        }
        n
    }

    /// The distinct codes of `all` in order of first appearance; `N` is
    /// [`unique_count`] of `all`.
    pub const fn unique<const N: usize>(all: &[&'static str]) -> [&'static str; N] {
        let mut out = [""; N];
        let (mut n, mut i) = (0, 0);
        while i < all.len() {
            if !seen_before(all, i) {
                out[n] = all[i];
                n += 1;
            }
            i += 1;
        }
        out
    }
}

/// The body of the crates' async conformance macros: a module `$module`
/// with one `#[tokio::test]` per case. Each test awaits `$make` (evaluated
/// inside the module, which sees the caller's items through
/// `use super::*`) for an `Option` of the subject and a guard kept alive
/// for the case, returns when that is `None` (a server that is not there),
/// and otherwise awaits `$run(case name, &subject, $args...)`, then
/// `$finish(&subject)`.
#[doc(hidden)]
#[macro_export]
macro_rules! async_suite {
    ($module:ident, $run:path, $args:tt, $make:expr, $finish:expr, [$($case:ident)*]) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $(
                $crate::async_suite! { @case $case, $run, $args, $make, $finish }
            )*
        }
    };
    (@case $case:ident, $run:path, ($($arg:expr),*), $make:expr, $finish:expr) => {
        #[tokio::test]
        async fn $case() {
            let Some((subject, _guard)) = $make.await else {
                return;
            };
            $run(stringify!($case), &subject $(, $arg)*).await;
            ($finish)(&subject).await;
        }
    };
}
