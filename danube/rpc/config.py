"""Limits and windows of one HTTP/2 endpoint (TransportConfig), and the token bucket that
rate-limits what a peer may ask of it."""

import dataclasses

#: The largest message a gRPC length prefix (4 bytes) can announce.
MAX_GRPC_MESSAGE = 2**32 - 1


class TokenBucket:
    """At most `rate` events a second, with one second's worth as a burst."""

    __slots__ = ("rate", "tokens", "at")

    def __init__(self, rate, now):
        self.rate = rate
        self.tokens = float(rate)
        self.at = now

    def take(self, now):
        """Spend one token; False when there is none (the event is over the rate)."""
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate) - 1
        self.at = now
        return self.tokens >= 0


@dataclasses.dataclass
class TransportConfig:
    """Limits and windows of one HTTP/2 endpoint."""

    max_concurrent_streams: int = 16384
    # What the peer may send on one stream / on the whole connection before we credit it.
    stream_window: int = 4 * 1024 * 1024
    connection_window: int = 64 * 1024 * 1024
    max_frame_size: int = 16384
    max_header_list_size: int = 65536
    # The transport's cap on one gRPC message, in either direction. Larger gets
    # RESOURCE_EXHAUSTED. Broker policies (max_message_size) sit below it.
    max_message_size: int = 16 * 1024 * 1024
    # A client's cap on the requests it sends, when not max_message_size. A client whose
    # server refuses oversize requests early (ours does) sets it to MAX_GRPC_MESSAGE, as
    # grpcio's default is: the caller then gets the server's status and reason, where a
    # local cap could only guess at the server's limit.
    max_send_message_size: int | None = None
    # Pending output per connection above which writers wait (socket backpressure).
    write_buffer_high: int = 4 * 1024 * 1024
    write_buffer_low: int = 1024 * 1024
    # Server: a call whose request is still arriving and that receives no request bytes for
    # this long is failed (CANCELLED, then RST_STREAM CANCEL) and its stream freed, so that
    # stalled streams cannot pin memory and stream slots forever. Calls whose request is
    # complete (a long-lived server stream) are never timed out. 0 disables.
    stream_idle_timeout_ms: int = 30000
    # -- limits against hostile peers (issue 17); servers apply all of them -------------
    # Incomplete request messages held per connection (the sum over its streams of what
    # their deframers hold, a large message counted at its announced length once its prefix
    # arrived). The stream whose data goes over it is reset with ENHANCE_YOUR_CALM. None: no
    # cap (a client's own connections).
    max_connection_buffered_bytes: int | None = 64 * 1024 * 1024
    # Non-ACK SETTINGS frames a peer may send per second (one second's worth as a burst);
    # over it: GOAWAY ENHANCE_YOUR_CALM.
    max_settings_per_second: int = 50
    # Client RST_STREAMs of streams that had not completed, plus calls whose deadline had
    # passed when they arrived, per second (one second's worth as a burst): the rapid-reset
    # attack (CVE-2023-44487) and its variant that abandons calls by deadline rather than by
    # RST_STREAM. Over it: GOAWAY ENHANCE_YOUR_CALM.
    max_resets_per_second: int = 1000
    # The client preface (after the TLS handshake, which has the same timeout) must arrive
    # within this, or the connection is closed.
    handshake_timeout_ms: int = 10_000
    # A connection with no open stream for this long gets GOAWAY NO_ERROR and is closed.
    # PINGs are answered but do not extend it (as grpc-go's MaxConnectionIdle), so a peer
    # sending only keepalive PINGs is bounded too; gRPC clients reconnect on the next call.
    idle_timeout_ms: int = 300_000
    # Open connections per server; beyond it new connections are closed at once. None:
    # three quarters of the process's open-file limit (read when the server starts).
    max_connections: int | None = None
