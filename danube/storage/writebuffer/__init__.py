"""The write buffer (``storage.write_buffer``): every reliable append also goes to a Valkey
or Redis stream, replicated there before the producer's ack, so the next owner of a topic
can rebuild what its durable tier does not hold yet. See docs/cluster.md.

``WriteBuffer`` (buffer.py) is the broker's connection; ``TopicBuffer`` (topic.py) one
topic's stream and its group commit; ``entries.py`` the entries' layout; ``recovery.py``
reads a stream's tail back for a new owner.
"""

from danube.storage.writebuffer.buffer import WriteBuffer
from danube.storage.writebuffer.topic import TopicBuffer

__all__ = ["WriteBuffer", "TopicBuffer"]
