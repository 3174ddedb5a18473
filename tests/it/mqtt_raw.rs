//! MQTT 5 packets written by hand: clients that cost their process nothing and read only what
//! they choose to. Used by the integration tests (`resources::raw`) and, by path, by the
//! connections benchmark.

/// MQTT's variable byte integer.
pub(crate) fn varint(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            return;
        }
    }
}

/// A length-prefixed MQTT string or binary field.
pub(crate) fn string(s: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s);
}

/// A whole packet: fixed header byte, remaining length, body.
pub(crate) fn packet(header: u8, body: Vec<u8>) -> Vec<u8> {
    let mut out = vec![header];
    varint(body.len(), &mut out);
    out.extend(body);
    out
}

/// CONNECT (MQTT 5, clean start, keep-alive 60 s), announcing a Receive Maximum when given.
pub fn connect_with(client_id: &str, receive_maximum: Option<u16>) -> Vec<u8> {
    connect_keep_alive(client_id, 60, receive_maximum)
}

/// CONNECT (MQTT 5, clean start) with a keep-alive of `secs` (0: off).
pub fn connect_keep_alive(client_id: &str, secs: u16, receive_maximum: Option<u16>) -> Vec<u8> {
    let mut b = Vec::new();
    string(b"MQTT", &mut b);
    b.extend_from_slice(&[5, 0x02]);
    b.extend_from_slice(&secs.to_be_bytes());
    match receive_maximum {
        Some(n) => {
            b.push(3);
            b.push(0x21);
            b.extend_from_slice(&n.to_be_bytes());
        }
        None => b.push(0),
    }
    string(client_id.as_bytes(), &mut b);
    packet(0x10, b)
}

/// A QoS 1 request with a response topic and correlation data.
pub fn request(topic: &str, packet_id: u16, response: &str, correlation: &[u8], payload: &[u8]) -> Vec<u8> {
    request_with(topic, packet_id, response, correlation, &[], payload)
}

/// The same with user properties (`__srcId`, `__ts`), in the order given.
pub fn request_with(
    topic: &str,
    packet_id: u16,
    response: &str,
    correlation: &[u8],
    user: &[(&str, &str)],
    payload: &[u8],
) -> Vec<u8> {
    let mut props = vec![0x08];
    string(response.as_bytes(), &mut props);
    props.push(0x09);
    string(correlation, &mut props);
    for (k, v) in user {
        props.push(0x26);
        string(k.as_bytes(), &mut props);
        string(v.as_bytes(), &mut props);
    }
    publish_qos1(topic, packet_id, &props, payload)
}

/// A QoS 1 PUBLISH with the given encoded properties (empty: none).
pub fn publish_qos1(topic: &str, packet_id: u16, props: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    string(topic.as_bytes(), &mut b);
    b.extend_from_slice(&packet_id.to_be_bytes());
    varint(props.len(), &mut b);
    b.extend_from_slice(props);
    b.extend_from_slice(payload);
    packet(0x32, b)
}

pub fn subscribe(packet_id: u16, filter: &str) -> Vec<u8> {
    let mut b = packet_id.to_be_bytes().to_vec();
    b.push(0);
    string(filter.as_bytes(), &mut b);
    b.push(1);
    packet(0x82, b)
}
