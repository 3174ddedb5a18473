"""schemathesis hooks for tests/it/schemathesis.rs: what a generator cannot learn from the
OpenAPI document alone. Loaded through SCHEMATHESIS_HOOKS (the test sets it)."""

import json
import re
import time

import schemathesis

# A version `{ms}:{counter}:{node}` (dto::Version).
VERSION = re.compile(r"^([0-9]{1,19})(:[0-9]{1,5}:[^:\x00-\x1f\x7f-\x9f]+)$")


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    """The import body: records, one JSON object per line, as the export writes them."""
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    return "".join(json.dumps(item) + "\n" for item in items).encode()


def _in_the_past(value):
    """Versions and fencing tokens may not be ahead of the service's clock (a rule of time the
    document states in words only): generated ones are moved into the past; deadlines too."""
    now = int(time.time() * 1000)
    if isinstance(value, str):
        m = VERSION.match(value)
        if m and int(m.group(1)) > now:
            return f"{int(m.group(1)) % now:015}{m.group(2)}"
        return value
    if isinstance(value, list):
        return [_in_the_past(v) for v in value]
    if isinstance(value, dict):
        out = {k: _in_the_past(v) for k, v in value.items()}
        deadline = out.get("expires_at_ms")
        if isinstance(deadline, int) and not isinstance(deadline, bool) and deadline > now:
            out["expires_at_ms"] = deadline % now
        return out
    return value


@schemathesis.hook
def map_body(ctx, body):
    body = _in_the_past(body)
    # A query's page token is valid only as the service issued it (a random one is refused).
    if ctx.operation is not None and ctx.operation.path.endswith("/query") and isinstance(body, dict):
        page = body.get("page")
        # Only a token of the right type: a wrong type is what a negative case is about.
        if isinstance(page, dict) and isinstance(page.get("token"), str) and page["token"]:
            page = dict(page)
            del page["token"]
            body = dict(body, page=page)
    return body
