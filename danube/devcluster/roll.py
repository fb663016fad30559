"""`danube cluster roll`: a rolling restart of a local cluster's brokers, one at a time,
by the procedure docs/cluster.md gives for any cluster:

1. drain the broker (UnloadBroker, asked of a broker that stays up): its topics move to
   the others by the handshake that loses nothing, and it takes no new ones;
2. wait ``pause`` seconds: the official clients learn that their consumer moved only from
   their health check, every 5 s, and need the drained broker alive to look it up again;
3. stop it with SIGTERM (nothing left to hand over) and start it again with the same
   command, data directory and ports (the same broker id);
4. wait until it is registered and active, then the next broker.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from danube.devcluster import procs
from danube.devcluster.local import ClusterError, _wait, list_brokers, load_state, save_state

DEFAULT_PAUSE = 6.0


async def _drain(admin: str, broker_id: str, timeout: float):
    from danube.client.admin import AdminClient
    from danube.proto import DanubeAdmin_pb2 as adm
    async with AdminClient(admin, timeout=timeout + 10, connect_timeout=2) as client:
        return await client.call("BrokerAdmin", "UnloadBroker", adm.UnloadBrokerRequest(
            broker_id=broker_id, max_parallel=8, timeout_seconds=int(timeout)),
            what=f"drain broker {broker_id}")


async def _rebalance(admin: str):
    from danube.client.admin import AdminClient
    from danube.proto import DanubeAdmin_pb2 as adm
    async with AdminClient(admin, timeout=120, connect_timeout=2) as client:
        return await client.call("BrokerAdmin", "TriggerRebalance",
                                 adm.RebalanceRequest(dry_run=False), what="rebalance")


def _broker_id(admin: str, broker_url: str) -> str | None:
    for b in asyncio.run(list_brokers(admin)):
        if b.broker_addr == broker_url:
            return b.broker_id
    return None


def _status(admin: str, broker_id: str) -> str | None:
    for b in asyncio.run(list_brokers(admin)):
        if b.broker_id == broker_id:
            return b.broker_status
    return None


def roll(directory: Path, *, pause: float = DEFAULT_PAUSE, timeout: float = 120.0,
         rebalance: bool = False, out=print) -> list[dict]:
    """Restart every broker in turn; returns one record per broker (wall-clock times of
    each step). Raises ClusterError when a step fails, leaving the rest untouched."""
    state = load_state(directory)
    if state is None:
        raise ClusterError(f"no cluster in {directory}")
    brokers = [p for p in state["processes"] if p.get("broker_url")]
    down = [b["name"] for b in brokers if not procs.alive(b["pid"])]
    if down:
        raise ClusterError(f"not running: {', '.join(down)} (`danube cluster up --dir "
                           f"{directory}` starts them)")
    if len(brokers) < 2:
        raise ClusterError("a rolling restart needs at least 2 brokers: the topics of the "
                           "one restarted move to the others")
    records = []
    for entry in brokers:
        other = next(b for b in brokers if b is not entry)["admin"]
        broker_id = _broker_id(other, entry["broker_url"])
        if broker_id is None:
            raise ClusterError(f"{entry['name']} ({entry['broker_url']}) is not registered")
        record = {"name": entry["name"], "broker_id": broker_id, "started": time.time()}
        answer = asyncio.run(_drain(other, broker_id, timeout))
        if answer.failed:
            raise ClusterError(f"draining {entry['name']}: {answer.failed} topics did not "
                               f"move: {list(answer.failed_topics)}")
        record.update(drained=time.time(), topics_moved=answer.succeeded)
        time.sleep(pause)
        clean = procs.stop(entry["pid"], signal.SIGTERM, timeout=60)
        record["stopped"] = time.time()
        log = Path(entry["log"])
        entry["log_offset"] = log.stat().st_size if log.exists() else 0
        entry["pid"] = procs.spawn(entry["cmd"], log)
        save_state(directory, state)
        offset = entry["log_offset"]
        _wait(entry["name"], lambda: b"broker ready" in log.read_bytes()[offset:], timeout,
              entry["pid"], log)
        _wait(f"{entry['name']} active again",
              lambda: _status(other, broker_id) == "active", timeout)
        record["active"] = time.time()
        records.append(record)
        out(f"rolled {entry['name']} (broker {broker_id}): {answer.succeeded} topics moved "
            f"in {record['drained'] - record['started']:.1f} s, stopped "
            f"{'cleanly' if clean else '(killed after 60 s)'}, active again "
            f"{record['active'] - record['stopped']:.1f} s after the stop")
    if rebalance:
        moved = asyncio.run(_rebalance(brokers[0]["admin"]))
        out(f"rebalanced: {moved.moves_executed} topics moved")
    return records
