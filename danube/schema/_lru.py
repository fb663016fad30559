"""A bounded, thread-safe least-recently-used map: the parsed schemas and the compiled
validators are each built once per fingerprint, and a long-lived broker must not keep every
one it ever saw."""

import collections
import threading


class LRU:
    def __init__(self, limit):
        self.limit = limit
        self._items = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key, value):
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def __len__(self):
        return len(self._items)
