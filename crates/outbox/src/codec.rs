//! Codecs: how a channel turns its values into stored bytes and back.
//!
//! Every stored value is one format byte ([`Codec::format`]) followed by the
//! codec's payload. A channel uses [`Postcard`] unless its
//! [`ChannelConfig`](crate::ChannelConfig) names another codec; [`Json`] is
//! built in, and any other format implements [`Codec`].
//!
//! [`Outbox::stage`](crate::Outbox::stage) refuses a value that does not
//! read back through the channel's codec ([`Codec::check_round_trip`]), so
//! a value that could never be delivered is an error at the call site, not
//! an entry retried forever.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a codec could not encode, decode or read back a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

impl CodecError {
    /// A codec error with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// A channel's value format.
///
/// Implementations must be deterministic: decoding what [`Codec::encode`]
/// wrote gives back the value. The outbox proves it for every staged value
/// with [`Codec::check_round_trip`] before anything is written.
pub trait Codec<T>: Send + Sync + 'static {
    /// A short name for errors and events (`"postcard"`, `"json"`).
    fn name(&self) -> &'static str;

    /// The format byte stored before every payload this codec writes:
    /// 1 is postcard, 2 is JSON; other codecs use `128..=255`. A stored
    /// value with another format byte is not decoded by this codec.
    fn format(&self) -> u8;

    /// Appends the payload of `value` to `out`.
    ///
    /// # Errors
    /// The value cannot be represented in this format.
    fn encode(&self, value: &T, out: &mut Vec<u8>) -> Result<(), CodecError>;

    /// Decodes a whole payload (trailing bytes are an error).
    ///
    /// # Errors
    /// The payload is not a valid encoding of a `T`.
    fn decode(&self, payload: &[u8]) -> Result<T, CodecError>;

    /// Proves that `payload`, what [`Codec::encode`] wrote for `value`,
    /// decodes back to `value`. The default decodes it and checks that the
    /// decoded value encodes to the same bytes, which refuses types whose
    /// encoding is not deterministic (a `HashMap` with several entries
    /// under postcard: use a `BTreeMap`, or the JSON codec).
    ///
    /// # Errors
    /// Why the value does not read back.
    fn check_round_trip(&self, value: &T, payload: &[u8]) -> Result<(), CodecError> {
        let _ = value;
        let back = self.decode(payload)?;
        let mut again = Vec::with_capacity(payload.len());
        self.encode(&back, &mut again)?;
        if again != payload {
            return Err(CodecError::new(
                "the decoded value encodes differently: a field is skipped or renamed when \
                 serializing, or the type's encoding is not deterministic (a HashMap)",
            ));
        }
        Ok(())
    }
}

/// Postcard, the default codec: compact, not self-describing. It cannot
/// decode types that need `deserialize_any`: `#[serde(tag = ...)]`,
/// `#[serde(untagged)]` and `#[serde(flatten)]`, `serde_json::Value`, or
/// fields skipped with `skip_serializing_if`. Staging such a value fails
/// with [`OutboxError::ValueDoesNotRoundTrip`](crate::OutboxError::ValueDoesNotRoundTrip).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Postcard;

/// Format byte of [`Postcard`].
pub const POSTCARD_FORMAT: u8 = 1;
/// Format byte of [`Json`].
pub const JSON_FORMAT: u8 = 2;

fn postcard_error(e: &postcard::Error) -> CodecError {
    match e {
        postcard::Error::WontImplement => CodecError::new(
            "postcard cannot decode this type: it needs a self-describing format \
             (deserialize_any: #[serde(tag = ...)], #[serde(untagged)], #[serde(flatten)] \
             or serde_json::Value); use the JSON codec",
        ),
        other => CodecError::new(format!("postcard: {other}")),
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Codec<T> for Postcard {
    fn name(&self) -> &'static str {
        "postcard"
    }

    fn format(&self) -> u8 {
        POSTCARD_FORMAT
    }

    fn encode(&self, value: &T, out: &mut Vec<u8>) -> Result<(), CodecError> {
        let buf = std::mem::take(out);
        *out = postcard::to_extend(value, buf).map_err(|e| postcard_error(&e))?;
        Ok(())
    }

    fn decode(&self, payload: &[u8]) -> Result<T, CodecError> {
        let (value, rest) = postcard::take_from_bytes(payload).map_err(|e| postcard_error(&e))?;
        if !rest.is_empty() {
            return Err(CodecError::new(format!(
                "postcard: {} trailing bytes after the value",
                rest.len()
            )));
        }
        Ok(value)
    }
}

/// JSON (`serde_json`): self-describing, so tagged and untagged enums,
/// flattened structs and `serde_json::Value` round-trip; larger than
/// postcard. Non-finite floats do not round-trip and are refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Json;

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Codec<T> for Json {
    fn name(&self) -> &'static str {
        "json"
    }

    fn format(&self) -> u8 {
        JSON_FORMAT
    }

    fn encode(&self, value: &T, out: &mut Vec<u8>) -> Result<(), CodecError> {
        serde_json::to_writer(&mut *out, value).map_err(|e| CodecError::new(format!("json: {e}")))
    }

    fn decode(&self, payload: &[u8]) -> Result<T, CodecError> {
        serde_json::from_slice(payload).map_err(|e| CodecError::new(format!("json: {e}")))
    }

    /// Compares the value and its decoded copy as JSON trees (object keys
    /// sorted), so a `HashMap`'s iteration order does not matter.
    fn check_round_trip(&self, value: &T, payload: &[u8]) -> Result<(), CodecError> {
        let back: T = self.decode(payload)?;
        let tree =
            |v: &T| serde_json::to_value(v).map_err(|e| CodecError::new(format!("json: {e}")));
        if tree(value)? != tree(&back)? {
            return Err(CodecError::new(
                "json: the decoded value differs from the staged one (a field skipped or \
                 renamed when serializing, or a float that JSON cannot hold exactly)",
            ));
        }
        Ok(())
    }
}
