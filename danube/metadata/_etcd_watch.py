"""Watches of the etcd store: one etcd watch stream per ``Watch``, read by a thread.

A stream is an HTTP POST to the gateway's ``/v3/watch`` whose response never ends: one JSON
message per line. A blocking read of it needs a thread; the thread hands each batch of events
to the event loop (``call_soon_threadsafe``), where the shared ``Watch`` buffers them with the
same overflow rule as the in-process stores. The thread holds the ``Watch`` only weakly, so a
watch its owner dropped is collected, and its finalizer stops the stream.

The stream asks etcd for the range ``[prefix, prefix + "0")`` (which holds every key by the
'/' boundary rule plus a few siblings such as ``prefix-x``) and the thread drops the
siblings. It starts at a revision fixed when ``watch()`` was called, so every commit after
``watch()`` returned is seen; when the connection breaks the thread reconnects from the
revision after the last one it received, so nothing is missed or repeated. If etcd has
compacted that revision away, events were lost and the watch ends with ``WatchOverflow``,
the same outcome as a watcher that fell behind.

``delivered`` is the highest revision the loop has processed; a write of this store waits
for it (``wait_for``) on the watches its keys fall under, so a caller's own writes reach its
own watches before the write returns, as with the in-process stores.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import socket
import threading
import weakref
from typing import TYPE_CHECKING

from danube.metadata._etcd_auth import UNAUTHENTICATED
from danube.metadata._etcd_wire import b64, unb64
from danube.metadata._watch import Watch, WatchHub
from danube.metadata.errors import WatchOverflow
from danube.metadata.store import DELETE, PUT, WatchEvent, in_prefix, prefix_bounds

if TYPE_CHECKING:
    from danube.metadata._etcd_wire import EtcdConnection

log = logging.getLogger("danube.metadata.etcd")

#: A stream silent this long is reconnected (from where it was), which is harmless on an
#: idle prefix and bounds how long a half-open connection can go unnoticed.
READ_TIMEOUT = 30.0
RECONNECT_BACKOFF = (0.05, 1.0)


def kv_event(event: dict) -> tuple[str, str, str | None, int, int]:
    """(kind, key, stored text or None, revision, lease) of one gateway watch event."""
    kv = event["kv"]
    kind = DELETE if event.get("type") == "DELETE" else PUT
    text = unb64(kv.get("value")) if kind == PUT else None
    return kind, unb64(kv["key"]), text, int(kv.get("mod_revision", 0)), int(kv.get("lease", 0))


class _Stream:
    """The thread reading one etcd watch stream for one ``Watch``."""

    def __init__(self, conn: EtcdConnection, watch: Watch, start_revision: int, decode):
        self.conn = conn
        self.prefix = watch.prefix
        _, lo, hi = prefix_bounds(watch.prefix)
        self.range = (watch.prefix if not watch.prefix.endswith("/") else lo, hi)
        self.next_revision = start_revision
        self.delivered = start_revision - 1
        self.loop = asyncio.get_running_loop()
        self.decode = decode
        self._watch = weakref.ref(watch)
        self._stopped = threading.Event()
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"etcd-watch {watch.prefix}")
        self._thread.start()

    # -- on the loop ------------------------------------------------------------------------

    def wait_for(self, revision: int) -> asyncio.Future | None:
        """A future done once the loop has processed events up to ``revision`` (None if it
        already has, or the stream is stopped)."""
        if self.delivered >= revision or self._stopped.is_set():
            return None
        future = self.loop.create_future()
        self._waiters.append((revision, future))
        return future

    def _deliver(self, changes: list, last_revision: int) -> None:
        watch = self._watch()
        if watch is not None:
            for kind, key, text, revision, lease in changes:
                if in_prefix(key, self.prefix):
                    watch._deliver(WatchEvent(kind, key, self.decode(text, lease), revision))
        self._progress(last_revision)

    def _progress(self, revision: int) -> None:
        self.delivered = max(self.delivered, revision)
        still = []
        for wanted, future in self._waiters:
            if wanted <= self.delivered or self._stopped.is_set():
                if not future.done():
                    future.set_result(None)
            else:
                still.append((wanted, future))
        self._waiters = still

    def _fail(self, error: BaseException) -> None:
        watch = self._watch()
        if watch is not None:
            watch._end(error)
        self._progress(self.delivered)

    def stop(self) -> None:
        """Stop the thread (from any thread); safe to call more than once."""
        self._stopped.set()
        with self._lock:
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self.loop.call_soon_threadsafe(self._progress, self.delivered)
        except RuntimeError:        # the loop is closed: nobody waits any more
            pass

    # -- in the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        backoff = RECONNECT_BACKOFF[0]
        while not self._stopped.is_set():
            endpoint = self.conn.stream_target()
            try:
                if self._read(endpoint):
                    return
                backoff = RECONNECT_BACKOFF[0]
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if self._stopped.is_set():
                    return
                self.conn.stream_failed(endpoint, exc)
                log.warning("etcd watch on %r lost its stream (%s); reconnecting", self.prefix,
                            exc)
                self._stopped.wait(backoff)
                backoff = min(RECONNECT_BACKOFF[1], backoff * 2)

    def _read(self, endpoint: tuple[str, int]) -> bool:
        """Read one connection until it ends; True when the watch is over for good."""
        request = {"create_request": {"key": b64(self.range[0]), "range_end": b64(self.range[1]),
                                      "start_revision": self.next_revision}}
        token = self.conn.stream_token(endpoint)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = token
        conn = self.conn.open_stream(endpoint)
        try:
            conn.request("POST", "/v3/watch", body=json.dumps(request), headers=headers)
            with self._lock:
                self._sock = conn.sock
            if self._stopped.is_set():
                return True
            resp = conn.getresponse()
            if resp.status != 200:
                if token and resp.status == 401:
                    self.conn.auth.rejected(token)
                raise http.client.HTTPException(f"watch answered HTTP {resp.status}")
            conn.sock.settimeout(READ_TIMEOUT)
            buffer = b""
            while not self._stopped.is_set():
                try:
                    chunk = resp.read1(65536)
                except TimeoutError:
                    return False
                if not chunk:
                    raise ConnectionResetError("etcd closed the watch stream")
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip() and self._message(json.loads(line), token):
                        return True
            return True
        finally:
            with self._lock:
                self._sock = None
            conn.close()

    def _message(self, message: dict, token: str | None = None) -> bool:
        if "error" in message:
            error = message["error"]
            if token and isinstance(error, dict) and \
                    error.get("grpc_code", error.get("code")) == UNAUTHENTICATED:
                self.conn.auth.rejected(token)      # a new token for the next stream
            raise http.client.HTTPException(f"watch error: {error}")
        result = message.get("result", {})
        if result.get("canceled"):
            compacted = int(result.get("compact_revision", 0))
            reason = (f"etcd compacted revision {self.next_revision} away (now at {compacted})"
                      if compacted else result.get("cancel_reason", "canceled by etcd"))
            self.loop.call_soon_threadsafe(self._fail, WatchOverflow(
                f"watch on {self.prefix!r} lost events: {reason}; re-read with scan() and "
                "watch again"))
            return True
        events = result.get("events")
        if events:
            changes = [kv_event(event) for event in events]
            last = changes[-1][3]
            self.next_revision = last + 1
            self.loop.call_soon_threadsafe(self._deliver, changes, last)
        return False


class EtcdWatchHub(WatchHub):
    """The open watches of one etcd store, each with its stream thread."""

    def __init__(self, conn: EtcdConnection, decode):
        super().__init__()
        self._conn = conn
        self._decode = decode
        self._streams: dict[int, _Stream] = {}

    def open_at(self, prefix: str, max_pending: int, start_revision: int) -> Watch:
        watch = self.open(prefix, max_pending)
        stream = _Stream(self._conn, watch, start_revision, self._decode)
        key = id(watch)
        self._streams[key] = stream
        weakref.finalize(watch, self._forget, key)
        return watch

    def streams_covering(self, keys) -> list[_Stream]:
        return [s for s in self._streams.values() if any(in_prefix(k, s.prefix) for k in keys)]

    def _forget(self, key: int) -> None:
        stream = self._streams.pop(key, None)
        if stream is not None:
            stream.stop()

    def _discard(self, watch: Watch) -> None:
        super()._discard(watch)
        self._forget(id(watch))
