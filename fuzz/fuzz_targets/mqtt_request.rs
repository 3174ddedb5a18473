//! One MQTT request as the door receives it: user properties (`name=value` lines, then an
//! empty line) and the RESP3 payload after them, handled as `mqtt::request::handle` does for
//! a PUBLISH on the invoke topic (envelope checks, protocol version, `__ts`/`__ft`/`__srcId`,
//! payload decoding, the command's own parsing, execution on a fresh engine).
//!
//! Whatever comes in: no panic, always an answer (the envelope is valid), never `__stat=500`
//! (a service fault: the memory store has none to report).

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use stategate::mqtt::INVOKE_TOPIC;
use stategate::mqtt::request::{PROP_STATUS, Request, handle};
use stategate_fuzz::{engine, head_and_body, run};

fuzz_target!(|data: &[u8]| {
    let (user_properties, payload) = head_and_body(data, b'=');
    let req = Request {
        topic: INVOKE_TOPIC.into(),
        qos: 1,
        payload: Bytes::copy_from_slice(payload),
        response_topic: Some("clients/fuzz/response".into()),
        correlation: Some(Bytes::from_static(b"fuzz-correlation")),
        user_properties,
        message_expiry: Some(10),
    };
    run(async {
        let engine = engine().await;
        let out = handle(&engine, "fuzz-service", &req)
            .await
            .expect("a valid envelope is always answered");
        let status = out.user_properties.iter().find(|(k, _)| k == PROP_STATUS);
        assert!(
            status.is_some_and(|(_, v)| v != "500"),
            "a service fault for a request: {:?}",
            out.user_properties
        );
    });
});
