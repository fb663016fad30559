"""The broker process: builds the servers from the configuration, starts them, and stops
them cleanly on SIGINT/SIGTERM."""

import asyncio
import logging
import os
import resource
import signal

from danube.broker.core import BrokerCore
from danube.broker.registry import ClientRegistry
from danube.config import GRPC_LIMIT_KEYS
from danube.dirsync import makedirs_durable
from danube.metadata.embedded import EmbeddedStore
from danube.metadata.errors import MetadataUnavailable
from danube.rpc.config import TransportConfig
from danube.rpc.server import Server
from danube.security.guard import Guard
from danube.security.rbac import Rbac
from danube.security.tls import ServerTls
from danube.security.tokens import TokenVerifier, weak_secret_warning
from danube.services import (admin, batch_consumer, client_api, edge, ext, health, history,
                             schema, storage_service)
from danube.services.admin import cluster as cluster_admin

log = logging.getLogger("danube.broker")


def raise_open_file_limit():
    """Each reliable topic holds a few files open (WAL segments, lock); lift the soft limit
    to the hard one so thousands of topics fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d: %s", soft, exc)
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20      # glibc's largest allowed value
TRIM_THRESHOLD = 128 << 20


def keep_freed_heap():
    """Have glibc's malloc keep freed memory for reuse (up to TRIM_THRESHOLD of free heap)
    rather than hand it back to the kernel at once. Batched publish allocates and frees a
    few MiB per call (request bodies, stamped batches); with glibc's defaults, several
    batches in flight push the heap over its trim threshold, the memory goes back to the
    kernel and every new batch faults its pages in again. On a VM whose balloon takes
    freed pages back that costs ~8 us per 4 KiB page, which halved 1 KiB x 1000 batched
    throughput (bench.reliable). Only the broker process does this; a no-op without glibc.
    Returns whether both settings took."""
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


class Broker:
    def __init__(self, cfg):
        self.cfg = cfg
        transport = TransportConfig(
            max_message_size=cfg.grpc_max_message_size,
            max_concurrent_streams=cfg.grpc_max_concurrent_streams,
            # None (not derived: a config not passed through validate()) keeps the default.
            stream_idle_timeout_ms=cfg.grpc_stream_idle_timeout_ms,
            **{key: getattr(cfg, f"grpc_{key}") for key in GRPC_LIMIT_KEYS
               if getattr(cfg, f"grpc_{key}") is not None})
        self.registry = ClientRegistry()
        self.client_server = Server(transport)
        self.admin_server = Server(transport)
        health.register(self.client_server, self.registry)
        # Built here, before anything is opened, so that a bad key setting stops the start
        # at once (tokens.KeyConfigError). None: no authentication (auth.mode none, or the
        # explicit --insecure-allow-unauthenticated).
        self.verifier = None
        if cfg.auth_mode == "tls" and not cfg.insecure_allow_unauthenticated:
            self.verifier = TokenVerifier.from_config(cfg.jwt)
        self.rbac = None
        self.guard = None
        self.tls = None
        self.store = None
        self.core = None
        self.cluster = None
        self.metrics = None
        self.client_port = None
        self.admin_port = None
        self._stopped = asyncio.Event()

    def rpc_servers(self):
        return (self.client_server, self.admin_server)

    def topics_owned(self):
        """Topics served here, loaded or resting (unloaded while idle)."""
        if self.core is None:
            return 0
        return len(self.core.topics) + len(self.core.topic_table.resting)

    def topics_loaded(self):
        return len(self.core.topics) if self.core is not None else 0

    async def start(self):
        cfg = self.cfg
        makedirs_durable(cfg.data_dir)
        log.debug("open-file limit %d", raise_open_file_limit())
        if not keep_freed_heap():
            log.debug("malloc tuning not available (not glibc)")
        self.store = await self._open_store()
        placement = None
        if cfg.etcd_endpoints:
            from danube.cluster import ClusterNode
            placement = ClusterNode(self.store, cfg, control_store=await self._open_store())
        self.core = BrokerCore(cfg, self.store, self.registry, placement=placement)
        await self.core.start()
        # Roles and bindings are kept (SecurityAdmin) whatever the mode; enforced in tls mode.
        self.rbac = Rbac(self.store, cfg.super_admins)
        await self.rbac.start()
        client_api.register(self.client_server, self.core)
        ext.register(self.client_server, self.core)
        batch_consumer.register(self.client_server, self.core)
        history.register(self.client_server, self.core)
        # Edge brokers replicate into this one (upstream: cluster and standalone modes).
        edge.register(self.client_server, self.core)
        storage_service.register(self.client_server, self.core)
        admin.register(self.admin_server, self.core, self.rbac)
        cluster_admin.register(self.admin_server, cluster_admin.EtcdStatus(
            self.store, MetadataUnavailable) if cfg.etcd_endpoints else
            cluster_admin.EmbeddedStatus(self.store, self.core.broker_id))
        # Both ports, as upstream (reference a.0): clients on 6650, danube-admin on 50051.
        schema.register(self.client_server, self.core)
        schema.register(self.admin_server, self.core)
        if self.verifier is not None:
            self.guard = Guard(self.verifier, self.rbac, self.core)
            self.guard.protect(self.client_server)
            self.guard.protect(self.admin_server)
            warning = weak_secret_warning(cfg.jwt)
            if warning:
                log.warning("%s", warning)
            log.info("authentication on: a JWT (%s) on every call of both ports; RBAC with "
                     "default deny; super admins: %s", ", ".join(self.verifier.algorithms),
                     ", ".join(cfg.super_admins) or "none")
        tls = None
        if cfg.auth_mode == "tls":
            self.tls = ServerTls.from_config(cfg)
            tls = self.tls.context
        self.client_port = await self.client_server.start(cfg.host, cfg.client_port, ssl=tls)
        log.info("client gRPC (danube.*) listening on %s:%d%s", cfg.host, self.client_port,
                 (" (mTLS)" if cfg.tls_require_client_cert else " (TLS)") if tls else "")
        admin_tls = tls if cfg.admin_tls else None
        self.admin_port = await self.admin_server.start(cfg.admin_host, cfg.admin_port,
                                                        ssl=admin_tls)
        log.info("admin gRPC (danube_admin.*) listening on %s:%d", cfg.admin_host,
                 self.admin_port)
        # Port 0 means "pick one": what clients are told must be the port actually bound.
        cfg.client_port, cfg.admin_port = self.client_port, self.admin_port
        if cfg.prom_port is not None:
            # prometheus_client (and the http.server, email and wsgiref modules it imports)
            # is loaded only by a broker that exports: ~40 modules less at every start.
            from danube.services.metrics import MetricsExporter
            self.metrics = MetricsExporter(self, cfg.prom_host, cfg.prom_port)
            cfg.prom_port = port = self.metrics.start()
            log.info("prometheus exporter listening on http://%s:%d/metrics", cfg.prom_host, port)
        await self.core.register()
        if placement is not None:
            self.cluster = placement
        log.info("broker ready: mode=%s broker_url=%s connect_url=%s data_dir=%s", cfg.mode,
                 cfg.advertised_broker_url, cfg.advertised_connect_url, cfg.data_dir)

    async def _open_store(self):
        cfg = self.cfg
        if not cfg.etcd_endpoints:
            return await EmbeddedStore.open(os.path.join(cfg.data_dir, "metadata"))
        try:
            from danube.metadata.etcd import EtcdStore
        except ImportError as exc:
            raise MetadataUnavailable(f"meta_store.etcd_endpoints needs etcd3gw: pip install "
                                      f"'danube-broker-py[etcd]' ({exc})") from None
        # A call may retry for as long as the lease lasts: past that the broker is fenced
        # anyway (danube.cluster.membership).
        store = await EtcdStore.open(cfg.etcd_endpoints, retry_for=cfg.lease_ttl_seconds,
                                     tls=cfg.etcd_tls, auth=cfg.etcd_auth)
        log.info("metadata on etcd at %s (lease %gs)", ", ".join(cfg.etcd_endpoints),
                 cfg.lease_ttl_seconds)
        return store

    def reload_tls(self):
        if self.tls is None:
            log.info("SIGHUP ignored: no TLS to reload (auth.mode none)")
            return
        self.tls.reload()

    async def stop(self, grace=10.0):
        log.info("broker stopping (grace %.0fs)", grace)
        if self.core is not None:
            await self.core.stop()
        await asyncio.gather(self.client_server.stop(grace), self.admin_server.stop(grace))
        if self.rbac is not None:
            await self.rbac.stop()
        if self.store is not None:
            await self.store.close()
        if self.metrics is not None:
            self.metrics.stop()
        log.info("broker stopped")
        self._stopped.set()

    async def run(self):
        """Start, then serve until SIGINT or SIGTERM."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        # SIGHUP reloads the TLS certificate; without TLS it is ignored rather than fatal.
        loop.add_signal_handler(signal.SIGHUP, self.reload_tls)
        await self.start()
        await stop.wait()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await self.stop()
