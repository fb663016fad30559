"""The targets a gRPC client connects to: `host:port` with an optional scheme."""


def parse_target(target):
    """(host, port, secure) of a target URL (`http://h:p`, `https://h:p` or `h:p`, secure
    None when unsaid); ValueError when it is none of those. Public: the client library checks
    its service URL with it."""
    secure = None
    if target.startswith("http://"):
        target, secure = target[7:], False
    elif target.startswith("https://"):
        target, secure = target[8:], True
    target = target.rstrip("/")
    if target.startswith("["):
        host, _, port = target[1:].partition("]:")
    else:
        host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"invalid target {target!r}: expected host:port")
    return host, int(port), secure
