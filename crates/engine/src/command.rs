//! The commands the engine executes, and their parsing from RESP arguments.
//!
//! Every front end builds these; the MQTT door parses them from the request payload with
//! [`Command::parse`], so argument rules live here once.

use bytes::Bytes;

use super::EngineError;
use crate::hlc::Hlc;

/// Request context that does not travel in the payload (MQTT user properties, HTTP metadata).
#[derive(Debug, Clone, Default)]
pub struct Meta {
    /// The caller's HLC (`__ts`).
    pub timestamp: Option<Hlc>,
    /// The caller's fencing token (`__ft`).
    pub fencing: Option<Hlc>,
    /// The caller's client id: whom KEYNOTIFY notifications go to. The identity the broker
    /// knows when the door can tell, else what the caller claims (`__srcId`).
    pub client: Option<String>,
    /// The caller's broker session, when the door can tell (see [`KeyNotify::session`]).
    pub session: Option<u64>,
    /// The caller asks that a SET be kept on persistent storage (MQTT `aio-persistence: true`).
    pub persist: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetCondition {
    /// Plain SET.
    Always,
    /// `NX`: only if the key is absent.
    IfAbsent,
    /// `NEX`: if absent, or if the stored value equals the new one.
    IfAbsentOrEqual,
    /// Only if the key exists with exactly this version (an ETag); otherwise an error.
    IfVersion(Hlc),
}

/// ```text
/// SET key value [NX|NEX] [PX ms [SLIDING]]
/// ```
#[derive(Debug, Clone)]
pub struct Set {
    pub key: Bytes,
    pub value: Bytes,
    pub condition: SetCondition,
    /// Time to live in milliseconds; `None` clears an earlier expiry.
    pub ttl_ms: Option<u64>,
    pub timestamp: Option<Hlc>,
    pub fencing: Option<Hlc>,
    /// The caller asks for the key to outlive the process; refused by storage that cannot
    /// (`EngineError::NotPersistent`), never silently ignored.
    pub persist: bool,
    /// The time to live slides: every read pushes the deadline out by `ttl_ms` again (a
    /// stategate extension: `SLIDING` over MQTT, `ttlSliding` in Dapr metadata). Needs `ttl_ms`.
    pub sliding: bool,
}

/// ```text
/// GET key
/// ```
#[derive(Debug, Clone)]
pub struct Get {
    pub key: Bytes,
}

/// ```text
/// MGET key [key ...]
/// ```
/// A stategate extension: every key's value and version as of one moment.
#[derive(Debug, Clone)]
pub struct MGet {
    pub keys: Vec<Bytes>,
}

/// When a DEL applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DelCondition {
    /// Plain DEL: deletes the key if it exists.
    Always,
    /// Only if the key exists with exactly this version (an ETag); otherwise an error.
    IfVersion(Hlc),
    /// Dapr's first-write without an ETag: deleting an absent key is a no-op, and an existing
    /// key may not be deleted blind (an error). Decided under the key's lock, like the others.
    IfAbsent,
}

/// ```text
/// DEL key
/// ```
#[derive(Debug, Clone)]
pub struct Del {
    pub key: Bytes,
    pub fencing: Option<Hlc>,
    pub condition: DelCondition,
}

/// ```text
/// VDEL key value
/// ```
#[derive(Debug, Clone)]
pub struct VDel {
    pub key: Bytes,
    pub value: Bytes,
    pub fencing: Option<Hlc>,
}

/// ```text
/// KEYNOTIFY key [STOP]
/// ```
#[derive(Debug, Clone)]
pub struct KeyNotify {
    pub key: Bytes,
    pub client: String,
    /// The broker session of the caller, when known: registrations end with their session.
    pub session: Option<u64>,
    pub stop: bool,
}

/// ```text
/// SCAN pattern [continuation-token]
/// ```
#[derive(Debug, Clone)]
pub struct Scan {
    pub pattern: Bytes,
    pub token: Option<Bytes>,
    /// Only keys this keeps are returned (the caller's readable keys; `None`: all). Applied
    /// where keys are produced, so hidden keys never reach a page.
    pub filter: Option<KeyFilter>,
}

/// A predicate over key names (the engine does not know why a key is kept or hidden).
#[derive(Clone)]
pub struct KeyFilter(std::sync::Arc<KeyPredicate>);

type KeyPredicate = dyn Fn(&[u8]) -> bool + Send + Sync;

impl KeyFilter {
    pub fn new(f: impl Fn(&[u8]) -> bool + Send + Sync + 'static) -> KeyFilter {
        KeyFilter(std::sync::Arc::new(f))
    }

    pub fn keeps(&self, key: &[u8]) -> bool {
        (self.0)(key)
    }
}

impl std::fmt::Debug for KeyFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyFilter")
    }
}

#[derive(Debug, Clone)]
pub enum Command {
    Set(Set),
    Get(Get),
    Del(Del),
    VDel(VDel),
    KeyNotify(KeyNotify),
    Scan(Scan),
    MGet(MGet),
}

