#!/usr/bin/env python3
"""Runs the official Python Dapr SDK (`pip install dapr`) one command at a time, so a test can
interleave its calls with other clients (the Azure IoT Operations SDK, MQTT, HTTP, gRPC).

Usage:
    python dapr_sdk_repl.py GRPC_ADDRESS HTTP_ENDPOINT

Prints `{"ready": true}` once the SDK is connected, then reads one JSON command per line on
stdin and answers each with one `{"reply": ...}` line on stdout (or `{"error": "..."}` when the
SDK raised). Configuration subscriptions print `{"event": {"id": ..., "items": {...}}}` lines
from the SDK's own watcher thread whenever its handler is called. Commands (`op`):

    try_lock {store, resource, owner, expiry}   -> {success, headers}
    unlock {store, resource, owner}             -> {status}      (the UnlockResponseStatus value)
    get_configuration {store, keys}             -> {items: {key: {value, version, metadata}}}
    subscribe_configuration {store, keys}       -> {id}
    unsubscribe_configuration {store, id}       -> {ok}
    save_state {store, key, value, metadata}    -> {}
    quit
"""

import json
import os
import sys
import threading
import warnings

OUT = threading.Lock()


def emit(obj):
    with OUT:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def items_of(response):
    return {
        k: {"value": v.value, "version": v.version, "metadata": dict(v.metadata or {})}
        for k, v in response.items.items()
    }


def main():
    grpc_addr, http_ep = sys.argv[1], sys.argv[2].rstrip("/")
    if grpc_addr.startswith("http://"):
        grpc_addr = grpc_addr[len("http://"):]
    os.environ["DAPR_GRPC_ENDPOINT"] = grpc_addr
    os.environ["DAPR_HTTP_ENDPOINT"] = http_ep
    os.environ.setdefault("DAPR_HEALTH_TIMEOUT", "20")
    warnings.simplefilter("ignore")  # the lock and configuration APIs warn that they are alpha

    from dapr.clients import DaprClient

    def on_change(sub_id, response):
        emit({"event": {"id": sub_id, "items": items_of(response)}})

    with DaprClient(address=grpc_addr) as d:
        emit({"ready": True})
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            op = cmd.get("op")
            try:
                if op == "quit":
                    emit({"reply": {}})
                    return
                if op == "try_lock":
                    r = d.try_lock(cmd["store"], cmd["resource"], cmd["owner"], cmd["expiry"])
                    emit({"reply": {"success": r.success, "headers": r.headers}})
                elif op == "unlock":
                    r = d.unlock(cmd["store"], cmd["resource"], cmd["owner"])
                    emit({"reply": {"status": r.status.value}})
                elif op == "get_configuration":
                    r = d.get_configuration(cmd["store"], cmd["keys"])
                    emit({"reply": {"items": items_of(r)}})
                elif op == "subscribe_configuration":
                    sub_id = d.subscribe_configuration(cmd["store"], cmd["keys"], on_change)
                    emit({"reply": {"id": sub_id}})
                elif op == "unsubscribe_configuration":
                    ok = d.unsubscribe_configuration(cmd["store"], cmd["id"])
                    emit({"reply": {"ok": ok}})
                elif op == "save_state":
                    d.save_state(cmd["store"], cmd["key"], cmd["value"], state_metadata=cmd.get("metadata"))
                    emit({"reply": {}})
                else:
                    emit({"error": f"unknown op {op!r}"})
            except Exception as e:  # noqa: BLE001 - every SDK failure is reported to the test
                emit({"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
