"""The etcd store's pieces of a gateway request and answer: keys as etcd returned them (with
the envelope of a leased key opened, see ``danube.metadata.etcd``), and the transaction
operations and comparisons in the gateway's JSON form."""

from __future__ import annotations

import json
from typing import Any

from danube.metadata._etcd_wire import b64, unb64


class _Kv:
    """One key as etcd returned it, with the envelope of a leased key opened."""
    __slots__ = ("key", "text", "version", "lease", "expires_at")

    def __init__(self, kv: dict):
        self.key = unb64(kv["key"])
        self.version = int(kv.get("mod_revision", 0))
        self.lease = int(kv.get("lease", 0))
        stored = unb64(kv.get("value"))
        self.expires_at = None
        if self.lease:
            envelope = json.loads(stored)
            self.expires_at = float(envelope["x"])
            self.text = json.dumps(envelope["v"], separators=(",", ":"))
        else:
            self.text = stored

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


def decode_stored(text: str | None, lease: int) -> Any:
    """The value of a watch event's stored text."""
    if text is None:
        return None
    value = json.loads(text)
    return value["v"] if lease else value


def _put_op(key: str, stored: str, lease: int) -> dict:
    op = {"key": b64(key), "value": b64(stored)}
    if lease:
        op["lease"] = lease
    return {"request_put": op}


def _range_op(key: str, range_end: str | None = None) -> dict:
    op = {"key": b64(key)}
    if range_end is not None:
        op["range_end"] = b64(range_end)
    return {"request_range": op}


def _compare(key: str, target: str, value: int) -> dict:
    field = {"MOD": "mod_revision", "VERSION": "version", "LEASE": "lease"}[target]
    return {"key": b64(key), "target": target, "result": "EQUAL", field: value}
