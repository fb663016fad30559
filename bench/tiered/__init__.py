"""Tiered-storage benchmark: replay throughput from object storage vs the local WAL (storage
layer and end to end through a broker), and publish latency while uploads run.

    .venv/bin/python -m bench.tiered [--quick]

See bench/README.md for what each number means.
"""
