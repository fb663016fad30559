"""A registered gRPC method: its kind (which sides stream), its handler, the conversions
between bytes and messages, and the request-size limit a service may give it
(Server.limit_requests)."""

import enum


class Kind(enum.Enum):
    UNARY_UNARY = (False, False)
    UNARY_STREAM = (False, True)
    STREAM_UNARY = (True, False)
    STREAM_STREAM = (True, True)

    @property
    def client_streaming(self):
        return self.value[0]


class RpcMethod:
    """A registered method: the handler plus how to turn bytes into requests and responses
    into bytes (None means the handler takes and returns bytes)."""

    __slots__ = ("path", "kind", "handler", "deserialize", "serialize", "name",
                 "client_streaming", "max_request", "own_limit", "refuse")

    def __init__(self, path, kind, handler, deserialize=None, serialize=None):
        self.path = path
        self.name = path.decode() if isinstance(path, bytes) else path
        self.kind = kind
        self.client_streaming = kind.client_streaming
        self.handler = handler
        self.deserialize = deserialize
        self.serialize = serialize
        # Set by Server.limit_requests: the length prefix a request may announce (None: the
        # transport's cap), the service's own limit and how it refuses a message over it.
        self.max_request = None
        self.own_limit = None
        self.refuse = None
