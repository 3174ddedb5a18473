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
pub(super) struct Carried {
    queue: VecDeque<Request>,
    /// The packet id of the last publish sent (`Outgoing::Publish` events).
    last_sent: u16,
}

impl Carried {
    /// A publish went out with `pkid`: rumqttc numbers them in sending order, cycling through
    /// its in-flight window, which is how [`Carried::take`] puts them back in that order.
    pub(super) fn sent(&mut self, pkid: u16) {
        if pkid != 0 {
            self.last_sent = pkid;
        }
    }

    /// After a connection error: takes the publishes rumqttc set aside, in the order they were
    /// sent. rumqttc lists the unacknowledged ones by packet id, and packet ids wrap around its
    /// in-flight window, so after a wrap its list put the newest first (the fault test bed saw
    /// a key's notifications arrive out of order after a reconnect): those numbered above the
    /// last one sent are the older ones. Then the requests that were still queued, in order.
    /// Everything else belongs to the broken session (acknowledgements of its packets, its
    /// subscriptions, which the poller makes again on every ConnAck) and is dropped.
    pub(super) fn take(&mut self, eventloop: &mut EventLoop) {
        let (mut older, mut newer) = (Vec::new(), Vec::new());
        for request in eventloop.pending.drain(..) {
            match request {
                Request::Publish(ref p) if p.pkid > self.last_sent => older.push(request),
                Request::Publish(ref p) if p.pkid != 0 => newer.push(request),
                Request::Publish(_) => {
                    // Queued, never sent: after every sent one.
                    self.queue.extend(older.drain(..).chain(newer.drain(..)));
                    self.queue.push_back(request);
                }
                _ => {}
            }
        }
        self.queue.extend(older.into_iter().chain(newer));
    }

    /// On a ConnAck: puts the carried publishes first in line. In a new session their packet
    /// ids mean nothing (and could collide with the new session's), so they get new ones.
    pub(super) fn restore(&mut self, eventloop: &mut EventLoop, session_present: bool) {
        if self.queue.is_empty() {
            return;
        }
        let mut carried = std::mem::take(&mut self.queue);
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
        self.queue.len()
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
    fn publishes_in_flight_come_back_in_the_order_they_were_sent_across_a_packet_id_wrap() {
        let mut el = EventLoop::new(MqttOptions::new("t", "127.0.0.1", 1), 10);
        // Sent as 98, 99, 1, 2, 3 (the ids wrapped); rumqttc lists them by id, then what was
        // still queued.
        for (topic, pkid) in [("c", 1), ("d", 2), ("e", 3), ("a", 98), ("b", 99), ("later", 0)] {
            el.pending.push_back(publish(topic, pkid));
        }
        let mut carried = Carried::default();
        for pkid in [98, 99, 1, 2, 3] {
            carried.sent(pkid);
        }
        carried.take(&mut el);
        carried.restore(&mut el, false);
        let order: Vec<String> = topics(&el.pending).into_iter().map(|(t, _, _)| t).collect();
        assert_eq!(order, ["a", "b", "c", "d", "e", "later"]);
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
