"""Reliable-topic benchmark: durable publish through the broker's write-ahead log (group
commit), against the disk's own limit measured in the same run on the same filesystem.

    .venv/bin/python -m bench.reliable [--duration 10] [--quick]

The broker, every producer, the consumer and the plain write+fdatasync loop each run in
their own process, bound to 127.0.0.1. See bench/README.md ("bench.reliable") for what each
number means.
"""
