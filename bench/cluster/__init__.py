"""Cluster mode on etcd benchmarks: see bench/README.md."""
