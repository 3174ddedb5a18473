//! Per-key access rules (`--acl-file`, TOML): which principals may `read`, `write`, `observe`
//! and/or `admin` which keys.
//!
//! ```toml
//! [[rule]]
//! usernames = ["sensor-*"]          # MQTT usernames (password users, certificate identities)
//! client_ids = ["gateway-1"]        # MQTT client ids
//! tokens = ["console"]              # HTTP/gRPC token names
//! anonymous = false                 # callers with neither a username nor a token
//! allow = ["read", "write"]
//! keys = ["devices/{clientId}/*", "shared/*"]
//! ```
//!
//! A rule applies to a principal that any of its selectors match (globs, SCAN's syntax). Keys
//! are engine keys (what MQTT sees; a Dapr store with a prefix stores `prefix||key`), matched
//! by glob; `{clientId}`, `{username}` and `{token}` stand for the principal's own values,
//! inserted literally (a client id `*` matches only the key level `*`), and a key glob whose
//! placeholder the principal lacks matches nothing. Rules only allow: what no rule allows is
//! denied.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use glob::Pattern;
use serde::Deserialize;

use super::FileError;
use super::identity::Principal;

/// What a rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// GET, bulk get; being shown the key by SCAN, key lists, queries, SSE and Watch.
    Read,
    /// SET (NX, NEX), DEL, VDEL, Dapr save, delete and transactions.
    Write,
    /// KEYNOTIFY: being notified of the key's changes (notifications carry the new value).
    Observe,
    /// The operations that go around the per-request rules, on top of `read` or `write`: an
    /// import (records keep their own versions, fencing tokens and deadlines; with
    /// `overwriteFenced`, fenced keys are replaced without their token) and, on every key, an
    /// online backup (a copy of the store's files that pauses log compaction while it runs).
    Admin,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        match s {
            "read" => Some(Op::Read),
            "write" => Some(Op::Write),
            "observe" => Some(Op::Observe),
            "admin" => Some(Op::Admin),
            _ => None,
        }
    }

    fn index(self) -> usize {
        match self {
            Op::Read => 0,
            Op::Write => 1,
            Op::Observe => 2,
            Op::Admin => 3,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDef {
    #[serde(default)]
    rule: Vec<toml::Spanned<RuleDef>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleDef {
    #[serde(default)]
    usernames: Vec<String>,
    #[serde(default)]
    client_ids: Vec<String>,
    #[serde(default)]
    tokens: Vec<String>,
    #[serde(default)]
    anonymous: bool,
    allow: Vec<String>,
    keys: Vec<String>,
}

/// How many operations a rule can allow.
const OPS: usize = 4;

#[derive(Debug)]
struct Rule {
    usernames: Vec<Pattern>,
    client_ids: Vec<Pattern>,
    tokens: Vec<Pattern>,
    anonymous: bool,
    allow: [bool; OPS],
    /// Key globs as written, placeholders not yet filled in.
    keys: Vec<KeyGlob>,
}

/// A key glob: fixed, or with placeholders to fill per principal.
#[derive(Debug)]
enum KeyGlob {
    Fixed(Pattern),
    Template(String),
}

const PLACEHOLDERS: [&str; 3] = ["{clientId}", "{username}", "{token}"];

impl Rule {
    fn applies_to(&self, p: &Principal) -> bool {
        let any =
            |pats: &[Pattern], v: &Option<String>| v.as_deref().is_some_and(|v| pats.iter().any(|g| g.matches(v)));
        (self.anonymous && p.is_anonymous())
            || any(&self.usernames, &p.username)
            || any(&self.client_ids, &p.client_id)
            || any(&self.tokens, &p.token)
    }
}

/// Most principals whose compiled rules are kept; past it the cache starts again.
const MAX_CACHED_PRINCIPALS: usize = 10_000;

/// A parsed rules file.
#[derive(Debug)]
pub struct RuleSet {
    rules: Vec<Rule>,
    cache: Mutex<HashMap<Principal, Arc<Allowed>>>,
}

/// What one principal may do: key globs per operation, placeholders filled in.
#[derive(Debug, Default)]
pub struct Allowed {
    globs: [Vec<Pattern>; OPS],
}

impl Allowed {
    /// Whether `op` is allowed on every key (a `*` glob): what a whole-store copy needs.
    pub fn may_every_key(&self, op: Op) -> bool {
        self.globs[op.index()].iter().any(|g| g.as_str() == "*")
    }

    /// Whether `op` on `key` is allowed.
    pub fn may(&self, op: Op, key: &[u8]) -> bool {
        let globs = &self.globs[op.index()];
        if globs.is_empty() {
            return false;
        }
        match std::str::from_utf8(key) {
            Ok(k) => globs.iter().any(|g| g.matches(k)),
            Err(_) => {
                let k = String::from_utf8_lossy(key);
                globs.iter().any(|g| g.matches(&k))
            }
        }
    }
}

impl RuleSet {
    /// Parses a rules file; errors name the file and line.
    pub fn parse(path: &Path, text: &str) -> Result<RuleSet, FileError> {
        let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
        let file: FileDef = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(s.start)).unwrap_or(1);
            FileError::at(path, line, e.message().trim())
        })?;
        let mut rules = Vec::with_capacity(file.rule.len());
        for spanned in file.rule {
            let line = line_of(spanned.span().start);
            let def = spanned.into_inner();
            let err = |m: String| FileError::at(path, line, &m);
            let globs = |what: &str, list: &[String]| -> Result<Vec<Pattern>, FileError> {
                list.iter()
                    .map(|g| Pattern::new(g).map_err(|e| err(format!("{what} {g:?}: {e}"))))
                    .collect()
            };
            let mut allow = [false; OPS];
            for a in &def.allow {
                let op = Op::parse(a)
                    .ok_or_else(|| err(format!("unknown permission {a:?} (read, write, observe or admin)")))?;
                allow[op.index()] = true;
            }
            if def.allow.is_empty() {
                return Err(err("`allow` is empty: name read, write, observe and/or admin".into()));
            }
            if def.usernames.is_empty() && def.client_ids.is_empty() && def.tokens.is_empty() && !def.anonymous {
                return Err(err(
                    "the rule applies to nobody: give usernames, client_ids, tokens or anonymous = true".into(),
                ));
            }
            let mut keys = Vec::with_capacity(def.keys.len());
            for k in &def.keys {
                if k.is_empty() {
                    return Err(err("an empty key glob".into()));
                }
                // Check the glob with every placeholder filled in.
                let probe = PLACEHOLDERS.iter().fold(k.clone(), |s, p| s.replace(p, "x"));
                Pattern::new(&probe).map_err(|e| err(format!("key glob {k:?}: {e}")))?;
                if probe.contains('{') || probe.contains('}') {
                    return Err(err(format!(
                        "key glob {k:?}: braces are only allowed in {{clientId}}, {{username}} and {{token}}"
                    )));
                }
                keys.push(if PLACEHOLDERS.iter().any(|p| k.contains(p)) {
                    KeyGlob::Template(k.clone())
                } else {
                    KeyGlob::Fixed(Pattern::new(k).map_err(|e| err(format!("key glob {k:?}: {e}")))?)
                });
            }
            rules.push(Rule {
                usernames: globs("username", &def.usernames)?,
                client_ids: globs("client id", &def.client_ids)?,
                tokens: globs("token name", &def.tokens)?,
                anonymous: def.anonymous,
                allow,
                keys,
            });
        }
        Ok(RuleSet {
            rules,
            cache: Mutex::new(HashMap::new()),
        })
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// What `p` may do (computed once per principal and kept).
    pub fn allowed(&self, p: &Principal) -> Arc<Allowed> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = cache.get(p) {
            return a.clone();
        }
        let a = Arc::new(self.compile(p));
        if cache.len() >= MAX_CACHED_PRINCIPALS {
            cache.clear();
        }
        cache.insert(p.clone(), a.clone());
        a
    }

    fn compile(&self, p: &Principal) -> Allowed {
        let mut out = Allowed::default();
        for rule in self.rules.iter().filter(|r| r.applies_to(p)) {
            let globs: Vec<Pattern> = rule.keys.iter().filter_map(|k| fill(k, p)).collect();
            for (i, allowed) in rule.allow.iter().enumerate() {
                if *allowed {
                    out.globs[i].extend(globs.iter().cloned());
                }
            }
        }
        out
    }
}

/// A key glob for principal `p`; `None` when it names a value `p` does not have.
fn fill(k: &KeyGlob, p: &Principal) -> Option<Pattern> {
    match k {
        KeyGlob::Fixed(g) => Some(g.clone()),
        KeyGlob::Template(t) => {
            let mut s = t.clone();
            for (name, value) in PLACEHOLDERS.iter().zip([&p.client_id, &p.username, &p.token]) {
                if s.contains(name) {
                    // Literally: glob characters in a client id must not widen the rule.
                    s = s.replace(name, &Pattern::escape(value.as_deref()?));
                }
            }
            Pattern::new(&s).ok()
        }
    }
}
