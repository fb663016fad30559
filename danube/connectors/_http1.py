"""A small HTTP/1.1 server for the webhook source: keep-alive, Content-Length bodies only
(a chunked request gets 411), and every part bounded before it is read: the request line
and headers (16 KiB, 100 headers), the body (``max_body``: 413 without reading it), the
idle time between requests (``timeout``)."""

import asyncio
import logging

log = logging.getLogger("danube.connectors.http")

MAX_HEAD = 16384
MAX_HEADERS = 100
REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized",
           404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           411: "Length Required", 413: "Payload Too Large", 415: "Unsupported Media Type",
           422: "Unprocessable Entity", 429: "Too Many Requests",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           503: "Service Unavailable", 504: "Gateway Timeout"}


class Request:
    __slots__ = ("method", "path", "headers", "body", "peer")

    def __init__(self, method, path, headers, body, peer):
        self.method, self.path, self.headers, self.body, self.peer = \
            method, path, headers, body, peer


class HttpServer:
    """``handler(request) -> (status, headers dict, body bytes)``; ``precheck(method, path,
    headers) -> None or (status, headers, body)`` answers before the body is read."""

    def __init__(self, handler, host, port, *, max_body, timeout, precheck=None):
        self.handler = handler
        self.precheck = precheck
        self.host, self.port = host, port
        self.max_body = max_body
        self.timeout = timeout
        self._server = None
        self._connections = set()

    async def start(self):
        self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                  limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self):
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()

    async def _serve(self, reader, writer):
        task = asyncio.current_task()
        self._connections.add(task)
        peer = (writer.get_extra_info("peername") or ("?",))[0]
        try:
            while True:
                keep = await self._one(reader, writer, peer)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _one(self, reader, writer, peer):
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout)
        except asyncio.TimeoutError:
            return False
        except asyncio.LimitOverrunError:
            await self._send(writer, 431, {}, b"request head too large\n", close=True)
            return False
        lines = head[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._send(writer, 400, {}, b"bad request line\n", close=True)
            return False
        method, target, version = parts
        if len(lines) - 1 > MAX_HEADERS:
            await self._send(writer, 431, {}, b"too many headers\n", close=True)
            return False
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                await self._send(writer, 400, {}, b"malformed header\n", close=True)
                return False
            headers[name.lower()] = value.strip()
        close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
        path = target.split("?", 1)[0]
        if "transfer-encoding" in headers:
            await self._send(writer, 411, {}, b"send the body with Content-Length\n",
                             close=True)
            return False
        try:
            length = int(headers.get("content-length", "0"))
            if length < 0:
                raise ValueError
        except ValueError:
            await self._send(writer, 400, {}, b"bad Content-Length\n", close=True)
            return False
        if length > self.max_body:
            # Not read: the connection is closed after the answer.
            await self._send(writer, 413, {}, b"body larger than max_body_size (%d bytes)\n"
                             % self.max_body, close=True)
            return False
        if self.precheck is not None:
            early = self.precheck(method, path, headers)
            if early is not None:
                status, extra, body = early
                # The body is not read either: the connection cannot be reused.
                await self._send(writer, status, extra, body, close=True)
                return False
        try:
            body = await asyncio.wait_for(reader.readexactly(length), self.timeout)
        except asyncio.TimeoutError:
            await self._send(writer, 408, {}, b"body not received in time\n", close=True)
            return False
        try:
            status, extra, out = await self.handler(Request(method, path, headers, body, peer))
        except Exception:       # noqa: BLE001 - answered, logged, the server goes on
            log.exception("webhook handler failed")
            status, extra, out = 500, {}, b"internal error\n"
        await self._send(writer, status, extra, out, close=close)
        return not close

    @staticmethod
    async def _send(writer, status, headers, body, close=False):
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}",
                 f"Content-Length: {len(body)}"]
        if "content-type" not in {k.lower() for k in headers}:
            lines.append("Content-Type: application/json" if body[:1] in (b"{", b"[")
                         else "Content-Type: text/plain")
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        if close:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
