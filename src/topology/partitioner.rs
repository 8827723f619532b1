//! The partition a producer gives a keyed record: for the partitioners tally's own writes may
//! use (`partitioner` in `kafka.properties`, default `consistent_random`), where the repartition
//! hop sent a key, and for the one a co-partitioned source's producers use, where its records
//! belong; either way, which task holds a key's state.

use std::collections::BTreeMap;

/// How a producer picks a keyed record's partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partitioner {
    /// CRC32 of the key (`consistent`, `consistent_random`).
    Crc32,
    /// The Java client's murmur2 (`murmur2`, `murmur2_random`).
    Murmur2,
    /// FNV-1a (`fnv1a`, `fnv1a_random`).
    Fnv1a,
    /// Not a function of the key (`random`, or a name this build does not know).
    Unknown,
}

impl Partitioner {
    /// The partitioner tally's producers use with these client properties.
    pub fn of(properties: &BTreeMap<String, String>) -> Self {
        let value = properties
            .get("partitioner")
            .map_or("consistent_random", String::as_str);
        Self::PROPERTY_VALUES
            .iter()
            .find(|(name, _)| *name == value)
            .map_or(Self::Unknown, |(_, p)| *p)
    }

    /// The values of librdkafka's `partitioner` that are a function of the key (the `_random`
    /// ones only place records without a key at random), with the hash each uses.
    pub const PROPERTY_VALUES: [(&'static str, Partitioner); 6] = [
        ("consistent_random", Partitioner::Crc32),
        ("consistent", Partitioner::Crc32),
        ("murmur2_random", Partitioner::Murmur2),
        ("murmur2", Partitioner::Murmur2),
        ("fnv1a_random", Partitioner::Fnv1a),
        ("fnv1a", Partitioner::Fnv1a),
    ];

    /// The names `co_partitioned` takes, with who uses each.
    pub const NAMED: [(&'static str, Partitioner, &'static str); 3] = [
        (
            "murmur2",
            Partitioner::Murmur2,
            "the Java client's default partitioner, and librdkafka's `murmur2_random`",
        ),
        (
            "crc32",
            Partitioner::Crc32,
            "librdkafka's default `consistent_random`: its Go, Python, .NET and C clients",
        ),
        (
            "fnv1a",
            Partitioner::Fnv1a,
            "librdkafka's `fnv1a_random`, and Sarama's default",
        ),
    ];

    /// The partitioner a `co_partitioned` name stands for.
    pub fn named(name: &str) -> Option<Self> {
        Self::NAMED.iter().find(|(n, ..)| *n == name).map(|(_, p, _)| *p)
    }

    /// The `partitioner` value that hashes with this partitioner every key, the empty one
    /// included: tally's producers use it, as librdkafka's `_random` forms send a record with
    /// an empty key to a random partition, which would part the copies of an event whose
    /// repartition key renders empty (a template of optional fields), or one entity's outputs.
    pub fn keyed_property(self) -> Option<&'static str> {
        match self {
            Self::Crc32 => Some("consistent"),
            Self::Murmur2 => Some("murmur2"),
            Self::Fnv1a => Some("fnv1a"),
            Self::Unknown => None,
        }
    }

    /// The name `co_partitioned` gives this partitioner.
    pub fn name(self) -> &'static str {
        Self::NAMED
            .iter()
            .find(|(_, p, _)| *p == self)
            .map_or("unknown", |(n, ..)| n)
    }

    /// The partition of `key` among `count`; `None` when it is not a function of the key (an
    /// empty key goes to a random partition under the `_random` partitioners).
    pub fn partition(self, key: &[u8], count: i32) -> Option<i32> {
        let count = u32::try_from(count).ok().filter(|&c| c > 0)?;
        if key.is_empty() {
            return None;
        }
        let p = match self {
            Self::Crc32 => crc32(key) % count,
            Self::Murmur2 => (murmur2(key) & 0x7fff_ffff) % count,
            // librdkafka takes the absolute value as a signed number, as Sarama does.
            Self::Fnv1a => (fnv1a(key) as i32).wrapping_abs() as u32 % count,
            Self::Unknown => return None,
        };
        i32::try_from(p).ok()
    }
}

