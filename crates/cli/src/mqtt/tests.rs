use super::*;

fn publish(topic: &str, payload: &[u8], props: &[(&str, &str)]) -> Publish {
    let mut p = Publish::new(topic, QoS::AtLeastOnce, payload.to_vec(), None);
    p.properties = Some(PublishProperties {
        user_properties: props.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    });
    p
}

#[test]
fn notifications_parse() {
    let topic = crate::resp3::envelope::notify_topic("c1", b"k\x00");
    let set = publish(
        &topic,
        &crate::resp3::envelope::notify_payload(Some(&Bytes::from_static(b"v"))),
        &[("__ts", "1:0:n")],
    );
    assert_eq!(
        notification(&set),
        Some(Event::Set {
            key: Bytes::from_static(b"k\x00"),
            value: Bytes::from_static(b"v"),
            version: "1:0:n".into()
        })
    );
    let del = publish(
        &topic,
        &crate::resp3::envelope::notify_payload(None),
        &[("__ts", "2:0:n")],
    );
    assert!(matches!(notification(&del), Some(Event::Delete { .. })));
    // No __ts, a bad payload or a bad key: ignored, never a panic.
    assert_eq!(
        notification(&publish(&topic, &crate::resp3::envelope::notify_payload(None), &[])),
        None
    );
    assert_eq!(
        notification(&publish(&topic, b"*1\r\n$6\r\nNOTIFY\r\n", &[("__ts", "1:0:n")])),
        None
    );
    assert_eq!(notification(&publish("a/b/zz", b"", &[("__ts", "1:0:n")])), None);
}

#[test]
fn refusals_map_to_exit_codes() {
    assert_eq!(refusal("ERR syntax error").exit, Exit::Usage);
    assert_eq!(
        refusal("ERR a fencing token is required for this request").exit,
        Exit::Conflict
    );
    assert_eq!(
        refusal("ERR the request fencing token is a lower version than the fencing token protecting the resource").exit,
        Exit::Conflict
    );
    assert_eq!(refusal("ERR the quota has been exceeded").exit, Exit::Unavailable);
    let p = publish("t", b"", &[("__stat", "403"), ("__stMsg", "not authorized")]);
    assert_eq!(check_status(&p).unwrap_err().exit, Exit::NotAuthorized);
    let p = publish("t", b"", &[("__stat", "503")]);
    assert_eq!(check_status(&p).unwrap_err().exit, Exit::Unavailable);
    assert!(check_status(&publish("t", b"", &[("__stat", "200")])).is_ok());
}
