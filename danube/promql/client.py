"""A Prometheus HTTP API client: instant and range queries (`/api/v1/query`,
`/api/v1/query_range`), as upstream's MetricsClient. The standard library's HTTP client runs
in a worker thread, so the serving event loop never blocks on a slow Prometheus; each answer
is capped at MAX_RESPONSE_BYTES and each call at the timeout."""

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request

DEFAULT_URL = "http://localhost:9090"
# A range query over a day at a 15 s step is 5,760 points per series: a few hundred KiB.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


class PromError(Exception):
    """A query that failed: Prometheus unreachable, an HTTP error, or not its JSON."""


class PrometheusClient:
    def __init__(self, base_url=DEFAULT_URL, timeout=5.0):
        parts = urllib.parse.urlsplit(base_url or "")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"prometheus URL {base_url!r}: expected http(s)://HOST:PORT")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    async def query_instant(self, query):
        """The `result` list of a vector answer: [{"metric": {...}, "value": [ts, "v"]}]."""
        data = await self._get("/api/v1/query", {"query": query})
        return data.get("result") or []

    async def query_range(self, query, start, end, step):
        """The `result` list of a matrix answer: [{"metric": {...}, "values": [[ts, "v"]]}]."""
        data = await self._get("/api/v1/query_range", {
            "query": query, "start": str(start), "end": str(end), "step": step})
        return data.get("result") or []

    async def _get(self, path, params):
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        return await asyncio.to_thread(self._fetch, url)

    def _fetch(self, url):
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                body = resp.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = _error_of(exc.read(4096))
            raise PromError(f"prometheus {self.base_url}: HTTP {exc.code}"
                            f"{': ' + detail if detail else ''}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PromError(f"prometheus {self.base_url} unreachable: {reason}") from None
        if len(body) > MAX_RESPONSE_BYTES:
            raise PromError(f"prometheus {self.base_url}: answer larger than "
                            f"{MAX_RESPONSE_BYTES} bytes")
        try:
            doc = json.loads(body)
        except ValueError:
            raise PromError(f"prometheus {self.base_url}: answer is not JSON") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            detail = doc.get("error") if isinstance(doc, dict) else None
            raise PromError(f"prometheus {self.base_url}: query failed"
                            f"{': ' + str(detail) if detail else ''}")
        data = doc.get("data")
        return data if isinstance(data, dict) else {}


def _error_of(body):
    try:
        return str(json.loads(body).get("error") or "")
    except (ValueError, AttributeError):
        return ""
