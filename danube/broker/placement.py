"""Where a topic lives: the one interface through which the broker core learns it.

The core receives a ``Placement`` at construction and asks it every question whose answer
depends on how many brokers share the topics: whether a name is served by another broker,
creating a topic (here, or wherever it is placed), forgetting a deleted one, the leader,
draining a broker, the balance, unloading a topic. It never asks which mode it runs in.

``Standalone`` (below) is one broker that serves every topic: a cluster of one, its own
leader, balanced by definition, with nowhere to move a topic to. The cluster's
implementation (topics placed by a leader among brokers sharing etcd) is
``danube.cluster.node.ClusterNode``; it drives the core only through the ``PlacementHost``
members the core exposes to it.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Protocol

from danube.broker.errors import BrokerNotFound, ClusterRequired, InvalidArgument
from danube.metadata import keys
from danube.storage.errors import WALError

#: Each broker's own non-reliable system topic: never placed, never moved.
SYSTEM_TOPIC = "/system/_events_topic"

#: What opening or uploading a topic's log may raise that a later attempt can get past (a
#: WAL still locked by its previous owner, a full disk): a placement serving a topic tries
#: again on these.
LOG_ERRORS = (WALError, OSError)


class PlacementHost(Protocol):
    """What the broker core exposes to a placement (and all that the cluster reaches)."""

    broker_id: int

    def registration_record(self) -> dict:
        """This broker's URLs, as registered under ``/cluster/register/{id}``."""

    def served_topics(self) -> list[str]:
        """The topics served here that may move (every one but SYSTEM_TOPIC)."""

    def serves(self, name: str) -> bool:
        """Whether ``name`` is served here now."""

    def served(self, name: str):
        """The Topic ``name`` served here, or None."""

    def topic_summaries(self) -> list[dict]:
        """Operators' statistics of every topic served here (the load report's input)."""

    async def serve_topic(self, name: str) -> None:
        """Serve a topic recorded in metadata (placed here)."""

    async def release_topic(self, name: str, reason: BaseException,
                            upload_timeout: float | None = None,
                            fenced: bool = False) -> bool:
        """Stop serving a topic; True if it had a log."""

    async def upload_released(self, name: str, upload_timeout: float) -> None:
        """Upload what a topic let go of while fenced left behind."""

    async def delete_topic_data(self, name: str) -> None:
        """A deleted topic's log, local and durable, goes."""

    def local_logs(self) -> list[str]:
        """The reliable topics with a local WAL here, served or not."""

    async def set_aside_past_ownership(self, name: str) -> None:
        """A local WAL of a topic another broker has owned since: moved aside (and, in
        lossy_local_wal, what it held that the next owner never had named)."""


class Lease:
    """Until when (``time.monotonic()``) this broker may acknowledge publishes to the topics
    it serves. A cluster moves ``deadline`` forward at each renewal of the broker's
    registration and to 0 when it is fenced; a publish checks it right before its ack, so a
    broker that was paused past its lease (SIGSTOP, a stall) acknowledges nothing when it
    resumes, even before its watchdog has run. A single broker's never runs out."""

    __slots__ = ("deadline",)

    def __init__(self, deadline: float = float("inf")):
        self.deadline = deadline


