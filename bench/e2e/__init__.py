"""End-to-end benchmark: non-reliable produce -> consume on one topic, broker, producer and
consumer each in its own process, with the official Python client and with ours.

    .venv/bin/python -m bench.e2e [--duration 10] [--quick]

See bench/README.md for what each number means.
"""
