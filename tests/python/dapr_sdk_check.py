#!/usr/bin/env python3
"""Drives stategate's Dapr state API with the official Python Dapr SDK (`pip install dapr`).

Usage:
    python dapr_sdk_check.py [GRPC_ADDRESS [HTTP_ENDPOINT]]

The gRPC address (e.g. `127.0.0.1:50001`; an `http://` prefix is dropped) comes from argv[1]
or env DAPR_GRPC_ENDPOINT; the HTTP endpoint (e.g. `http://127.0.0.1:3500`) from argv[2] or
env DAPR_HTTP_ENDPOINT. With DAPR_SDK_CHECK_THROUGH_DAPRD=1 the endpoints are a real daprd's,
whose stategate component holds the state (the one difference: daprd reports a component's
refusal of a save as INTERNAL). The SDK probes `{HTTP_ENDPOINT}/v1.0/healthz/outbound` before its
first call, so stategate's HTTP door must be up too.

Exercises save_state, get_state, get_bulk_state, delete_state, execute_state_transaction and
query_state with ETags, first-write concurrency and TTLs (metadata `ttlInSeconds`), asserting
every result. Exits 0 when all checks pass; on the first failure prints `FAIL: <what>` to
stderr and exits 1. The last line of stdout is

    RESULT {"key": "...", "etag": "...", "value": "..."}

naming a key the script left in the store with the ETag (version) and value it last saw, so
the caller can read it back over another protocol.
"""

import json
import os
import sys
import time
import urllib.request
import uuid

STORE = "statestore"


def fail(what):
    print(f"FAIL: {what}", file=sys.stderr)
    sys.exit(1)


def check(cond, what):
    if not cond:
        fail(what)


def endpoints():
    grpc_addr = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DAPR_GRPC_ENDPOINT", "")
    http_ep = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("DAPR_HTTP_ENDPOINT", "")
    if not grpc_addr or not http_ep:
        fail("give the gRPC address and HTTP endpoint as arguments or DAPR_GRPC_ENDPOINT/DAPR_HTTP_ENDPOINT")
    for scheme in ("http://", "dns:"):
        if grpc_addr.startswith(scheme):
            grpc_addr = grpc_addr[len(scheme):]
    # The SDK reads these from the environment (health probe, default address).
    os.environ["DAPR_GRPC_ENDPOINT"] = grpc_addr
    os.environ["DAPR_HTTP_ENDPOINT"] = http_ep.rstrip("/")
    os.environ.setdefault("DAPR_HEALTH_TIMEOUT", "20")
    return grpc_addr, http_ep.rstrip("/")


def expect_grpc_error(code_name, what, fn, *args, **kwargs):
    """Runs fn, which must fail with a DaprGrpcError of the given grpc.StatusCode name."""
    from dapr.clients.exceptions import DaprGrpcError

    try:
        fn(*args, **kwargs)
    except DaprGrpcError as err:
        got = err.code().name if err.code() is not None else None
        check(got == code_name, f"{what}: expected {code_name}, got {got} ({err.details()})")
        return err
    fail(f"{what}: expected {code_name}, the call succeeded")


