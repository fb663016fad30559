"""bench.soak: producers and consumers of every subscription type on a reliable and a
non-reliable topic, with consumers and the broker killed and restarted at random, then a
check that every acknowledged reliable message was delivered, in order where the
subscription type promises it, and that the broker's memory and descriptors stayed flat."""
