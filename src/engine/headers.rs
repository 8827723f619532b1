//! Record headers as bytes. rdkafka's header accessors hand out names as `&str` and panic on a
//! name that is not UTF-8 (an unchecked conversion in `BorrowedHeaders::try_get`), which any
//! librdkafka, Go or kcat producer can send; these read and copy headers through librdkafka's C
//! API without that assumption. That API hands names out NUL-terminated and without their
//! length, so a name holding a NUL byte is read up to it (README, "Outputs").

use rdkafka::bindings as rdsys;
use rdkafka::message::{BorrowedHeaders, BorrowedMessage, Message, OwnedHeaders};
use std::ffi::CStr;
use std::os::raw::c_void;
use std::ptr;

/// One header: its name and value as bytes (`None`: a null value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawHeader<'a> {
    /// The name, whatever its encoding.
    pub name: &'a [u8],
    /// The value.
    pub value: Option<&'a [u8]>,
}

/// The headers of a list, in order.
pub fn list(headers: &BorrowedHeaders) -> impl Iterator<Item = RawHeader<'_>> + '_ {
    let native = native(headers);
    // SAFETY: `native` is the list behind `headers`, alive for the borrow.
    let count = unsafe { rdsys::rd_kafka_header_cnt(native) };
    (0..count).filter_map(move |idx| {
        let mut name = ptr::null();
        let mut value: *const c_void = ptr::null();
        let mut size = 0;
        // SAFETY: idx < count; the out-pointers are valid locals; what they receive points into
        // the list, alive as long as `headers` is borrowed.
        let err = unsafe { rdsys::rd_kafka_header_get_all(native, idx, &mut name, &mut value, &mut size) };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            return None;
        }
        // SAFETY: librdkafka keeps names NUL-terminated, and a non-null value is `size` bytes.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let value = (!value.is_null()).then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) });
        Some(RawHeader { name, value })
    })
}

/// The headers of a consumed record, in order.
pub fn entries<'a>(msg: &'a BorrowedMessage<'_>) -> impl Iterator<Item = RawHeader<'a>> + 'a {
    msg.headers().into_iter().flat_map(list)
}

/// The value of the first header named `name`, when it is UTF-8 text.
pub fn text<'a>(msg: &'a BorrowedMessage<'_>, name: &str) -> Option<&'a str> {
    entries(msg)
        .find(|h| h.name == name.as_bytes())
        .and_then(|h| std::str::from_utf8(h.value?).ok())
}

/// A copy of the record's headers, names and values as they are (binary names included), minus
/// every header named `skip` or starting with `tally.` (tally sets those itself).
pub fn copy_except(msg: &BorrowedMessage<'_>, skip: &str) -> OwnedHeaders {
    let kept: Vec<RawHeader<'_>> = entries(msg)
        .filter(|h| h.name != skip.as_bytes() && !h.name.starts_with(b"tally."))
        .collect();
    let mut owned = OwnedHeaders::new_with_capacity(kept.len());
    for h in kept {
        owned = add(owned, h.name, h.value);
    }
    owned
}

/// Adds a header whose name is any bytes (a NUL ends it, as in librdkafka's own storage).
pub fn add(headers: OwnedHeaders, name: &[u8], value: Option<&[u8]>) -> OwnedHeaders {
    let (value_ptr, size) = match value {
        Some(v) => (v.as_ptr().cast::<c_void>(), v.len() as isize),
        None => (ptr::null(), 0),
    };
    let native = native(headers.as_borrowed());
    // SAFETY: `native` is the list `headers` owns, and `headers` is held by value here, so no
    // other reference reads it during the call; librdkafka copies name and value.
    unsafe {
        rdsys::rd_kafka_header_add(native, name.as_ptr().cast(), name.len() as isize, value_ptr, size);
    }
    headers
}

/// The native list behind a header view: rdkafka's `BorrowedHeaders` is a transparent view of
/// an `rd_kafka_headers_t` pointer, which is how rdkafka itself converts between the two.
fn native(headers: &BorrowedHeaders) -> *mut rdsys::rd_kafka_headers_t {
    headers as *const BorrowedHeaders as *mut rdsys::rd_kafka_headers_t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_names_and_values_survive_a_round_trip() {
        let h = add(OwnedHeaders::new(), b"\xff\xfe", Some(b"\x00\x01"));
        let h = add(h, b"plain", None);
        let h = add(h, b"tally.source.offset", Some(b"7"));
        let seen: Vec<RawHeader<'_>> = list(h.as_borrowed()).collect();
        assert_eq!(
            seen,
            vec![
                RawHeader {
                    name: b"\xff\xfe",
                    value: Some(b"\x00\x01")
                },
                RawHeader {
                    name: b"plain",
                    value: None
                },
                RawHeader {
                    name: b"tally.source.offset",
                    value: Some(b"7")
                },
            ]
        );
    }

    #[test]
    fn empty_names_and_values_read_back_and_a_name_keeps_what_precedes_a_nul() {
        let h = add(OwnedHeaders::new(), b"", Some(b""));
        let h = add(h, b"a\0b", Some(b"\0"));
        let seen: Vec<RawHeader<'_>> = list(h.as_borrowed()).collect();
        // librdkafka keeps names NUL-terminated: the one thing a name can lose.
        assert_eq!(
            seen,
            vec![
                RawHeader {
                    name: b"",
                    value: Some(b"")
                },
                RawHeader {
                    name: b"a",
                    value: Some(b"\0")
                },
            ]
        );
    }
}
