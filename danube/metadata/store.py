"""The one metadata interface the broker and the cluster layer program against.

Upstream Danube moved from etcd to an embedded Raft store and kept one trait in front of both;
we do the same so a single broker needs nothing installed (the embedded SQLite store) while a
cluster can share etcd, and so tests of the layers above can run on an in-memory store with
the very same semantics. Every operation is async even where a backend happens to be
synchronous, because a remote backend is not.

The contract, shared by every backend:

* Keys are ``str`` starting with '/', without NUL, valid Unicode. Values are anything that
  round-trips through JSON (``None`` is JSON null and is a real value: a key holding null
  exists, which upstream relies on for membership keys such as ``/cluster/brokers/{id}/...``).
  Values are copied in and out through JSON, so a caller never aliases stored state.
* Every committed change gets a revision from one store-wide counter that only grows (etcd's
  ``mod_revision``). ``Entry.version`` is the revision of the key's last change; it is what
  ``compare_and_swap`` compares. Changes committed together (one ``delete_prefix``,
  ``delete_many`` or ``put_many``) share a revision.
* Prefixes respect the '/' boundary: ``scan("/ns/foo")`` covers ``/ns/foo`` and
  ``/ns/foo/...`` but not ``/ns/foobar``; a prefix ending in '/' covers just what starts with
  it (``"/"`` covers everything). This deliberately differs from upstream, whose
  ``get_childrens`` is a raw string prefix, so that topic ``/ns/foo`` "sees" ``/ns/foobar``
  keys (reference appendix item 7). Callers that really want a raw prefix can end it in '/'
  or filter themselves; none of the upstream key layout needs one.
* A key written with a TTL disappears ``ttl`` seconds after its latest write unless that write
  is repeated; a later write without a TTL makes it permanent. An expired key is invisible to
  every read at once, before any background reaping, and its expiry is announced to watchers
  as a ``delete`` event ahead of any later change.
* A write returns once it is durable: it survives the broker being killed and the machine
  losing power. ``put_many(..., durable=False)`` relaxes that for writes that can be redone
  (a segment descriptor whose object is still in the store): it returns once committed and
  visible, survives the broker being killed, but a machine crash may lose it, until the next
  durable write or ``sync()``, which make every earlier write durable as well.
* Watch events arrive in commit order, and a watch sees every commit made after ``watch()``
  returned. A watcher never slows writers: see ``danube.metadata._watch`` for what happens to
  one that falls behind.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from danube.metadata.errors import InvalidKey

if TYPE_CHECKING:
    from danube.metadata._watch import Watch

PUT = "put"
DELETE = "delete"

#: How many undelivered events a watch may hold before it is ended with ``WatchOverflow``.
DEFAULT_MAX_PENDING = 10_000


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """A live key: its decoded value, the revision of its last change, and its absolute expiry
    (seconds since the epoch) if it was written with a TTL."""
    key: str
    value: Any
    version: int
    expires_at: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class WatchEvent:
    """One committed change. ``kind`` is ``"put"`` or ``"delete"``; a delete (explicit or by
    TTL expiry) carries ``value=None``; ``version`` is the revision of the change."""
    kind: str
    key: str
    value: Any
    version: int


def validate_key(key: Any, what: str = "key") -> str:
    """Return ``key`` if it obeys the key rules, else raise ``InvalidKey`` (a ValueError)."""
    if not isinstance(key, str):
        raise InvalidKey(f"metadata {what} must be a str, got {type(key).__name__}")
    if not key.startswith("/"):
        raise InvalidKey(f"metadata {what} must start with '/': {key!r}")
    if "\x00" in key:
        raise InvalidKey(f"metadata {what} must not contain NUL: {key!r}")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidKey(f"metadata {what} is not valid Unicode: {key!r}") from None
    return key


def validate_prefix(prefix: Any) -> str:
    return validate_key(prefix, "prefix")


def in_prefix(key: str, prefix: str) -> bool:
    """True if ``key`` is under ``prefix`` by the '/' boundary rule."""
    if prefix.endswith("/"):
        return key.startswith(prefix)
    return key == prefix or key.startswith(prefix) and key[len(prefix)] == "/"


def prefix_bounds(prefix: str) -> tuple[str | None, str, str]:
    """Split a prefix into the exact key it names (or None) and a half-open key range
    ``[lo, hi)`` holding exactly the keys that start with ``prefix/``.

    '0' follows '/' in code point order (and in UTF-8 byte order, which SQLite's BINARY
    collation uses), so the range needs no further filtering."""
    if prefix.endswith("/"):
        return None, prefix, prefix[:-1] + "0"
    return prefix, prefix + "/", prefix + "0"


def encode_value(value: Any) -> str:
    """JSON text for a value; TypeError or ValueError (NaN, infinity) if it has none."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def decode_value(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def put_many_args(items: Any, ttl: Any) -> tuple[list[tuple[str, str]], float | None]:
    """put_many's arguments checked, in every store's order: the items (a mapping, or
    (key, value) pairs) as (key, JSON text) pairs, and the TTL. InvalidKey, ValueError for
    a bad TTL or a key given twice, TypeError or ValueError for a value JSON cannot hold."""
    entries = [(validate_key(key), value) for key, value in
               (items.items() if isinstance(items, Mapping) else items)]
    ttl = validate_ttl(ttl)
    if len({key for key, _ in entries}) != len(entries):
        raise ValueError("put_many: a key is given more than once")
    return [(key, encode_value(value)) for key, value in entries], ttl


