"""sink-qdrant: topics -> Qdrant collections (upstream danube-connectors/sink-qdrant, the same
``[qdrant]`` keys and ``[[qdrant.routes]]``), on ``qdrant-client``: a Qdrant server through
gRPC (upstream's ``url``, e.g. ``http://localhost:6334``), or, ours, Qdrant's local mode in
this process (``url = "file:///var/lib/vectors"``, or ``":memory:"``).

A record is upstream's JSON message ``{"id": "...", "vector": [...], "payload": {...}}``
(``id`` and ``payload`` optional). The vector must have the route's ``vector_dimension``
(checked before Qdrant is asked, as upstream); the payload's objects are flattened to
dotted keys (as upstream), and with ``include_danube_metadata`` the point also carries
``_danube_topic``, ``_danube_partition``, ``_danube_offset``, ``_danube_timestamp``,
``_danube_producer`` and ``_danube_attr_<name>`` for each attribute.

Delivery: at least once with idempotent writes. Every point's id is deterministic: the
message's ``id`` (a decimal string is that number, any other string the first 8 bytes of
its SHA-256, as upstream), else the first 8 bytes of SHA-256 of ``danube:{partition}:
{offset}``: the partition's topic and the record's offset (upstream hashes the publish
time, which two records may share). A batch written again after a crash, before the
broker's acknowledgement, upserts the same points with the same contents: no point twice,
none lost. Records Qdrant cannot take (not JSON, no vector, the wrong dimension, a point the
server refuses) go to the dead-letter topic, acknowledged by the broker, before the batch
is acknowledged."""

import asyncio
import concurrent.futures
import hashlib
import logging
import urllib.parse

import orjson

from danube.connect import (ConfigError, ConsumerConfig, FatalError, Field, InvalidRecord,
                            RetryableError, SinkConnector, Table, Tables, Unavailable)
from danube.connect.settings import topic_name, upstream_subscription_type

try:
    from qdrant_client import QdrantClient, models
    from qdrant_client.http.exceptions import UnexpectedResponse
except ImportError as exc:      # pragma: no cover - reported by the registry with the extra
    raise ImportError(f"sink-qdrant needs qdrant-client (pip install "
                      f"'danube-broker-py[qdrant]'): {exc}", name="qdrant_client") from None

log = logging.getLogger("danube.connectors.qdrant")

DISTANCES = {"Cosine": models.Distance.COSINE, "Euclid": models.Distance.EUCLID,
             "Dot": models.Distance.DOT, "Manhattan": models.Distance.MANHATTAN}


def _url(value):
    if value == ":memory:" or value.startswith("file://"):
        return None if value != "file://" else "file:// needs a directory"
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return (f"{value!r}: expected http(s)://host:port (the gRPC endpoint), "
                f"file:///directory or :memory: (local mode)")
    return None


ROUTE = {
    "from": Field(str, check=topic_name),
    "subscription": Field(str, check=lambda v: None if v else "must not be empty"),
    "subscription_type": Field(str, "Exclusive", check=upstream_subscription_type),
    "to": Field(str, check=lambda v: None if v else "must not be empty"),
    "vector_dimension": Field(int, min=1, max=65536),
    "distance": Field(str, "Cosine", choices=tuple(DISTANCES)),
    "auto_create_collection": Field(bool, True),
    "include_danube_metadata": Field(bool, True),
    "expected_schema_subject": Field(str, None),
}

QDRANT = {
    "url": Field(str, env="QDRANT_URL", check=_url),
    "api_key": Field(str, None, env="QDRANT_API_KEY"),
    "timeout_secs": Field(int, 30, min=1),
    "routes": Tables(ROUTE, min_items=1),
}


