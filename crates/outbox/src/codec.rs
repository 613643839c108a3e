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

use postcard::ser_flavors::Flavor;
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
        reencodes(self, payload)
    }
}

/// The default round-trip check: `payload` decodes, and the decoded value
/// encodes to `payload` again.
fn reencodes<T, C: Codec<T> + ?Sized>(codec: &C, payload: &[u8]) -> Result<(), CodecError> {
    let back = codec.decode(payload)?;
    let mut again = Vec::with_capacity(payload.len());
    codec.encode(&back, &mut again)?;
    if again != payload {
        return Err(CodecError::new(ENCODES_DIFFERENTLY));
    }
    Ok(())
}

/// Why a decoded value failed the round-trip check of
/// [`Codec::check_round_trip`]'s default (and [`Postcard`]'s).
const ENCODES_DIFFERENTLY: &str = "the decoded value encodes differently: a field is skipped or \
     renamed when serializing, or the type's encoding is not deterministic (a HashMap)";

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
        if let Some(bytes) = as_bytes(value) {
            let (len, used) = varint(bytes.len());
            out.reserve(used + bytes.len());
            out.extend_from_slice(&len[..used]);
            out.extend_from_slice(bytes);
            return Ok(());
        }
        postcard::serialize_with_flavor(value, Append(out)).map_err(|e| postcard_error(&e))
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

    /// As the default; a `Vec<u8>` is checked to be exactly its encoding (a
    /// length, then the bytes), which always reads back.
    fn check_round_trip(&self, value: &T, payload: &[u8]) -> Result<(), CodecError> {
        let Some(bytes) = as_bytes(value) else {
            return reencodes::<T, _>(self, payload);
        };
        let (len, used) = varint(bytes.len());
        match payload.split_at_checked(used) {
            Some((head, rest)) if head == &len[..used] && rest == bytes => Ok(()),
            _ => Err(CodecError::new(ENCODES_DIFFERENTLY)),
        }
    }
}

/// `value` if it is a byte vector. Serde writes a `Vec<u8>` one element at a
/// time (and reads it back so); postcard's encoding of it is its length as
/// a varint, then the bytes, which [`Postcard`] writes with one copy.
fn as_bytes<T: 'static>(value: &T) -> Option<&[u8]> {
    (value as &dyn std::any::Any)
        .downcast_ref::<Vec<u8>>()
        .map(Vec::as_slice)
}

/// Postcard's varint of a length (LEB128: seven bits a byte, low first) and
/// how many of the bytes it uses.
fn varint(mut n: usize) -> ([u8; 10], usize) {
    let mut out = [0u8; 10];
    let mut used = 0;
    while n >= 0x80 {
        out[used] = (n & 0x7f) as u8 | 0x80;
        n >>= 7;
        used += 1;
    }
    out[used] = n as u8;
    (out, used + 1)
}

/// A postcard flavor appending to a `Vec`: one `push` per byte, which is
/// what a `Vec<u8>` field costs (serde writes it element by element).
struct Append<'a>(&'a mut Vec<u8>);

impl Flavor for Append<'_> {
    type Output = ();

    #[inline(always)]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    #[inline(always)]
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
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

#[cfg(test)]
mod tests;
