"""Which producers and consumers this broker currently serves, by id: what the health check
answers from. The topic layer registers and unregisters its clients here."""


class ClientRegistry:
    def __init__(self):
        self._producers = {}
        self._consumers = {}

    def add_producer(self, producer_id: int, owner) -> None:
        self._producers[producer_id] = owner

    def remove_producer(self, producer_id: int) -> None:
        self._producers.pop(producer_id, None)

    def add_consumer(self, consumer_id: int, owner) -> None:
        self._consumers[consumer_id] = owner

    def remove_consumer(self, consumer_id: int) -> None:
        self._consumers.pop(consumer_id, None)

    def producer_active(self, producer_id: int) -> bool:
        owner = self._producers.get(producer_id)
        return owner is not None and getattr(owner, "active", True)

    def consumer_active(self, consumer_id: int) -> bool:
        owner = self._consumers.get(consumer_id)
        return owner is not None and getattr(owner, "active", True)
