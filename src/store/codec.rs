//! Stored value encoding: one format byte, then bincode, so the layout can change later.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The only layout written today: bincode 2 standard configuration.
pub const FORMAT_BINCODE_V1: u8 = 1;

/// A stored value that cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// Zero bytes: not even a format byte.
    #[error("stored value is empty (no format byte)")]
    Empty,
    /// A format this build does not know (written by a newer tally?).
    #[error("stored value has format byte {0}; this tally reads format {FORMAT_BINCODE_V1}")]
    UnknownFormat(u8),
    /// The bytes after the format byte are not a valid value.
    #[error("stored value is corrupt: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    /// Serialization failed (a bug in a value type).
    #[error("cannot encode value: {0}")]
    Encode(#[from] bincode::error::EncodeError),
}

/// Encodes a value with the current format byte.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![FORMAT_BINCODE_V1];
    out.extend(bincode::serde::encode_to_vec(value, bincode::config::standard())?);
    Ok(out)
}

/// The most memory one decode may reserve for the lengths a value claims. Stored values come
/// back from changelog and other internal topics anyone with write access can fill; bincode
/// reserves a string's or a list's claimed length before reading it, so without a bound a
/// crafted length of a few exabytes aborts the process. Every value tally writes is far
/// smaller: it passed the write limit (the broker's record size) on its way to a changelog.
pub const MAX_DECODE_BYTES: usize = 256 * 1024 * 1024;

/// Decodes a value written by `encode`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.split_first() {
        None => Err(CodecError::Empty),
        Some((&FORMAT_BINCODE_V1, body)) => {
            let config = bincode::config::standard().with_limit::<MAX_DECODE_BYTES>();
            let (value, _) = bincode::serde::decode_from_slice(body, config)?;
            Ok(value)
        }
        Some((&other, _)) => Err(CodecError::UnknownFormat(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        first_seen_ms: i64,
        note: String,
    }

    #[test]
    fn round_trips_with_a_leading_format_byte() {
        let v = Sample {
            first_seen_ms: 1_700_000_000_000,
            note: "x".into(),
        };
        let bytes = encode(&v).expect("encodes");
        assert_eq!(bytes[0], FORMAT_BINCODE_V1);
        assert_eq!(decode::<Sample>(&bytes).expect("decodes"), v);
    }

    #[test]
    fn unknown_format_empty_and_truncated_values_are_errors() {
        assert!(matches!(decode::<Sample>(&[]), Err(CodecError::Empty)));
        assert!(matches!(
            decode::<Sample>(&[9, 1, 2]),
            Err(CodecError::UnknownFormat(9))
        ));
        let bytes = encode(&Sample {
            first_seen_ms: 5,
            note: "long note".into(),
        })
        .expect("encodes");
        assert!(matches!(decode::<Sample>(&bytes[..4]), Err(CodecError::Decode(_))));
    }

    #[test]
    fn a_claimed_length_past_the_bound_is_an_error_not_an_allocation() {
        // first_seen_ms 0, then a string claiming u64::MAX >> 1 bytes, then claiming just over
        // the bound: neither is reserved.
        for claim in [u64::MAX >> 1, MAX_DECODE_BYTES as u64 + 1] {
            let mut bytes = vec![FORMAT_BINCODE_V1, 0, 0xFD];
            bytes.extend(claim.to_le_bytes());
            assert!(
                matches!(decode::<Sample>(&bytes), Err(CodecError::Decode(_))),
                "claim {claim}"
            );
        }
    }
}
