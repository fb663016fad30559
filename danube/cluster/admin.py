"""What the admin API asks of a cluster: draining a broker (UnloadBroker), moving one topic
(UnloadTopic), the balance (GetClusterBalance) and a manual rebalance (TriggerRebalance).
Any broker answers them: they are writes to etcd that the leader and the owners act on.

A move is upstream's handshake: the topic gets an unassigned marker naming the broker it
leaves (``from_broker``, ``ready: false``) and its assignment is deleted; the owner stops
serving it (producers and consumers are told to look it up again, a reliable topic's last
segments go to the durable tier) and sets ``ready``; only then does the leader place it
elsewhere (``to_broker`` for a rebalance). No message is lost and the two brokers never
serve the topic at once.
"""

from __future__ import annotations

import asyncio
import time

from danube.broker.errors import ClusterRequired, InvalidArgument, TopicElsewhere, TopicNotFound
from danube.cluster import strategies
from danube.metadata import keys

STRATEGY_NAMES = {"fair": "Fair", "balanced": "Balanced", "weighted_load": "WeightedLoad"}
#: A broker this much above (below) the mean is reported overloaded (underloaded).
LOAD_BAND = 0.2
#: TriggerRebalance does nothing for a cluster whose coefficient of variation is below this.
BALANCED_CV = 0.1


