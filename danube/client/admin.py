"""A client of a broker's admin port: upstream's danube_admin services, the schema registry
(served on both ports) and our topic statistics (danube_ext.TopicStatsService). Used by
`danube admin` and its web console, which talk to the broker through nothing else.

    admin = AdminClient("http://127.0.0.1:50051")
    topics = await admin.call("TopicAdmin", "ListNamespaceTopics",
                              adm.NamespaceRequest(name="default"))
    await admin.close()

Every failure is a DanubeError (danube.client.errors) whose text is the broker's status and
message, prefixed with what was being done.
"""

import os

from danube.client import errors
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeExt_pb2 as ext
from danube.proto import SchemaRegistry_pb2 as sr
from danube.rpc import RpcError
from danube.rpc.client import Channel
from danube.rpc.target import parse_target

DEFAULT_ENDPOINT = "http://127.0.0.1:50051"
ENDPOINT_ENV = "DANUBE_ADMIN_ENDPOINT"

# service name -> (proto package, generated module)
_SERVICES = {
    "BrokerAdmin": ("danube_admin", adm),
    "NamespaceAdmin": ("danube_admin", adm),
    "TopicAdmin": ("danube_admin", adm),
    "ClusterAdmin": ("danube_admin", adm),
    "SecurityAdmin": ("danube_admin", adm),
    "SchemaRegistry": ("danube_schema", sr),
    "TopicStatsService": ("danube_ext", ext),
}


def endpoint_from_env(value=None):
    """The admin endpoint: ``value`` if given, else $DANUBE_ADMIN_ENDPOINT, else upstream's
    default."""
    return value or os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT


class AdminClient:
    def __init__(self, endpoint=None, *, timeout=10.0, ssl=None, token=None,
                 connect_timeout=5.0):
        self.endpoint = endpoint_from_env(endpoint)
        try:
            parse_target(self.endpoint)
        except ValueError as exc:
            raise errors.InvalidArgument(f"admin endpoint {self.endpoint!r}: {exc}") from None
        self.timeout = timeout
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.channel = Channel(self.endpoint, ssl=ssl, metadata=metadata,
                               connect_timeout=connect_timeout)
        self._methods = {}

    def _method(self, service, method):
        key = (service, method)
        fn = self._methods.get(key)
        if fn is None:
            try:
                package, module = _SERVICES[service]
                desc = module.DESCRIPTOR.services_by_name[service].methods_by_name[method]
            except KeyError:
                raise ValueError(f"unknown admin method {service}/{method}") from None
            response_cls = getattr(module, desc.output_type.name, None) or \
                _message_class(desc.output_type)
            fn = self._methods[key] = self.channel.unary_unary(
                f"/{package}.{service}/{method}", _serialize, response_cls.FromString)
        return fn

    async def call(self, service, method, request=None, what=None):
        """One unary call; ``what`` ("list topics of ns") prefixes an error's message."""
        fn = self._method(service, method)
        if request is None:
            request = adm.Empty()
        try:
            return await fn(request, timeout=self.timeout)
        except RpcError as exc:
            raise errors.from_rpc(exc, what) from None
        except OSError as exc:
            raise errors.Unavailable(f"{what + ': ' if what else ''}cannot reach the admin "
                                     f"endpoint {self.endpoint}: {exc}") from None

    async def close(self):
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


def _serialize(message):
    return message.SerializeToString()


def _message_class(descriptor):
    from google.protobuf import message_factory
    return message_factory.GetMessageClass(descriptor)
