"""One broker's membership in a cluster: the cluster's implementation of the core's
``Placement`` (danube.broker.placement), between the cluster's metadata on etcd and the
broker core.

The core asks it where a topic lives (``locate``, ``check_elsewhere``) and to create topics
(``create``: recorded, marked unassigned, placed by the leader); it drives the core only
through the ``PlacementHost`` members, chiefly ``serve_topic`` and ``release_topic``, as
assignments to this broker come and go (``/cluster/brokers/{id}/{ns}/{topic}``). See
docs/cluster.md for the whole design.
"""

from __future__ import annotations

import asyncio
import logging

from danube.broker.errors import TopicElsewhere, TopicUnloaded
from danube.broker.placement import LOG_ERRORS, Lease, Placement
from danube.cluster.admin import ClusterOps
from danube.cluster.election import LeaderElection
from danube.cluster.load_manager import LoadManager
from danube.cluster.load_report import LoadReporter
from danube.cluster.membership import Membership
from danube.cluster.rebalancer import AutoRebalancer
from danube.cluster.view import ClusterView
from danube.metadata import keys
from danube.metadata.errors import MetadataError

log = logging.getLogger("danube.cluster")

#: How long creating a topic waits for the leader to place it.
CREATE_WAIT = 10.0
# danube_client_redirects_total's reason for a creating call sent to look the topic up
POST_CREATE = "post_create"
SERVE_RETRY = (0.05, 1.0)
#: Topics loaded at once: each load is a few metadata calls, and thousands at once would
#: crowd out every other call.
SERVE_CONCURRENCY = 8
#: A graceful release (unload, drain) waits this long for the topic's last segments to reach
#: the durable tier.
RELEASE_UPLOAD_TIMEOUT = 30.0
#: How long a lookup of a topic this broker's view has no owner for waits for the view
#: (catch_up): a placement or a move takes well under this on a loaded machine.
LOOKUP_CATCH_UP = 5.0


