//! Kafka offsets as stores record them (a changelog's last applied record, an ID-mapping
//! partition's position): eight bytes, big-endian.

/// The bytes recorded for `offset`.
pub fn encode(offset: i64) -> [u8; 8] {
    offset.to_be_bytes()
}

/// The offset `bytes` record, or `None` when they cannot be one: not eight bytes, negative (a
/// Kafka offset never is), or `i64::MAX` (the next one must exist).
pub fn decode(bytes: &[u8]) -> Option<i64> {
    <[u8; 8]>::try_from(bytes)
        .map(i64::from_be_bytes)
        .ok()
        .filter(|o| (0..i64::MAX).contains(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_eight_bytes_of_a_possible_offset_read_back() {
        for o in [0, 1, 41, i64::MAX - 1] {
            assert_eq!(decode(&encode(o)), Some(o));
        }
        for bad in [-1, i64::MIN, i64::MAX] {
            assert_eq!(decode(&encode(bad)), None, "{bad}");
        }
        assert_eq!(decode(b"bad"), None);
        assert_eq!(decode(&[0; 9]), None);
    }
}