class ClusterOps:
    def __init__(self, node):
        self.node = node
        self.store = node.store
        self.view = node.view

    def elsewhere(self, topic: str) -> TopicElsewhere:
        """The error for an admin call about a topic another broker serves."""
        owner = self.view.owners.get(topic)
        record = self.view.registered.get(owner or "") or {}
        where = f"broker {owner} (admin port {record.get('admin_addr', 'unknown')})" \
            if owner else "no broker yet (it is being placed)"
        error = TopicElsewhere(f"topic {topic} is served by {where}; ask that broker")
        error.admin_addr = record.get("admin_addr")     # where the admin API forwards it
        error.broker_url = record.get("broker_url")     # its host, if admin_addr's is 0.0.0.0
        return error

    async def describe_remote(self, name: str, targets: list[str]) -> dict:
        """DescribeTopic of a topic served elsewhere, from the shared metadata."""
        if not targets:
            raise TopicNotFound(f"Unable to find the requested topic: {name}")
        first = targets[0]
        subscriptions = []
        for target in targets:
            prefix = keys.topic_subscriptions_prefix(target) + "/"
            for key in await self.store.keys(keys.topic_subscriptions_prefix(target)):
                sub = key[len(prefix):].split("/", 1)[0]
                if sub and sub not in subscriptions:
                    subscriptions.append(sub)
        info = {"name": name, "subscriptions": subscriptions,
                "broker_id": self.view.owners.get(first, ""),
                "delivery": await self.store.get(keys.topic_delivery(first)) or "NonReliable"}
        subject = await self.store.get(keys.topic_schema_subject(first))
        if subject:
            info["schema_subject"] = subject
        return info

    async def move(self, topic: str, source: str, target: str | None = None,
                    reason: str = "unload") -> None:
        marker = {"reason": reason, "from_broker": source, "ready": False}
        if target is not None:
            marker["to_broker"] = target
        await self.store.put(keys.cluster_unassigned(topic), marker)
        await self.store.delete(keys.cluster_broker_topic(source, topic))

    async def _moved(self, topics, source, timeout: float) -> list[str]:
        """Wait until every topic has an owner other than its source (``source``: one broker
        id for all, or a mapping topic -> broker id); the ones that did not make it."""
        def pending(t):
            src = source.get(t) if isinstance(source, dict) else source
            return self.view.owners.get(t) in (None, src)
        await self.view.until(lambda: not any(pending(t) for t in topics), timeout)
        return [t for t in topics if pending(t)]

    async def unload_topic(self, topic: str, timeout: float = 30.0) -> None:
        source = self.view.owners.get(topic)
        if source is None:
            return                      # being placed already
        if len(self.view.active_brokers()) < 2:
            raise ClusterRequired(f"Cannot unload topic {topic}: no other active broker to "
                                  "move it to")
        await self.move(topic, source)
        await self._moved([topic], source, timeout)

    async def drain(self, broker_id: str, *, dry_run=False, include=(), exclude=(),
                    max_parallel=1, timeout=60.0) -> dict:
        """Move every topic off ``broker_id`` (filtered by namespace) and leave it
        ``drained``: no topic is placed on it until ActivateBroker."""
        others = [b for b in self.view.active_brokers() if b != broker_id]
        if not others:
            raise ClusterRequired("Cannot unload broker: single broker cluster detected.")
        topics = [t for t in self.view.topics_of(broker_id)
                  if (not include or t.split("/")[1] in include)
                  and t.split("/")[1] not in exclude]
        if dry_run:
            return {"started": False, "total": len(topics), "succeeded": 0, "failed": 0,
                    "pending": len(topics), "failed_topics": []}
        await self.store.put(keys.cluster_broker_state(broker_id),
                             {"mode": "draining", "reason": "admin_unload"})
        failed = []
        step = max(1, max_parallel)
        for i in range(0, len(topics), step):
            chunk = topics[i:i + step]
            await asyncio.gather(*(self.move(t, broker_id) for t in chunk))
            failed += await self._moved(chunk, broker_id, timeout)
        await self.store.put(keys.cluster_broker_state(broker_id),
                             {"mode": "drained", "reason": "admin_unload"})
        return {"started": True, "total": len(topics), "succeeded": len(topics) - len(failed),
                "failed": len(failed), "pending": 0, "failed_topics": failed}

    def _counts(self) -> dict[str, int]:
        counts = {b: 0 for b in self.view.active_brokers()}
        for owner in self.view.owners.values():
            if owner in counts:
                counts[owner] += 1
        return counts

    def balance(self) -> dict:
        strategy = self.node.cfg.assignment_strategy
        counts = self._counts()
        loads = strategies.loads(strategy, counts, self.view.loads) if counts else {}
        values = list(loads.values()) or [0.0]
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
        brokers = [{"broker_id": int(b), "load": loads[b], "topic_count": counts[b],
                    "is_overloaded": mean > 0 and loads[b] > mean * (1 + LOAD_BAND),
                    "is_underloaded": mean > 0 and loads[b] < mean * (1 - LOAD_BAND)}
                   for b in sorted(loads)]
        return {"coefficient_of_variation": std / mean if mean > 0 else 0.0,
                "mean_load": mean, "max_load": max(values), "min_load": min(values),
                "std_deviation": std, "broker_count": len(loads),
                "assignment_strategy": STRATEGY_NAMES[strategy], "brokers": brokers}

    def plan(self, max_moves: int | None, movable=None) -> list[dict]:
        """Moves from the most to the least loaded broker (by topic count) until the
        counts are within one of each other, or ``max_moves``. ``movable(topic)``: whether
        a topic may be moved (automatic rebalancing's blacklist and minimum age); a broker
        with nothing movable is passed over for the next most loaded."""
        counts = self._counts()
        if len(counts) < 2:
            return []
        owned = {b: [t for t in self.view.topics_of(b) if movable is None or movable(t)]
                 for b in counts}
        moves = []
        limit = max_moves if max_moves is not None else sum(counts.values())
        while len(moves) < limit:
            target = min(counts, key=lambda b: (counts[b], b))
            sources = [b for b in counts if owned[b] and counts[b] - counts[target] > 1]
            if not sources:
                break
            source = max(sources, key=lambda b: (counts[b], b))
            topic = owned[source].pop()
            counts[source] -= 1
            counts[target] += 1
            moves.append({"topic_name": topic, "from_broker": int(source),
                          "to_broker": int(target), "estimated_load": 1.0,
                          "reason": f"balance topic counts ({counts[source] + 1} -> "
                                    f"{counts[target] - 1})"})
        return moves

    async def rebalance(self, dry_run: bool, max_moves: int | None,
                        timeout: float = 30.0) -> dict:
        if max_moves is not None and max_moves < 0:
            raise InvalidArgument("max_moves must not be negative")
        cv = self.balance()["coefficient_of_variation"]
        moves = self.plan(max_moves)
        if not moves:
            return {"success": True, "moves_executed": 0, "proposed_moves": [],
                    "error_message": f"Cluster is balanced (CV: {cv:.3f})"}
        if dry_run:
            return {"success": True, "moves_executed": 0, "proposed_moves": moves,
                    "error_message": ""}
        started = time.monotonic()
        for move in moves:
            await self.move(move["topic_name"], str(move["from_broker"]),
                             str(move["to_broker"]), reason="rebalance")
        # each topic has left its own source (the view shows the old owner until it has)
        left = await self._moved([m["topic_name"] for m in moves],
                                 {m["topic_name"]: str(m["from_broker"]) for m in moves},
                                 timeout)
        stuck = [m for m in moves if self.view.owners.get(m["topic_name"]) ==
                 str(m["from_broker"]) or m["topic_name"] in left]
        return {"success": not stuck, "moves_executed": len(moves) - len(stuck),
                "proposed_moves": moves,
                "error_message": "" if not stuck else
                f"{len(stuck)} moves not finished after {time.monotonic() - started:.0f}s"}
