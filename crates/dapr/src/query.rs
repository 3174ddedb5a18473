//! The Dapr state query language over JSON values: filters (EQ, NEQ, GT, GTE, LT, LTE, IN,
//! AND, OR) on dotted paths into the value, sort, and paging with an opaque token.
//!
//! Paths (filter fields and sort keys) are dotted paths into the stored JSON document
//! (`person.org`). A leading `value.` is optional (`value.person.org` is the same path), as the
//! Dapr components that keep the document under `value` accept it; so the bare path `value` is
//! the whole document (`{"EQ": {"value": 5}}` matches documents that are the number 5, sort key
//! `value` orders by the documents themselves), and a field named `value` is `value.value`.
//! Values that are not JSON never match.

use std::cmp::Ordering;

use serde_json::Value;

use super::{DaprError, StoreSpec};
use crate::access::Grant;
use crate::engine::Engine;

/// A parsed query.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub filter: Option<Filter>,
    pub sort: Vec<SortKey>,
    pub limit: Option<usize>,
    /// Where the page starts: after this row of the previous page.
    pub after: Option<Cursor>,
}

/// The last row of a page, in result order: its sort values and its key. The next page is the
/// rows that come after it, so a page costs memory in proportion to its size however deep it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Cursor {
    sort: Vec<Value>,
    key: Vec<u8>,
}

impl Cursor {
    /// The opaque `page.token`.
    fn encode(&self) -> String {
        use base64::Engine as _;
        let doc = serde_json::json!({ "s": self.sort, "k": hex::encode(&self.key) });
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(doc.to_string())
    }

    fn decode(token: &str) -> Option<Cursor> {
        use base64::Engine as _;
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).ok()?;
        let doc: Value = serde_json::from_slice(&raw).ok()?;
        let sort = doc.get("s")?.as_array()?.clone();
        let key = hex::decode(doc.get("k")?.as_str()?).ok()?;
        Some(Cursor { sort, key })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    Cmp(Op, String, Value),
    In(String, Vec<Value>),
    And(Vec<Filter>),
    Or(Vec<Filter>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Neq,
    Gt,
    Gte,
    Lt,
    Lte,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortKey {
    pub path: String,
    pub descending: bool,
}

/// One result row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub key: String,
    pub value: bytes::Bytes,
    pub etag: String,
}

/// A page of results and the token of the next page.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueryPage {
    pub rows: Vec<Row>,
    pub token: Option<String>,
}

fn bad(msg: impl Into<String>) -> DaprError {
    DaprError::Malformed(format!("failed parsing query: {}", msg.into()))
}

/// Most keys a query examines; beyond that it is refused rather than run unbounded.
pub const MAX_QUERY_KEYS: usize = 1_000_000;
/// Most rows in one page (also without a `page.limit`): a page's memory is bounded by it.
pub const MAX_QUERY_PAGE: usize = 1000;
/// Keys examined between two yields to the scheduler, so a long query does not hold a worker.
const YIELD_EVERY: usize = 256;

impl Query {
    /// Parses the JSON body of a query request.
    pub fn parse(body: &Value) -> Result<Query, DaprError> {
        let obj = body.as_object().ok_or_else(|| bad("the query must be a JSON object"))?;
        for k in obj.keys() {
            if !matches!(k.as_str(), "filter" | "sort" | "page") {
                return Err(bad(format!("unknown field {k:?}")));
            }
        }
        let filter = match obj.get("filter") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) if m.is_empty() => None,
            Some(f) => Some(Filter::parse(f)?),
        };
        let mut sort = Vec::new();
        if let Some(s) = obj.get("sort") {
            let arr = s.as_array().ok_or_else(|| bad("sort must be an array"))?;
            for item in arr {
                let key = item
                    .get("key")
                    .and_then(Value::as_str)
                    .filter(|k| !k.is_empty())
                    .ok_or_else(|| bad("each sort item needs a key"))?;
                let descending = match item.get("order") {
                    None | Some(Value::Null) => false,
                    Some(Value::String(o)) if o == "ASC" || o == "asc" => false,
                    Some(Value::String(o)) if o == "DESC" || o == "desc" => true,
                    Some(o) => return Err(bad(format!("sort order {o} is not ASC or DESC"))),
                };
                sort.push(SortKey {
                    path: key.to_owned(),
                    descending,
                });
            }
        }
        let (mut limit, mut after) = (None, None);
        if let Some(p) = obj.get("page") {
            let p = p.as_object().ok_or_else(|| bad("page must be an object"))?;
            match p.get("limit") {
                None | Some(Value::Null) => {}
                Some(l) => {
                    // A whole number, as JSON counts them (`5` or `5.0`).
                    let l = l
                        .as_u64()
                        .or_else(|| {
                            l.as_f64()
                                .filter(|f| f.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(f))
                                .map(|f| f as u64)
                        })
                        .ok_or_else(|| bad("page.limit must be a non-negative integer"))?;
                    if l > 0 {
                        limit = Some(l as usize);
                    }
                }
            }
            match p.get("token") {
                None | Some(Value::Null) => {}
                Some(Value::String(t)) if t.is_empty() => {}
                Some(Value::String(t)) => {
                    after = Some(Cursor::decode(t).ok_or_else(|| bad("page.token is not a token we issued"))?)
                }
                Some(_) => return Err(bad("page.token must be a string")),
            }
        }
        Ok(Query {
            filter,
            sort,
            limit,
            after,
        })
    }
}

