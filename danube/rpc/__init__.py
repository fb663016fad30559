"""gRPC over HTTP/2 on uvloop: server and client sharing one Cython frame codec."""

from danube.rpc.status import RpcError, StatusCode

__all__ = ["RpcError", "StatusCode"]
