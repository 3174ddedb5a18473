//! Who a caller is: the principal every rule and limit is about, the MQTT password file and the
//! HTTP/gRPC token file that establish it.

use std::collections::HashMap;
use std::path::Path;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use subtle::ConstantTimeEq;

use super::FileError;

/// Who sent a request, as far as the door can tell.
///
/// - MQTT in the embedded broker: `client_id` is the connection's client id and `username` the
///   name it authenticated with (a password-file user, or a certificate identity when the
///   listener maps certificates to usernames). Never what the request claims.
/// - MQTT through an external broker: nothing, unless `--mqtt-trust-src-id` makes the claimed
///   `__srcId` the client id (the broker's ACLs must then make that claim true).
/// - HTTP and gRPC: `token` is the name of the token presented; no token configured: nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Principal {
    pub client_id: Option<String>,
    pub username: Option<String>,
    pub token: Option<String>,
}

impl Principal {
    /// A principal with neither a username nor a token: nobody has vouched for it.
    pub fn is_anonymous(&self) -> bool {
        self.username.is_none() && self.token.is_none()
    }

    /// The key its rate and stream limits count under: its strongest identity.
    pub fn limit_key(&self) -> String {
        match (&self.token, &self.username, &self.client_id) {
            (Some(t), _, _) => format!("token:{t}"),
            (None, Some(u), _) => format!("user:{u}"),
            (None, None, Some(c)) => format!("client:{c}"),
            (None, None, None) => "anonymous".into(),
        }
    }
}

/// What separates an identity from the rest of a client id bound to it
/// (`--mqtt-bind-client-id`), as in `sensor-1:logger`. A password-file username cannot contain
/// it; `-` or `_` would let user `sensor` take `sensor-1`'s id. A certificate identity could
/// (a CN `sensor:1`), and then CN `sensor` would own its ids: such an identity binds no id at
/// all ([`binds_client_ids`]).
pub const CLIENT_ID_SEPARATOR: char = ':';

/// Whether `identity` can have client ids bound to it: not empty, and without
/// [`CLIENT_ID_SEPARATOR`], so that no identity's ids are another identity followed by it.
pub fn binds_client_ids(identity: &str) -> bool {
    !identity.is_empty() && !identity.contains(CLIENT_ID_SEPARATOR)
}

/// Whether `client_id` belongs to `identity` (an authenticated username or certificate
/// identity): equal to it, or it followed by [`CLIENT_ID_SEPARATOR`] and anything.
pub fn client_id_bound(client_id: &str, identity: &str) -> bool {
    binds_client_ids(identity)
        && client_id
            .strip_prefix(identity)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(CLIENT_ID_SEPARATOR))
}

/// The password the service's own MQTT connection proves itself with to the embedded broker
/// (`--mqtt-client-path`), which refuses the service's client id to everyone else: random, made
/// at startup, held only in this process's memory, so no client can know or forge it.
pub struct ServiceSecret(String);

impl ServiceSecret {
    /// A fresh secret (`None` when the system has no randomness).
    pub fn new() -> Option<ServiceSecret> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).ok()?;
        Some(ServiceSecret(hex::encode(bytes)))
    }

    pub fn password(&self) -> &str {
        &self.0
    }

    /// Whether `given` is the secret, compared in constant time.
    pub fn matches(&self, given: &[u8]) -> bool {
        token_matches(&self.0, std::str::from_utf8(given).ok())
    }
}

impl std::fmt::Debug for ServiceSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceSecret(***)")
    }
}

/// The name `--api-token` (the single shared token) has as a principal.
pub const DEFAULT_TOKEN_NAME: &str = "default";

/// Named HTTP/gRPC tokens.
#[derive(Debug, Default, Clone)]
pub struct Tokens {
    entries: Vec<(String, String)>,
}

impl Tokens {
    /// `name:token` lines; `#` comments and blank lines are skipped.
    pub fn parse(path: &Path, text: &str) -> Result<Tokens, FileError> {
        let mut entries: Vec<(String, String)> = Vec::new();
        for (n, line) in numbered_lines(text) {
            let err = |m: &str| FileError::at(path, n, m);
            let Some((name, token)) = line.split_once(':') else {
                return Err(err("expected name:token"));
            };
            let (name, token) = (name.trim(), token.trim());
            if name.is_empty() || token.is_empty() {
                return Err(err("the name and the token must both be non-empty"));
            }
            if token.len() < 16 {
                return Err(err("a token must be at least 16 characters long"));
            }
            if entries.iter().any(|(n, _)| n == name) {
                return Err(err(&format!("the name {name:?} is given twice")));
            }
            entries.push((name.to_owned(), token.to_owned()));
        }
        Ok(Tokens { entries })
    }

