"""The admin port's services (reference a.3): danube_admin's BrokerAdmin, NamespaceAdmin and
TopicAdmin, one module each, SecurityAdmin (security.py: roles and bindings) and our
danube_ext.TopicStatsService (stats.py). ClusterAdmin (cluster.py) is registered once the
metadata store is known (process/app.py): etcd's Raft group, or the embedded store's group
of one."""

from danube.proto import DanubeAdmin_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from danube.services.admin.brokers import BrokerAdmin
from danube.services.admin.namespaces import NamespaceAdmin
from danube.services.admin import security
from danube.services.admin.stats import TopicStatsService
from danube.services.admin.topics import TopicAdmin


def register(server, core, rbac=None):
    services = pb.DESCRIPTOR.services_by_name
    server.add_service(services["TopicAdmin"], TopicAdmin(core))
    server.add_service(services["NamespaceAdmin"], NamespaceAdmin(core))
    server.add_service(services["BrokerAdmin"], BrokerAdmin(core))
    server.add_service(ext.DESCRIPTOR.services_by_name["TopicStatsService"],
                       TopicStatsService(core))
    if rbac is not None:
        security.register(server, rbac)
