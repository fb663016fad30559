"""Section `topics`: reliable topics on one standalone broker, each with a producer and one
100 B message, created in steps up to N; after each step what the broker holds (RSS,
descriptors, disk), how long SIGTERM takes to stop it and a restart to serve an existing
topic again. A step with errors ends the sweep."""

import asyncio
import shutil
import time

import uvloop

from bench.scale import load
from bench.scale.common import Broker, disk_bytes, disk_free
from danube.rpc.client import Channel

#: A step is not started with less free disk than this (today's build preallocates ~1 MiB
#: per reliable topic).
MIN_FREE_DISK = 4 << 30


async def _probe(addr, topic, deadline):
    """Until `deadline` (perf_counter): a reliable producer on the existing `topic` and one
    message acknowledged on it. Returns the error of the last attempt, None when served."""
    last = "not tried"
    while time.perf_counter() < deadline:
        ch = Channel(addr, connect_timeout=1.0)
        try:
            pb, create, send = load._calls(ch)
            pid = await load._producer(pb, create, topic, name="ready-probe")
            await send(load._message(pb, pid, topic), timeout=10)
            return None
        except Exception as exc:  # noqa: BLE001 - not ready yet
            last = load._error(exc)
            await asyncio.sleep(0.02)
        finally:
            await ch.close()
    return last


def restart(broker, probe_topic, timeout=120.0):
    """SIGTERM, then start again and wait until `probe_topic` is served: (seconds from
    SIGTERM to exit or None if it took over 60 s and was killed, seconds from the start to
    serving or None, the probe's last error or None)."""
    sigterm_s = broker.terminate(60.0)
    t0 = time.perf_counter()
    broker.launch()
    error = uvloop.run(_probe(broker.addr, probe_topic, t0 + timeout))
    serving_s = time.perf_counter() - t0
    return sigterm_s, serving_s if error is None else None, error


def sweep(python, workdir, name, steps, *, procs, inflight, keep, log):
    """One build's sweep; returns a list of rows, one per step."""
    broker = Broker(python, workdir, f"topics-{name}").start()
    rows = []
    made = 0
    try:
        for n in steps:
            free = disk_free(workdir)
            if free < MIN_FREE_DISK:
                rows.append({"topics": n, "skipped": f"only {free >> 20} MiB of disk free"})
                log(f"  {name}: {n:,} topics skipped: {rows[-1]['skipped']}")
                break
            res, workers = load.create(broker.addr, "scale", made, n, procs=procs,
                                       inflight=inflight, keep=keep)
            made += res["created"]
            time.sleep(1.0)       # what the broker does right after the last ack settles
            row = {"topics": n, "created_total": made, "step_created": res["created"],
                   "step_seconds": round(res["seconds"], 2),
                   "topics_per_s": round(res["created"] / res["seconds"], 1)
                   if res["seconds"] else None,
                   "errors": res["errors"], "first_error": res["first_error"],
                   "rss_mib": round(broker.rss_kib() / 1024, 1), "fds": broker.fds()}
            if keep:
                workers.stop()
            row["disk_bytes"], row["disk_apparent_bytes"] = disk_bytes(broker.data)
            sigterm_s, serving_s, error = restart(broker, load.topic_name("scale", 0))
            row.update({"sigterm_s": round(sigterm_s, 2) if sigterm_s is not None else None,
                        "restart_serving_s": round(serving_s, 2)
                        if serving_s is not None else None,
                        "restart_error": error})
            if error is None:
                time.sleep(0.5)
                row["rss_after_restart_mib"] = round(broker.rss_kib() / 1024, 1)
                row["fds_after_restart"] = broker.fds()
            rows.append(row)
            log(f"  {name}: {n:,} topics ({made:,} made): +{row['step_created']:,} in "
                f"{row['step_seconds']:.1f} s = {row['topics_per_s'] or 0:,.0f}/s, "
                f"{row['errors']} errors, RSS {row['rss_mib']:.0f} MiB, {row['fds']} fds, "
                f"disk {row['disk_bytes'] / 2**20:,.0f} MiB (apparent "
                f"{row['disk_apparent_bytes'] / 2**20:,.0f}), SIGTERM "
                f"{_s(row['sigterm_s'], '> 60 s, killed')}, serving again "
                f"{_s(row['restart_serving_s'], 'never: ' + str(error))}")
            if res["errors"] or error is not None:
                row["stopped_here"] = True
                log(f"  {name}: sweep stopped at {n:,} topics (errors: "
                    f"{res['first_error'] or error})")
                break
    finally:
        broker.stop()
        shutil.rmtree(broker.data, ignore_errors=True)
    return rows


def _s(v, none):
    return f"{v:.2f} s" if v is not None else none
