"""Cluster mode on etcd: brokers register under a lease, elect a leader that places topics
on them, serve only the topics placed on them, and fence themselves when their lease may
have run out. See docs/cluster.md."""

from danube.cluster.node import ClusterNode

__all__ = ["ClusterNode"]