def main():
    grpc_addr, http_ep = endpoints()

    import warnings

    warnings.simplefilter("ignore")  # query_state warns that the API is alpha

    from dapr.clients import DaprClient
    from dapr.clients.grpc._request import TransactionalStateOperation, TransactionOperationType
    from dapr.clients.grpc._state import Concurrency, StateOptions

    run = uuid.uuid4().hex[:8]

    def k(name):
        return f"py-{run}-{name}"

    with DaprClient(address=grpc_addr) as d:
        # save/get, ETags change on every write and are opaque non-empty strings.
        d.save_state(STORE, k("a"), "one")
        r = d.get_state(STORE, k("a"))
        check(r.data == b"one", f"get_state returns the saved bytes, got {r.data!r}")
        etag1 = r.etag
        check(etag1 != "", "an existing key has an etag")
        d.save_state(STORE, k("a"), b"two", etag=etag1)
        r = d.get_state(STORE, k("a"))
        check(r.data == b"two", f"a save with the current etag applies, got {r.data!r}")
        etag2 = r.etag
        check(etag2 != etag1, "the etag changes on every write")
        expect_grpc_error("ABORTED", "save with a stale etag", d.save_state, STORE, k("a"), "three", etag=etag1)
        expect_grpc_error("INVALID_ARGUMENT", "save with an invalid etag", d.save_state, STORE, k("a"), "x", etag="nope")
        check(d.get_state(STORE, k("a")).data == b"two", "refused saves change nothing")

        # first-write: a save without an etag fails once the key exists.
        fw = StateOptions(concurrency=Concurrency.first_write)
        d.save_state(STORE, k("fw"), "first", options=fw)
        expect_grpc_error("ABORTED", "first-write save on an existing key", d.save_state, STORE, k("fw"), "again", options=fw)

        # A missing key: empty data and etag, no error.
        r = d.get_state(STORE, k("missing"))
        check(r.data == b"" and r.etag == "", f"a missing key reads empty, got {r.data!r}/{r.etag!r}")

        # Bulk get keeps the request order and marks missing keys by empty data.
        d.save_state(STORE, k("b"), "bee")
        bulk = d.get_bulk_state(STORE, keys=[k("b"), k("missing"), k("a")]).items
        check([i.key for i in bulk] == [k("b"), k("missing"), k("a")], "bulk get keeps the request order")
        check(bulk[0].data == b"bee" and bulk[0].etag != "", "bulk item of an existing key")
        check(bulk[1].data == b"" and bulk[1].etag == "" and bulk[1].error == "", "bulk item of a missing key")
        check(bulk[2].etag == etag2, "bulk get reports the same etag as get_state")

        # Delete: a stale etag conflicts, the current one deletes, a missing key is fine.
        expect_grpc_error("ABORTED", "delete with a stale etag", d.delete_state, STORE, k("a"), etag=etag1)
        expect_grpc_error("INVALID_ARGUMENT", "delete with an invalid etag", d.delete_state, STORE, k("a"), etag="nope")
        d.delete_state(STORE, k("a"), etag=etag2)
        check(d.get_state(STORE, k("a")).data == b"", "deleted with the current etag")
        d.delete_state(STORE, k("a"))

        # Transactions: applied in order; a conflict applies nothing.
        d.save_state(STORE, k("t1"), "1")
        d.execute_state_transaction(
            STORE,
            operations=[
                TransactionalStateOperation(operation_type=TransactionOperationType.delete, key=k("t1")),
                TransactionalStateOperation(key=k("t2"), data="2"),
                TransactionalStateOperation(operation_type=TransactionOperationType.delete, key=k("t2")),
                TransactionalStateOperation(key=k("t3"), data="3"),
            ],
        )
        check(d.get_state(STORE, k("t1")).data == b"", "tx: t1 deleted")
        check(d.get_state(STORE, k("t2")).data == b"", "tx: t2 upserted then deleted")
        t3 = d.get_state(STORE, k("t3"))
        check(t3.data == b"3", "tx: t3 upserted")
        expect_grpc_error(
            "INTERNAL",
            "a transaction with a stale etag",
            d.execute_state_transaction,
            STORE,
            operations=[
                TransactionalStateOperation(key=k("t4"), data="4"),
                TransactionalStateOperation(key=k("t3"), data="33", etag=etag1),
            ],
        )
        check(d.get_state(STORE, k("t4")).data == b"", "a failed transaction applies nothing")
        check(d.get_state(STORE, k("t3")).etag == t3.etag, "a failed transaction changes nothing")
        d.execute_state_transaction(
            STORE,
            operations=[TransactionalStateOperation(key=k("t3"), data="33", etag=t3.etag)],
        )
        check(d.get_state(STORE, k("t3")).data == b"33", "tx with the current etag applies")

        # TTL: reported as metadata.ttlExpireTime over HTTP; a 1 s TTL expires; bad TTL refused.
        d.save_state(STORE, k("ttl-long"), "t", state_metadata={"ttlInSeconds": "300"})
        with urllib.request.urlopen(f"{http_ep}/v1.0/state/{STORE}/{k('ttl-long')}", timeout=10) as resp:
            exp = resp.headers.get("metadata.ttlExpireTime")
        check(exp is not None and exp.endswith("Z"), f"ttlExpireTime is reported, got {exp!r}")
        # daprd answers any component error on a save that is not about an ETag as INTERNAL
        # (its state error mapping); stategate's own door says INVALID_ARGUMENT.
        bad_ttl_code = "INTERNAL" if os.environ.get("DAPR_SDK_CHECK_THROUGH_DAPRD") == "1" else "INVALID_ARGUMENT"
        expect_grpc_error(
            bad_ttl_code,
            "a non-integer ttlInSeconds",
            d.save_state,
            STORE,
            k("ttl-bad"),
            "x",
            state_metadata={"ttlInSeconds": "soon"},
        )
        check(d.get_state(STORE, k("ttl-bad")).data == b"", "a refused TTL save writes nothing")
        d.save_state(STORE, k("ttl-short"), "gone soon", state_metadata={"ttlInSeconds": "1"})
        deadline = time.monotonic() + 15
        while d.get_state(STORE, k("ttl-short")).data != b"":
            check(time.monotonic() < deadline, "a key with ttlInSeconds=1 expires within 15 s")
            time.sleep(0.1)

        # Query (alpha): JSON values, filter, sort, paging.
        for i in range(5):
            doc = {"run": run, "id": i, "state": "WA" if i % 2 == 0 else "CA"}
            d.save_state(STORE, k(f"q{i}"), json.dumps(doc), state_metadata={"contentType": "application/json"})
        query = {
            "filter": {"AND": [{"EQ": {"run": run}}, {"EQ": {"state": "WA"}}]},
            "sort": [{"key": "id", "order": "DESC"}],
            "page": {"limit": 2},
        }
        page = d.query_state(STORE, json.dumps(query))
        check([r.key for r in page.results] == [k("q4"), k("q2")], f"query page 1: {[r.key for r in page.results]}")
        check(json.loads(page.results[0].value) == {"run": run, "id": 4, "state": "WA"}, "query returns the value")
        check(all(r.etag for r in page.results), "query results carry etags")
        check(page.token != "", "a first page of a longer result has a token")
        query["page"]["token"] = page.token
        page = d.query_state(STORE, json.dumps(query))
        check([r.key for r in page.results] == [k("q0")], f"query page 2: {[r.key for r in page.results]}")
        check(page.token == "", "the last page has no token")

        # The value left for the caller to read back over MQTT.
        final = k("final")
        d.save_state(STORE, final, "hello from the Python Dapr SDK")
        r = d.get_state(STORE, final)
        check(r.etag != "", "the final key has an etag")
        print("all Dapr SDK checks passed")
        print("RESULT " + json.dumps({"key": final, "etag": r.etag, "value": r.data.decode()}))


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - any unexpected error is a failure with a message
        fail(f"unexpected {type(e).__name__}: {e}")
