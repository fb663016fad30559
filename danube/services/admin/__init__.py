"""The admin port's services (reference a.3): danube_admin's BrokerAdmin, NamespaceAdmin and
TopicAdmin, one module each, and our danube_ext.TopicStatsService (stats.py). ClusterAdmin
and SecurityAdmin come with cluster mode and security; until then they answer
UNIMPLEMENTED."""

from danube.proto import DanubeAdmin_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from danube.services.admin.brokers import BrokerAdmin
from danube.services.admin.namespaces import NamespaceAdmin
from danube.services.admin.stats import TopicStatsService
from danube.services.admin.topics import TopicAdmin


def register(server, core):
    services = pb.DESCRIPTOR.services_by_name
    server.add_service(services["TopicAdmin"], TopicAdmin(core))
    server.add_service(services["NamespaceAdmin"], NamespaceAdmin(core))
    server.add_service(services["BrokerAdmin"], BrokerAdmin(core))
    server.add_service(ext.DESCRIPTOR.services_by_name["TopicStatsService"],
                       TopicStatsService(core))