def validate_ttl(ttl: Any) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) \
            or ttl <= 0:
        raise ValueError(f"ttl must be a positive number of seconds or None, got {ttl!r}")
    return float(ttl)


def validate_version(version: Any) -> int | None:
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise TypeError(f"expected version must be an int or None, got {version!r}")
    return version


class MetadataStore(abc.ABC):
    """A flat, ordered map from key to JSON value with revisions, TTLs, CAS and watches.

    Use it as ``store = await SomeStore.open(...)`` ... ``await store.close()``, or as an async
    context manager. After ``close()`` every call raises ``MetadataUnavailable``."""

    async def get(self, key: str) -> Any:
        """The key's value, or None if it is missing. None is also a valid stored value: use
        ``get_entry`` where the difference matters."""
        entry = await self.get_entry(key)
        return None if entry is None else entry.value

    @abc.abstractmethod
    async def get_entry(self, key: str) -> Entry | None:
        """The live entry for ``key``, or None if it is missing or expired."""

    @abc.abstractmethod
    async def put(self, key: str, value: Any, ttl: float | None = None) -> int:
        """Set the key (creating or replacing it); return the new version. With ``ttl`` the key
        expires ``ttl`` seconds from now; without, it is permanent."""

    @abc.abstractmethod
    async def put_many(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]],
                       ttl: float | None = None, *, durable: bool = True) -> int:
        """Set several keys in one atomic transaction (all or none of them); return the
        revision they share, which is each key's new version (as an etcd ``Txn`` of puts
        does). A key given twice is a ValueError; with ``ttl`` every key expires ``ttl``
        seconds from now. With no items nothing is written and the current revision is
        returned. ``durable=False``: see the module docstring; a backend whose every commit
        is durable anyway ignores it."""

    @abc.abstractmethod
    async def put_many_if(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]],
                          guard_key: str, guard_value: Any, *, durable: bool = True) -> bool:
        """Set several keys (no TTL) in one transaction, only if ``guard_key`` holds
        ``guard_value`` at that moment; True if written. A fencing token's check: a writer
        whose token was superseded (another owner raised it) writes nothing."""

    async def sync(self) -> None:
        """Return once every write that returned before this call is durable (a no-op for a
        backend whose every commit is)."""

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Remove the key; True if it existed."""

    @abc.abstractmethod
    async def delete_many(self, keys: Iterable[str]) -> int:
        """Remove several keys in one atomic transaction (they share a revision); return how
        many existed. Missing keys are skipped; nothing is written if none exists."""

    @abc.abstractmethod
    async def delete_prefix(self, prefix: str) -> int:
        """Atomically remove every key under ``prefix``; return how many were removed."""

    @abc.abstractmethod
    async def scan(self, prefix: str) -> list[tuple[str, Any]]:
        """Every live ``(key, value)`` under ``prefix``, sorted by key."""

    async def keys(self, prefix: str) -> list[str]:
        """Every live key under ``prefix``, sorted."""
        return [key for key, _ in await self.scan(prefix)]

    @abc.abstractmethod
    async def watch(self, prefix: str, *, max_pending: int = DEFAULT_MAX_PENDING) -> Watch:
        """Start watching ``prefix``. Once this returns, every later commit under the prefix is
        delivered by iterating the returned ``Watch`` (an async iterator and async context
        manager). To see current state without a gap: watch first, then scan, and treat
        events as idempotent updates."""

    @abc.abstractmethod
    async def compare_and_swap(self, key: str, expected_version: int | None, new_value: Any,
                               ttl: float | None = None) -> bool:
        """Atomically put ``new_value`` if the key's current version is ``expected_version``
        (None: the key must be absent or expired). True if written."""

    @abc.abstractmethod
    async def allocate_id(self, counter_key: str) -> int:
        """Atomically increment the integer held at ``counter_key`` (missing counts as 0),
        make it permanent, and return the new value: 1, 2, 3, ... The counter is an ordinary
        key (upstream keeps ``/schemas/_global/next_schema_id`` the same way), so ids are
        never reused as long as nobody deletes or overwrites it."""

    async def start(self) -> None:
        """Start background work (TTL expiry). Idempotent."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop background work, end open watches with ``MetadataUnavailable`` and release the
        backend. Idempotent."""

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc_info):
        await self.close()
