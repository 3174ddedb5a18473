//! What an external broker retained under the mirror's prefix, read whenever the mirror
//! republishes (at start, and after changes were dropped).
//!
//! An external broker may keep retained messages across a restart of this process (Mosquitto
//! with persistence, a cluster): a key deleted while the service was down would otherwise stay
//! on its topic for good. MQTT has no "that was every retained message" marker, so a second,
//! short-lived connection subscribes to `<prefix>#` and to a topic of its own, then publishes
//! to that topic: a broker sends the retained messages of a subscription when it takes the
//! SUBSCRIBE, so they are ahead of that later publish in the connection's queue, and once it
//! comes back every retained topic has been seen.
//!
//! A broker that refuses either subscription (SUBACK reason 0x80 or above: its ACL) delivers
//! nothing on it, which must not read as "nothing retained": the read fails with
//! [`ReadError::Refused`], and the mirror then clears nothing it would have learnt from it.

use std::collections::HashSet;
use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Filter, Packet, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, Event};

use crate::metrics::RetainedRead;
use crate::service::MqttSettings;

/// The whole read, connection included.
const PATIENCE: Duration = Duration::from_secs(10);

/// Why what the broker retained could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The broker refused a subscription the read needs, most likely by its ACL: the service's
    /// MQTT user needs to subscribe to `<prefix>#` (and `stategate/state-topics-sync/#`).
    #[error("the broker refused the subscription to {filter} (SUBACK {reason})")]
    Refused { filter: String, reason: String },
    #[error("{0}")]
    Failed(String),
}

impl ReadError {
    /// The outcome the metrics count it as.
    pub fn outcome(&self) -> RetainedRead {
        match self {
            ReadError::Refused { .. } => RetainedRead::Refused,
            ReadError::Failed(_) => RetainedRead::Failed,
        }
    }
}

fn failed(e: impl std::fmt::Display) -> ReadError {
    ReadError::Failed(e.to_string())
}

/// The topics under `prefix` that hold a retained message now.
pub async fn retained_topics(settings: &MqttSettings, prefix: &str) -> Result<HashSet<String>, ReadError> {
    let nonce = format!("{:016x}", rand_u64());
    let mut reader = settings.clone();
    reader.client_id = format!("{}-state-topics-{nonce}", settings.client_id);
    reader.session_expiry = Duration::ZERO;
    let options = reader.options().map_err(failed)?;
    let (client, mut events) = AsyncClient::new(options, 16);
    let marker = format!("stategate/state-topics-sync/{nonce}");
    let filters = [format!("{prefix}#"), marker.clone()];
    let read = async {
        let mut topics = HashSet::new();
        loop {
            match events.poll().await.map_err(failed)? {
                Event::Incoming(Packet::ConnAck(_)) => {
                    let filters = filters.iter().map(|f| Filter::new(f.clone(), QoS::AtMostOnce));
                    // A queued request, not awaited here: this task drives the event loop.
                    client.try_subscribe_many(filters).map_err(failed)?;
                }
                Event::Incoming(Packet::SubAck(ack)) => {
                    refused(&filters, &ack.return_codes)?;
                    client
                        .try_publish(marker.clone(), QoS::AtMostOnce, false, Vec::new())
                        .map_err(failed)?;
                }
                Event::Incoming(Packet::Publish(p)) => {
                    let topic = String::from_utf8_lossy(&p.topic).into_owned();
                    if topic == marker {
                        return Ok::<_, ReadError>(topics);
                    }
                    if p.retain && !p.payload.is_empty() {
                        topics.insert(topic);
                    }
                }
                _ => {}
            }
        }
    };
    let result = tokio::time::timeout(PATIENCE, read)
        .await
        .unwrap_or_else(|_| Err(failed("the broker did not answer in time")));
    let _ = client.try_disconnect();
    // Drive the DISCONNECT out; an error here only means the connection is gone already.
    let _ = tokio::time::timeout(Duration::from_millis(200), events.poll()).await;
    result
}

/// The first of `filters` the SUBACK's `codes` refused (a code per filter, in order; a SUBACK
/// that answers fewer filters refuses the rest).
fn refused(filters: &[String], codes: &[SubscribeReasonCode]) -> Result<(), ReadError> {
    for (i, filter) in filters.iter().enumerate() {
        match codes.get(i) {
            Some(SubscribeReasonCode::Success(_)) => {}
            code => {
                return Err(ReadError::Refused {
                    filter: filter.clone(),
                    reason: code.map_or("missing".into(), |c| format!("{c:?}")),
                });
            }
        }
    }
    Ok(())
}

/// A number that tells this process's reader from another's (no randomness crate needed: the
/// standard hasher is seeded randomly per process).
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_filter_fails_the_read() {
        let filters = ["state/#".to_owned(), "stategate/state-topics-sync/1".to_owned()];
        let ok = SubscribeReasonCode::Success(QoS::AtMostOnce);
        assert_eq!(refused(&filters, &[ok, ok]), Ok(()));
        let e = refused(&filters, &[SubscribeReasonCode::NotAuthorized, ok]).unwrap_err();
        assert_eq!(e.outcome(), RetainedRead::Refused);
        assert!(e.to_string().contains("state/#"), "{e}");
        assert!(
            matches!(refused(&filters, &[ok, SubscribeReasonCode::Failure]), Err(ReadError::Refused { filter, .. }) if filter == filters[1])
        );
        assert!(
            refused(&filters, &[ok]).is_err(),
            "a filter left unanswered is not granted"
        );
    }
}
