"""Timeouts for server calls whose request stalls (TransportConfig.stream_idle_timeout_ms):
one lazy timer wheel per server, not one timer per stream."""


class IdleStreams:
    """Times out calls whose request stalls: one timer per server, not one per stream.

    A lazy timer wheel with a tick of timeout/8. A stream joins the bucket of the current
    tick when it starts waiting for request data; request bytes only store the current tick
    on the stream (no timer, no move), and the sweep moves a stream that made progress to
    the bucket of its last progress when its old bucket comes due. A stream whose request
    completes, or that ends, leaves its bucket at once, so finished calls are never held.
    A stream is timed out between `timeout` and `timeout` plus one tick after its last
    request bytes. The timer runs only while some stream waits."""

    __slots__ = ("timeout", "period", "span", "tick", "buckets", "_timer", "_loop")

    def __init__(self, timeout_ms):
        self.timeout = timeout_ms / 1000
        self.period = max(self.timeout / 8, 0.005)
        self.span = max(1, round(self.timeout / self.period))
        self.tick = 0
        self.buckets = {}          # tick -> set of streams that last progressed then
        self._timer = None
        self._loop = None

    def add(self, stream):
        stream._idle_tick = self.tick
        self._file(stream)
        if self._timer is None:
            self._loop = stream.conn.loop
            self._timer = self._loop.call_later(self.period, self._sweep)

    def _sweep(self):
        self._timer = None
        self.tick += 1
        # A stream whose last progress was at tick `limit` or before has been idle for at
        # least `span` full periods.
        limit = self.tick - self.span - 1
        expired = []
        for key in sorted(k for k in self.buckets if k <= limit):
            for stream in self.buckets.pop(key):
                stream._idle_bucket = None
                if stream._idle_tick <= limit:
                    expired.append(stream)
                else:
                    self._file(stream)
        # No flush per stream: conn.write schedules one flush per connection for this
        # loop turn, so thousands of streams expiring together cost one socket write each.
        for stream in expired:
            stream.on_idle_timeout()
        if self.buckets and self._timer is None:
            self._timer = self._loop.call_later(self.period, self._sweep)

    def _file(self, stream):
        """Put the stream in the bucket of its last progress."""
        bucket = self.buckets.get(stream._idle_tick)
        if bucket is None:       # not setdefault: most calls join an existing bucket
            bucket = self.buckets[stream._idle_tick] = set()
        bucket.add(stream)
        stream._idle_bucket = bucket

    def close(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
