//! The codec against the byte-exact forms of the spec (section 3 and 8), malformed input, and
//! properties (round trips, no panics on arbitrary bytes). Fixtures live in `tests/data/resp3`.

use bytes::Bytes;
use proptest::prelude::*;

use super::*;

fn bulk(b: &[u8]) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(b))
}

fn arr(items: Vec<Frame>) -> Frame {
    Frame::Array(items)
}

fn args(list: &[&[u8]]) -> Vec<Bytes> {
    list.iter().map(|a| Bytes::copy_from_slice(a)).collect()
}

/// `frame` encodes to exactly `wire`, and `wire` decodes to exactly `frame`.
#[track_caller]
fn check_both(wire: &[u8], frame: Frame) {
    assert_eq!(frame.encode(), Bytes::copy_from_slice(wire), "encode {frame:?}");
    assert_eq!(
        decode(&Bytes::copy_from_slice(wire)),
        Ok(frame),
        "decode {:?}",
        String::from_utf8_lossy(wire)
    );
}

#[track_caller]
fn check_request(wire: &[u8], expect: &[&[u8]]) {
    assert_eq!(
        encode_request(expect.iter()),
        Bytes::copy_from_slice(wire),
        "encode_request {expect:?}"
    );
    assert_eq!(
        decode_request(&Bytes::copy_from_slice(wire)),
        Ok(args(expect)),
        "decode_request {:?}",
        String::from_utf8_lossy(wire)
    );
}

#[track_caller]
fn request_err(wire: &[u8], expect: DecodeError) {
    assert_eq!(
        decode_request(&Bytes::copy_from_slice(wire)),
        Err(expect),
        "decode_request {:?}",
        String::from_utf8_lossy(wire)
    );
}

#[track_caller]
fn frame_err(wire: &[u8], expect: DecodeError) {
    assert_eq!(
        decode(&Bytes::copy_from_slice(wire)),
        Err(expect),
        "decode {:?}",
        String::from_utf8_lossy(wire)
    );
}

// ----- the request table of spec section 3 -----

