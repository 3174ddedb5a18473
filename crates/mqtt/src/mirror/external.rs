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

use std::collections::HashSet;
use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Filter, Packet};
use rumqttc::v5::{AsyncClient, Event};

use crate::service::MqttSettings;

/// The whole read, connection included.
const PATIENCE: Duration = Duration::from_secs(10);

/// The topics under `prefix` that hold a retained message now.
pub async fn retained_topics(settings: &MqttSettings, prefix: &str) -> Result<HashSet<String>, String> {
    let nonce = format!("{:016x}", rand_u64());
    let mut reader = settings.clone();
    reader.client_id = format!("{}-state-topics-{nonce}", settings.client_id);
    reader.session_expiry = Duration::ZERO;
    let options = reader.options().map_err(|e| e.to_string())?;
    let (client, mut events) = AsyncClient::new(options, 16);
    let marker = format!("stategate/state-topics-sync/{nonce}");
    let read = async {
        let mut topics = HashSet::new();
        loop {
            match events.poll().await.map_err(|e| e.to_string())? {
                Event::Incoming(Packet::ConnAck(_)) => {
                    let filters = [
                        Filter::new(format!("{prefix}#"), QoS::AtMostOnce),
                        Filter::new(marker.clone(), QoS::AtMostOnce),
                    ];
                    // A queued request, not awaited here: this task drives the event loop.
                    client.try_subscribe_many(filters).map_err(|e| e.to_string())?;
                }
                Event::Incoming(Packet::SubAck(_)) => {
                    client
                        .try_publish(marker.clone(), QoS::AtMostOnce, false, Vec::new())
                        .map_err(|e| e.to_string())?;
                }
                Event::Incoming(Packet::Publish(p)) => {
                    let topic = String::from_utf8_lossy(&p.topic).into_owned();
                    if topic == marker {
                        return Ok::<_, String>(topics);
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
        .unwrap_or_else(|_| Err("the broker did not answer in time".into()));
    let _ = client.try_disconnect();
    // Drive the DISCONNECT out; an error here only means the connection is gone already.
    let _ = tokio::time::timeout(Duration::from_millis(200), events.poll()).await;
    result
}

/// A number that tells this process's reader from another's (no randomness crate needed: the
/// standard hasher is seeded randomly per process).
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}
