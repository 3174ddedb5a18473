//! What the OpenAPI document must say that utoipa's types cannot hold, added to the derived
//! schemas by name: JSON Schema conditionals (`if`/`then`) between fields, and what the names
//! of an open object may hold. `openapi_json` applies them; the rules are the Dapr layer's and
//! the export format's (`dapr::WriteMeta::parse`, `dapr::decode_value`, `dump::decode_line`).

use serde_json::{Value, json};

/// Base64, standard alphabet, padded, canonical (unused bits zero), as the `base64` crate's
/// standard engine decodes it. The same pattern is on `dto::ImportRecord::value`.
const BASE64: &str = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$";

/// [`BASE64`] of at least one byte.
const BASE64_NOT_EMPTY: &str =
    r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{4}|[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)$";

/// A `ttlInSeconds` that sets a time to live (not empty, not `-1`).
const POSITIVE_TTL: &str = r"^\s*\+?0*([1-9][0-9]{0,8}|[12][0-9]{9}|30[0-9]{8}|31[0-4][0-9]{7}|315[0-2][0-9]{6}|3153[0-5][0-9]{5}|3153600000)\s*$";

/// Adds the rules to the document (a `serde_json` rendering of `openapi()`).
pub fn apply(doc: &mut Value) {
    // Bodies that are required, yet may be `null` (none: Go's decoder reads `null` so, and
    // daprd's clients send it).
    for path in [
        "/v1.0/state/{store}",
        "/v1.0/state/{store}/bulk",
        "/v1.0/state/{store}/transaction",
    ] {
        for method in ["post", "put"] {
            let body = &mut doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"];
            *body = json!({"oneOf": [body.take(), {"type": "null"}]});
        }
    }
    query_language(doc);
    links_in_camel_case(doc);

    let schemas = &mut doc["components"]["schemas"];

    // Metadata names other than the known ones hold strings (or null); `ttlSliding: true`
    // needs a time to live to slide.
    let meta = &mut schemas["WriteMetadata"];
    meta["additionalProperties"] = json!({"type": ["string", "null"]});
    meta["if"] = json!({
        "required": ["ttlSliding"],
        "properties": {"ttlSliding": {"type": "string", "pattern": r"^\s*[Tt][Rr][Uu][Ee]\s*$"}}
    });
    meta["then"] = json!({
        "required": ["ttlInSeconds"],
        "properties": {"ttlInSeconds": {"type": "string", "pattern": POSITIVE_TTL}}
    });

    // `contentEncoding: base64` makes the value a JSON string of base64: an item's own
    // metadata, or a transaction's (which every operation takes, deletes included).
    let base64_in_metadata = json!({
        "required": ["metadata"],
        "properties": {"metadata": {"type": "object", "required": ["contentEncoding"]}}
    });
    let base64_value = json!({"required": ["value"], "properties": {"value": {"type": "string", "pattern": BASE64}}});
    schemas["SaveItem"]["if"] = base64_in_metadata.clone();
    schemas["SaveItem"]["then"] = base64_value.clone();
    schemas["TransactionRequest"]["if"] = base64_in_metadata;
    schemas["TransactionRequest"]["then"] = json!({
        "properties": {"operations": {"type": ["array", "null"], "items": {"properties": {"request": base64_value}}}}
    });

    // An import record: no other field; a base64 key decodes to at least one byte; a sliding
    // time to live needs the deadline it slides.
    let record = &mut schemas["ImportRecord"];
    record["additionalProperties"] = json!(false);
    record["allOf"] = json!([
        {
            "if": {"required": ["key_base64"], "properties": {"key_base64": {"const": true}}},
            "then": {"properties": {"key": {"pattern": BASE64_NOT_EMPTY}}}
        },
        {
            "if": {"required": ["slide_ms"], "properties": {"slide_ms": {"type": "integer"}}},
            "then": {"required": ["expires_at_ms"], "properties": {"expires_at_ms": {"type": "integer"}}}
        }
    ]);
}

/// The query body (`dapr::query::Query::parse`): its grammar is recursive (`AND`/`OR` hold
/// filters), which utoipa's derived schemas do not express with the rules on each level
/// (exactly one operator, exactly one field).
fn query_language(doc: &mut Value) {
    let one_field =
        |value: Value| json!({"type": "object", "minProperties": 1, "maxProperties": 1, "additionalProperties": value});
    let mut operators = serde_json::Map::new();
    for op in ["EQ", "NEQ", "GT", "GTE", "LT", "LTE"] {
        operators.insert(op.into(), one_field(json!({})));
    }
    operators.insert("IN".into(), one_field(json!({"type": "array"})));
    for op in ["AND", "OR"] {
        operators.insert(
            op.into(),
            json!({"type": "array", "minItems": 2, "items": {"$ref": "#/components/schemas/QueryFilter"}}),
        );
    }
    let schemas = &mut doc["components"]["schemas"];
    schemas["QueryFilter"] = json!({
        "description": "One operator and its argument: `EQ`, `NEQ`, `GT`, `GTE`, `LT`, `LTE` take \
                        `{field: value}`, `IN` takes `{field: [values]}`, `AND` and `OR` take two or \
                        more filters. A field is a dotted path into the JSON value.",
        "type": "object",
        "minProperties": 1,
        "maxProperties": 1,
        "properties": Value::Object(operators),
        "additionalProperties": false
    });
    schemas["QueryRequest"] = json!({
        "description": "A query: which values (`filter`; none or `{}`: every one), in which order \
                        (`sort`), which page (`page.limit` rows, at most 1000; `page.token` from the \
                        previous answer, as the service issued it).",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "filter": {"oneOf": [
                {"type": "null"},
                {"type": "object", "maxProperties": 0},
                {"$ref": "#/components/schemas/QueryFilter"}
            ]},
            "sort": {"type": "array", "items": {
                "type": "object",
                "required": ["key"],
                "properties": {
                    "key": {"type": "string", "minLength": 1},
                    "order": {"enum": ["ASC", "asc", "DESC", "desc", null]}
                }
            }},
            "page": {"type": "object", "properties": {
                "limit": {"type": ["integer", "null"], "minimum": 0},
                "token": {"type": ["string", "null"]}
            }}
        }
    });
    for method in ["post", "put"] {
        doc["paths"]["/v1.0-alpha1/state/{store}/query"][method]["requestBody"]["content"]["application/json"]["schema"] =
            json!({"$ref": "#/components/schemas/QueryRequest"});
    }
}

/// utoipa 5 writes a link's fields in snake case (`operation_id`, `request_body`); OpenAPI
/// names them `operationId`, `operationRef` and `requestBody` (the stateful checks follow
/// links by those names).
fn links_in_camel_case(doc: &mut Value) {
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    let operations = paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|p| p.values_mut());
    let responses = operations
        .filter_map(|o| o["responses"].as_object_mut())
        .flat_map(|r| r.values_mut());
    for response in responses {
        let Some(links) = response.get_mut("links").and_then(Value::as_object_mut) else {
            continue;
        };
        for link in links.values_mut().filter_map(Value::as_object_mut) {
            for (snake, camel) in [
                ("operation_id", "operationId"),
                ("operation_ref", "operationRef"),
                ("request_body", "requestBody"),
            ] {
                if let Some(v) = link.remove(snake) {
                    link.insert(camel.to_owned(), v);
                }
            }
        }
    }
}
