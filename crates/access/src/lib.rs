//! Who may do what, decided once for every door.
//!
//! - [`identity`]: the [`Principal`] (MQTT client id and username, HTTP/gRPC token name), the
//!   MQTT password file and the named API tokens.
//! - [`rules`]: the per-key rules (`--acl-file`): `read`, `write`, `observe`, `admin` on key
//!   globs.
//! - [`limits`]: per-principal request rate and open streams.
//! - `seal`: paging tokens that would name a key the caller may not read go out encrypted.
//!
//! A door finds out who is calling, gets a [`Grant`] from [`Access::grant`] and asks it before
//! it runs anything ([`execute`] for engine commands, [`Grant::check`] for the Dapr layer's
//! reads and writes, [`Grant::read_filter`] where key names are produced). Without a rules file
//! every principal may do everything (the behaviour before rules existed).

use stategate_engine as engine;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use bytes::Bytes;

use crate::engine::{Command, Engine, EngineError, KeyFilter, Reply, Response};

pub mod identity;
pub mod limits;
pub mod passwd;
pub mod rules;
mod seal;

pub use identity::{Passwords, Principal, Tokens, token_matches};
pub use limits::{LimitSettings, StreamSlot};
pub use rules::{Op, RuleSet};

/// Where the access files are and the limits per principal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessSettings {
    /// MQTT users and password hashes; when set the embedded broker refuses anonymous clients.
    pub mqtt_auth_file: Option<PathBuf>,
    /// Per-key rules (TOML).
    pub acl_file: Option<PathBuf>,
    /// Principals whose compiled rules are kept (0: [`rules::DEFAULT_CACHED_PRINCIPALS`]).
    pub acl_cache_principals: usize,
    /// Named HTTP/gRPC tokens, `name:token` per line.
    pub api_token_file: Option<PathBuf>,
    /// External broker: take the claimed `__srcId` as the caller's client id for rules.
    pub trust_src_id: bool,
    /// Embedded broker: a client id must be its client's identity, or that and `:` and more.
    pub bind_client_id: bool,
    pub limits: LimitSettings,
}