#[test]
fn requests_of_every_spec_form() {
    check_request(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n", &[b"SET", b"k", b"v"]);
    check_request(
        b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nNX\r\n",
        &[b"SET", b"k", b"v", b"NX"],
    );
    check_request(
        b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$3\r\nNEX\r\n",
        &[b"SET", b"k", b"v", b"NEX"],
    );
    check_request(
        b"*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nNX\r\n$2\r\nPX\r\n$3\r\n100\r\n",
        &[b"SET", b"k", b"v", b"NX", b"PX", b"100"],
    );
    check_request(
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nPX\r\n$6\r\n1500.5\r\n",
        &[b"SET", b"k", b"v", b"PX", b"1500.5"],
    );
    check_request(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", &[b"GET", b"k"]);
    check_request(b"*2\r\n$3\r\nDEL\r\n$1\r\nk\r\n", &[b"DEL", b"k"]);
    check_request(b"*3\r\n$4\r\nVDEL\r\n$1\r\nk\r\n$1\r\nv\r\n", &[b"VDEL", b"k", b"v"]);
    check_request(b"*2\r\n$9\r\nKEYNOTIFY\r\n$1\r\nk\r\n", &[b"KEYNOTIFY", b"k"]);
    check_request(
        b"*3\r\n$9\r\nKEYNOTIFY\r\n$1\r\nk\r\n$4\r\nSTOP\r\n",
        &[b"KEYNOTIFY", b"k", b"STOP"],
    );
    check_request(b"*2\r\n$4\r\nSCAN\r\n$1\r\n*\r\n", &[b"SCAN", b"*"]);
    check_request(b"*3\r\n$4\r\nSCAN\r\n$1\r\n*\r\n$2\r\n6B\r\n", &[b"SCAN", b"*", b"6B"]);
}

#[test]
fn request_arguments_may_hold_crlf_and_any_byte() {
    check_request(
        b"*3\r\n$3\r\nSET\r\n$3\r\na\r\n\r\n$5\r\n\r\n\r\n\x00\r\n",
        &[b"SET", b"a\r\n", b"\r\n\r\n\x00"],
    );
    // A value that looks like RESP framing is still one opaque value.
    check_request(
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$8\r\n\r\n$3\r\n\r\n\r\n",
        &[b"SET", b"k", b"\r\n$3\r\n\r\n"],
    );
    check_request(b"*3\r\n$3\r\nSET\r\n$1\r\n\xff\r\n$0\r\n\r\n", &[b"SET", b"\xff", b""]);
    check_request(b"*0\r\n", &[]);
}

#[test]
fn decoded_arguments_share_the_payload_memory() {
    let payload = encode_request([&b"GET"[..], b"somekey"]);
    let args = decode_request(&payload).unwrap();
    let range = payload.as_ptr_range();
    assert!(range.contains(&args[1].as_ptr()));
}

// ----- the response table of spec section 3 -----

#[test]
fn responses_of_every_spec_form() {
    check_both(b"+OK\r\n", Frame::Simple("OK".into()));
    check_both(b":-1\r\n", Frame::Integer(-1));
    check_both(b"$-1\r\n", Frame::Null);
    check_both(b"$5\r\nhello\r\n", bulk(b"hello"));
    check_both(b"$0\r\n\r\n", bulk(b""));
    check_both(b":1\r\n", Frame::Integer(1));
    check_both(b":0\r\n", Frame::Integer(0));
    check_both(b"-ERR syntax error\r\n", Frame::Error("ERR syntax error".into()));
}

#[test]
fn get_hit_values_may_hold_crlf() {
    check_both(b"$4\r\na\r\nb\r\n", bulk(b"a\r\nb"));
    check_both(b"$2\r\n\r\n\r\n", bulk(b"\r\n"));
    check_both(b"$5\r\n$-1\r\n\r\n", bulk(b"$-1\r\n"));
}

#[test]
fn scan_replies() {
    // Last page.
    check_both(
        b"*1\r\n*2\r\n$4\r\nkey1\r\n$4\r\nkey2\r\n",
        arr(vec![arr(vec![bulk(b"key1"), bulk(b"key2")])]),
    );
    // Last page, no keys.
    check_both(b"*1\r\n*0\r\n", arr(vec![arr(vec![])]));
    // More pages follow.
    check_both(
        b"*2\r\n*1\r\n$4\r\nkey1\r\n$8\r\n6B657931\r\n",
        arr(vec![arr(vec![bulk(b"key1")]), bulk(b"6B657931")]),
    );
    // More pages follow, none of the examined keys matched.
    check_both(b"*2\r\n*0\r\n$2\r\n6B\r\n", arr(vec![arr(vec![]), bulk(b"6B")]));
}

#[test]
fn notification_payloads() {
    check_both(
        b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\na\r\n\r\n",
        arr(vec![bulk(b"NOTIFY"), bulk(b"SET"), bulk(b"VALUE"), bulk(b"a\r\n")]),
    );
    check_both(
        b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n",
        arr(vec![bulk(b"NOTIFY"), bulk(b"DELETE")]),
    );
}

#[test]
fn integers_at_the_edges() {
    check_both(b":9223372036854775807\r\n", Frame::Integer(i64::MAX));
    check_both(b":-9223372036854775808\r\n", Frame::Integer(i64::MIN));
    frame_err(b":9223372036854775808\r\n", DecodeError::BadNumber);
    frame_err(b":-9223372036854775809\r\n", DecodeError::BadNumber);
    frame_err(b":00000000000000000001\r\n", DecodeError::BadNumber);
}

#[test]
fn decode_accepts_the_other_null_forms() {
    assert_eq!(decode(&Bytes::from_static(b"*-1\r\n")), Ok(Frame::Null));
    assert_eq!(decode(&Bytes::from_static(b"_\r\n")), Ok(Frame::Null));
}

#[test]
fn empty_simple_and_error_strings() {
    check_both(b"+\r\n", Frame::Simple(String::new()));
    check_both(b"-\r\n", Frame::Error(String::new()));
}

// ----- malformed requests -----

#[test]
fn request_incomplete() {
    request_err(b"", DecodeError::Incomplete);
    request_err(b"*", DecodeError::Incomplete);
    request_err(b"*1", DecodeError::Incomplete);
    request_err(b"*1\r", DecodeError::Incomplete);
    request_err(b"*1\r\n", DecodeError::Incomplete);
    request_err(b"*1\r\n$3\r\nGET", DecodeError::Incomplete);
    request_err(b"*1\r\n$3\r\nGET\r", DecodeError::Incomplete);
    request_err(b"*2\r\n$3\r\nGET\r\n", DecodeError::Incomplete);
    // A declared length longer than what is there.
    request_err(b"*1\r\n$4\r\nGET\r\n", DecodeError::Incomplete);
}

#[test]
fn request_wrong_lengths_and_missing_crlf() {
    // A declared length shorter than the bytes before CRLF.
    request_err(b"*1\r\n$2\r\nGET\r\n", DecodeError::MissingCrlf);
    // Bytes where the CRLF after a bulk should be.
    request_err(b"*1\r\n$3\r\nGETXX", DecodeError::MissingCrlf);
    request_err(b"*1\r\n$3\r\nGET\n\r", DecodeError::MissingCrlf);
    // A bare CR ends the count line.
    request_err(b"*1\r$3\r\nGET\r\n", DecodeError::MissingCrlf);
    // A bare LF is not a line end: the count line runs to the next CRLF.
    request_err(b"*1\n$3\r\nGET\r\n", DecodeError::BadNumber);
    request_err(b"*1\r\n$3\nGET\r\n", DecodeError::BadNumber);
}

#[test]
fn request_trailing_bytes() {
    request_err(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nx", DecodeError::TrailingBytes);
    request_err(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n\r\n", DecodeError::TrailingBytes);
    request_err(b"*1\r\n$3\r\nGET\r\n*1\r\n$3\r\nGET\r\n", DecodeError::TrailingBytes);
    request_err(b"*0\r\n*0\r\n", DecodeError::TrailingBytes);
}

#[test]
fn request_negative_lengths() {
    // A null array or a null bulk is not a command.
    request_err(b"*-1\r\n", DecodeError::NotACommand);
    request_err(b"*1\r\n$-1\r\n", DecodeError::NotACommand);
    // Other negatives are not lengths at all.
    request_err(b"*-2\r\n", DecodeError::BadNumber);
    request_err(b"*1\r\n$-2\r\n", DecodeError::BadNumber);
    request_err(b"*1\r\n$-3\r\nGET\r\n", DecodeError::BadNumber);
    request_err(b"*-9223372036854775808\r\n", DecodeError::BadNumber);
}

#[test]
fn request_huge_counts_fail_without_allocating() {
    // Counts are not trusted for allocation: too many arguments are refused at once, and
    // lengths fail when the bytes run out.
    request_err(b"*999999999999\r\n", DecodeError::TooLarge);
    request_err(b"*9223372036854775807\r\n$0\r\n\r\n", DecodeError::TooLarge);
    request_err(b"*1\r\n$999999999999\r\nGET\r\n", DecodeError::Incomplete);
    request_err(b"*1\r\n$9223372036854775807\r\nGET\r\n", DecodeError::Incomplete);
    // More digits than any i64.
    request_err(b"*99999999999999999999\r\n", DecodeError::BadNumber);
    request_err(b"*1\r\n$99999999999999999999\r\n", DecodeError::BadNumber);
}

/// A request is bounded like any frame: more than `MAX_ELEMENTS` arguments are refused before
/// anything is allocated for them.
#[test]
fn request_over_max_elements_is_refused() {
    let n = MAX_ELEMENTS + 1;
    let mut wire = format!("*{n}\r\n").into_bytes();
    wire.extend_from_slice(&b"$0\r\n\r\n".repeat(n));
    let wire = Bytes::from(wire);
    assert_eq!(decode(&wire), Err(DecodeError::TooLarge));
    assert_eq!(decode_request(&wire), Err(DecodeError::TooLarge));
}

#[test]
fn request_bad_numbers() {
    for wire in [
        &b"*\r\n"[..],
        b"*x\r\n",
        b"*+1\r\n",
        b"* 1\r\n",
        b"*1 \r\n",
        b"*-\r\n",
        b"*1.0\r\n",
        b"*0x1\r\n",
        b"*1\r\n$\r\n\r\n",
        b"*1\r\n$a\r\nGET\r\n",
    ] {
        request_err(wire, DecodeError::BadNumber);
    }
}

#[test]
fn request_must_be_an_array_of_bulk_strings() {
    for wire in [
        &b"+OK\r\n"[..],
        b"-ERR x\r\n",
        b":1\r\n",
        b"$3\r\nGET\r\n",
        b"$-1\r\n",
        b"_\r\n",
        b"GET k\r\n",
        b"*1\r\n+GET\r\n",
        b"*1\r\n:1\r\n",
        b"*1\r\n*1\r\n$3\r\nGET\r\n",
        b"*2\r\n$3\r\nGET\r\n_\r\n",
        b"*2\r\n$3\r\nGET\r\nk\r\n",
    ] {
        request_err(wire, DecodeError::NotACommand);
    }
}

// ----- malformed frames -----

#[test]
fn frame_errors() {
    frame_err(b"", DecodeError::Incomplete);
    frame_err(b"+OK", DecodeError::Incomplete);
    frame_err(b"+OK\r", DecodeError::Incomplete);
    frame_err(b"$3\r\nab", DecodeError::Incomplete);
    frame_err(b"*2\r\n:1\r\n", DecodeError::Incomplete);
    frame_err(b"+OK\rX", DecodeError::MissingCrlf);
    frame_err(b"$1\r\nabc\r\n", DecodeError::MissingCrlf);
    frame_err(b"_x\r\n", DecodeError::MissingCrlf);
    frame_err(b"?\r\n", DecodeError::UnknownType(b'?'));
    frame_err(b"\r\n", DecodeError::UnknownType(b'\r'));
    frame_err(b"#t\r\n", DecodeError::UnknownType(b'#'));
    frame_err(b":\r\n", DecodeError::BadNumber);
    frame_err(b":-\r\n", DecodeError::BadNumber);
    frame_err(b":1a\r\n", DecodeError::BadNumber);
    frame_err(b"$-2\r\n", DecodeError::BadNumber);
    frame_err(b"*-2\r\n", DecodeError::BadNumber);
    frame_err(b"+\xff\r\n", DecodeError::NotUtf8);
    frame_err(b"-ERR \xc3\x28\r\n", DecodeError::NotUtf8);
    frame_err(b"+OK\r\n+OK\r\n", DecodeError::TrailingBytes);
    frame_err(b"$-1\r\n\r\n", DecodeError::TrailingBytes);
}

#[test]
fn frame_counts_and_depth_are_bounded() {
    frame_err(b"*999999999999\r\n", DecodeError::TooLarge);
    let over = format!("*{}\r\n", MAX_ELEMENTS + 1);
    frame_err(over.as_bytes(), DecodeError::TooLarge);
    let at = format!("*{MAX_ELEMENTS}\r\n");
    frame_err(at.as_bytes(), DecodeError::Incomplete);

    // Eight nested arrays around a leaf decode; nine do not.
    let nested = |n: usize| {
        let mut wire = b"*1\r\n".repeat(n);
        wire.extend_from_slice(b":7\r\n");
        Bytes::from(wire)
    };
    let mut expect = Frame::Integer(7);
    for _ in 0..8 {
        expect = arr(vec![expect]);
    }
    assert_eq!(decode(&nested(8)), Ok(expect));
    assert_eq!(decode(&nested(9)), Err(DecodeError::TooLarge));
    assert_eq!(decode(&nested(10_000)), Err(DecodeError::TooLarge));
}

// ----- fixtures -----

fn fixture_dir() -> std::path::PathBuf {
    // Cargo sets the variable when it runs the test too: a test binary built in another
    // checkout sharing the target directory (CI's) would name that checkout at compile time.
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    std::path::Path::new(&dir).join("../../tests/data/resp3")
}

fn fixture(name: &str) -> Bytes {
    let path = fixture_dir().join(name);
    Bytes::from(std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// Request fixtures: one per request form of spec section 3.
const REQUEST_FIXTURES: &[(&str, &[&[u8]])] = &[
    ("set.resp", &[b"SET", b"SOMEKEY", b"SOMEVALUE"]),
    ("set_nx.resp", &[b"SET", b"SOMEKEY", b"SOMEVALUE", b"NX"]),
    ("set_nex.resp", &[b"SET", b"SOMEKEY", b"SOMEVALUE", b"NEX"]),
    ("set_px.resp", &[b"SET", b"SOMEKEY", b"SOMEVALUE", b"PX", b"1000"]),
    (
        "set_nx_px.resp",
        &[b"SET", b"SOMEKEY", b"SOMEVALUE", b"NX", b"PX", b"1000"],
    ),
    (
        "set_nex_px.resp",
        &[b"SET", b"SOMEKEY", b"SOMEVALUE", b"NEX", b"PX", b"10000"],
    ),
    (
        "set_px_fraction.resp",
        &[b"SET", b"SOMEKEY", b"SOMEVALUE", b"PX", b"1500.5"],
    ),
    ("set_value_crlf.resp", &[b"SET", b"k\r\n1", b"\r\n$3\r\n\r\n"]),
    ("set_empty_value.resp", &[b"SET", b"SOMEKEY", b""]),
    ("get.resp", &[b"GET", b"SOMEKEY"]),
    ("del.resp", &[b"DEL", b"SOMEKEY"]),
    ("vdel.resp", &[b"VDEL", b"SOMEKEY", b"SOMEVALUE"]),
    ("keynotify.resp", &[b"KEYNOTIFY", b"SOMEKEY"]),
    ("keynotify_stop.resp", &[b"KEYNOTIFY", b"SOMEKEY", b"STOP"]),
    ("scan.resp", &[b"SCAN", b"key*"]),
    ("scan_token.resp", &[b"SCAN", b"key*", b"6B6579"]),
];

/// Reply and notification fixtures: one per response form of spec sections 3 and 8.
fn reply_fixtures() -> Vec<(&'static str, Frame)> {
    vec![
        ("reply_ok.resp", Frame::Simple("OK".into())),
        ("reply_not_applied.resp", Frame::Integer(-1)),
        ("reply_nil.resp", Frame::Null),
        ("reply_value.resp", bulk(b"SOMEVALUE")),
        ("reply_empty_value.resp", bulk(b"")),
        ("reply_deleted.resp", Frame::Integer(1)),
        ("reply_absent.resp", Frame::Integer(0)),
        // Codec bug: `i64::MIN` encoded but did not decode (the magnitude overflowed first).
        ("reply_int_min.resp", Frame::Integer(i64::MIN)),
        (
            "reply_scan_last.resp",
            arr(vec![arr(vec![bulk(b"key1"), bulk(b"key2")])]),
        ),
        (
            "reply_scan_more.resp",
            arr(vec![arr(vec![bulk(b"key1")]), bulk(b"6B657931")]),
        ),
        ("reply_scan_empty_more.resp", arr(vec![arr(vec![]), bulk(b"6B657931")])),
        ("reply_error.resp", Frame::Error("ERR syntax error".into())),
        (
            "notify_set.resp",
            arr(vec![bulk(b"NOTIFY"), bulk(b"SET"), bulk(b"VALUE"), bulk(b"SOMEVALUE")]),
        ),
        ("notify_delete.resp", arr(vec![bulk(b"NOTIFY"), bulk(b"DELETE")])),
    ]
}

#[test]
fn request_fixtures_decode_to_their_arguments() {
    for (name, expect) in REQUEST_FIXTURES {
        let wire = fixture(name);
        assert_eq!(decode_request(&wire), Ok(args(expect)), "{name}");
        assert_eq!(encode_request(expect.iter()), wire, "{name}");
    }
}

#[test]
fn reply_fixtures_decode_to_their_frames() {
    for (name, expect) in reply_fixtures() {
        let wire = fixture(name);
        assert_eq!(expect.encode(), wire, "{name}");
        assert_eq!(decode(&wire), Ok(expect), "{name}");
        if !name.starts_with("notify_") {
            assert_eq!(
                decode_request(&wire),
                Err(DecodeError::NotACommand),
                "{name}: a reply is not a request"
            );
        }
    }
}

#[test]
fn every_fixture_is_checked() {
    let replies = reply_fixtures();
    let mut unchecked = Vec::new();
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !name.ends_with(".resp") {
            continue;
        }
        let known = REQUEST_FIXTURES.iter().any(|(n, _)| *n == name) || replies.iter().any(|(n, _)| *n == name);
        if !known {
            unchecked.push(name);
        }
    }
    assert!(unchecked.is_empty(), "fixtures without expectations: {unchecked:?}");
}

// ----- properties -----

/// Frames that survive a round trip: simple and error strings without CR or LF, and no deeper
/// nesting than the decoder accepts.
fn arb_frame() -> impl Strategy<Value = Frame> {
    let leaf = prop_oneof![
        "[^\r\n]{0,16}".prop_map(Frame::Simple),
        "[^\r\n]{0,16}".prop_map(Frame::Error),
        any::<i64>().prop_map(Frame::Integer),
        proptest::collection::vec(any::<u8>(), 0..32).prop_map(|v| Frame::Bulk(Bytes::from(v))),
        Just(Frame::Null),
    ];
    leaf.prop_recursive(8, 64, 6, |inner| {
        proptest::collection::vec(inner, 0..6).prop_map(Frame::Array)
    })
}

/// Bytes built from RESP-like tokens: more likely than random bytes to reach deep decoder paths.
fn resp_like_bytes() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(&b"*"[..]),
        Just(&b"$"[..]),
        Just(&b"+"[..]),
        Just(&b"-"[..]),
        Just(&b":"[..]),
        Just(&b"_"[..]),
        Just(&b"\r\n"[..]),
        Just(&b"\r"[..]),
        Just(&b"\n"[..]),
        Just(&b"-1"[..]),
        Just(&b"0"[..]),
        Just(&b"1"[..]),
        Just(&b"2"[..]),
        Just(&b"3"[..]),
        Just(&b"999999999999"[..]),
        Just(&b"9223372036854775808"[..]),
        Just(&b"SET"[..]),
        Just(&b"\xff"[..]),
    ];
    proptest::collection::vec(token, 0..40).prop_map(|ts| ts.concat())
}

/// One argument of a generated request: any bytes, or RESP-like tokens (so that an argument can
/// look like a header, `\r\n$3\r\n`, and a decoder that trusts content over lengths goes wrong).
fn arb_arg() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..12),
        proptest::collection::vec(resp_like_bytes(), 0..3).prop_map(|v| v.concat()),
    ]
}