class Placement:
    """The questions the core asks; this base answers them for a single broker (see
    ``Standalone``). ``bind`` is called once by the core it serves."""

    host = None
    store = None        # the metadata store
    #: Whether other brokers serve topics too (admin calls may be forwarded to them).
    spans_brokers = False
    #: This broker's right to acknowledge (see Lease); a cluster's placement replaces it.
    lease = Lease()

    async def ownership_epoch(self, name: str) -> tuple[int | None, bool]:
        """A new ownership of reliable topic ``name`` begins here: the epoch every write of
        it to storage other brokers share carries (greater than any earlier owner's; None
        when no other broker can own it), and whether another broker began to own it since
        this one last did (a local WAL of it here is then a past ownership's)."""
        return None, False

    def bind(self, host) -> None:
        self.host = host

    async def on_start(self) -> None:
        """The core has started (namespaces exist, storage open)."""

    async def join(self) -> None:
        """The servers are bound: announce this broker."""

    async def leave(self) -> None:
        """The broker stops: called before the core closes its topics."""

    async def record_served(self, name: str) -> None:
        """A topic is now served here (created or loaded by this broker)."""

    async def known_elsewhere(self, name: str) -> bool:
        """Whether ``name`` exists although this broker does not serve it."""
        return False

    def check_elsewhere(self, name: str) -> None:
        """Raise TopicElsewhere if another broker serves ``name`` (or is about to)."""

    async def catch_up(self, name: str) -> bool:
        """``locate`` found no owner of ``name``: wait (bounded) until this broker's view of
        where topics live has caught up with a topic the metadata store has or one being
        placed; True if it now may know. A single broker's view never lags."""
        return False

    async def create(self, name: str, delivery_name: str,
                     create_here: Callable[[], Awaitable]):
        """Create a new topic: here (``create_here()``), or wherever it is placed. Returns
        the Topic served here, or raises TopicElsewhere."""
        return await create_here()

    async def forget(self, name: str) -> None:
        """A deleted topic: drop its assignment."""

    async def drop_assignment(self, name: str) -> None:
        """A topic this broker created is taken back (its creating request failed): its
        assignment to this broker goes."""
        await self.store.delete(keys.cluster_broker_topic(self.host.broker_id, name))

    def locate(self, name: str):
        """(broker_url, connect_url) of the broker serving ``name`` elsewhere, or None."""
        return None

    def count_redirect(self, reason: str, name: str) -> None:
        """A producer or consumer was sent to look ``name`` up again (upstream's
        danube_client_redirects_total); a single broker sends nobody elsewhere."""

    @property
    def leader_id(self) -> str:
        return str(self.host.broker_id)

    # -- the registered brokers (upstream's /cluster/register and /cluster/brokers keys) --

    async def list_brokers(self) -> list[dict]:
        """Every registered broker as upstream's BrokerInfo fields."""
        out = []
        leader = self.leader_id
        for key, record in await self.store.scan(keys.CLUSTER_REGISTER):
            broker_id = key.rsplit("/", 1)[-1]
            if not isinstance(record, dict) or not record.get("broker_url"):
                continue
            out.append({"broker_id": broker_id, "broker_addr": record["broker_url"],
                        "broker_role": "Cluster_Leader" if broker_id == leader
                        else "Cluster_Follower",
                        "admin_addr": record.get("admin_addr", ""),
                        "metrics_addr": record.get("prom_exporter", ""),
                        "broker_status": await self.broker_status(broker_id)})
        return out

    async def broker_status(self, broker_id: str) -> str:
        state = await self.store.get(keys.cluster_broker_state(broker_id))
        mode = state.get("mode") if isinstance(state, dict) else None
        return mode if mode in ("active", "draining", "drained") else "active"

    async def check_registered(self, broker_id: str) -> None:
        if not broker_id:
            raise InvalidArgument("broker_id must be provided")
        if "/" in broker_id or \
                await self.store.get_entry(keys.cluster_register(broker_id)) is None:
            raise BrokerNotFound(f"broker {broker_id} is not registered in the cluster")

    async def activate(self, broker_id: str, reason: str) -> None:
        await self.check_registered(broker_id)
        await self.store.put(keys.cluster_broker_state(broker_id),
                             {"mode": "active", "reason": reason or "admin_activate"})

    async def drain(self, broker_id: str, **options) -> dict:
        """Move every topic off ``broker_id``."""
        raise NotImplementedError

    def balance(self) -> dict:
        raise NotImplementedError

    async def rebalance(self, dry_run: bool, max_moves: int | None) -> dict:
        raise NotImplementedError

    async def topics_of(self, broker_id: str) -> list[str]:
        raise NotImplementedError

    async def unserved_row(self, name: str) -> dict:
        """A topics listing's row for a topic not served here."""
        return {"name": name, "broker_id": str(self.host.broker_id), "delivery": "NonReliable"}

    def not_served_here(self, targets: list[str]) -> BaseException | None:
        """The error for live-state calls about ``targets``, none of them served here; None:
        answer as for a topic without live state."""
        return None

    async def unload(self, targets: list[str], unload_here: Callable[[], Awaitable]) -> None:
        """Unload a topic (each of ``targets``): here, closed and served again."""
        await unload_here()

    async def describe_elsewhere(self, name: str, targets: list[str]) -> dict | None:
        """DescribeTopic's answer for a topic none of whose ``targets`` is served here, or
        None to describe it from what is here."""
        return None


class Standalone(Placement):
    """One broker serving every topic: a cluster of one. Unloading the broker is refused
    (FAILED_PRECONDITION, as upstream answers a one-broker cluster); unloading a topic closes
    it and serves it again here. Its topics are recorded under
    ``/cluster/brokers/{id}/{ns}/{topic}``, as upstream's single broker does."""

    def __init__(self, store):
        self.store = store

    async def on_start(self) -> None:
        await self.host.load_recorded_topics()

    async def join(self) -> None:
        await self.store.put(keys.cluster_register(self.host.broker_id),
                             self.host.registration_record())

    async def record_served(self, name: str) -> None:
        await self.store.put(keys.cluster_broker_topic(self.host.broker_id, name), None)

    async def forget(self, name: str) -> None:
        await self.store.delete(keys.cluster_broker_topic(self.host.broker_id, name))

    async def drain(self, broker_id: str, **options) -> dict:
        if len(await self.list_brokers()) < 2:
            raise ClusterRequired("Cannot unload broker: single broker cluster detected.")
        await self.check_registered(broker_id)
        raise ClusterRequired(f"Cannot unload broker {broker_id}: moving topics to another "
                              f"broker needs cluster mode")

    def balance(self) -> dict:
        """Its load is its topic count, and it is balanced by definition."""
        count = len(self.host.served_topics()) + self.host.serves(SYSTEM_TOPIC)
        return {"coefficient_of_variation": 0.0, "mean_load": float(count),
                "max_load": float(count), "min_load": float(count), "std_deviation": 0.0,
                "broker_count": 1, "assignment_strategy": "Fair",
                "brokers": [{"broker_id": self.host.broker_id, "load": float(count),
                             "topic_count": count, "is_overloaded": False,
                             "is_underloaded": False}]}

    async def rebalance(self, dry_run: bool, max_moves: int | None) -> dict:
        # Upstream's answer for a cluster under its imbalance threshold.
        return {"success": True, "moves_executed": 0, "proposed_moves": [],
                "error_message": "Cluster is balanced (CV: 0.000): a single broker has no "
                                 "topic to move"}

    async def topics_of(self, broker_id: str) -> list[str]:
        if broker_id == str(self.host.broker_id):
            return sorted(self.host.served_topics() +
                          ([SYSTEM_TOPIC] if self.host.serves(SYSTEM_TOPIC) else []))
        prefix = keys.cluster_broker_prefix(broker_id)
        return sorted(k[len(prefix):] for k in await self.store.keys(prefix)
                      if k.count("/") == prefix.count("/") + 2)
