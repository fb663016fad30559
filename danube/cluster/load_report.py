"""This broker's load report, written to ``/cluster/load/{id}`` every
``load_manager.load_report_interval_seconds`` in upstream's LoadReport shape, for the
leader's ``balanced`` and ``weighted_load`` strategies and for GetClusterBalance.

CPU is this process's share of one core over the last interval (from ``os.times``), memory
the share of the machine's RAM its resident set takes (``/proc``), both in percent as
upstream reports them. The key has a TTL of three intervals, so the report of a broker that
died goes with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from danube.metadata import keys
from danube.metadata.errors import MetadataError
from danube.tasks import cancel_and_wait

log = logging.getLogger("danube.cluster")


def _memory_percent() -> float:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            resident_pages = int(f.read().split()[1])
        total = os.sysconf("SC_PHYS_PAGES")
        return 100.0 * resident_pages / total if total > 0 else 0.0
    except (OSError, ValueError, IndexError):
        return 0.0


class LoadReporter:
    """``summaries``: returns the statistics of every topic this broker serves (the core's
    ``topic_summaries``)."""

    def __init__(self, summaries, store, broker_id: str, interval: float):
        self.summaries = summaries
        self.store = store
        self.broker_id = broker_id
        self.interval = interval
        self._task: asyncio.Task | None = None
        self._last_cpu = (time.monotonic(), sum(os.times()[:2]))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="load-report")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    def _cpu_percent(self) -> float:
        now, used = time.monotonic(), sum(os.times()[:2])
        then, before = self._last_cpu
        self._last_cpu = (now, used)
        return 100.0 * (used - before) / (now - then) if now > then else 0.0

    def report(self) -> dict:
        topics = []
        for s in self.summaries():
            topics.append({"topic_name": s["name"], "message_rate": int(s["msg_rate_in"]),
                           "byte_rate": int(s["byte_rate_in"]),
                           "byte_rate_mbps": s["byte_rate_in"] * 8 / 1e6,
                           "producer_count": s["producers"], "consumer_count": s["consumers"],
                           "subscription_count": s["subscription_count"],
                           "backlog_messages": s["backlog"]})
        return {"resources_usage": [{"resource": "CPU", "usage": self._cpu_percent()},
                                    {"resource": "Memory", "usage": _memory_percent()}],
                "topics": topics,
                "total_throughput_mbps": sum(t["byte_rate_mbps"] for t in topics),
                "total_message_rate": sum(t["message_rate"] for t in topics),
                "total_lag_messages": sum(t["backlog_messages"] for t in topics),
                "timestamp": int(time.time()), "broker_id": int(self.broker_id)}

    async def _run(self) -> None:
        while True:
            try:
                await self.store.put(keys.cluster_load(self.broker_id), self.report(),
                                     ttl=self.interval * 3)
            except MetadataError as exc:
                log.warning("load report not written: %s", exc)
            await asyncio.sleep(self.interval)