/// A file that cannot be used, with where.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{}:{line}: {message}", path.display())]
    At {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no system randomness (for sealing paging tokens and the service's broker login)")]
    NoRandomness,
}

impl FileError {
    pub fn at(path: &Path, line: usize, message: &str) -> FileError {
        FileError::At {
            path: path.to_owned(),
            line,
            message: message.to_owned(),
        }
    }
}

/// What the files said, replaced whole on reload.
#[derive(Debug, Default)]
struct Loaded {
    passwords: Passwords,
    tokens: Tokens,
    rules: Option<Arc<RuleSet>>,
}

/// Why an HTTP or gRPC call was not let in.
#[derive(Debug)]
pub enum Refusal {
    /// A missing or wrong token (401 / UNAUTHENTICATED).
    BadToken,
    /// The caller's rate is spent ([`EngineError::RateLimited`]).
    Limited(EngineError),
}

/// The access decisions of a running service (a cheap handle).
#[derive(Clone, Debug)]
pub struct Access(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    settings: AccessSettings,
    api_token: Option<String>,
    loaded: ArcSwap<Loaded>,
    reloads: AtomicU64,
    /// Tells open streams that the files were read again.
    reloaded: tokio::sync::watch::Sender<u64>,
    limits: limits::Limits,
    sealer: seal::Sealer,
    /// Password checks running at once (argon2 costs ~20 MiB and tens of ms each).
    verify_slots: tokio::sync::Semaphore,
    /// What the service's own connection to the embedded broker logs in with.
    service_secret: identity::ServiceSecret,
}

/// Most password checks at once.
const MAX_CONCURRENT_VERIFIES: usize = 4;

impl Access {
    /// Reads the files `settings` name; `api_token` is the single `--api-token`, if any.
    pub fn load(settings: &AccessSettings, api_token: Option<&str>) -> Result<Access, FileError> {
        let api_token = api_token.filter(|t| !t.is_empty()).map(str::to_owned);
        let loaded = read_files(settings, api_token.as_deref())?;
        Ok(Access(Arc::new(Inner {
            settings: settings.clone(),
            api_token,
            loaded: ArcSwap::from_pointee(loaded),
            reloads: AtomicU64::new(0),
            reloaded: tokio::sync::watch::Sender::new(0),
            limits: limits::Limits::new(&settings.limits),
            sealer: seal::Sealer::new().ok_or(FileError::NoRandomness)?,
            verify_slots: tokio::sync::Semaphore::new(MAX_CONCURRENT_VERIFIES),
            service_secret: identity::ServiceSecret::new().ok_or(FileError::NoRandomness)?,
        })))
    }

    /// No files, no limits: everything allowed to whoever can connect.
    pub fn open() -> Access {
        let settings = AccessSettings {
            limits: LimitSettings {
                max_streams: None,
                ..LimitSettings::default()
            },
            ..AccessSettings::default()
        };
        Access::load(&settings, None).unwrap_or_else(|e| panic!("access without files cannot fail: {e}"))
    }

    /// Reads the files again (SIGHUP). On any error the rules in force stay, and the error says
    /// which file and line.
    pub fn reload(&self) -> Result<(), FileError> {
        let loaded = read_files(&self.0.settings, self.0.api_token.as_deref())?;
        let summary = (
            loaded.passwords.len(),
            loaded.tokens.len(),
            loaded.rules.as_ref().map(|r| r.len()),
        );
        self.0.loaded.store(Arc::new(loaded));
        let n = self.0.reloads.fetch_add(1, Ordering::SeqCst) + 1;
        // Streams whose token this reload removed end (see `Grant::revoked`).
        self.0.reloaded.send_replace(n);
        tracing::info!(
            reloads = n,
            users = summary.0,
            tokens = summary.1,
            rules = ?summary.2,
            "access files reloaded"
        );
        Ok(())
    }

    /// Puts new per-principal limits in force (a reloaded configuration); see
    /// [`limits::Limits::apply`].
    pub fn set_limits(&self, limits: &LimitSettings) {
        self.0.limits.apply(limits);
    }

    /// Successful reloads so far.
    pub fn reloads(&self) -> u64 {
        self.0.reloads.load(Ordering::SeqCst)
    }

    pub fn settings(&self) -> &AccessSettings {
        &self.0.settings
    }

    /// Whether MQTT clients must authenticate (a password file is configured).
    pub fn mqtt_auth_required(&self) -> bool {
        self.0.settings.mqtt_auth_file.is_some()
    }

    /// Whether HTTP/gRPC callers must present a token.
    pub fn tokens_required(&self) -> bool {
        self.0.settings.api_token_file.is_some() || self.0.api_token.is_some()
    }

    /// Whether a rules file is in force.
    pub fn has_rules(&self) -> bool {
        self.0.loaded.load().rules.is_some()
    }

    /// Whether an MQTT client authenticated as `identity` (`None`: anonymous) may use
    /// `client_id`: any id, unless `--mqtt-bind-client-id` binds ids to identities
    /// ([`identity::client_id_bound`]); an anonymous client has nothing to bind to.
    pub fn may_use_client_id(&self, client_id: &str, identity: Option<&str>) -> bool {
        !self.0.settings.bind_client_id || identity.is_some_and(|id| identity::client_id_bound(client_id, id))
    }

    /// The password of the service's own connection to the embedded broker (client path).
    pub fn service_password(&self) -> &str {
        self.0.service_secret.password()
    }

    /// Whether `given` is [`Self::service_password`] (constant time).
    pub fn is_service_password(&self, given: &[u8]) -> bool {
        self.0.service_secret.matches(given)
    }

    /// With an external broker: whether the claimed `__srcId` names the caller.
    pub fn trust_src_id(&self) -> bool {
        self.0.settings.trust_src_id
    }

    /// Checks an MQTT username and password against the password file (off the async threads,
    /// a few at a time). `false` when no password file is configured.
    pub async fn verify_password(&self, user: &str, password: &[u8]) -> bool {
        if !self.mqtt_auth_required() {
            return false;
        }
        let Ok(_slot) = self.0.verify_slots.acquire().await else {
            return false;
        };
        let loaded = self.0.loaded.load_full();
        let (user, password) = (user.to_owned(), password.to_vec());
        tokio::task::spawn_blocking(move || loaded.passwords.verify(&user, &password))
            .await
            .unwrap_or(false)
    }

    /// Lets an HTTP or gRPC call in: the token presented (`dapr-api-token`) names the caller
    /// (anonymous when no token is configured), one request is taken from the caller's rate,
    /// and the caller's [`Grant`] is what the handlers check. The one admission path of both
    /// doors.
    pub fn admit_token(&self, given: Option<&str>) -> Result<Grant, Refusal> {
        let (principal, credential) = if self.tokens_required() {
            let loaded = self.0.loaded.load();
            let given = given.ok_or(Refusal::BadToken)?;
            let name = loaded.tokens.name_of(given).ok_or(Refusal::BadToken)?;
            let principal = Principal {
                token: Some(name.to_owned()),
                ..Principal::default()
            };
            (principal, Some(identity::fingerprint(given)))
        } else {
            (Principal::default(), None)
        };
        self.admit(&principal).map_err(Refusal::Limited)?;
        Ok(Grant {
            access: Some(self.clone()),
            principal,
            credential,
        })
    }

    /// What `principal` may do, for one request or one stream.
    pub fn grant(&self, principal: Principal) -> Grant {
        Grant {
            access: Some(self.clone()),
            principal,
            credential: None,
        }
    }

    /// Takes one request from `principal`'s rate.
    pub fn admit(&self, principal: &Principal) -> Result<(), EngineError> {
        if self.0.limits.take(&principal.limit_key()) {
            Ok(())
        } else {
            Err(EngineError::RateLimited)
        }
    }

    /// Counts an open change stream of `principal`; dropped, the slot is free again.
    pub fn open_stream(&self, principal: &Principal) -> Result<StreamSlot, EngineError> {
        self.0
            .limits
            .open_stream(&principal.limit_key())
            .ok_or(EngineError::RateLimited)
    }

    /// Requests and streams refused by the limits so far.
    pub fn refused_by_limits(&self) -> u64 {
        self.0.limits.refused()
    }
}

fn read(path: &Path) -> Result<String, FileError> {
    std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_files(s: &AccessSettings, api_token: Option<&str>) -> Result<Loaded, FileError> {
    let passwords = match &s.mqtt_auth_file {
        Some(p) => Passwords::parse(p, &read(p)?)?,
        None => Passwords::default(),
    };
    let tokens = match &s.api_token_file {
        Some(p) => Tokens::parse(p, &read(p)?)?,
        None => Tokens::default(),
    }
    .with_default(api_token);
    let rules = match &s.acl_file {
        Some(p) => {
            let capacity = match s.acl_cache_principals {
                0 => rules::DEFAULT_CACHED_PRINCIPALS,
                n => n,
            };
            Some(Arc::new(RuleSet::parse(p, &read(p)?)?.with_cache_capacity(capacity)))
        }
        None => None,
    };
    Ok(Loaded {
        passwords,
        tokens,
        rules,
    })
}

/// One caller's permissions. Checks read the rules in force at the time of the check, so a
/// long stream follows a reload; a reload that removes the caller's token ends its streams
/// ([`Grant::revoked`]).
#[derive(Debug, Clone)]
pub struct Grant {
    /// `None`: everything allowed (the Dapr component socket: daprd, trusted by file mode).
    access: Option<Access>,
    principal: Principal,
    /// The token that vouched for the caller, when one did.
    credential: Option<identity::Fingerprint>,
}

impl Grant {
    /// Everything allowed.
    pub fn all() -> Grant {
        Grant {
            access: None,
            principal: Principal::default(),
            credential: None,
        }
    }

    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// Whether the token that vouched for this caller is gone: removed or replaced by a
    /// reload (the token file, or `--api-token`).
    pub fn is_revoked(&self) -> bool {
        let (Some(access), Some(print), Some(name)) = (&self.access, &self.credential, &self.principal.token) else {
            return false;
        };
        !access.0.loaded.load().tokens.holds(name, print)
    }

    /// Resolves once a reload has revoked this caller's token; never for a caller no token
    /// vouched for. Every stream (SSE, gRPC Watch, configuration subscriptions) ends with it:
    /// a reconnect meets the files in force.
    pub async fn revoked(&self) {
        let Some(access) = self.access.as_ref().filter(|_| self.credential.is_some()) else {
            return std::future::pending().await;
        };
        let mut reloads = access.0.reloaded.subscribe();
        // Subscribed before looking: a reload after the look wakes the loop.
        while !self.is_revoked() {
            if reloads.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    fn allowed(&self) -> Option<Arc<rules::Allowed>> {
        let access = self.access.as_ref()?;
        let loaded = access.0.loaded.load();
        Some(loaded.rules.as_ref()?.allowed(&self.principal))
    }

    /// Whether `op` on engine key `key` is allowed.
    pub fn may(&self, op: Op, key: &[u8]) -> bool {
        self.allowed().is_none_or(|a| a.may(op, key))
    }

    /// Whether `op` is allowed on every key, present and future (no rules, or a `*` rule): an
    /// online backup copies the whole store.
    pub fn may_every_key(&self, op: Op) -> bool {
        self.allowed().is_none_or(|a| a.may_every_key(op))
    }

    /// [`Grant::may`] as the error every door maps (MQTT 403, HTTP 403, gRPC PERMISSION_DENIED).
    pub fn check(&self, op: Op, key: &[u8]) -> Result<(), EngineError> {
        if self.may(op, key) {
            Ok(())
        } else {
            Err(EngineError::NotAuthorized)
        }
    }

    /// Every key must allow `op` (a transaction: all or nothing).
    pub fn check_all<'a>(&self, op: Op, keys: impl IntoIterator<Item = &'a [u8]>) -> Result<(), EngineError> {
        let Some(allowed) = self.allowed() else {
            return Ok(());
        };
        if keys.into_iter().all(|k| allowed.may(op, k)) {
            Ok(())
        } else {
            Err(EngineError::NotAuthorized)
        }
    }

    /// The keys this caller may read, for the places that produce key names; `None` when every
    /// key may be read. A snapshot of the rules in force now.
    pub fn read_filter(&self) -> Option<KeyFilter> {
        let allowed = self.allowed()?;
        Some(KeyFilter::new(move |k: &[u8]| allowed.may(Op::Read, k)))
    }

    /// A paging position for the caller, paging through `of`: the key itself when the caller
    /// may read it (then the name tells nothing new), sealed otherwise, bound to this caller
    /// and to `of` (see [`Grant::open_position`]).
    pub fn position_token(&self, filter: Option<&KeyFilter>, key: &[u8], of: Pages<'_>) -> String {
        match (filter, &self.access) {
            (Some(f), Some(access)) if !f.keeps(key) => access.0.sealer.seal(key, &self.binding(of)),
            _ => hex::encode_upper(key),
        }
    }

    /// The key a paging token names (plain upper-case hex, or sealed); `None` if it is
    /// neither, or sealed for another principal or another `of`: a sealed token names a key
    /// its holder may not read, and is only good for continuing the pages it came from.
    pub fn open_position(&self, token: &[u8], of: Pages<'_>) -> Option<Vec<u8>> {
        if seal::Sealer::is_sealed(token) {
            return self.access.as_ref()?.0.sealer.open(token, &self.binding(of));
        }
        hex::decode(token).ok().filter(|k| !k.is_empty())
    }

    /// What a sealed token is bound to (its associated data): the operation, the store, and
    /// this caller's principal, each field length-prefixed so that no two differ only in
    /// where one ends.
    fn binding(&self, of: Pages<'_>) -> Vec<u8> {
        fn field(out: &mut Vec<u8>, v: Option<&[u8]>) {
            match v {
                None => out.push(0),
                Some(v) => {
                    out.push(1);
                    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                    out.extend_from_slice(v);
                }
            }
        }
        let mut out = b"stategate paging token 1".to_vec();
        match of {
            Pages::Scan => out.push(b's'),
            Pages::Keys { store } => {
                out.push(b'k');
                field(&mut out, Some(store.as_bytes()));
            }
        }
        let p = &self.principal;
        for v in [&p.client_id, &p.username, &p.token] {
            field(&mut out, v.as_deref().map(str::as_bytes));
        }
        out
    }
}

/// What a paging token pages through: a sealed token opens only for the same (and the same
/// principal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages<'a> {
    /// SCAN of engine keys (MQTT, gRPC `statestore.v1`).
    Scan,
    /// The key list of the Dapr store named `store`.
    Keys { store: &'a str },
}

/// Runs one engine command for `grant`: refused with [`EngineError::NotAuthorized`] (nothing
/// executed) when the rules do not allow it; SCAN shows only readable keys, and its
/// continuation token never names a key the caller may not read.
pub async fn execute(engine: &Engine, grant: &Grant, cmd: Command) -> Result<Response, EngineError> {
    execute_request(engine, grant, cmd, None).await
}

/// [`execute`] of a request a transport may deliver more than once (see
/// [`crate::engine::RequestId`]).
pub async fn execute_request(
    engine: &Engine,
    grant: &Grant,
    mut cmd: Command,
    request: Option<&crate::engine::RequestId>,
) -> Result<Response, EngineError> {
    let mut scan_filter = None;
    match &mut cmd {
        Command::Get(c) => grant.check(Op::Read, &c.key)?,
        // All or nothing, as a transaction's writes are.
        Command::MGet(c) => {
            for key in &c.keys {
                grant.check(Op::Read, key)?;
            }
        }
        Command::Set(c) => grant.check(Op::Write, &c.key)?,
        Command::Del(c) => grant.check(Op::Write, &c.key)?,
        Command::VDel(c) => grant.check(Op::Write, &c.key)?,
        // STOP only ends the caller's own registration.
        Command::KeyNotify(c) if c.stop => {}
        Command::KeyNotify(c) => grant.check(Op::Observe, &c.key)?,
        Command::Scan(c) => {
            if let Some(filter) = grant.read_filter() {
                if let Some(t) = &c.token {
                    let key = grant.open_position(t, Pages::Scan).ok_or(EngineError::Syntax)?;
                    c.token = Some(Bytes::from(hex::encode_upper(key)));
                }
                c.filter = Some(filter.clone());
                scan_filter = Some(filter);
            }
        }
    }
    let mut resp = engine.execute_request(cmd, request).await?;
    if let (Some(filter), Reply::Keys { token: Some(t), .. }) = (&scan_filter, &mut resp.reply) {
        let key = hex::decode(&t[..]).map_err(|_| EngineError::Syntax)?;
        *t = Bytes::from(grant.position_token(Some(filter), &key, Pages::Scan));
    }
    Ok(resp)
}

#[cfg(test)]
mod tests;
