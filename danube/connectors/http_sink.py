"""sink-http: topics -> an HTTP endpoint (upstream has no HTTP sink; the keys follow its
other sinks: ``[http]`` and ``[[http.routes]]``). ``mode = "record"``: one request per
record, its payload as the body, the record's topic, offset and key in ``X-Danube-*``
headers; ``mode = "batch"``: one request per batch and route, the body a JSON array of the
records' payloads (a record that is not JSON is dead-lettered).

Answers: 2xx is written; 429 and 5xx are retried with backoff (``[retry]``) and then
dead-lettered; any other 4xx is dead-lettered at once with the status and the answer's
first bytes as the reason; a connection that fails is an outage, retried until the
endpoint is back. Records a retried batch had already delivered are not sent again."""

import asyncio
import json
import logging
import os

from danube.connect import (ConfigError, ConsumerConfig, Field, InvalidRecord,
                            RetryableError, SinkConnector, Table, Tables, Unavailable)
from danube.connect.settings import topic_name

try:
    import urllib3
except ImportError as exc:      # pragma: no cover - reported by the registry with the extra
    raise ImportError(f"sink-http needs urllib3: {exc}", name="urllib3") from None

log = logging.getLogger("danube.connectors.http_sink")

# The answer's first bytes kept in a dead letter's reason.
REASON_BODY = 200


def _url(value):
    return None if value.startswith(("http://", "https://")) else \
        f"{value!r}: expected an http:// or https:// URL"


def _headers(value):
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return "header names and values must be strings"
    return None


ROUTE = {
    "from": Field(str, check=topic_name),
    "subscription": Field(str, check=lambda v: None if v else "must not be empty"),
    "subscription_type": Field(str, "shared", choices=("exclusive", "shared", "failover")),
    "url": Field(str, None, check=_url),
}
HTTP = {
    "url": Field(str, env="HTTP_SINK_URL", check=_url),
    "method": Field(str, "POST", choices=("POST", "PUT", "PATCH")),
    "mode": Field(str, "record", choices=("record", "batch")),
    "content_type": Field(str, "application/json"),
    "headers": Field(dict, {}, check=_headers),
    "token_env": Field(str, None),
    "timeout_ms": Field(int, 10000, min=1),
    "max_inflight": Field(int, 8, min=1, max=256),
    "routes": Tables(ROUTE, min_items=1),
}


class HttpSink(SinkConnector):
    CONFIG = {"http": Table(HTTP)}

    def __init__(self, context):
        super().__init__(context)
        h = self.http = self.config.http
        self.headers = {"Content-Type": h.content_type, **h.headers}
        if h.token_env:
            token = os.environ.get(h.token_env)
            if not token:
                raise ConfigError(f"http.token_env: environment variable {h.token_env} is "
                                  f"not set")
            self.headers["Authorization"] = f"Bearer {token}"
        self.urls = {getattr(r, "from"): r.url or h.url for r in h.routes}
        self.pool = urllib3.PoolManager(maxsize=h.max_inflight, retries=False,
                                        timeout=urllib3.Timeout(total=h.timeout_ms / 1000))
        # (partition, offset) -> None (delivered) or its InvalidRecord, for the records of a
        # batch being retried: none is sent twice.
        self._done = {}
        self._delivered = set()     # batch mode: (topic, last offset) of requests sent

    def consumer_configs(self):
        return [ConsumerConfig(getattr(r, "from"), r.subscription, r.subscription_type)
                for r in self.http.routes]

    def _post(self, url, body, headers):
        try:
            response = self.pool.request(self.http.method, url, body=body, headers=headers)
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"{url}: {exc}") from None
        status = response.status
        if 200 <= status < 300:
            return
        text = response.data[:REASON_BODY].decode("utf-8", "replace")
        if status == 429 or status >= 500:
            raise RetryableError(f"HTTP {status} from {url}: {text}")
        raise InvalidRecord(f"HTTP {status} from {url}: {text}")

    async def process_batch(self, records):
        if self.http.mode == "batch":
            return await self._batches(records)
        return await self._per_record(records)

    async def _per_record(self, records):
        limit = asyncio.Semaphore(self.http.max_inflight)
        done = self._done
        failed = []

        async def one(record):
            mark = (record.partition, record.offset)
            if mark in done:
                return
            headers = dict(self.headers, **{"X-Danube-Topic": record.topic,
                                             "X-Danube-Offset": str(record.offset)})
            if record.key is not None:
                headers["X-Danube-Key"] = record.key
            async with limit:
                try:
                    await asyncio.to_thread(self._post, self.urls[record.topic],
                                            record.payload, headers)
                    done[mark] = None
                except InvalidRecord as exc:
                    done[mark] = InvalidRecord(exc.reason, record)
                except (RetryableError, Unavailable) as exc:
                    failed.append((record, exc))

        await asyncio.gather(*(one(r) for r in records))
        if failed:
            # An outage first: it is retried without end, a 5xx only so often.
            outage = next((e for _, e in failed if isinstance(e, Unavailable)), None)
            if outage is not None:
                raise outage
            raise RetryableError(str(failed[0][1]), [r for r, _ in failed])
        rejected = [v for v in done.values() if v is not None]
        done.clear()
        return rejected

    async def _batches(self, records):
        rejected, by_topic = [], {}
        for record in records:
            try:
                doc = json.loads(record.payload)
            except ValueError as exc:
                rejected.append(InvalidRecord(f"invalid JSON (batch mode sends a JSON "
                                              f"array): {exc}", record))
                continue
            by_topic.setdefault(record.topic, []).append((record, doc))
        for topic, items in by_topic.items():
            mark = (topic, items[-1][0].offset)
            if mark in self._delivered:
                continue
            body = json.dumps([doc for _, doc in items], separators=(",", ":")).encode()
            try:
                await asyncio.to_thread(self._post, self.urls[topic], body, self.headers)
            except InvalidRecord as exc:
                rejected.extend(InvalidRecord(exc.reason, r) for r, _ in items)
            self._delivered.add(mark)
        self._delivered.clear()
        return rejected
