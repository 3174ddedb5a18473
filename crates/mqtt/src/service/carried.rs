//! Publishes that a broken connection had not delivered, carried into the next connection.
//!
//! When the connection breaks, rumqttc moves the publishes the broker had not acknowledged, and
//! the requests still queued for the connection, into `EventLoop::pending`, and sends them again
//! after the reconnect, but only if the broker kept the session: on a new session it clears
//! them. The service's session is new after every reconnect with `--mqtt-share-group` (its
//! session expiry is 0) and after a broker restart, so every answer and KEYNOTIFY notification in
//! flight when the link broke was lost: an observer missed a change, silently (the fault test
//! bed, a replica cut from Mosquitto). So the poller takes the publishes out of `pending` when
//! the connection breaks and puts them back once the next connection is up: resent under the
//! session's own packet ids if the broker kept the session, as new publishes otherwise. A
//! publish the broker had received before the break may so come twice: QoS 1 is at least once,
//! and a notification carries the version a client drops a repeat by.

use std::collections::VecDeque;

use rumqttc::v5::{EventLoop, Request};

/// The publishes taken out of a broken connection, oldest first.
#[derive(Debug, Default)]
pub(super) struct Carried(VecDeque<Request>);

impl Carried {
    /// After a connection error: takes the publishes rumqttc set aside. Everything else there
    /// belongs to the broken session (acknowledgements of its packets, its subscriptions, which
    /// the poller makes again on every ConnAck) and is dropped.
    pub(super) fn take(&mut self, eventloop: &mut EventLoop) {
        for request in eventloop.pending.drain(..) {
            if let Request::Publish(_) = request {
                self.0.push_back(request);
            }
        }
    }

    /// On a ConnAck: puts the carried publishes first in line. In a new session their packet
    /// ids mean nothing (and could collide with the new session's), so they get new ones.
    pub(super) fn restore(&mut self, eventloop: &mut EventLoop, session_present: bool) {
        if self.0.is_empty() {
            return;
        }
        let mut carried = std::mem::take(&mut self.0);
        if !session_present {
            for request in &mut carried {
                if let Request::Publish(p) = request {
                    p.pkid = 0;
                    p.dup = false;
                }
            }
        }
        carried.extend(eventloop.pending.drain(..));
        eventloop.pending = carried;
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use rumqttc::v5::MqttOptions;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{Publish, Subscribe};

    use super::*;

    fn publish(topic: &str, pkid: u16) -> Request {
        let mut p = Publish::new(topic, QoS::AtLeastOnce, Bytes::from_static(b"x"), None);
        p.pkid = pkid;
        p.dup = true;
        Request::Publish(p)
    }

    fn topics(pending: &VecDeque<Request>) -> Vec<(String, u16, bool)> {
        pending
            .iter()
            .map(|r| match r {
                Request::Publish(p) => (String::from_utf8_lossy(&p.topic).into_owned(), p.pkid, p.dup),
                other => (format!("{other:?}"), 0, false),
            })
            .collect()
    }

    #[test]
    fn publishes_outlive_a_new_session_in_order_with_new_packet_ids() {
        let mut el = EventLoop::new(MqttOptions::new("t", "127.0.0.1", 1), 10);
        el.pending.push_back(publish("a", 7));
        el.pending.push_back(Request::Subscribe(Subscribe::new(
            rumqttc::v5::mqttbytes::v5::Filter::new("s", QoS::AtLeastOnce),
            None,
        )));
        el.pending.push_back(publish("b", 8));
        let mut carried = Carried::default();
        carried.take(&mut el);
        assert!(el.pending.is_empty());
        assert_eq!(carried.len(), 2);
        // What rumqttc does on a ConnAck without a session: clears what it kept.
        el.pending.clear();
        el.pending.push_back(publish("later", 0));
        carried.restore(&mut el, false);
        assert_eq!(
            topics(&el.pending),
            [
                ("a".into(), 0, false),
                ("b".into(), 0, false),
                ("later".into(), 0, true)
            ]
        );
        assert_eq!(carried.len(), 0);
    }

    #[test]
    fn a_kept_session_gets_its_packets_again_as_they_were() {
        let mut el = EventLoop::new(MqttOptions::new("t", "127.0.0.1", 1), 10);
        el.pending.push_back(publish("a", 7));
        let mut carried = Carried::default();
        carried.take(&mut el);
        carried.restore(&mut el, true);
        assert_eq!(topics(&el.pending), [("a".into(), 7, true)]);
    }
}
