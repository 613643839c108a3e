//! Tokens and times: row tokens, run tokens, safe-integer validation.

use std::fmt;

use durability_scheduler::MAX_SAFE_INTEGER;

use crate::error::AlarmError;

/// Longest token accepted, in bytes.
pub const MAX_TOKEN_BYTES: usize = 64;

/// An opaque token: a row token (carried by the backend job of one alarm
/// row) or a run token (fencing one claim of a job).
///
/// Non-empty, at most [`MAX_TOKEN_BYTES`] bytes of `[0-9A-Za-z_-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(String);

impl Token {
    /// Validates and wraps a token.
    ///
    /// # Errors
    /// [`AlarmError::InvalidToken`] for an empty, long or non-ASCII token.
    pub fn new(token: impl Into<String>) -> Result<Self, AlarmError> {
        let token = token.into();
        let reason = if token.is_empty() {
            Some("must not be empty")
        } else if token.len() > MAX_TOKEN_BYTES {
            Some("must be at most 64 bytes")
        } else if !token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            Some("must be [0-9A-Za-z_-]")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(AlarmError::InvalidToken { reason }),
            None => Ok(Self(token)),
        }
    }

    /// A fresh random token (128 random bits, hex).
    pub fn random() -> Self {
        Self(format!("{:032x}", rand::random::<u128>()))
    }

    /// The token as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks that `at` is a Unix-millisecond time in `0..=2^53-1`.
///
/// # Errors
/// [`AlarmError::InvalidTime`] otherwise.
pub fn validate_time(at: i64) -> Result<i64, AlarmError> {
    if (0..=MAX_SAFE_INTEGER).contains(&at) {
        Ok(at)
    } else {
        Err(AlarmError::InvalidTime { at })
    }
}

/// `a + b` clamped to the safe-integer range.
pub(crate) fn safe_add(a: i64, b: i64) -> i64 {
    a.saturating_add(b).clamp(0, MAX_SAFE_INTEGER)
}
