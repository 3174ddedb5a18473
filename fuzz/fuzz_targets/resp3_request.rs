//! Untrusted request payloads: the codec must never panic, what it accepts must round-trip,
//! and the engine's argument parser must not panic on anything the codec lets through.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use stategate::engine::{Command, Meta};
use stategate::hlc::Hlc;
use stategate::resp3::{Frame, decode, decode_request, encode_request};

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);

    if let Ok(frame) = decode(&payload) {
        assert_eq!(decode(&frame.encode()), Ok(frame));
    }

    if let Ok(args) = decode_request(&payload) {
        // A request is also a frame: an array of bulk strings.
        let as_frame = Frame::Array(args.iter().cloned().map(Frame::Bulk).collect());
        assert_eq!(decode(&payload), Ok(as_frame));
        assert_eq!(decode_request(&encode_request(&args)).as_ref(), Ok(&args));

        let meta = Meta {
            timestamp: Some(Hlc::new(1_700_000_000_000, 1, "fuzz")),
            fencing: Some(Hlc::new(1_700_000_000_000, 2, "fuzz")),
            client: Some("fuzz".into()),
            persist: true,
            ..Meta::default()
        };
        let _ = Command::parse(args.clone(), meta);
        let _ = Command::parse(args, Meta::default());
    }
});