impl Filter {
    fn parse(v: &Value) -> Result<Filter, DaprError> {
        let obj = v.as_object().ok_or_else(|| bad("a filter must be an object"))?;
        if obj.len() != 1 {
            return Err(bad("a filter has exactly one operator"));
        }
        let Some((op, arg)) = obj.iter().next() else {
            return Err(bad("empty filter"));
        };
        let pair = |arg: &Value| -> Result<(String, Value), DaprError> {
            let m = arg.as_object().ok_or_else(|| bad(format!("{op} takes an object")))?;
            if m.len() != 1 {
                return Err(bad(format!("{op} takes exactly one field")));
            }
            let (k, v) = m.iter().next().ok_or_else(|| bad(format!("{op} is empty")))?;
            Ok((k.clone(), v.clone()))
        };
        let cmp = |o| -> Result<Filter, DaprError> {
            let (k, v) = pair(arg)?;
            Ok(Filter::Cmp(o, k, v))
        };
        match op.as_str() {
            "EQ" => cmp(Op::Eq),
            "NEQ" => cmp(Op::Neq),
            "GT" => cmp(Op::Gt),
            "GTE" => cmp(Op::Gte),
            "LT" => cmp(Op::Lt),
            "LTE" => cmp(Op::Lte),
            "IN" => {
                let (k, v) = pair(arg)?;
                let list = v.as_array().ok_or_else(|| bad("IN takes an array"))?;
                Ok(Filter::In(k, list.clone()))
            }
            "AND" | "OR" => {
                let list = arg.as_array().ok_or_else(|| bad(format!("{op} takes an array")))?;
                if list.len() < 2 {
                    return Err(bad(format!("{op} takes at least two filters")));
                }
                let fs = list.iter().map(Filter::parse).collect::<Result<Vec<_>, _>>()?;
                Ok(if op == "AND" { Filter::And(fs) } else { Filter::Or(fs) })
            }
            other => Err(bad(format!("unknown operator {other:?}"))),
        }
    }

    pub fn matches(&self, doc: &Value) -> bool {
        match self {
            Filter::Cmp(op, path, want) => {
                let got = lookup(doc, path);
                match op {
                    Op::Eq => got == Some(want),
                    Op::Neq => got != Some(want),
                    Op::Gt | Op::Gte | Op::Lt | Op::Lte => {
                        let Some(ord) = got.and_then(|g| compare_same_kind(g, want)) else {
                            return false;
                        };
                        match op {
                            Op::Gt => ord == Ordering::Greater,
                            Op::Gte => ord != Ordering::Less,
                            Op::Lt => ord == Ordering::Less,
                            Op::Lte => ord != Ordering::Greater,
                            Op::Eq | Op::Neq => false,
                        }
                    }
                }
            }
            Filter::In(path, list) => lookup(doc, path).is_some_and(|g| list.contains(g)),
            Filter::And(fs) => fs.iter().all(|f| f.matches(doc)),
            Filter::Or(fs) => fs.iter().any(|f| f.matches(doc)),
        }
    }
}

/// Follows a dotted path (`person.org`) into a JSON document. A leading `value.` is accepted;
/// the bare path `value` is the whole document.
fn lookup<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    if path == "value" {
        return Some(doc);
    }
    let path = path.strip_prefix("value.").unwrap_or(path);
    path.split('.').try_fold(doc, |v, part| v.get(part))
}