/// How a generated request is damaged before it is decoded.
#[derive(Debug, Clone)]
enum Mutation {
    /// Left as encoded: a valid request.
    Keep,
    /// Cut at an offset.
    Truncate(prop::sample::Index),
    /// Bytes appended after the end.
    Append(Vec<u8>),
    /// One byte replaced by a byte that means something in RESP (a type, a digit, CR, LF).
    Replace(prop::sample::Index, u8),
    /// One byte xor-ed with a non-zero mask.
    Flip(prop::sample::Index, u8),
    /// One byte inserted.
    Insert(prop::sample::Index, u8),
    /// One byte removed.
    Remove(prop::sample::Index),
    /// One element (or, in an empty request, a new one) replaced by the encoding of a frame that
    /// is not a bulk string: `$-1`, `*-1`, `_`, a simple string, an integer, a nested array.
    Foreign(prop::sample::Index, Vec<u8>),
}

impl Mutation {
    fn is_keep(&self) -> bool {
        matches!(self, Mutation::Keep)
    }

    /// The request `list` encoded, then damaged.
    fn apply(&self, list: &[Vec<u8>]) -> Vec<u8> {
        if let Mutation::Foreign(at, frame) = self {
            let at = at.index(list.len().max(1));
            let n = list.len().max(1);
            let mut out = format!("*{n}\r\n").into_bytes();
            for i in 0..n {
                match list.get(i) {
                    Some(_) if i == at => out.extend_from_slice(frame),
                    Some(arg) => out.extend_from_slice(&Frame::Bulk(Bytes::from(arg.clone())).encode()),
                    None => out.extend_from_slice(frame),
                }
            }
            return out;
        }
        let mut out = encode_request(list).to_vec();
        // Every encoded request has at least `*0\r\n`, so indexing into it is safe.
        match self {
            Mutation::Keep | Mutation::Foreign(..) => {}
            Mutation::Truncate(at) => out.truncate(at.index(out.len())),
            Mutation::Append(extra) => out.extend_from_slice(extra),
            Mutation::Replace(at, b) => {
                let i = at.index(out.len());
                out[i] = *b;
            }
            Mutation::Flip(at, mask) => {
                let i = at.index(out.len());
                out[i] ^= *mask;
            }
            Mutation::Insert(at, b) => out.insert(at.index(out.len() + 1), *b),
            Mutation::Remove(at) => {
                out.remove(at.index(out.len()));
            }
        }
        out
    }
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    let foreign = prop_oneof![
        Just(b"$-1\r\n".to_vec()),
        Just(b"*-1\r\n".to_vec()),
        Just(b"_\r\n".to_vec()),
        Just(b"+OK\r\n".to_vec()),
        Just(b"-ERR x\r\n".to_vec()),
        Just(b":1\r\n".to_vec()),
        Just(b"*1\r\n$1\r\nx\r\n".to_vec()),
        arb_frame()
            .prop_filter("not a bulk string", |f| !matches!(f, Frame::Bulk(_)))
            .prop_map(|f| f.encode().to_vec()),
    ];
    let resp_byte = prop::sample::select(&b"*$+-:_\r\n0123456789"[..]);
    prop_oneof![
        8 => Just(Mutation::Keep),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Truncate),
        1 => proptest::collection::vec(any::<u8>(), 1..4).prop_map(Mutation::Append),
        1 => (any::<prop::sample::Index>(), resp_byte.clone()).prop_map(|(i, b)| Mutation::Replace(i, b)),
        1 => (any::<prop::sample::Index>(), 1..=255u8).prop_map(|(i, m)| Mutation::Flip(i, m)),
        1 => (any::<prop::sample::Index>(), resp_byte).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Remove),
        1 => (any::<prop::sample::Index>(), foreign).prop_map(|(i, f)| Mutation::Foreign(i, f)),
    ]
}

