"""The metadata store of a cluster: etcd, through its v3 JSON gateway (``etcd3gw``).

How the contract of ``danube.metadata.store`` maps onto etcd:

* Versions are etcd's ``mod_revision``; the store revision is etcd's. A ``put_many`` or a
  ``delete_prefix`` is one etcd transaction, so its changes share a revision.
* Values: a key without a TTL holds its JSON text as is (``etcdctl get`` shows it). A key
  with a TTL is attached to an etcd lease and holds ``{"x": expires_at, "v": value}``: etcd
  leases count whole seconds and are reaped up to half a second late, while the contract
  wants a 0.2 s TTL to hide the key at once. So reads hide a leased key whose ``x`` has
  passed (by this host's clock: hosts of a cluster need NTP, as for any lease), and the
  lease (``ceil(ttl)`` seconds) makes etcd delete it anyway if its writer dies.
* Expiry events: this store deletes the TTL keys it wrote at their deadline, with a
  transaction guarded by the ``mod_revision`` it wrote (a key rewritten since is left alone),
  so watchers see a ``delete`` on time; keys of a writer that died are deleted by their
  lease. A write that finds an expired key first deletes it (guarded the same way), so the
  expiry is announced before the change.
* CAS compares ``mod_revision`` (``version == 0`` for "absent") in a transaction.
* Prefix reads, deletes and watches use the range ``[prefix, prefix + "0")`` and drop the
  siblings the '/' boundary rule excludes (see ``danube.metadata.store.prefix_bounds``).
* Durability is etcd's: a write returns once the etcd cluster has committed it to a quorum
  of fsynced logs, so ``durable=False`` changes nothing.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from danube.metadata._etcd_ops import _compare, _Kv, _put_op, _range_op, decode_stored
from danube.metadata._etcd_watch import EtcdWatchHub
from danube.metadata._etcd_wire import EtcdConnection, b64
from danube.metadata._watch import Watch
from danube.metadata.errors import MetadataError, MetadataUnavailable
from danube.metadata.store import (DEFAULT_MAX_PENDING, Entry, MetadataStore, decode_value,
                                   encode_value, prefix_bounds, put_many_args, validate_key,
                                   validate_prefix, validate_ttl, validate_version)

log = logging.getLogger("danube.metadata.etcd")

#: How long a write waits for this store's own watches to receive it before returning anyway
#: (a stream that is reconnecting must not hold up writers).
SETTLE_TIMEOUT = 2.0


class EtcdStore(MetadataStore):
    """``MetadataStore`` on an etcd cluster. Use from one event loop."""

    def __init__(self, endpoints: list[str], *, timeout: float = 5.0, retry_for: float = 10.0,
                 clock=time.time, tls=None, auth: tuple[str, str] | None = None):
        self.conn = EtcdConnection(endpoints, timeout=timeout, retry_for=retry_for, tls=tls,
                                   auth=auth)
        self._clock = clock
        self._hub = EtcdWatchHub(self.conn, decode_stored)
        self._revision = 0
        self._deadlines: list[tuple[float, str, int]] = []
        #: key -> (revision, deadline) of this store's latest TTL write of it. A broker
        #: rewrites its registration and load report every second: the rewrite expects that
        #: revision (one transaction, not a failed one to learn it), and the deadline of
        #: each earlier write is passed without a call (its guarded delete could only fail).
        self._latest_ttl_write: dict[str, tuple[int, float]] = {}
        self._reaper: asyncio.Task | None = None
        self._reaper_wakeup = asyncio.Event()
        self._counter_locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    @classmethod
    async def open(cls, endpoints: list[str], **kwargs) -> EtcdStore:
        store = cls(endpoints, **kwargs)
        try:
            await store.start()
        except BaseException:
            await store.close()
            raise
        return store

    @property
    def revision(self) -> int:
        """The highest etcd revision this store has seen."""
        return self._revision

    @property
    def watch_count(self) -> int:
        return len(self._hub)

    @property
    def available(self) -> bool:
        """False while etcd cannot be reached (the last call failed)."""
        return self.conn.available

    # -- plumbing ---------------------------------------------------------------------------

    async def _call(self, path: str, body: dict, *, idempotent: bool = True) -> dict:
        if self._closed:
            raise MetadataUnavailable("metadata store is closed")
        answer = await self.conn.call(path, body, idempotent=idempotent)
        revision = int(answer.get("header", {}).get("revision", 0))
        if revision > self._revision:
            self._revision = revision
        return answer

    async def _txn(self, compare: list, success: list, failure: list = (), *,
                   idempotent: bool = True) -> dict:
        return await self._call("kv/txn", {"compare": compare, "success": success,
                                           "failure": list(failure)}, idempotent=idempotent)

    async def _settle(self, revision: int, keys: Iterable[str]) -> None:
        """Let this store's watches on ``keys`` receive ``revision`` before returning."""
        waits = [f for s in self._hub.streams_covering(list(keys))
                 if (f := s.wait_for(revision)) is not None]
        if waits:
            await asyncio.wait(waits, timeout=SETTLE_TIMEOUT)

    async def _lease(self, ttl: float | None) -> tuple[int, float | None]:
        if ttl is None:
            return 0, None
        answer = await self._call("lease/grant", {"TTL": max(1, math.ceil(ttl))})
        return int(answer["ID"]), self._clock() + ttl

    def _stored(self, text: str, expires_at: float | None) -> str:
        return text if expires_at is None else f'{{"x":{expires_at!r},"v":{text}}}'

    def _track(self, key: str, expires_at: float | None, revision: int) -> None:
        if expires_at is None:
            self._latest_ttl_write.pop(key, None)
            return
        heapq.heappush(self._deadlines, (expires_at, key, revision))
        self._latest_ttl_write[key] = (revision, expires_at)
        self._reaper_wakeup.set()

    async def _delete_expired(self, kvs: list[_Kv]) -> None:
        """Delete keys found expired, each only if unchanged since it was read."""
        if not kvs:
            return
        answer = await self._txn([_compare(kv.key, "MOD", kv.version) for kv in kvs],
                                 [{"request_delete_range": {"key": b64(kv.key)}} for kv in kvs])
        if answer.get("succeeded"):
            await self._settle(int(answer["header"]["revision"]), [kv.key for kv in kvs])

    async def _get_kv(self, key: str) -> _Kv | None:
        answer = await self._call("kv/range", {"key": b64(key)})
        kvs = answer.get("kvs")
        return _Kv(kvs[0]) if kvs else None

    # -- reads ------------------------------------------------------------------------------

    async def get_entry(self, key: str) -> Entry | None:
        validate_key(key)
        kv = await self._get_kv(key)
        if kv is None or kv.expired(self._clock()):
            return None
        return Entry(key, decode_value(kv.text), kv.version, kv.expires_at)

    async def _range(self, prefix: str, keys_only: bool = False) -> list[_Kv]:
        exact, lo, hi = prefix_bounds(validate_prefix(prefix))
        ops = [_range_op(lo, hi)]
        if exact is not None:
            ops.insert(0, _range_op(exact))
        answer = await self._txn([], ops)
        now = self._clock()
        found = [_Kv(kv) for r in answer.get("responses", ())
                 for kv in r.get("response_range", {}).get("kvs", ())]
        return [kv for kv in found if not kv.expired(now)]

    async def scan(self, prefix: str) -> list[tuple[str, Any]]:
        return [(kv.key, decode_value(kv.text)) for kv in await self._range(prefix)]

    # -- writes -----------------------------------------------------------------------------

    async def _write(self, texts: list[tuple[str, str]], ttl: float | None) -> int:
        """Put every key in one transaction; announce the expiry of any expired key first."""
        lease, expires_at = await self._lease(ttl)
        stored = [(key, self._stored(text, expires_at)) for key, text in texts]
        # A key without a lease cannot have expired, so the first attempt just checks that
        # (lease == 0 also holds for an absent key), or, for a key this store wrote with a
        # TTL that has not run out, that it is still that write. Other leased keys cost a
        # second look.
        now = self._clock()
        expect: dict[str, int | None] = {}
        for key, _ in texts:
            mine = self._latest_ttl_write.get(key)
            expect[key] = mine[0] if mine is not None and mine[1] > now else None
        while True:
            compare = [_compare(k, "LEASE", 0) if v is None else _compare(k, "MOD", v)
                       for k, v in expect.items()]
            answer = await self._txn(compare, [_put_op(k, s, lease) for k, s in stored],
                                     [_range_op(k) for k in expect])
            if answer.get("succeeded"):
                revision = int(answer["header"]["revision"])
                for key, _ in texts:
                    self._track(key, expires_at, revision)
                await self._settle(revision, expect)
                return revision
            now = self._clock()
            expired = []
            for key, response in zip(expect, answer.get("responses", ())):
                kvs = response.get("response_range", {}).get("kvs")
                kv = _Kv(kvs[0]) if kvs else None
                if kv is not None and kv.expired(now):
                    expired.append(kv)
                expect[key] = kv.version if kv is not None and kv.lease and \
                    not kv.expired(now) else None
            await self._delete_expired(expired)

    async def put(self, key: str, value: Any, ttl: float | None = None) -> int:
        validate_key(key)
        ttl = validate_ttl(ttl)
        return await self._write([(key, encode_value(value))], ttl)

    async def put_many(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]],
                       ttl: float | None = None, *, durable: bool = True) -> int:
        texts, ttl = put_many_args(items, ttl)
        if not texts:
            await self._call("kv/range", {"key": b64("/"), "count_only": True})
            return self._revision
        return await self._write(texts, ttl)

    async def put_many_if(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]],
                          guard_key: str, guard_value: Any, *, durable: bool = True) -> bool:
        texts, _ = put_many_args(items, None)
        validate_key(guard_key)
        # The guard is compared by its stored text: a key written without a TTL holds its
        # JSON as is.
        compare = [{"key": b64(guard_key), "target": "VALUE", "result": "EQUAL",
                    "value": b64(encode_value(guard_value))}]
        answer = await self._txn(compare, [_put_op(k, t, 0) for k, t in texts],
                                 idempotent=True)
        if not answer.get("succeeded"):
            return False
        revision = int(answer["header"]["revision"])
        for key, _ in texts:
            self._track(key, None, revision)
        await self._settle(revision, [k for k, _ in texts])
        return True

    async def delete(self, key: str) -> bool:
        validate_key(key)
        return await self._delete_range(key, None) > 0

    async def delete_many(self, keys: Iterable[str]) -> int:
        keys = list(dict.fromkeys(validate_key(key) for key in keys))
        if not keys:
            return 0
        ops = [{"request_delete_range": {"key": b64(key), "prev_kv": True}} for key in keys]
        return await self._delete_ops(ops)

    async def delete_prefix(self, prefix: str) -> int:
        exact, lo, hi = prefix_bounds(validate_prefix(prefix))
        return await self._delete_range(exact, (lo, hi))

    async def _delete_range(self, exact: str | None, bounds: tuple[str, str] | None) -> int:
        """Delete ``exact`` and the range ``bounds`` in one transaction; count the live keys
        removed (an expired one is removed too, which announces its expiry)."""
        ops = []
        if exact is not None:
            ops.append({"request_delete_range": {"key": b64(exact), "prev_kv": True}})
        if bounds is not None:
            ops.append({"request_delete_range": {"key": b64(bounds[0]),
                                                 "range_end": b64(bounds[1]), "prev_kv": True}})
        return await self._delete_ops(ops)

    async def _delete_ops(self, ops: list) -> int:
        answer = await self._txn([], ops)
        now = self._clock()
        removed = [_Kv(kv) for r in answer.get("responses", ())
                   for kv in r.get("response_delete_range", {}).get("prev_kvs", ())]
        if removed:
            await self._settle(int(answer["header"]["revision"]), [kv.key for kv in removed])
        return sum(1 for kv in removed if not kv.expired(now))

    async def watch(self, prefix: str, *, max_pending: int = DEFAULT_MAX_PENDING) -> Watch:
        validate_prefix(prefix)
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending!r}")
        # The current revision: the stream replays from the next one, so nothing committed
        # after this call returns can be missed, however long the stream takes to connect.
        answer = await self._call("kv/range", {"key": b64(prefix), "count_only": True})
        start = int(answer["header"]["revision"]) + 1
        return self._hub.open_at(prefix, max_pending, start)

    async def compare_and_swap(self, key: str, expected_version: int | None, new_value: Any,
                               ttl: float | None = None) -> bool:
        validate_key(key)
        validate_version(expected_version)
        ttl = validate_ttl(ttl)
        text = encode_value(new_value)
        lease = expires_at = put = None
        while True:
            # The key is read first, so a swap that cannot succeed (a follower trying for a
            # leader key that is held, every second) costs one read, not a lease and a
            # transaction as well.
            kv = await self._get_kv(key)
            live = kv is not None and not kv.expired(self._clock())
            if kv is not None and not live:
                await self._delete_expired([kv])
            if expected_version is None:
                if live:
                    return False
                compare = [_compare(key, "VERSION", 0)]
            else:
                if not live or kv.version != expected_version:
                    return False
                compare = [_compare(key, "MOD", expected_version)]
            if put is None:
                lease, expires_at = await self._lease(ttl)
                put = [_put_op(key, self._stored(text, expires_at), lease)]
            answer = await self._txn(compare, put, idempotent=False)
            if answer.get("succeeded"):
                revision = int(answer["header"]["revision"])
                self._track(key, expires_at, revision)
                await self._settle(revision, [key])
                return True
            if expected_version is not None:
                return False
            # Created by another writer since the read: the next read says whether it is
            # live (no swap) or already expired (deleted, then tried again).

    async def allocate_id(self, counter_key: str) -> int:
        validate_key(counter_key)
        # Callers in this process take turns: racing each other's CAS would only make all
        # but one of them retry. Other processes still race through the CAS.
        lock = self._counter_locks.setdefault(counter_key, asyncio.Lock())
        async with lock:
            return await self._allocate(counter_key)

    async def _allocate(self, counter_key: str) -> int:
        while True:
            kv = await self._get_kv(counter_key)
            if kv is not None and kv.expired(self._clock()):
                await self._delete_expired([kv])
                continue
            current = 0 if kv is None else decode_value(kv.text)
            if type(current) is not int or current < 0:
                raise MetadataError(
                    f"counter {counter_key!r} holds {current!r}, not a non-negative integer")
            compare = [_compare(counter_key, "VERSION", 0) if kv is None
                       else _compare(counter_key, "MOD", kv.version)]
            answer = await self._txn(compare, [_put_op(counter_key, encode_value(current + 1),
                                                       0)], idempotent=False)
            if answer.get("succeeded"):
                await self._settle(int(answer["header"]["revision"]), [counter_key])
                return current + 1

    async def cluster_status(self) -> dict:
        """The etcd cluster as the member this store talks to sees it: Raft term and index,
        the leader's member id, that member's own id and peer URLs (its Raft transport),
        and the member ids of voters and learners."""
        status = await self._call("maintenance/status", {})
        members = (await self._call("cluster/member/list", {})).get("members", [])

        def member_id(m):
            return int(m.get("ID", 0))
        # The gateway spells these fields as etcd's proto does (camelCase; uint64 as text).
        self_id = int(status.get("header", {}).get("member_id", 0))
        me = next((m for m in members if member_id(m) == self_id), {})
        return {"raft_term": int(status.get("raftTerm", 0)),
                "raft_applied_index": int(status.get("raftAppliedIndex",
                                                     status.get("raftIndex", 0))),
                "leader": int(status.get("leader", 0)),
                "self": self_id, "self_peer_urls": list(me.get("peerURLs", [])),
                "voters": sorted(member_id(m) for m in members if not m.get("isLearner")),
                "learners": sorted(member_id(m) for m in members if m.get("isLearner"))}

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise MetadataUnavailable("metadata store is closed")
        if self._reaper is not None:
            return
        await self._call("maintenance/status", {})
        self._reaper = asyncio.get_running_loop().create_task(
            self._reap_forever(), name="EtcdStore-ttl-reaper")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            try:
                await self._reaper
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
        self._hub.close(MetadataUnavailable("metadata store closed"))
        self.conn.close()

    async def _reap_forever(self) -> None:
        """Delete this store's TTL keys at their deadlines (unless rewritten since)."""
        while True:
            self._reaper_wakeup.clear()
            now = self._clock()
            due = []
            while self._deadlines and self._deadlines[0][0] <= now:
                deadline, key, revision = heapq.heappop(self._deadlines)
                if self._latest_ttl_write.get(key) == (revision, deadline):
                    del self._latest_ttl_write[key]
                    due.append((key, revision))
            for key, revision in due:
                try:
                    answer = await self._txn([_compare(key, "MOD", revision)],
                                             [{"request_delete_range": {"key": b64(key)}}])
                    if answer.get("succeeded"):
                        await self._settle(int(answer["header"]["revision"]), [key])
                except MetadataError as exc:
                    # The lease deletes the key anyway, a little later.
                    log.warning("could not delete expired metadata key %r: %s", key, exc)
            timeout = (max(0.0, self._deadlines[0][0] - self._clock())
                       if self._deadlines else None)
            try:
                async with asyncio.timeout(timeout):
                    await self._reaper_wakeup.wait()
            except TimeoutError:
                pass
