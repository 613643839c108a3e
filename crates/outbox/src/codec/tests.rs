#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde::de::{Error as _, SeqAccess, Visitor};
use serde::ser::{Error as _, SerializeTuple};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Codec, CodecError, ENCODES_DIFFERENTLY, POSTCARD_FORMAT, Postcard};

/// The check as the trait's default does it: decode, encode into a new
/// buffer, compare.
fn default_check<T>(payload: &[u8]) -> Result<(), CodecError>
where
    T: Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let back: T = Codec::<T>::decode(&Postcard, payload)?;
    let mut again = Vec::new();
    Codec::<T>::encode(&Postcard, &back, &mut again)?;
    if again != payload {
        return Err(CodecError::new(ENCODES_DIFFERENTLY));
    }
    Ok(())
}

/// Encodes `value` and runs Postcard's check and the default check on it;
/// both must give the same verdict, which is returned.
fn checked<T>(value: &T) -> Result<(), CodecError>
where
    T: Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let mut payload = Vec::new();
    Codec::<T>::encode(&Postcard, value, &mut payload)?;
    let ours = Codec::<T>::check_round_trip(&Postcard, value, &payload);
    assert_eq!(
        ours,
        default_check::<T>(&payload),
        "same verdict as the default"
    );
    ours
}

/// Reads back in lower case: same length, different bytes.
#[derive(Debug, Serialize)]
struct Lowered(String);

impl<'de> Deserialize<'de> for Lowered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self(String::deserialize(d)?.to_lowercase()))
    }
}

/// Written as a tuple of its bytes (no length prefix); read back as `READ`
/// bytes of which the first is kept `KEEP` times. `Resized<2, 1>` encodes
/// back to a strict prefix of its payload, `Resized<1, 2>` past its end.
#[derive(Debug)]
struct Resized<const READ: usize, const KEEP: usize>(Vec<u8>);

impl<const READ: usize, const KEEP: usize> Serialize for Resized<READ, KEEP> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(self.0.len())?;
        for b in &self.0 {
            t.serialize_element(b)?;
        }
        t.end()
    }
}

/// Reads `READ` bytes and returns the first.
struct FirstOf<const READ: usize>;

impl<'de, const READ: usize> Visitor<'de> for FirstOf<READ> {
    type Value = u8;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{READ} bytes")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u8, A::Error> {
        let mut first = None;
        for i in 0..READ {
            let b: u8 = seq
                .next_element()?
                .ok_or_else(|| A::Error::invalid_length(i, &self))?;
            first.get_or_insert(b);
        }
        Ok(first.unwrap_or(0))
    }
}

impl<'de, const READ: usize, const KEEP: usize> Deserialize<'de> for Resized<READ, KEEP> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let first = d.deserialize_tuple(READ, FirstOf::<READ>)?;
        Ok(Self(vec![first; KEEP]))
    }
}

/// Encodes once; its decoded copy refuses to encode.
#[derive(Debug)]
struct OnlyOnce {
    decoded: bool,
}

impl Serialize for OnlyOnce {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.decoded {
            return Err(S::Error::custom("a decoded OnlyOnce does not encode"));
        }
        s.serialize_unit()
    }
}

impl<'de> Deserialize<'de> for OnlyOnce {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <()>::deserialize(d)?;
        Ok(Self { decoded: true })
    }
}

#[test]
fn a_value_that_reads_back_different_bytes_is_refused() {
    let err = checked(&Lowered("Placed".to_owned())).unwrap_err();
    assert_eq!(err.0, ENCODES_DIFFERENTLY);
    checked(&Lowered("placed".to_owned())).expect("lower case reads back");
}

#[test]
fn a_value_whose_copy_encodes_to_a_prefix_or_past_the_payload_is_refused() {
    let err = checked(&Resized::<2, 1>(vec![1, 2])).unwrap_err();
    assert_eq!(err.0, ENCODES_DIFFERENTLY, "a strict prefix is not a match");
    let err = checked(&Resized::<1, 2>(vec![5])).unwrap_err();
    assert_eq!(
        err.0, ENCODES_DIFFERENTLY,
        "bytes past the payload are not a match"
    );
    checked(&Resized::<2, 1>(vec![1])).unwrap_err(); // one byte is too short to read two
}

#[test]
fn a_decoded_copy_that_fails_to_encode_reports_the_codec_error() {
    let err = checked(&OnlyOnce { decoded: false }).unwrap_err();
    assert!(err.0.starts_with("postcard: "), "{}", err.0);
    assert_ne!(err.0, ENCODES_DIFFERENTLY);
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    note: Option<String>,
    lines: Vec<(String, i32)>,
    tags: BTreeMap<String, Vec<u8>>,
}

fn order() -> impl Strategy<Value = Order> {
    (
        any::<u64>(),
        proptest::option::of(".{0,20}"),
        proptest::collection::vec((".{0,8}", any::<i32>()), 0..5),
        proptest::collection::btree_map(
            ".{0,8}",
            proptest::collection::vec(any::<u8>(), 0..300),
            0..4,
        ),
    )
        .prop_map(|(id, note, lines, tags)| Order {
            id,
            note,
            lines,
            tags,
        })
}

proptest! {
    /// The stored bytes are postcard's own (after the format byte), and
    /// every such value passes the check.
    #[test]
    fn encoding_is_postcard_and_every_plain_value_round_trips(
        order in order(),
        bytes in proptest::collection::vec(any::<u8>(), 0..20_000),
    ) {
        let mut out = vec![POSTCARD_FORMAT];
        Codec::<Order>::encode(&Postcard, &order, &mut out).unwrap();
        prop_assert_eq!(&out[1..], &postcard::to_stdvec(&order).unwrap()[..]);
        prop_assert_eq!(out[0], POSTCARD_FORMAT, "what was there is kept");
        prop_assert!(checked(&order).is_ok());
        let mut out = Vec::new();
        Codec::<Vec<u8>>::encode(&Postcard, &bytes, &mut out).unwrap();
        prop_assert_eq!(&out[..], &postcard::to_stdvec(&bytes).unwrap()[..]);
        prop_assert!(checked(&bytes).is_ok());
    }
}

#[test]
fn a_byte_vector_is_written_as_postcard_writes_it_and_checked_against_its_value() {
    for len in [0, 1, 127, 128, 300, 16_383, 16_384, 70_000] {
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut out = vec![POSTCARD_FORMAT];
        Codec::<Vec<u8>>::encode(&Postcard, &bytes, &mut out).unwrap();
        assert_eq!(
            out[1..],
            postcard::to_stdvec(&bytes).unwrap()[..],
            "len {len}"
        );
        Codec::<Vec<u8>>::check_round_trip(&Postcard, &bytes, &out[1..]).unwrap();
        let back: Vec<u8> = Codec::<Vec<u8>>::decode(&Postcard, &out[1..]).unwrap();
        assert_eq!(back, bytes);
    }
    // A payload that is not the value's encoding is refused: another
    // value, a cut or a longer payload.
    let bytes = vec![1u8, 2, 3];
    let check = |p: &[u8]| Codec::<Vec<u8>>::check_round_trip(&Postcard, &bytes, p);
    for payload in [
        &[3u8, 1, 2, 4][..],
        &[3, 1, 2],
        &[3, 1, 2, 3, 0],
        &[],
        &[4, 1, 2, 3],
    ] {
        assert_eq!(
            check(payload).unwrap_err().0,
            ENCODES_DIFFERENTLY,
            "{payload:?}"
        );
    }
    check(&[3, 1, 2, 3]).unwrap();
}