    /// Adds the single `--api-token` as [`DEFAULT_TOKEN_NAME`].
    pub fn with_default(mut self, token: Option<&str>) -> Tokens {
        if let Some(t) = token.filter(|t| !t.is_empty()) {
            self.entries.retain(|(n, _)| n != DEFAULT_TOKEN_NAME);
            self.entries.push((DEFAULT_TOKEN_NAME.into(), t.to_owned()));
        }
        self
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the token whose [`fingerprint`] is `print` is still the token named `name`
    /// (a reload may have removed or replaced it).
    pub fn holds(&self, name: &str, print: &Fingerprint) -> bool {
        self.entries.iter().any(|(n, t)| n == name && fingerprint(t) == *print)
    }

    /// The name of the token `given`, if it is one. Every token is compared, each in constant
    /// time, so the answer's timing tells nothing about any token.
    pub fn name_of(&self, given: &str) -> Option<&str> {
        let mut found = None;
        for (name, token) in &self.entries {
            if token_matches(token, Some(given)) && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found
    }
}

/// A token's SHA-256: what a grant keeps of the token that vouched for it, so that a reload
/// can tell whether that token still holds without the secret staying in memory.
pub type Fingerprint = [u8; 32];

pub fn fingerprint(token: &str) -> Fingerprint {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// Whether `given` is the configured token, compared in constant time (a caller timing the
/// answer learns nothing about how much of its guess was right).
pub fn token_matches(expected: &str, given: Option<&str>) -> bool {
    let Some(given) = given else {
        return false;
    };
    // Lengths differ: still compare something of the same cost before saying no.
    if given.len() != expected.len() {
        let _ = expected.as_bytes().ct_eq(expected.as_bytes());
        return false;
    }
    expected.as_bytes().ct_eq(given.as_bytes()).into()
}

/// MQTT users and their password hashes (argon2id, PHC strings).
#[derive(Debug, Default, Clone)]
pub struct Passwords {
    users: HashMap<String, String>,
}

impl Passwords {
    /// `username:$argon2id$...` lines, as `stategate passwd` writes them.
    pub fn parse(path: &Path, text: &str) -> Result<Passwords, FileError> {
        let mut users = HashMap::new();
        for (n, line) in numbered_lines(text) {
            let err = |m: &str| FileError::at(path, n, m);
            let Some((user, hash)) = line.split_once(':') else {
                return Err(err("expected username:hash (write entries with `stategate passwd`)"));
            };
            if user.is_empty() {
                return Err(err("the username is empty"));
            }
            let parsed = PasswordHash::new(hash).map_err(|e| err(&format!("not a password hash: {e}")))?;
            if parsed.algorithm.as_str() != "argon2id" {
                return Err(err(&format!(
                    "hash algorithm {} is not supported (argon2id only)",
                    parsed.algorithm
                )));
            }
            if users.insert(user.to_owned(), hash.to_owned()).is_some() {
                return Err(err(&format!("the user {user:?} is given twice")));
            }
        }
        Ok(Passwords { users })
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Whether `password` is `user`'s. Slow on purpose (argon2): run it off the async threads.
    /// An unknown user costs one hash too, so timing does not tell which users exist.
    pub fn verify(&self, user: &str, password: &[u8]) -> bool {
        let known = self.users.get(user);
        let hash = known.map(String::as_str).unwrap_or_else(|| dummy_hash());
        let ok = PasswordHash::new(hash)
            .map(|h| argon2::Argon2::default().verify_password(password, &h).is_ok())
            .unwrap_or(false);
        ok && known.is_some()
    }
}

/// A hash of a random password nobody knows, verified for unknown users (same cost as a real
/// one).
fn dummy_hash() -> &'static str {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY.get_or_init(|| {
        let mut password = [0u8; 32];
        let _ = getrandom::fill(&mut password);
        hash_entry("x", &password)
            .ok()
            .and_then(|e| e.split_once(':').map(|(_, h)| h.to_owned()))
            .unwrap_or_default()
    })
}

/// One password-file line for `user` (argon2id with the crate's recommended parameters).
pub fn hash_entry(user: &str, password: &[u8]) -> Result<String, String> {
    if user.is_empty() || user.contains(':') || user.contains(char::is_whitespace) {
        return Err("a username must be non-empty, without ':' or spaces".into());
    }
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).map_err(|_| "no randomness for the salt".to_owned())?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| e.to_string())?;
    let hash = argon2::Argon2::default()
        .hash_password(password, &salt)
        .map_err(|e| e.to_string())?;
    Ok(format!("{user}:{hash}"))
}

/// Non-empty, non-comment lines with their 1-based numbers, trimmed.
fn numbered_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}