/// CRC-32 (IEEE, as zlib and librdkafka's `rd_crc32`).
fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Murmur2 as the Java client's `Utils.murmur2` (and librdkafka's `rd_murmur2`): little-endian
/// words, Kafka's seed.
fn murmur2(bytes: &[u8]) -> u32 {
    murmur2::murmur2(bytes, murmur2::KAFKA_SEED)
}

/// 32-bit FNV-1a (librdkafka's `rd_fnv1a`).
fn fnv1a(bytes: &[u8]) -> u32 {
    const_fnv1a_hash::fnv1a_hash_32(bytes, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::bindings as rd;
    use std::ffi::c_void;

    type Native =
        unsafe extern "C" fn(*const rd::rd_kafka_topic_t, *const c_void, usize, i32, *mut c_void, *mut c_void) -> i32;

    /// librdkafka's own partitioner; the deterministic ones read neither the topic nor the
    /// opaques, so null pointers stand in for them.
    fn native(f: Native, key: &[u8], count: i32) -> i32 {
        // SAFETY: `key` is valid for `key.len()` bytes; the functions read nothing else.
        unsafe {
            f(
                std::ptr::null(),
                key.as_ptr().cast(),
                key.len(),
                count,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    }

    #[test]
    fn partitions_match_librdkafka_for_every_deterministic_partitioner() {
        let cases: [(Partitioner, Native); 3] = [
            (Partitioner::Crc32, rd::rd_kafka_msg_partitioner_consistent),
            (Partitioner::Murmur2, rd::rd_kafka_msg_partitioner_murmur2),
            (Partitioner::Fnv1a, rd::rd_kafka_msg_partitioner_fnv1a),
        ];
        for (ours, theirs) in cases {
            for n in 0..500u32 {
                let key = format!("PAY-{n}{}", "x".repeat((n % 7) as usize));
                for count in [1, 2, 3, 7, 12, 1000] {
                    assert_eq!(
                        ours.partition(key.as_bytes(), count),
                        Some(native(theirs, key.as_bytes(), count)),
                        "{ours:?} {key} of {count}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_partitioner_comes_from_the_properties_and_randomness_is_unknown() {
        let props = |v: &str| BTreeMap::from([("partitioner".to_string(), v.to_string())]);
        assert_eq!(Partitioner::of(&BTreeMap::new()), Partitioner::Crc32);
        assert_eq!(Partitioner::of(&props("murmur2_random")), Partitioner::Murmur2);
        assert_eq!(Partitioner::of(&props("fnv1a")), Partitioner::Fnv1a);
        assert_eq!(Partitioner::of(&props("random")), Partitioner::Unknown);
        for (name, partitioner, _) in Partitioner::NAMED {
            assert_eq!(
                (Partitioner::named(name), partitioner.name()),
                (Some(partitioner), name)
            );
        }
        assert_eq!(Partitioner::named("random"), None);
        for (name, partitioner) in Partitioner::PROPERTY_VALUES {
            let keyed = partitioner.keyed_property().expect("a keyed form");
            assert_eq!(Partitioner::of(&props(keyed)), partitioner, "{name} keeps its hash");
            assert!(!keyed.ends_with("_random"), "{name}: {keyed}");
        }
        assert_eq!(Partitioner::Unknown.keyed_property(), None);
        assert_eq!(Partitioner::Unknown.partition(b"k", 3), None);
        assert_eq!(Partitioner::Crc32.partition(b"", 3), None, "empty keys go anywhere");
        assert_eq!(Partitioner::Crc32.partition(b"k", 0), None);
        // The Java client's value for "21" (Kafka's own test of Utils.murmur2).
        assert_eq!(murmur2(b"21") as i32, -973_932_308);
    }
}