def hashed_id(text):
    """Upstream's id of a string: the first 8 bytes of its SHA-256, big-endian."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def point_id(given, record):
    """The point's id: the message's ``id``, else one derived from (partition, offset)."""
    if given is None:
        return hashed_id(f"danube:{record.partition}:{record.offset}")
    if isinstance(given, str):
        if given.isdigit() and int(given) < 2 ** 64:
            return int(given)
        return hashed_id(given)
    if isinstance(given, int) and not isinstance(given, bool) and 0 <= given < 2 ** 64:
        return given
    raise InvalidRecord(f"field 'id': expected a string or an unsigned integer, got "
                        f"{given!r}", record)


def flatten(out, prefix, value):
    """Upstream's payload: objects flattened to dotted keys, nulls left out, arrays kept
    with their strings, numbers and booleans only (an empty one left out)."""
    if value is None:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(out, f"{prefix}.{key}" if prefix else key, item)
    elif isinstance(value, list):
        items = [v for v in value if isinstance(v, (str, int, float, bool))]
        if items:
            out[prefix] = items
    else:
        out[prefix] = value


class Route:
    def __init__(self, cfg):
        self.cfg = cfg
        self.topic = getattr(cfg, "from")
        self.collection = cfg.to
        self.dimension = cfg.vector_dimension
        self.metadata = cfg.include_danube_metadata

    def point(self, record):
        """(id, vector, payload) of ``record``; InvalidRecord if it cannot be one."""
        try:
            doc = orjson.loads(record.payload)
        except orjson.JSONDecodeError as exc:
            raise InvalidRecord(f"invalid JSON: {exc}", record) from None
        if not isinstance(doc, dict):
            raise InvalidRecord(f"expected a JSON object with a vector, got "
                                f"{type(doc).__name__}", record)
        vector = doc.get("vector")
        if not isinstance(vector, list):
            raise InvalidRecord("field 'vector' is missing or not an array", record)
        if len(vector) != self.dimension:
            raise InvalidRecord(f"Vector dimension mismatch: expected {self.dimension}, got "
                                f"{len(vector)}", record)
        for x in vector:
            if type(x) is not float and (type(x) is not int or not -2 ** 53 <= x <= 2 ** 53):
                raise InvalidRecord(f"field 'vector': {x!r} is not a number", record)
        user = doc.get("payload")
        if user is not None and not isinstance(user, dict):
            raise InvalidRecord(f"field 'payload': expected an object, got "
                                f"{type(user).__name__}", record)
        payload = {}
        if user:
            flatten(payload, "", user)
        if self.metadata:
            payload["_danube_topic"] = record.topic
            payload["_danube_partition"] = record.partition
            payload["_danube_offset"] = record.offset
            payload["_danube_timestamp"] = record.publish_time
            payload["_danube_producer"] = record.producer_name
            for key, value in record.attributes.items():
                payload[f"_danube_attr_{key}"] = value
        return point_id(doc.get("id"), record), vector, payload


class QdrantSink(SinkConnector):
    CONFIG = {"qdrant": Table(QDRANT)}

    def __init__(self, context):
        super().__init__(context)
        self.q = self.config.qdrant
        self.routes = {}
        for i, cfg in enumerate(self.q.routes):
            route = Route(cfg)
            if route.topic in self.routes:
                raise ConfigError(f"qdrant.routes[{i}].from: {route.topic} is routed twice")
            self.routes[route.topic] = route
        self.client = None
        # One thread for every call: local mode's SQLite wants it, a server does not mind.
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="qdrant")

    def consumer_configs(self):
        return [ConsumerConfig(r.topic, r.cfg.subscription,
                               r.cfg.subscription_type.lower(),
                               consumer_name=f"qdrant-sink-{r.collection}",
                               expected_schema_subject=r.cfg.expected_schema_subject)
                for r in self.routes.values()]

    # -- the client -----------------------------------------------------------------------

    def _open(self):
        url, q = self.q.url, self.q
        if url == ":memory:":
            return QdrantClient(location=":memory:")
        if url.startswith("file://"):
            return QdrantClient(path=urllib.parse.unquote(urllib.parse.urlsplit(url).path))
        parsed = urllib.parse.urlsplit(url)
        https = parsed.scheme == "https"
        return QdrantClient(host=parsed.hostname, grpc_port=parsed.port or 6334,
                            prefer_grpc=True, https=https, api_key=q.api_key,
                            timeout=q.timeout_secs)

    async def _call(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, lambda: fn(*args, **kwargs))

    async def initialize(self):
        try:
            if self.client is None:
                self.client = await self._call(self._open)
            existing = {c.name for c in (await self._call(self.client.get_collections))
                        .collections}
        except Exception as exc:      # noqa: BLE001 - sorted by _outage
            self._outage(exc, "connecting")
        for route in self.routes.values():
            await self._ensure(route, route.collection in existing)

    async def _ensure(self, route, exists):
        name = route.collection
        if not exists:
            if not route.cfg.auto_create_collection:
                raise FatalError(f"Collection '{name}' does not exist and "
                                 f"auto_create_collection is disabled")
            log.info("creating collection %s (dimension %d, %s)", name, route.dimension,
                     route.cfg.distance)
            try:
                await self._call(self.client.create_collection, name,
                                 vectors_config=models.VectorParams(
                                     size=route.dimension,
                                     distance=DISTANCES[route.cfg.distance]))
            except Exception as exc:      # noqa: BLE001
                self._outage(exc, f"creating collection {name}")
            return
        try:
            info = await self._call(self.client.get_collection, name)
        except Exception as exc:      # noqa: BLE001
            self._outage(exc, f"reading collection {name}")
        vectors = info.config.params.vectors
        size = getattr(vectors, "size", None)
        if size is None:
            raise FatalError(f"collection '{name}' has named vectors; sink-qdrant writes one "
                             f"unnamed vector")
        if size != route.dimension:
            raise FatalError(f"collection '{name}' holds vectors of dimension {size}, the "
                             f"route says vector_dimension = {route.dimension}")

    def _outage(self, exc, doing):
        """Raise what ``exc`` means: a refusal of the request is fatal at start, anything
        else (refused, timed out, the folder locked by another instance) an outage."""
        if isinstance(exc, UnexpectedResponse) and exc.status_code in (400, 401, 403, 422):
            raise FatalError(f"Qdrant refused {doing}: {exc}") from None
        raise Unavailable(f"Qdrant ({doing}): {type(exc).__name__}: {exc}") from None

    async def health_check(self):
        if self.client is None:
            return "not connected"
        try:
            await self._call(self.client.get_collections)
        except Exception as exc:      # noqa: BLE001
            return f"Qdrant: {exc}"
        return None

    async def shutdown(self):
        if self.client is not None:
            try:
                await self._call(self.client.close)
            except Exception as exc:      # noqa: BLE001 - nothing left to lose
                log.warning("closing the Qdrant client: %s", exc)
            self.client = None
        self.pool.shutdown(wait=False)

    # -- records --------------------------------------------------------------------------

    def prepare(self, records):
        """Per route: (route, {id: (vector, payload, record)} in order, [InvalidRecord]).
        A later record of an id replaces an earlier one of the batch, as writing them one
        after the other would."""
        out = {}
        for record in records:
            route = self.routes[record.topic]
            entry = out.get(record.topic)
            if entry is None:
                entry = out[record.topic] = (route, {}, [])
            try:
                pid, vector, payload = route.point(record)
            except InvalidRecord as exc:
                entry[2].append(exc)
                continue
            points = entry[1]
            points.pop(pid, None)
            points[pid] = (vector, payload, record)
        return list(out.values())

    async def process_batch(self, records, prepared=None):
        if self.client is None:
            await self.initialize()
        rejected = []
        for route, points, bad in prepared or self.prepare(records):
            # In the dead-letter topic before the batch is acknowledged.
            await self.dead_letter(bad)
            rejected.extend(bad)
            if points:
                refused = await self._upsert(route, points)
                await self.dead_letter(refused)
                rejected.extend(refused)
        return rejected

    async def _upsert(self, route, points):
        """Write ``points``; [InvalidRecord] for those Qdrant refuses (found one by one when
        it refuses the whole request)."""
        ids = list(points)
        batch = models.Batch(ids=ids, vectors=[p[0] for p in points.values()],
                             payloads=[p[1] for p in points.values()])
        try:
            await self._call(self.client.upsert, route.collection, batch, wait=True)
            return []
        except Exception as exc:      # noqa: BLE001 - sorted below
            if not self._refused(exc):
                self._failed(exc)
            if len(points) == 1:
                [(vector, payload, record)] = points.values()
                return [InvalidRecord(f"Qdrant refused the point: {_reason(exc)}", record)]
        refused = []
        for pid, (vector, payload, record) in points.items():
            refused += await self._upsert(route, {pid: (vector, payload, record)})
        return refused

    @staticmethod
    def _refused(exc):
        """A request Qdrant answered with a refusal (local mode: ValueError)."""
        if isinstance(exc, UnexpectedResponse):
            return exc.status_code in (400, 422)
        if isinstance(exc, ValueError):
            return True
        code = getattr(exc, "code", None)
        if callable(code):      # grpc.RpcError
            try:
                return code().name in ("INVALID_ARGUMENT", "FAILED_PRECONDITION")
            except Exception:   # noqa: BLE001
                return False
        return False

    def _failed(self, exc):
        """Raise what an error other than a refusal means: the collection gone or the key
        refused stops the sink; a 5xx or 429 is retried, then dead-lettered; anything else
        (refused, reset, timed out) is an outage."""
        if isinstance(exc, UnexpectedResponse):
            if exc.status_code == 429 or exc.status_code >= 500:
                raise RetryableError(f"Qdrant: {_reason(exc)}") from None
            raise FatalError(f"Qdrant: {_reason(exc)}") from None
        code = getattr(exc, "code", None)
        if callable(code):      # grpc.RpcError
            try:
                name = code().name
            except Exception:   # noqa: BLE001
                name = ""
            if name in ("UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND"):
                raise FatalError(f"Qdrant: {_reason(exc)}") from None
        raise Unavailable(f"Qdrant: {_reason(exc)}") from None


def _reason(exc):
    details = getattr(exc, "details", None)
    if callable(details):
        try:
            return f"{exc.code().name}: {details()}"
        except Exception:   # noqa: BLE001
            pass
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 500 else text[:500] + "..."

