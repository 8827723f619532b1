//! Arbitrary header names and values (any bytes: not UTF-8, empty, NUL inside) through the
//! byte-level header functions tally reads and copies record headers with. Input layout:
//! segments separated by 0xFF, taken in pairs as name and value; a value of the single byte
//! 0xFE stands for a null value.
//!
//! Checked: no panic, and what is added reads back in order, byte for byte. The one loss is
//! librdkafka's: it keeps names NUL-terminated, so a name reads back up to its first NUL.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdkafka::message::OwnedHeaders;
use tally::engine::headers;

fuzz_target!(|data: &[u8]| {
    let segments: Vec<&[u8]> = data.split(|&b| b == 0xFF).collect();
    let pairs: Vec<(&[u8], Option<&[u8]>)> = segments
        .chunks(2)
        .map(|pair| {
            let value = pair.get(1).copied().unwrap_or_default();
            (pair[0], (value != [0xFE]).then_some(value))
        })
        .collect();
    let built = pairs
        .iter()
        .fold(OwnedHeaders::new(), |h, (name, value)| headers::add(h, name, *value));
    let read: Vec<_> = headers::list(built.as_borrowed()).collect();
    assert_eq!(read.len(), pairs.len(), "every header reads back");
    for (got, (name, value)) in read.iter().zip(&pairs) {
        let kept = name.split(|&b| b == 0).next().unwrap_or_default();
        assert_eq!(got.name, kept, "the name, up to a NUL");
        assert_eq!(got.value, *value, "the value, byte for byte");
    }
});