class ClusterNode(Placement):
    """``control_store``: a second connection to the same metadata for the lease renewal and
    the election, so that they never queue behind the topics' metadata calls (a broker
    loading thousands of topics would otherwise miss its own renewals and fence itself).

    Built before the core, which binds it (``host``); its parts that need the broker's id
    are made once the core has started (``on_start``), and it joins at ``join``."""

    spans_brokers = True

    def __init__(self, store, cfg, control_store=None):
        self.store = store
        self.control_store = control_store or store
        self.cfg = cfg
        self.broker_id = None
        # Nothing is acknowledged before the first registration.
        self.lease = Lease(0.0)
        self._joined = False
        self.view = ClusterView(store)
        self._serve_slots = asyncio.Semaphore(SERVE_CONCURRENCY)
        self.manager = LoadManager(store, self.view, cfg.assignment_strategy,
                                   reconcile_every=cfg.lease_ttl_seconds)
        self.ops = ClusterOps(self)
        self.rebalancer = AutoRebalancer(self.ops, cfg.rebalancing)
        # upstream's danube_client_redirects_total{reason, topic_ns}: (reason, ns) -> calls
        self.redirects: dict[tuple[str, str], int] = {}
        self._serving: dict[str, asyncio.Task] = {}
        self._placed: dict[str, list[asyncio.Future]] = {}

    # -- lifecycle --------------------------------------------------------------------------

    async def on_start(self) -> None:
        """The core has its id: the parts registered under it."""
        cfg, control = self.cfg, self.control_store
        self.broker_id = str(self.host.broker_id)
        self.membership = Membership(control, self.broker_id, None, cfg.lease_ttl_seconds,
                                     on_fenced=self._fenced, on_restored=self._restored,
                                     lease=self.lease)
        self.election = LeaderElection(control, self.broker_id, cfg.lease_ttl_seconds,
                                       on_elected=self._elected, on_deposed=self._deposed,
                                       eligible=lambda: self.membership.registered)
        self.reporter = LoadReporter(self.host.topic_summaries, self.store, self.broker_id,
                                     cfg.load_report_interval_seconds)

    async def join(self) -> None:
        self._joined = True
        await self.start()

    async def leave(self) -> None:
        if self._joined:
            await self.stop()

    async def start(self) -> None:
        # The servers are bound now: the registration names the ports actually in use.
        self.membership.record = self.host.registration_record()
        await self.view.start()
        self.view.listeners.append(self._on_event)
        await self.membership.start()
        if self.cfg.failover_is_lossy:
            await self._check_returning_logs()
        await self.store.put(keys.cluster_broker_state(self.broker_id),
                             {"mode": "active", "reason": "boot"})
        for topic in self.view.topics_of(self.broker_id):
            self._serve_soon(topic)
        self.election.start()
        self.reporter.start()
        log.info("broker %s joined the cluster (%d brokers registered, leader %s)",
                 self.broker_id, len(self.view.registered), self.view.leader or "not yet")

    async def _check_returning_logs(self) -> None:
        """Back after an absence (a kill, a lost host): a local WAL of a topic that another
        broker began to own meanwhile is a past ownership's, and in lossy_local_wal it may
        hold acknowledged messages the new owner never had. They are named now, not only if
        the topic ever comes back here."""
        mine = set(self.view.topics_of(self.broker_id))
        for name in self.host.local_logs():
            if name in mine:
                continue            # served here: its opening decides
            try:
                owner = await self.store.get(keys.topic_owner(name))
                if isinstance(owner, dict) and str(owner.get("broker")) != self.broker_id:
                    await self.host.set_aside_past_ownership(name)
            except (MetadataError, *LOG_ERRORS) as exc:
                log.warning("could not check the local WAL of %s against its owner: %s",
                            name, exc)

    async def stop(self) -> None:
        """Leave gracefully: hand the leadership on, stop serving every topic (its last
        segments uploaded), and only then deregister, which has the leader move them."""
        await self.reporter.stop()
        await self.election.stop()
        await self.manager.stop()
        await self.rebalancer.stop()
        for task in list(self._serving.values()):
            task.cancel()
        self.membership.leaving = True
        moved = TopicUnloaded("this broker is shutting down; look the topic up and connect "
                              "again")
        await asyncio.gather(*(self.host.release_topic(name, moved,
                                                       upload_timeout=RELEASE_UPLOAD_TIMEOUT)
                               for name in self.host.served_topics()),
                             return_exceptions=True)
        await self.membership.stop()
        await self.view.stop()
        if self.control_store is not self.store:
            await self.control_store.close()

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    # -- what the core asks (Placement) -----------------------------------------------------

    async def known_elsewhere(self, name: str) -> bool:
        """Recorded in metadata, wherever it is served."""
        return await self.store.get_entry(keys.namespace_topic(name)) is not None

    async def create(self, name: str, delivery_name: str, create_here):
        """Topics are placed by the leader (``create_here`` is for a single broker)."""
        return await self.create_topic(name, delivery_name)

    async def forget(self, name: str) -> None:
        await self.forget_topic(name)

    async def ownership_epoch(self, name: str) -> tuple[int, bool]:
        """One atomic increment in etcd per ownership: a broker that owned the topic before
        holds a smaller epoch, which the shared storage then refuses. The owner record says
        who began to own it last (this broker, or another since it did)."""
        previous = await self.store.get(keys.topic_owner(name))
        epoch = await self.store.allocate_id(keys.topic_owner_epoch(name))
        await self.store.put(keys.topic_owner(name), {"broker": self.broker_id, "epoch": epoch})
        taken_over = isinstance(previous, dict) and str(previous.get("broker")) != self.broker_id
        return epoch, taken_over

    @property
    def leader_id(self) -> str:
        return self.view.leader or ""

    async def drain(self, broker_id: str, **options) -> dict:
        await self.check_registered(broker_id)
        return await self.ops.drain(broker_id, **options)

    def balance(self) -> dict:
        return self.ops.balance()

    async def rebalance(self, dry_run: bool, max_moves: int | None) -> dict:
        return await self.ops.rebalance(dry_run, max_moves)

    async def topics_of(self, broker_id: str) -> list[str]:
        return self.view.topics_of(broker_id)

    async def unserved_row(self, name: str) -> dict:
        delivery = await self.store.get(keys.topic_delivery(name))
        return {"name": name, "broker_id": self.view.owners.get(name, ""),
                "delivery": delivery or "NonReliable"}

    def not_served_here(self, targets: list[str]) -> BaseException | None:
        # Live state (subscriptions, dispatchers, rates) is the owner's alone.
        return self.ops.elsewhere(targets[0])

    async def unload(self, targets: list[str], unload_here) -> None:
        for target in targets:
            await self.ops.unload_topic(target)

    async def describe_elsewhere(self, name: str, targets: list[str]) -> dict | None:
        return await self.ops.describe_remote(name, targets)

    def locate(self, topic: str):
        """(broker_url, connect_url) of the broker that owns ``topic``, or None."""
        owner = self.view.owners.get(topic)
        record = self.view.registered.get(owner) if owner is not None else None
        if record is None or not record.get("broker_url"):
            return None
        return record["broker_url"], record.get("connect_url") or record["broker_url"]

    async def catch_up(self, topic: str) -> bool:
        # A topic created a moment ago through another broker, or one between owners (a
        # drain, a failover): the watch that feeds the view may be behind the store. A
        # lookup waits for it rather than answering NOT_FOUND for a topic that exists.
        if topic not in self.view.unassigned:
            try:
                if await self.store.get_entry(keys.namespace_topic(topic)) is None:
                    return False
            except MetadataError:
                return False            # the store is out of reach: answer from the view
        return await self.view.until(lambda: self.locate(topic) is not None,
                                     LOOKUP_CATCH_UP)

    def count_redirect(self, reason: str, topic: str) -> None:
        """A producer or consumer sent back to look the topic up again (upstream counts
        these, where its get_topic answers UNAVAILABLE, not lookups answered Redirect)."""
        ns = topic.split("/")[1] if topic.count("/") >= 2 else ""
        self.redirects[reason, ns] = self.redirects.get((reason, ns), 0) + 1

    def check_elsewhere(self, topic: str) -> None:
        """Raise TopicElsewhere if ``topic`` lives (or is about to live) on a broker of the
        cluster other than this one; return if nobody has it."""
        owner = self.view.owners.get(topic)
        if owner is not None and owner != self.broker_id:
            raise TopicElsewhere(f"topic {topic} is served by broker {owner}; look it up again")
        if owner == self.broker_id or topic in self.view.unassigned:
            raise TopicElsewhere(f"topic {topic} is moving between brokers; look it up again")

    async def create_topic(self, name: str, delivery_name: str):
        """Record a new topic, have the leader place it, and return it if it landed here;
        TopicElsewhere (UNAVAILABLE, the clients look it up again) if it landed elsewhere."""
        await self.store.put(keys.namespace_topic(name), None)
        await self.store.put(keys.topic_delivery(name), delivery_name)
        placed = asyncio.get_running_loop().create_future()
        self._placed.setdefault(name, []).append(placed)
        await self.store.put(keys.cluster_unassigned(name), None)
        try:
            await asyncio.wait_for(asyncio.shield(placed), CREATE_WAIT)
        except TimeoutError:
            raise TopicElsewhere(f"topic {name} was created and waits for a broker; look it "
                                 "up again", POST_CREATE) from None
        finally:
            waiters = self._placed.get(name, [])
            if placed in waiters:
                waiters.remove(placed)
        topic = self.host.served(name)
        if topic is None:
            try:
                self.check_elsewhere(name)
            except TopicElsewhere as exc:
                raise TopicElsewhere(str(exc), POST_CREATE) from None
            raise TopicElsewhere(f"topic {name} is not served yet; look it up again",
                                 POST_CREATE)
        if self.cfg.advertised_connect_url != self.cfg.advertised_broker_url:
            # Proxy mode: the call came through the ingress without a routing header (the
            # topic did not exist, so the client's lookup failed). Answering it here would
            # leave the client with no header for its next calls, which the ingress would
            # then send to any broker; upstream's answer to a creating call makes it look
            # the topic up, and so learn the owner's broker_url.
            raise TopicElsewhere(f"topic {name} was created; look it up again", POST_CREATE)
        return topic

    async def forget_topic(self, name: str) -> None:
        """A deleted topic: drop its assignment (the owner then lets it go) and marker."""
        owner = self.view.owners.get(name)
        if owner is not None:
            await self.store.delete(keys.cluster_broker_topic(owner, name))
        await self.store.delete(keys.cluster_unassigned(name))

    # -- assignments to this broker ---------------------------------------------------------

    def _on_event(self, event) -> None:
        if self.election.is_leader:
            self.manager.on_event(event)
            self.rebalancer.on_event(event)
        if event is None:
            self._reconcile()
            return
        key, deleted = event.key, event.kind == "delete"
        mine = keys.cluster_broker_prefix(self.broker_id) + "/"
        if key.startswith(mine) and not key.endswith("/state"):
            topic = key[len(mine) - 1:]
            if deleted:
                self._release_soon(topic)
            else:
                self._serve_soon(topic)
        elif key.startswith(keys.CLUSTER_BROKERS + "/") and not deleted:
            self._wake_creators(key)
        elif key == self.membership.key and deleted:
            self.membership.registration_deleted()
        elif key == keys.CLUSTER_LEADER and deleted:
            self.election.poke()

    def _wake_creators(self, key: str) -> None:
        broker, _, rest = key[len(keys.CLUSTER_BROKERS) + 1:].partition("/")
        topic = "/" + rest
        if broker != self.broker_id:
            for waiter in self._placed.get(topic, ()):
                if not waiter.done():
                    waiter.set_result(broker)

    def _reconcile(self) -> None:
        if self.membership.fenced:
            return
        mine = set(self.view.topics_of(self.broker_id))
        served = set(self.host.served_topics())
        for topic in mine - served:
            self._serve_soon(topic)
        for topic in served - mine:
            self._release_soon(topic)

    def _serve_soon(self, topic: str) -> None:
        self._chain(topic, self._serve(topic))

    def _release_soon(self, topic: str) -> None:
        self._chain(topic, self._release(topic))

    def _chain(self, topic: str, coro) -> None:
        """Run serve/release of one topic one after another, in event order."""
        previous = self._serving.get(topic)

        async def run():
            if previous is not None:
                try:
                    await previous
                except BaseException:  # noqa: BLE001 - its own failure was logged
                    pass
            await coro

        task = asyncio.get_running_loop().create_task(run(), name=f"cluster-topic {topic}")
        self._serving[topic] = task
        task.add_done_callback(lambda t: self._serving.get(topic) is t and
                               self._serving.pop(topic, None))

    async def _serve(self, name: str) -> None:
        delay = SERVE_RETRY[0]
        while self.view.owners.get(name) == self.broker_id and not self.membership.fenced:
            if self.host.serves(name):
                break
            try:
                if await self.store.get_entry(keys.namespace_topic(name)) is None:
                    await self.store.delete(keys.cluster_broker_topic(self.broker_id, name))
                    return
                async with self._serve_slots:
                    await self.host.serve_topic(name)
                log.info("serving topic %s (assigned to broker %s)", name, self.broker_id)
                break
            except (MetadataError, *LOG_ERRORS) as exc:
                # WALLockedError: the previous owner is still closing the topic's log.
                log.warning("cannot serve topic %s yet (%s); retrying", name, exc)
                await asyncio.sleep(delay)
                delay = min(SERVE_RETRY[1], delay * 2)
        for waiter in self._placed.get(name, ()):
            if not waiter.done():
                waiter.set_result(self.broker_id)

    async def _release(self, name: str) -> None:
        had_log = False
        if self.host.serves(name):
            had_log = await self.host.release_topic(
                name, TopicUnloaded(f"topic {name} moved to another broker; look it up and "
                                    "connect again"), upload_timeout=RELEASE_UPLOAD_TIMEOUT)
            log.info("released topic %s", name)
        if self.membership.fenced:
            return
        try:
            marker = self.view.unassigned.get(name)
            if isinstance(marker, dict) and marker.get("ready") is False and \
                    str(marker.get("from_broker")) == self.broker_id:
                await self.store.put(keys.cluster_unassigned(name), {**marker, "ready": True})
            if had_log and await self.store.get_entry(keys.namespace_topic(name)) is None:
                await self.host.delete_topic_data(name)     # the topic was deleted
        except MetadataError as exc:
            log.warning("after releasing %s: %s", name, exc)

    async def _answer_moves(self) -> None:
        """Set ``ready`` on the move markers naming this broker whose topic it no longer
        serves: a release while fenced leaves them unanswered, and the leader waits for
        them as long as this broker is registered."""
        for topic, marker in list(self.view.unassigned.items()):
            if isinstance(marker, dict) and marker.get("ready") is False and \
                    str(marker.get("from_broker")) == self.broker_id and \
                    not self.host.serves(topic) and \
                    self.view.owners.get(topic) != self.broker_id:
                try:
                    await self.host.upload_released(topic, RELEASE_UPLOAD_TIMEOUT)
                except (MetadataError, *LOG_ERRORS) as exc:
                    log.warning("could not upload the rest of %s before letting it go: %s",
                                topic, exc)
                await self.store.put(keys.cluster_unassigned(topic), {**marker, "ready": True})

    # -- leadership and fencing -------------------------------------------------------------

    async def _elected(self) -> None:
        self.manager.start()
        self.rebalancer.start()

    async def _deposed(self) -> None:
        await self.manager.stop()
        await self.rebalancer.stop()

    async def _fenced(self, reason: str) -> None:
        """Stop serving every topic at once: the leader may hand them to others any time."""
        await self.election.stop_leading()
        unloaded = TopicUnloaded("this broker lost its cluster membership; look the topic up "
                                 "and connect again")
        await asyncio.gather(*(self.host.release_topic(name, unloaded, fenced=True)
                               for name in self.host.served_topics()),
                             return_exceptions=True)

    async def _restored(self) -> None:
        """Registered again after a fence. If the registration never lapsed, no leader moved
        anything: serve again what is still assigned here, from this broker's own WAL, which
        holds every message it acknowledged (handing it back would have the next owner
        continue from the durable tier, behind them). Otherwise hand back whatever is still
        assigned here (the leader may be moving it already), then take topics like a new
        broker. Either way, a move that asked this broker to let a topic go while it was
        fenced is answered: the topic is let go (``ready``)."""
        await self._answer_moves()
        mine = self.view.topics_of(self.broker_id)
        if mine and not self.membership.lapsed:
            log.warning("broker %s: the registration never lapsed; serving its %d topics "
                        "again", self.broker_id, len(mine))
            for topic in mine:
                self._serve_soon(topic)
        elif mine:
            marker = {"reason": "failover", "from_broker": self.broker_id}
            await self.store.put_many({keys.cluster_unassigned(t): marker for t in mine})
            for topic in mine:
                await self.store.delete(keys.cluster_broker_topic(self.broker_id, topic))
        await self.store.put(keys.cluster_broker_state(self.broker_id),
                             {"mode": "active", "reason": "re-registered after a fence"})
