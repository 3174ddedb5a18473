//! The Dapr state query language over JSON values: filters (EQ, NEQ, GT, GTE, LT, LTE, IN,
//! AND, OR) on dotted paths into the value, sort, and paging with an opaque token.

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
    /// Offset into the sorted result where the page starts.
    pub offset: usize,
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
                let descending = match item.get("order").and_then(Value::as_str) {
                    None | Some("ASC") | Some("asc") => false,
                    Some("DESC") | Some("desc") => true,
                    Some(o) => return Err(bad(format!("sort order {o:?} is not ASC or DESC"))),
                };
                sort.push(SortKey {
                    path: key.to_owned(),
                    descending,
                });
            }
        }
        let (mut limit, mut offset) = (None, 0);
        if let Some(p) = obj.get("page") {
            let p = p.as_object().ok_or_else(|| bad("page must be an object"))?;
            match p.get("limit") {
                None | Some(Value::Null) => {}
                Some(l) => {
                    let l = l
                        .as_u64()
                        .ok_or_else(|| bad("page.limit must be a non-negative integer"))?;
                    if l > 0 {
                        limit = Some(l as usize);
                    }
                }
            }
            match p.get("token") {
                None | Some(Value::Null) => {}
                Some(Value::String(t)) if t.is_empty() => {}
                Some(Value::String(t)) => offset = t.parse().map_err(|_| bad("page.token is not a token we issued"))?,
                Some(_) => return Err(bad("page.token must be a string")),
            }
        }
        Ok(Query {
            filter,
            sort,
            limit,
            offset,
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

/// Follows a dotted path (`person.org`) into a JSON value. A leading `value.` is accepted.
fn lookup<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
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

/// Runs a query over the JSON values of a store. Values that are not JSON never match.
/// Only keys the caller may read are examined, so results, counts and offsets say nothing
/// about the others.
pub async fn run(engine: &Engine, grant: &Grant, store: &StoreSpec, q: &Query) -> Result<QueryPage, DaprError> {
    let prefix = store.key_prefix();
    let readable = grant.read_filter();
    let mut after: Option<bytes::Bytes> = None;
    let mut rows: Vec<(Value, Row)> = Vec::new();
    let mut examined = 0usize;
    loop {
        let page = engine.keys_with_prefix(&prefix, after.as_deref(), 4096).await?;
        for key in page.keys {
            examined += 1;
            if !store.owns(&key) || readable.as_ref().is_some_and(|f| !f.keeps(&key)) {
                continue;
            }
            if examined > MAX_QUERY_KEYS {
                return Err(DaprError::Malformed(format!(
                    "the query would examine more than {MAX_QUERY_KEYS} keys"
                )));
            }
            let Some(entry) = engine.read(&key).await? else {
                continue;
            };
            let Ok(doc) = serde_json::from_slice::<Value>(&entry.value) else {
                continue;
            };
            if q.filter.as_ref().is_none_or(|f| f.matches(&doc)) {
                rows.push((
                    doc,
                    Row {
                        key: store.dapr_key(&key),
                        value: entry.value,
                        etag: entry.version.to_string(),
                    },
                ));
            }
        }
        match page.resume_after {
            Some(k) => after = Some(k),
            None => break,
        }
    }
    if !q.sort.is_empty() {
        rows.sort_by(|(a, _), (b, _)| {
            q.sort
                .iter()
                .map(|s| {
                    let o = sort_order(lookup(a, &s.path), lookup(b, &s.path));
                    if s.descending { o.reverse() } else { o }
                })
                .find(|o| *o != Ordering::Equal)
                .unwrap_or(Ordering::Equal)
        });
    }
    let total = rows.len();
    let start = q.offset.min(total);
    let end = match q.limit {
        Some(l) => start.saturating_add(l).min(total),
        None => total,
    };
    let token = (end < total).then(|| end.to_string());
    Ok(QueryPage {
        rows: rows.into_iter().skip(start).take(end - start).map(|(_, r)| r).collect(),
        token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(v: Value) -> Query {
        Query::parse(&v).unwrap()
    }

    #[test]
    fn filters_match_dotted_paths() {
        let doc = json!({"person": {"org": "Dev Ops", "id": 1036}, "city": "Seattle", "state": "WA"});
        let cases = [
            (json!({"EQ": {"person.org": "Dev Ops"}}), true),
            (json!({"EQ": {"value.person.org": "Dev Ops"}}), true),
            (json!({"NEQ": {"state": "CA"}}), true),
            (json!({"GT": {"person.id": 1000}}), true),
            (json!({"GTE": {"person.id": 1036}}), true),
            (json!({"LT": {"person.id": 1036}}), false),
            (json!({"LTE": {"person.id": 1036.0}}), true),
            (json!({"GT": {"person.id": "1"}}), false),
            (json!({"IN": {"state": ["CA", "WA"]}}), true),
            (
                json!({"AND": [{"EQ": {"state": "WA"}}, {"EQ": {"city": "Seattle"}}]}),
                true,
            ),
            (
                json!({"AND": [{"EQ": {"state": "WA"}}, {"EQ": {"city": "Spokane"}}]}),
                false,
            ),
            (
                json!({"OR": [{"EQ": {"state": "CA"}}, {"EQ": {"city": "Seattle"}}]}),
                true,
            ),
            (json!({"EQ": {"missing.path": 1}}), false),
        ];
        for (f, want) in cases {
            let query = q(json!({ "filter": f.clone() }));
            assert_eq!(query.filter.unwrap().matches(&doc), want, "{f}");
        }
    }

    #[test]
    fn malformed_queries_are_refused() {
        for bad in [
            json!([]),
            json!({"filter": {"XX": {"a": 1}}}),
            json!({"filter": {"EQ": {"a": 1, "b": 2}}}),
            json!({"filter": {"EQ": 1}}),
            json!({"filter": {"AND": [{"EQ": {"a": 1}}]}}),
            json!({"filter": {"IN": {"a": 1}}}),
            json!({"sort": [{"order": "ASC"}]}),
            json!({"sort": [{"key": "a", "order": "UP"}]}),
            json!({"page": {"limit": -1}}),
            json!({"page": {"token": "x"}}),
            json!({"page": {"token": 3}}),
            json!({"other": 1}),
        ] {
            assert!(matches!(Query::parse(&bad), Err(DaprError::Malformed(_))), "{bad}");
        }
    }

    #[test]
    fn page_and_sort_parse() {
        let query =
            q(json!({"sort": [{"key": "a", "order": "DESC"}, {"key": "b"}], "page": {"limit": 2, "token": "4"}}));
        assert_eq!(query.limit, Some(2));
        assert_eq!(query.offset, 4);
        assert_eq!(
            query.sort,
            vec![
                SortKey {
                    path: "a".into(),
                    descending: true
                },
                SortKey {
                    path: "b".into(),
                    descending: false
                }
            ]
        );
    }

    #[test]
    fn sort_order_is_total() {
        let vals = [
            None,
            Some(json!(null)),
            Some(json!(true)),
            Some(json!(2)),
            Some(json!("a")),
        ];
        for w in vals.windows(2) {
            assert_eq!(sort_order(w[0].as_ref(), w[1].as_ref()), Ordering::Less);
        }
        assert_eq!(sort_order(Some(&json!(10)), Some(&json!(9.5))), Ordering::Greater);
    }
}
