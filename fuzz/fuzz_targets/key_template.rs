//! Arbitrary template text and JSON through `KeyTemplate` parse and render. Input layout:
//! template bytes, a 0xFF byte (never part of UTF-8), then the JSON document.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tally::topology::KeyTemplate;

fuzz_target!(|data: &[u8]| {
    let (template, json) = match data.iter().position(|&b| b == 0xFF) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(template) else {
        return;
    };
    let Ok(parsed) = text.parse::<KeyTemplate>() else {
        return;
    };
    assert_eq!(
        parsed.to_string(),
        text,
        "a template displays as the text it was parsed from"
    );
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(json) else {
        return;
    };
    let first = parsed.render(&doc);
    assert_eq!(first, parsed.render(&doc), "rendering is a function of the document");
    let key = parsed.render_key(&doc);
    assert_eq!(key.clone().map(|k| k.text), first, "both forms agree on success and failure");
    // Numbers keep their text: the document written out and read back keys the same.
    let again: serde_json::Map<String, Value> =
        serde_json::from_str(&serde_json::to_string(&doc).expect("serializes")).expect("reads back");
    assert_eq!(parsed.render_key(&again), key, "a round trip through JSON text changes no key");
});