/// `decode_request` and `decode` agree on every input: a request decodes as an array of bulk
/// strings with the same bytes, and an array of bulk strings decodes as that request. The inputs
/// are valid requests (most of them) and mutations of them; counters check that both the valid
/// and the damaged branches really run, so the property cannot pass vacuously.
#[test]
fn a_request_is_a_frame_too() {
    use std::cell::Cell;

    use proptest::test_runner::{Config, TestRunner};

    let cases = 2048;
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let (total, requests, mutated, mutated_requests) =
        (Cell::new(0u32), Cell::new(0u32), Cell::new(0u32), Cell::new(0u32));
    let strategy = (proptest::collection::vec(arb_arg(), 0..6), arb_mutation());
    runner
        .run(&strategy, |(list, mutation)| {
            let wire = Bytes::from(mutation.apply(&list));
            total.set(total.get() + 1);
            if !mutation.is_keep() {
                mutated.set(mutated.get() + 1);
            }
            let as_request = decode_request(&wire);
            if mutation.is_keep() {
                let expect: Vec<Bytes> = list.into_iter().map(Bytes::from).collect();
                prop_assert_eq!(&as_request, &Ok(expect));
            }
            match as_request {
                Ok(args) => {
                    requests.set(requests.get() + 1);
                    if !mutation.is_keep() {
                        mutated_requests.set(mutated_requests.get() + 1);
                    }
                    let expect = Frame::Array(args.into_iter().map(Frame::Bulk).collect());
                    prop_assert_eq!(decode(&wire), Ok(expect), "{:?}", String::from_utf8_lossy(&wire));
                }
                Err(_) => {
                    // Not a request: then it must not be an array of bulk strings either.
                    if let Ok(Frame::Array(items)) = decode(&wire) {
                        prop_assert!(
                            !items.iter().all(|f| matches!(f, Frame::Bulk(_))),
                            "decode reads a request that decode_request refuses: {:?}",
                            String::from_utf8_lossy(&wire)
                        );
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    let (total, requests, mutated, mutated_requests) =
        (total.get(), requests.get(), mutated.get(), mutated_requests.get());
    assert_eq!(total, cases, "every case ran once (no shrinking on success)");
    assert!(
        requests * 2 > total,
        "most inputs must be requests: {requests} of {total}"
    );
    assert!(
        mutated * 5 > total,
        "enough inputs must be mutated: {mutated} of {total}"
    );
    assert!(
        mutated_requests > 0 && mutated_requests < mutated,
        "mutations must yield both requests and non-requests: {mutated_requests} of {mutated}"
    );
}

proptest! {
    #[test]
    fn frame_round_trip(f in arb_frame()) {
        prop_assert_eq!(decode(&f.encode()), Ok(f));
    }

    #[test]
    fn request_round_trip(list in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..48), 0..8)) {
        let wire = encode_request(&list);
        let expect: Vec<Bytes> = list.into_iter().map(Bytes::from).collect();
        prop_assert_eq!(decode_request(&wire), Ok(expect));
    }

    #[test]
    fn never_panics_on_arbitrary_bytes(wire in proptest::collection::vec(any::<u8>(), 0..256)) {
        let wire = Bytes::from(wire);
        let _ = decode(&wire);
        let _ = decode_request(&wire);
    }

    #[test]
    fn never_panics_on_resp_like_bytes(wire in resp_like_bytes()) {
        let wire = Bytes::from(wire);
        let _ = decode(&wire);
        let _ = decode_request(&wire);
    }

    #[test]
    fn never_panics_on_truncated_or_extended_requests(
        list in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..16), 0..6),
        cut in any::<prop::sample::Index>(),
        extra in proptest::collection::vec(any::<u8>(), 0..4),
    ) {
        let wire = encode_request(&list);
        let cut = cut.index(wire.len() + 1);
        let truncated = wire.slice(..cut);
        if cut < wire.len() {
            prop_assert_eq!(decode_request(&truncated), Err(DecodeError::Incomplete));
        }
        let _ = decode(&truncated);
        let mut extended = wire.to_vec();
        extended.extend_from_slice(&extra);
        let extended = Bytes::from(extended);
        if extra.is_empty() {
            let expect: Vec<Bytes> = list.iter().map(|a| Bytes::copy_from_slice(a)).collect();
            prop_assert_eq!(decode_request(&extended), Ok(expect));
        } else {
            prop_assert_eq!(decode_request(&extended), Err(DecodeError::TrailingBytes));
        }
    }
}
