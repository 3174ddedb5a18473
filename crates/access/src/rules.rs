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

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Principals whose compiled rules are kept unless configured otherwise
/// (`--acl-cache-principals`).
pub const DEFAULT_CACHED_PRINCIPALS: usize = 10_000;

/// A parsed rules file, with the rules of the principals seen lately compiled.
///
/// Every access check of every door asks [`RuleSet::allowed`], so the cache is on the hot
/// path: a hit takes only the read lock of one of the cache's shards (no lock shared by all
/// checks), a miss compiles outside any lock (two callers may compile the same principal at
/// once; the second insert wins, both results are equal), and past its capacity the cache
/// evicts the principals seen least (CLOCK-Pro), one at a time: a fleet of devices larger
/// than the cache, or a client churning ids, costs compiles for the newcomers only, never a
/// clear-all that makes every principal compile again.
pub struct RuleSet {
    rules: Vec<Rule>,
    cache: quick_cache::sync::Cache<Principal, Arc<Allowed>>,
    /// Principals compiled so far (a miss of the cache).
    compiled: AtomicU64,
}

impl std::fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleSet")
            .field("rules", &self.rules)
            .field("cached", &self.cache.len())
            .finish()
    }
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
            cache: quick_cache::sync::Cache::new(DEFAULT_CACHED_PRINCIPALS),
            compiled: AtomicU64::new(0),
        })
    }

    /// Keeps the compiled rules of up to `principals` principals (at least 1).
    pub fn with_cache_capacity(mut self, principals: usize) -> RuleSet {
        self.cache = quick_cache::sync::Cache::new(principals.max(1));
        self
    }

    /// Principals whose rules were compiled (cache misses) so far.
    pub fn compiled(&self) -> u64 {
        self.compiled.load(Ordering::Relaxed)
    }

    /// Principals whose compiled rules are kept now.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// What `p` may do (compiled once per principal and kept while it is used).
    pub fn allowed(&self, p: &Principal) -> Arc<Allowed> {
        if let Some(a) = self.cache.get(p) {
            return a;
        }
        self.compiled.fetch_add(1, Ordering::Relaxed);
        let a = Arc::new(self.compile(p));
        self.cache.insert(p.clone(), a.clone());
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

#[cfg(test)]
mod cache_tests {
    use super::*;

    fn rules() -> RuleSet {
        let text = "[[rule]]\nclient_ids = [\"*\"]\nallow = [\"read\"]\nkeys = [\"devices/{clientId}/*\"]\n";
        RuleSet::parse(Path::new("acl.toml"), text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn device(n: usize) -> Principal {
        Principal {
            client_id: Some(format!("dev-{n}")),
            ..Principal::default()
        }
    }

    /// A fleet three times the cache's size passing through costs a compile per newcomer; the
    /// principal in constant use is compiled once (a clear-all at the limit compiled it again).
    #[test]
    fn churn_past_the_capacity_never_evicts_a_principal_in_use() {
        let rules = rules();
        let hot = Principal {
            client_id: Some("gateway".into()),
            ..Principal::default()
        };
        let fleet = 3 * DEFAULT_CACHED_PRINCIPALS;
        for n in 0..fleet {
            assert!(rules.allowed(&hot).may(Op::Read, b"devices/gateway/t"));
            assert!(
                rules
                    .allowed(&device(n))
                    .may(Op::Read, format!("devices/dev-{n}/t").as_bytes())
            );
        }
        assert_eq!(rules.compiled(), fleet as u64 + 1, "the gateway compiled once");
        assert!(
            rules.cached() <= DEFAULT_CACHED_PRINCIPALS + DEFAULT_CACHED_PRINCIPALS / 10,
            "bounded: {} cached",
            rules.cached()
        );
    }

    #[test]
    fn the_capacity_is_configurable_and_a_hit_compiles_nothing() {
        let rules = rules().with_cache_capacity(100);
        for n in 0..1_000 {
            rules.allowed(&device(n));
        }
        assert!(rules.cached() <= 110, "{} cached", rules.cached());
        let before = rules.compiled();
        rules.allowed(&device(999));
        assert_eq!(rules.compiled(), before, "the newest principal is still cached");
        // An evicted principal gets the same answer, compiled again.
        assert!(rules.allowed(&device(0)).may(Op::Read, b"devices/dev-0/x"));
        assert!(!rules.allowed(&device(0)).may(Op::Read, b"devices/dev-1/x"));
    }
}
