"""Ports for the servers the tests start, picked in one place.

A port the system hands out for port 0 comes from the range it also takes outgoing
connections' local ports from, so between being picked and being bound by its server it can be
taken by any connection of a parallel test, or by another server picked the same way
(SeaweedFS once found its S3 port taken and exited). These come from outside that range, at
random, each checked free by binding it: `danube.devcluster.procs.free_port`, what
`danube cluster up` picks with for the same reason."""

from danube.devcluster.procs import free_port

__all__ = ["free_port", "free_ports"]


def free_ports(count: int, *, besides=()) -> list[int]:
    """``count`` distinct free ports, none of ``besides``."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports and port not in besides:
            ports.append(port)
    return ports
