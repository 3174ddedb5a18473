//! MQTT broker URLs: `mqtt[s]://[user[:password]@]host[:port]`.

use super::{BrokerChoice, ConfigError};

/// `mqtt[s]://[user[:password]@]host[:port]` (or `tcp://`, `ssl://`) as an external broker.
pub fn parse_mqtt_url(url: &str) -> Result<BrokerChoice, ConfigError> {
    let u = parse_broker_url(url)?;
    Ok(BrokerChoice::External {
        host: u.host,
        port: u.port,
    })
}

pub use stategate_net::url::{BrokerUrl, MqttCredentials};

pub use crate::secret::mask_url_password;

/// [`stategate_net::url::parse_broker_url`], as a configuration error.
pub fn parse_broker_url(url: &str) -> Result<BrokerUrl, ConfigError> {
    Ok(stategate_net::url::parse_broker_url(url)?)
}
