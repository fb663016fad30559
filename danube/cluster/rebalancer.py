"""Automatic rebalancing (``load_manager.rebalancing``): the leader checks the balance every
``check_interval_seconds`` and, when the rules of ``rebalance_policy`` allow, moves one
topic from the most to the least loaded active broker.

The move is the one ``TriggerRebalance`` makes (``ClusterOps.plan`` and ``ClusterOps.move``:
upstream's handshake, the owner lets the topic go before the target takes it), so it loses
no message. Only the leader runs it, from its election to its deposition; the move history
(the hourly budget, the cooldown) and the topics' ages are the leader's own, so a new leader
starts with an empty history and counts every topic's age from its election, which can only
delay a move.
"""

from __future__ import annotations

import asyncio
import logging
import time

from danube.cluster import rebalance_policy as policy
from danube.metadata import keys
from danube.metadata.errors import MetadataError
from danube.metering import Summary
from danube.tasks import cancel_and_wait

log = logging.getLogger("danube.cluster")

#: Upstream's audit trail of the moves made: ``{HISTORY}/{unix milliseconds}``.
HISTORY = "/cluster/rebalancing_history"


class AutoRebalancer:
    def __init__(self, ops, cfg, clock=time.monotonic):
        self.ops = ops
        self.view = ops.view
        self.cfg = cfg
        self.clock = clock
        self.budget = policy.MoveBudget(cfg.max_moves_per_hour, cfg.cooldown_seconds)
        self.placed_at: dict[str, float] = {}
        self.moves_total = 0
        self.failures_total = 0
        self.last_cv = 0.0
        self.cycle_seconds = Summary()
        self._stuck = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """On election."""
        if not self.cfg.enabled:
            return
        now = self.clock()
        self.placed_at = {topic: now for topic in self.view.owners}
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rebalancer")
        log.info("automatic rebalancing on: a check every %gs, CV threshold %.2f (%s), at "
                 "most %d moves an hour, %gs between moves", self.cfg.check_interval_seconds,
                 self.cfg.cv_threshold, self.cfg.aggressiveness, self.cfg.max_moves_per_hour,
                 self.cfg.cooldown_seconds)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def on_event(self, event) -> None:
        """A view event, while leading: an assignment put starts the topic's age."""
        if not self.cfg.enabled:
            return
        now = self.clock()
        if event is None:
            owners = self.view.owners
            self.placed_at = {t: self.placed_at.get(t, now) for t in owners}
            return
        if event.key.startswith(keys.CLUSTER_BROKERS + "/"):
            _, _, rest = event.key[len(keys.CLUSTER_BROKERS) + 1:].partition("/")
            if rest == "state":
                return
            if event.kind == "put":
                self.placed_at["/" + rest] = now
            else:                       # moving (placed again later) or deleted
                self.placed_at.pop("/" + rest, None)

    def movable(self, topic: str, now: float) -> bool:
        return not policy.is_blacklisted(topic, self.cfg.blacklist_topics) and \
            policy.old_enough(self.placed_at.get(topic), now, self.cfg.min_topic_age_seconds)

    async def _finish_moves(self) -> bool:
        """Whether a move is still under way (the counts are right again only once the
        topic is placed). A move whose assignment is still there (the delete after the
        marker failed) would wait for ever: it is finished here."""
        pending = False
        for topic, marker in list(self.view.unassigned.items()):
            if not isinstance(marker, dict) or marker.get("reason") != "rebalance":
                continue
            pending = True
            source = str(marker.get("from_broker"))
            if self.view.owners.get(topic) == source and marker.get("ready") is False:
                await self.ops.store.delete(keys.cluster_broker_topic(source, topic))
        return pending

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.check_interval_seconds)
            started = time.perf_counter()
            try:
                await self.check()
            except MetadataError as exc:
                self.failures_total += 1
                log.warning("rebalancing move failed (%s); trying again at the next check",
                            exc)
            # upstream's danube_rebalancing_cycle_duration_seconds
            self.cycle_seconds.observe(time.perf_counter() - started)

    async def check(self) -> dict | None:
        """One check: the move made, or None."""
        now = self.clock()
        balance = self.ops.balance()
        self.last_cv = cv = balance["coefficient_of_variation"]
        reason = policy.skip_reason(self.cfg, balance["broker_count"], cv)
        if reason is None and await self._finish_moves():
            reason = "the last move is not finished"
        if reason is None:
            reason = self.budget.blocked(now)
        if reason is not None:
            log.debug("rebalancing check: nothing to do (%s)", reason)
            return None
        moves = self.ops.plan(1, movable=lambda t: self.movable(t, now))
        if not moves:
            # Said once per stretch of such checks, not at every one.
            log.log(logging.DEBUG if self._stuck else logging.INFO,
                    "cluster imbalanced (CV %.3f) but no topic may move (counts within one, "
                    "or topics blacklisted or younger than %gs)", cv,
                    self.cfg.min_topic_age_seconds)
            self._stuck = True
            return None
        self._stuck = False
        move = moves[0]
        topic, source, target = move["topic_name"], move["from_broker"], move["to_broker"]
        log.info("rebalancing (CV %.3f): moving %s from broker %s to broker %s", cv, topic,
                 source, target)
        self.budget.record(now)
        stamp = time.time()
        await self.ops.move(topic, str(source), str(target), reason="rebalance")
        # The next check must see this move under way, not count the topic twice.
        await self.view.until(lambda: self.view.owners.get(topic) != str(source))
        self.moves_total += 1
        try:
            await self.ops.store.put(f"{HISTORY}/{int(stamp * 1000)}", {
                "topic": topic, "from_broker": source, "to_broker": target,
                "reason": "LoadImbalance", "estimated_load": move["estimated_load"],
                "timestamp": int(stamp)})
        except MetadataError as exc:
            log.warning("rebalancing history not written (%s)", exc)
        return move
