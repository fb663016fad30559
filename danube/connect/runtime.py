"""One connector process: load and validate the configuration, start the client, the
health and metrics endpoint and the connector, run the source or sink loop until SIGTERM or
SIGINT, then finish the batch in flight, commit it, and exit (a second signal stops at
once, committing nothing: the external system or the subscription gives it again)."""

import asyncio
import logging
import signal
import time
import types

from danube.client import DanubeClient
from danube.client import errors as client_errors
from danube.connect import config as config_mod
from danube.connect import logs, registry
from danube.connect.deadletter import DeadLetters
from danube.connect.errors import ConfigError, FatalError, Unavailable
from danube.connect.health import Health, HealthServer
from danube.connect.metrics import ConnectorMetrics
from danube.connect.retry import Backoff
from danube.connect.sink import SinkRuntime
from danube.connect.source import SourceRuntime

log = logging.getLogger("danube.connect")


def prepare(path=None, connector=None, env=None):
    """(connector class, core, own) from the file (or CONNECTOR_CONFIG_PATH); ConfigError
    naming the bad key."""
    import os
    env = os.environ if env is None else env
    path = path or env.get(config_mod.CONFIG_PATH_ENV)
    if not path:
        raise ConfigError("no configuration: give --config FILE or set CONNECTOR_CONFIG_PATH")
    raw = config_mod.read_file(path)
    name = connector or config_mod.connector_of(raw, env)
    cls = registry.load(name)
    if connector:
        raw = dict(raw, connector=connector)
    core, own = config_mod.load(raw, cls.CONFIG, env)
    return cls, core, own


class Runtime:
    def __init__(self, cls, core, own):
        self.cls = cls
        self.core = core
        self.name = core.connector_name
        self.metrics = ConnectorMetrics(self.name)
        self.health = Health(self.metrics)
        self.backoff = Backoff.from_settings(core.retry)
        self.client = None
        self.dead_letters = None
        self.stop = None
        self._stop_deadline = None
        self.context = types.SimpleNamespace(core=core, config=own, name=self.name,
                                             log=logging.getLogger(f"danube.connect.{cls.__module__}"),
                                             metrics=self.metrics, health=self.health,
                                             runtime=self)

    # -- retries ------------------------------------------------------------------------

    def stopping(self):
        return self._stop_deadline is not None and time.monotonic() > self._stop_deadline

    async def _wait(self, seconds):
        await asyncio.sleep(seconds)

    async def broker_failed(self, exc, attempt):
        """The broker could not take a batch: count, mark not ready after max_retries, wait
        the backoff; returns the next attempt number (raises after the stop deadline)."""
        if self.stopping():
            raise FatalError(f"stopping with a batch the broker did not take: {exc}")
        self.metrics.retry("broker")
        self.metrics.error("broker")
        if attempt >= self.backoff.max_retries:
            self.health.set("broker", f"broker unreachable: {exc}")
        log.warning("broker call failed (attempt %d), retrying: %s", attempt + 1, exc,
                    extra={"target": "broker", "attempt": attempt + 1})
        await self._wait(self.backoff.delay(attempt))
        return attempt + 1

    async def external_failed(self, exc, attempt, forever, what=None):
        """``what``: the call that failed, said before the error in the log line."""
        text = f"{what}: {exc}" if what else str(exc)
        if self.stopping():
            raise FatalError(f"stopping with a batch the external system did not take: {text}")
        self.metrics.retry("external")
        self.metrics.error(type(exc).__name__)
        if forever and attempt >= self.backoff.max_retries:
            self.health.set("external", f"external system unavailable: {text}")
        log.warning("external system failed (attempt %d), retrying: %s", attempt + 1, text,
                    extra={"target": "external", "attempt": attempt + 1,
                           "error_kind": type(exc).__name__})
        await self._wait(self.backoff.delay(attempt))
        return attempt + 1

    async def broker_retry(self, call, what):
        attempt = 0
        while True:
            try:
                result = await call()
                self.health.set("broker")
                return result
            except (client_errors.Unavailable, client_errors.DeadlineExceeded,
                    client_errors.ResourceExhausted, client_errors.InternalError,
                    client_errors.Aborted, client_errors.NotFound, OSError) as exc:
                # NotFound: a sink's topic that no producer has created yet; waited for.
                attempt = await self.broker_failed(f"{what}: {exc}", attempt)

    async def external_retry(self, call, what):
        attempt = 0
        while True:
            try:
                result = await call()
                self.health.set("external")
                return result
            except Unavailable as exc:
                attempt = await self.external_failed(exc, attempt, forever=True, what=what)

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self):
        core = self.core
        self.stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = 0

        def on_signal(signum):
            nonlocal signals
            signals += 1
            if signals == 1:
                log.info("signal %s: finishing the batch in flight, then stopping",
                         signal.Signals(signum).name)
                self._stop_deadline = time.monotonic() + \
                    core.processing.shutdown_timeout_ms / 1000.0
                self.stop.set()
            else:
                log.warning("second signal: stopping now, nothing more is committed")
                main.cancel()

        main = asyncio.current_task()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        server = await HealthServer(self.health, core.processing.metrics_host,
                                    core.processing.metrics_port).start()
        self.client = DanubeClient(core.danube_service_url)
        self.dead_letters = DeadLetters(self.client, core.dead_letter_topic, self.name,
                                        self.metrics, self.backoff, self.stopping)
        connector = self.cls(self.context)
        loop_runtime = (SourceRuntime if connector.kind == "source" else SinkRuntime)(
            self, connector)
        try:
            if not await self._initialized(connector):
                log.info("stopped before the external system was reached: nothing to commit")
                return
            await loop_runtime.start()
            self.health.set("starting")
            log.info("connector running", extra={"kind": connector.kind,
                                                 "connector_type": core.connector})
            await loop_runtime.run(self.stop)
            log.info("stopped: the last batch is committed")
        finally:
            self.health.set("starting", "stopping")
            try:
                await connector.shutdown()
            finally:
                await self.client.close()
                await server.close()
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)


    async def _initialized(self, connector):
        """``connector.initialize()`` retried until it succeeds (True) or a stop signal
        comes first (False): with no batch taken yet, a stop does not wait out the retries
        (it waited shutdown_timeout_ms, then exited 1)."""
        init = asyncio.ensure_future(self.external_retry(connector.initialize, "initialize"))
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({init, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not init.done():
                init.cancel()
                await asyncio.gather(init, return_exceptions=True)
        if init.cancelled():
            return False
        init.result()
        return True


def main(path=None, connector=None):
    """`danube connect run`: 0 after a clean stop, 1 after a fatal error, 2 for a bad
    configuration."""
    import sys
    import uvloop
    try:
        cls, core, own = prepare(path, connector)
    except ConfigError as exc:
        print(f"danube connect: {exc}", file=sys.stderr)
        return 2
    logs.setup(core.connector_name, core.processing.log_level, core.processing.log_format)
    runtime = Runtime(cls, core, own)
    try:
        uvloop.run(runtime.run())
    except ConfigError as exc:
        log.error("configuration: %s", exc)
        return 2
    except asyncio.CancelledError:
        return 1
    except Exception as exc:            # noqa: BLE001 - the process's last word
        log.error("connector failed: %s", exc, exc_info=True)
        return 1
    return 0
