//! The export format (`stategate import`, `POST /v1.0-alpha1/stategate/import`): JSON lines.
//! Whatever comes in: no panic; and what is accepted round-trips, so an import of an export
//! loses nothing (the key, the value and every field).

#![no_main]

use libfuzzer_sys::fuzz_target;
use stategate::dump::{decode_line, decode_lines, encode_line};

fuzz_target!(|data: &[u8]| {
    let Ok(records) = decode_lines(data, 1) else {
        return;
    };
    for (key, record) in records {
        let mut line = Vec::new();
        encode_line(&key, &record, &mut line);
        let line = line.strip_suffix(b"\n").expect("a line ends with its newline");
        let (key2, record2) = decode_line(line).expect("an encoded line decodes");
        assert_eq!(key2, key);
        assert_eq!(record2, record);
    }
});