/// Orders numbers numerically and strings lexically; other pairs are not comparable.
fn compare_same_kind(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64()?.partial_cmp(&y.as_f64()?),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

/// A total order for sorting: missing < null < bool < number < string < array < object.
fn sort_order(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    fn rank(v: Option<&Value>) -> u8 {
        match v {
            None => 0,
            Some(Value::Null) => 1,
            Some(Value::Bool(_)) => 2,
            Some(Value::Number(_)) => 3,
            Some(Value::String(_)) => 4,
            Some(Value::Array(_)) => 5,
            Some(Value::Object(_)) => 6,
        }
    }
    match (a, b) {
        (Some(x), Some(y)) => compare_same_kind(x, y).unwrap_or_else(|| rank(a).cmp(&rank(b))),
        _ => rank(a).cmp(&rank(b)),
    }
}

/// One matching row, with what it sorts by.
struct Candidate {
    sort: Vec<Value>,
    key: Vec<u8>,
    row: Row,
}

impl Query {
    /// The sort values of a document.
    fn sort_values(&self, doc: &Value) -> Vec<Value> {
        self.sort
            .iter()
            .map(|s| lookup(doc, &s.path).cloned().unwrap_or(Value::Null))
            .collect()
    }

    /// Result order: the sort keys (each in its direction), then the key, ascending.
    fn order(&self, a_sort: &[Value], a_key: &[u8], b_sort: &[Value], b_key: &[u8]) -> Ordering {
        self.sort
            .iter()
            .zip(a_sort.iter().zip(b_sort))
            .map(|(s, (a, b))| {
                let o = sort_order(Some(a), Some(b));
                if s.descending { o.reverse() } else { o }
            })
            .find(|o| *o != Ordering::Equal)
            .unwrap_or_else(|| a_key.cmp(b_key))
    }
}

/// Runs a query over the JSON values of a store. Values that are not JSON never match.
///
/// A page holds at most `page.limit` rows (and never more than [`MAX_QUERY_PAGE`]). Without a
/// sort, the keys are read in key order from where the previous page ended and the scan stops
/// when the page is full. With a sort, every key of the store is examined, keeping only the
/// best rows after the previous page's last one: memory in proportion to the page, not to the
/// store, and the scan yields to other work as it goes.
/// Only keys the caller may read are considered, so results, pages and tokens say nothing
/// about the others (a token names the last row returned, which the caller may read).
pub async fn run(engine: &Engine, grant: &Grant, store: &StoreSpec, q: &Query) -> Result<QueryPage, DaprError> {
    let readable = grant.read_filter();
    let limit = q.limit.unwrap_or(MAX_QUERY_PAGE).min(MAX_QUERY_PAGE);
    let sorted = !q.sort.is_empty();
    let prefix = store.key_prefix();
    // Without a sort, result order is key order: start right after the previous page.
    let mut after: Option<bytes::Bytes> = match (&q.after, sorted) {
        (Some(c), false) => Some(bytes::Bytes::copy_from_slice(&c.key)),
        _ => None,
    };
    let mut best: Vec<Candidate> = Vec::new();
    let mut examined = 0usize;
    let mut more = false;
    'scan: loop {
        let page = engine.keys_with_prefix(&prefix, after.as_deref(), 1024).await?;
        for key in page.keys {
            examined += 1;
            if examined.is_multiple_of(YIELD_EVERY) {
                tokio::task::yield_now().await;
            }
            if examined > MAX_QUERY_KEYS {
                return Err(DaprError::Malformed(format!(
                    "the query would examine more than {MAX_QUERY_KEYS} keys"
                )));
            }
            if !store.owns(&key) || readable.as_ref().is_some_and(|f| !f.keeps(&key)) {
                continue;
            }
            let Some(entry) = engine.peek(&key).await? else {
                continue;
            };
            let Ok(doc) = serde_json::from_slice::<Value>(&entry.value) else {
                continue;
            };
            if !q.filter.as_ref().is_none_or(|f| f.matches(&doc)) {
                continue;
            }
            let sort = q.sort_values(&doc);
            if let Some(c) = &q.after
                && q.order(&sort, &key, &c.sort, &c.key) != Ordering::Greater
            {
                continue;
            }
            if !sorted && best.len() == limit {
                // One more match past a full page: there is a next page.
                more = true;
                break 'scan;
            }
            best.push(Candidate {
                sort,
                key: key.to_vec(),
                row: Row {
                    key: store.dapr_key(&key),
                    value: entry.value,
                    etag: entry.version.to_string(),
                },
            });
            if sorted && best.len() >= 2 * limit.max(1) {
                trim(q, &mut best, limit, &mut more);
            }
        }
        match page.resume_after {
            Some(k) => after = Some(k),
            None => break,
        }
    }
    if sorted {
        trim(q, &mut best, limit, &mut more);
    }
    let token = if more {
        best.last().map(|c| {
            Cursor {
                sort: c.sort.clone(),
                key: c.key.clone(),
            }
            .encode()
        })
    } else {
        None
    };
    Ok(QueryPage {
        rows: best.into_iter().map(|c| c.row).collect(),
        token,
    })
}

/// Keeps the first `limit` candidates in result order; notes whether any were dropped.
fn trim(q: &Query, best: &mut Vec<Candidate>, limit: usize, more: &mut bool) {
    best.sort_by(|a, b| q.order(&a.sort, &a.key, &b.sort, &b.key));
    if best.len() > limit {
        *more = true;
        best.truncate(limit);
    }
}

#[cfg(test)]
mod tests;
