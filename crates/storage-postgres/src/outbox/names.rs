//! The outbox's SQL names: a schema and a table name, validated against a
//! strict grammar and always written quoted, so no name reaches SQL that
//! could change a statement.

use super::error::PgOutboxError;

/// Longest schema or table name accepted, in bytes (so the notification
/// channel `schema.table` fits PostgreSQL's 63-byte identifiers).
pub const MAX_NAME_BYTES: usize = 30;

/// A validated identifier: `[a-z_][a-z0-9_]*`, at most
/// [`MAX_NAME_BYTES`] bytes, not starting with `pg_`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ident(String);

impl Ident {
    pub(crate) fn new(what: &'static str, name: &str) -> Result<Self, PgOutboxError> {
        let refuse = |reason| PgOutboxError::InvalidName {
            what,
            name: name.to_owned(),
            reason,
        };
        let mut chars = name.chars();
        match chars.next() {
            None => return Err(refuse("must not be empty")),
            Some(c) if !(c.is_ascii_lowercase() || c == '_') => {
                return Err(refuse("must start with a lowercase ASCII letter or '_'"));
            }
            Some(_) => {}
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(refuse("must be at most 30 bytes"));
        }
        if !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
            return Err(refuse(
                "may hold only lowercase ASCII letters, digits and '_'",
            ));
        }
        if name.starts_with("pg_") {
            return Err(refuse("must not start with 'pg_' (reserved by PostgreSQL)"));
        }
        Ok(Self(name.to_owned()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// Quotes an identifier for SQL (doubling any `"`), whatever it holds.
pub(crate) fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}