impl Command {
    pub fn name(&self) -> &'static str {
        match self {
            Command::Set(_) => "SET",
            Command::Get(_) => "GET",
            Command::Del(_) => "DEL",
            Command::VDel(_) => "VDEL",
            Command::KeyNotify(_) => "KEYNOTIFY",
            Command::Scan(_) => "SCAN",
            Command::MGet(_) => "MGET",
        }
    }

    /// Parses RESP arguments (verb first). `meta` supplies what the payload does not carry.
    pub fn parse(args: Vec<Bytes>, meta: Meta) -> Result<Command, EngineError> {
        let mut args = Args(args.into_iter());
        let verb = args.next().ok_or(EngineError::UnknownCommand)?;
        let cmd = match &verb[..] {
            b"SET" => {
                let key = args.key()?;
                let value = args.next().ok_or(EngineError::WrongArity)?;
                let mut condition = SetCondition::Always;
                let mut ttl_ms = None;
                let mut sliding = false;
                while let Some(opt) = args.next() {
                    match &opt[..] {
                        b"NX" | b"NEX" if condition != SetCondition::Always => {
                            return Err(EngineError::Syntax);
                        }
                        b"NX" => condition = SetCondition::IfAbsent,
                        b"NEX" => condition = SetCondition::IfAbsentOrEqual,
                        b"PX" if ttl_ms.is_none() => {
                            let ms = args.next().ok_or(EngineError::Syntax)?;
                            ttl_ms = Some(parse_px(&ms)?);
                        }
                        b"SLIDING" if !sliding => sliding = true,
                        _ => return Err(EngineError::Syntax),
                    }
                }
                // A deadline to slide is needed: SLIDING alone means nothing.
                if sliding && ttl_ms.is_none() {
                    return Err(EngineError::Syntax);
                }
                Command::Set(Set {
                    key,
                    value,
                    condition,
                    ttl_ms,
                    timestamp: meta.timestamp,
                    fencing: meta.fencing,
                    persist: meta.persist,
                    sliding,
                })
            }
            b"GET" => {
                let key = args.key()?;
                args.finish()?;
                Command::Get(Get { key })
            }
            b"DEL" => {
                let key = args.key()?;
                args.finish()?;
                Command::Del(Del {
                    key,
                    fencing: meta.fencing,
                    condition: DelCondition::Always,
                })
            }
            b"VDEL" => {
                let key = args.key()?;
                let value = args.next().ok_or(EngineError::WrongArity)?;
                args.finish()?;
                Command::VDel(VDel {
                    key,
                    value,
                    fencing: meta.fencing,
                })
            }
            b"KEYNOTIFY" => {
                let key = args.key()?;
                let stop = match args.next() {
                    None => false,
                    Some(opt) if &opt[..] == b"STOP" => true,
                    Some(_) => return Err(EngineError::Syntax),
                };
                args.finish()?;
                // Without a caller id there is nobody to notify: the front end checks first.
                let client = meta.client.ok_or(EngineError::Syntax)?;
                Command::KeyNotify(KeyNotify {
                    key,
                    client,
                    session: meta.session,
                    stop,
                })
            }
            b"SCAN" => {
                let pattern = args.next().ok_or(EngineError::WrongArity)?;
                let token = args.next();
                args.finish()?;
                Command::Scan(Scan {
                    pattern,
                    token,
                    filter: None,
                })
            }
            // Which keys are acceptable is the engine's rule (`Engine::mget`), for every door.
            b"MGET" => Command::MGet(MGet {
                keys: args.0.by_ref().collect(),
            }),
            _ => return Err(EngineError::UnknownCommand),
        };
        Ok(cmd)
    }
}

/// A cursor over the arguments of one request.
struct Args(std::vec::IntoIter<Bytes>);

impl Args {
    fn next(&mut self) -> Option<Bytes> {
        self.0.next()
    }

    fn key(&mut self) -> Result<Bytes, EngineError> {
        let key = self.next().ok_or(EngineError::WrongArity)?;
        if key.is_empty() {
            return Err(EngineError::EmptyKey);
        }
        Ok(key)
    }

    fn finish(&mut self) -> Result<(), EngineError> {
        match self.next() {
            None => Ok(()),
            Some(_) => Err(EngineError::WrongArity),
        }
    }
}

/// `PX` milliseconds: a decimal number, fractions accepted and rounded up (one SDK sends
/// `1500.5`). Whether the time to live is in range is the engine's rule, not the parser's.
fn parse_px(raw: &[u8]) -> Result<u64, EngineError> {
    let s = std::str::from_utf8(raw).map_err(|_| EngineError::Syntax)?;
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(EngineError::Syntax);
    }
    let ms: f64 = s.parse().map_err(|_| EngineError::Syntax)?;
    if ms.is_nan() {
        return Err(EngineError::Syntax);
    }
    // Saturates: anything past u64 is out of range for the engine anyway.
    Ok(ms.ceil() as u64)
}
