"""The single executable's builds, kept by what went into them, as ccache keeps compiles: a
build is reused only when every input is the same. The key hashes the installed danube
package's files (sources and compiled modules), packaging/'s files, every installed
distribution's name and version (PyInstaller and its hooks among them) and the Python
build. The cache is the user's (``$XDG_CACHE_HOME``, else ``~/.cache``, then
``danube-tests/executable``), so a fresh clone of an unchanged tree reuses it; it keeps the
newest KEEP builds."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import sys
from pathlib import Path

import danube

KEEP = 2


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "danube-tests" / "executable"


def _hash_tree(digest, root: Path):
    for path in sorted(p for p in root.rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())


def build_key(packaging_dir) -> str:
    digest = hashlib.sha256()
    digest.update(sys.version.encode() + sys.platform.encode() + b"\0")
    _hash_tree(digest, Path(danube.__file__).parent)
    _hash_tree(digest, Path(packaging_dir))
    dists = sorted(f"{d.metadata['Name']}=={d.version}"
                   for d in importlib.metadata.distributions())
    digest.update("\n".join(dists).encode())
    return digest.hexdigest()[:32]


class ExecutableCache:
    def __init__(self, packaging_dir, root: Path | None = None):
        self.root = root or cache_root()
        self.key = build_key(packaging_dir)
        self.entry = self.root / self.key

    def lookup(self) -> str | None:
        """The kept build's path, or None."""
        exe = self.entry / "danube"
        if exe.is_file() and os.access(exe, os.X_OK):
            os.utime(self.entry)            # the newest used: kept longest
            return str(exe)
        return None

    def keep(self, built) -> str:
        """Keep ``built`` (a fresh build) under the key; its kept path (``built`` itself if
        the cache cannot be written)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            partial = self.root / f".{self.key}.{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            shutil.copy2(built, partial / "danube")
            shutil.rmtree(self.entry, ignore_errors=True)
            os.rename(partial, self.entry)  # whole, or not there
            self._prune()
            return str(self.entry / "danube")
        except OSError:
            return str(built)

    def _prune(self):
        entries = sorted((p for p in self.root.iterdir() if not p.name.startswith(".")),
                         key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
