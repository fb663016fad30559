"""Which broker of a Danube cluster serves each partition, and calls sent to it.

In a cluster every partition lives on one broker (its owner), which alone can read or append
it; the others answer UNAVAILABLE "look it up again". So the driver and every task look the
partition up (danube.Discovery/TopicLookup, on any broker of ``service_url``) and talk to the
owner. When the owner dies or the partition moves, calls fail (UNAVAILABLE: unreachable or
"served by broker N"; NOT_FOUND while no broker has it yet): the partition is looked up again
and the call retried, with backoff, for up to ``ownerWaitMs`` since the last call that worked
(a killed owner's partitions come back once its lease runs out and the leader places them).

A standalone broker answers every lookup with Connect, so the same code serves it with no
extra channel. Channels are kept per broker for the life of an ``Owners`` (one per task, one
per streaming query on the driver); pickling drops them, so a reader holding one can still be
shipped to the executors."""

import time

from danube_spark.errors import DanubeSparkError, TopicNotFound
from danube_spark.options import service_urls
from danube_spark.rpc import Broker

# Status codes after which the partition is looked up again: the broker is gone or cannot be
# reached (UNAVAILABLE, DEADLINE_EXCEEDED), it does not serve the partition (UNAVAILABLE
# "look it up again"), or no broker serves it right now (NOT_FOUND, during a failover).
RETRIED = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "NOT_FOUND"})
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 1.0


class OwnerUnavailable(DanubeSparkError):
    """No broker served the partition within ownerWaitMs."""


class Owners:
    def __init__(self, service_url, timeout, wait):
        self.seeds = service_urls(service_url)
        self.timeout = timeout
        self.wait = wait
        self._channels = {}     # (url, broker_url for an ingress) -> Broker
        self._owners = {}       # partition name -> Broker
        self.lookups = 0
        # Whether a topic's offsets may be asked of the first broker in one call (it serves
        # every partition); cleared for good once it did not.
        self.one_call_offsets = True

    def __getstate__(self):
        return {"seeds": self.seeds, "timeout": self.timeout, "wait": self.wait,
                "_channels": {}, "_owners": {}, "lookups": 0,
                "one_call_offsets": self.one_call_offsets}

    def close(self):
        for broker in self._channels.values():
            broker.close()
        self._channels.clear()
        self._owners.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _broker(self, url, broker_url=None):
        key = (url, broker_url)
        broker = self._channels.get(key)
        if broker is None:
            broker = self._channels[key] = Broker(url, self.timeout, broker_url)
        return broker

    def _drop(self, broker):
        """Forget a broker that failed: a channel to a dead process would wait out gRPC's
        reconnect backoff when it comes back, and every partition it served is looked up
        again."""
        for key, known in list(self._channels.items()):
            if known is broker:
                del self._channels[key]
        for name, known in list(self._owners.items()):
            if known is broker:
                del self._owners[name]
        broker.close()

    def seed(self):
        """The first broker of service_url."""
        return self._broker(self.seeds[0])

    def on_seed(self, fn):
        """fn(broker) on the first broker of service_url that answers (calls any broker may
        answer: lookups, partition listings); the error of the last one if none does."""
        last = None
        for url in self.seeds:
            broker = self._broker(url)
            try:
                return broker, fn(broker)
            except DanubeSparkError as exc:
                if exc.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    raise
                self._drop(broker)
                last = exc
        raise last

    def partitions(self, topic):
        """The partition names of ``topic`` ([topic] if it is not partitioned); TopicNotFound
        if it does not exist."""
        _, names = self.on_seed(lambda b: b.partitions(topic))
        if not names:
            # The broker's own error for a missing topic, naming it.
            self.on_seed(lambda b: b.offsets(topic))
            raise TopicNotFound(f"topic {topic} not found on the Danube brokers at "
                                f"{', '.join(self.seeds)}")
        return names

    def owner(self, name):
        """The Broker serving partition (or topic) ``name``."""
        broker = self._owners.get(name)
        if broker is not None:
            return broker
        self.lookups += 1
        try:
            asked, (kind, connect_url, broker_url, proxy) = self.on_seed(
                lambda b: b.lookup(name))
        except DanubeSparkError as exc:
            if exc.code != "UNIMPLEMENTED":
                raise
            # A server without danube.Discovery (one that serves only the history calls)
            # is a single broker: it serves everything itself.
            asked, kind = self.seed(), "Connect"
        if kind == "Connect":
            broker = asked
        elif kind == "Redirect":
            broker = (self._broker(connect_url, broker_url) if proxy
                      else self._broker(broker_url or connect_url))
        else:
            err = DanubeSparkError(f"the lookup of {name} failed on the Danube broker at "
                                   f"{asked.service_url}")
            err.code = "UNAVAILABLE"
            raise err
        self._owners[name] = broker
        return broker

    def retry(self, name, what):
        return Retry(self, name, what)

    def call(self, name, fn, what):
        """fn(owner of name), looked up again and retried while the owner changes."""
        retry = self.retry(name, what)
        while True:
            try:
                return fn(self.owner(name))
            except DanubeSparkError as exc:
                retry.failed(exc)


class Retry:
    """The retries of one partition's calls: ``failed(exc)`` re-raises what is not about the
    owner, forgets the owner and waits (backoff), or raises OwnerUnavailable once ownerWaitMs
    has passed since the first failure after the last ``progressed()``."""

    def __init__(self, owners, name, what):
        self.owners = owners
        self.name = name
        self.what = what
        self.deadline = None
        self.delay = FIRST_BACKOFF
        self.attempts = 0

    def progressed(self):
        self.deadline = None
        self.delay = FIRST_BACKOFF

    def failed(self, exc):
        if exc.code not in RETRIED:
            raise exc
        broker = self.owners._owners.get(self.name)
        if broker is not None:
            self.owners._drop(broker)
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.owners.wait
        if now >= self.deadline:
            raise OwnerUnavailable(
                f"{self.what} of {self.name}: no broker of the Danube cluster at "
                f"{', '.join(self.owners.seeds)} served it within ownerWaitMs "
                f"({self.owners.wait:g} s, {self.attempts + 1} attempts); last error: "
                f"{exc}") from None
        self.attempts += 1
        time.sleep(min(self.delay, self.deadline - now))
        self.delay = min(self.delay * 2, MAX_BACKOFF)
