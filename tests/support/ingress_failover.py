"""Proxy mode's failover with the official clients, shared by tests/e2e/test_cluster_ingress.py
and bench.cluster: brokers on one etcd advertising a real HAProxy as their connect_url, the
official Python producer and consumer given only the ingress, and a kill -9 of the topic's
owner. The loss check's consumer is tests/support/cluster_clients.ResilientConsumer (it asks
the brokers directly)."""

from __future__ import annotations

import contextlib
import time

from cluster_clients import ResilientConsumer
from cluster_failover import owner
from cluster_process import ClusterBrokers
from etcd_process import EtcdProcess
from haproxy_process import HAProxyProcess
from official_client import spawn_scenario
from waiting import wait_for


def url(broker) -> str:
    return f"http://{broker.client_addr}"


@contextlib.contextmanager
def ingress_cluster(etcd_dir, haproxy_dir, cluster_dir, *, lease: float = 3, brokers: int = 3):
    """``brokers`` brokers with ``--connect-url`` the ingress, and the ingress (``.ingress``
    of the ClusterBrokers yielded), all stopped at exit."""
    etcd = EtcdProcess(etcd_dir).start()
    ingress = HAProxyProcess(haproxy_dir)
    cluster = ClusterBrokers(etcd, cluster_dir, lease=lease)
    try:
        for _ in range(brokers):
            cluster.add(None, "--connect-url", ingress.url)
        ingress.start([url(b) for b in cluster.brokers])
        cluster.ingress = ingress
        yield cluster
    finally:
        ingress.stop()
        cluster.stop()
        etcd.stop()


def official_through_owner_kill(cluster, topic: str, workdir) -> dict:
    """The official producer and consumer through the ingress while the owner is killed;
    returns ``served_again`` (seconds from the kill to the producer's first acknowledged
    publish after it), ``acked`` (payloads), ``lost`` (acknowledged, never received by our
    consumer), ``official_missing`` (never received by the official consumer within 30 s
    after the producer stopped), ``errors`` (sends that raised to the application) and
    ``official_stderr`` (the consumer's last log lines). The killed broker stays down."""
    go, stop = workdir / "go", workdir / "stop"
    producer = spawn_scenario("proxy_producer.py", {
        "url": cluster.ingress.url, "topic": topic, "go_file": str(go),
        "stop_file": str(stop), "interval": 0.005, "retry_pause": 0.05}, timeout=120)
    consumer = ResilientConsumer(cluster, topic)
    official = None

    def acks():
        return [line.split() for line in list(producer.lines)
                if line is not None and line.startswith("acked ")]

    def official_got():
        return {line.split()[1] for line in list(official.lines)
                if line is not None and line.startswith("received ")}
    try:
        producer.wait_line("created", timeout=30)
        consumer.start()
        wait_for(lambda: consumer.reconnects, what="the consumer subscribed")
        official = spawn_scenario("consumer_listen.py", {
            "url": cluster.ingress.url, "topic": topic, "name": "official",
            "subscription": "official", "kind": "shared", "run_for": 110}, timeout=120)
        official.wait_line("subscribed", timeout=30)
        go.touch()
        wait_for(lambda: len(consumer.received) >= 100, timeout=30,
                 what="the consumer receiving")
        victim = owner(cluster, topic)
        killed_at = time.time()
        cluster.kill(victim)
        wait_for(lambda: sum(float(a[2]) > killed_at for a in acks()) >= 100, timeout=60,
                 what="the official producer publishing again after the kill")
        served_again = next(float(a[2]) for a in acks() if float(a[2]) > killed_at) - killed_at
        stop.touch()
        producer.wait_line("{", timeout=30)         # the scenario's JSON result
        acked = [a[1] for a in acks()]
        try:
            wait_for(lambda: consumer.has_all(acked), timeout=30)
        except AssertionError:
            pass                                    # reported as lost
        try:
            wait_for(lambda: set(acked) <= official_got(), timeout=30)
        except AssertionError:
            pass                                    # reported as official_missing
        return {"served_again": served_again, "acked": acked,
                "lost": sorted(set(acked) - set(consumer.received)),
                "official_missing": len(set(acked) - official_got()),
                "errors": sum(1 for line in producer.lines if line and
                              line.startswith("error")),
                "official_stderr": official.stderr[-3000:]}
    finally:
        stop.touch()
        consumer.stop()
        producer.kill()
        if official is not None:
            official.kill()
