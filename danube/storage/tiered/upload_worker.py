"""Uploads to cloud object stores run in a child process.

The SDKs (boto3, google-cloud-storage, azure-storage-blob) do milliseconds of pure-Python
work per request: signing, retries, response parsing. In a thread of the broker that work
holds the GIL, and the event loop thread then waits for it (up to the 5 ms switch interval)
in the middle of a publish: measured as a 3x higher publish p99 while uploads ran. A child
process has its own GIL, runs under SCHED_IDLE (it gets a core only when the broker does not
want it), and gets only a file path to upload,
so the broker's part of an upload is one pickled descriptor coming back.

The file-system store uploads from the child too. Its work is a few syscalls that release
the GIL, but checking (and, across file systems, copying and syncing) a segment is still CPU
on the broker's cores: with a copy, in-process it raised the publish p99 by ~4 ms while
uploads ran every second (bench.tiered, session 7), from the child by ~1.6 ms. Only the
memory store stays in-process, since it can only be shared within one process; its uploads
run on a thread of their own at idle priority (``run_idle``).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import multiprocessing
import os
import signal

from danube.storage.durable.config import open_object_store
from danube.storage.tiered.segments import upload_segment

IN_PROCESS_BACKENDS = ("memory",)
NICE = 10

_store = None


def run_idle() -> None:
    """Give the calling thread (on Linux a thread is scheduled on its own) CPU only when
    nothing else wants it: the broker, not the upload, owns the cores."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(NICE)
        except OSError:
            pass


def _init(durable_cfg) -> None:
    global _store
    try:
        # Die with the broker, even when it is killed with SIGKILL (Linux).
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort off Linux
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the broker decides when to stop
    run_idle()
    logging.getLogger("azure").setLevel(logging.WARNING)
    _store = open_object_store(durable_cfg)


def _upload(topic, path, first_offset, last_offset, size, epoch=None):
    return upload_segment(_store, topic, path, first_offset, last_offset, size, epoch)


def _ready():
    return os.getpid()


class ProcessUploader:
    """``upload(topic, path, first, last, size)`` in the child; the pool is made again if
    the child dies (the failed upload is retried by the caller like any other failure)."""

    def __init__(self, durable_cfg):
        self._cfg = durable_cfg
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def _get_pool(self):
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                initargs=(self._cfg,))
        return self._pool

    def submit(self, topic, path, first_offset, last_offset, size, epoch=None):
        try:
            return self._get_pool().submit(_upload, topic, path, first_offset, last_offset,
                                           size, epoch)
        except concurrent.futures.process.BrokenProcessPool:
            self._pool = None
            return self._get_pool().submit(_upload, topic, path, first_offset, last_offset,
                                           size, epoch)

    def warm(self) -> None:
        """Start the child now and wait until it is ready (blocking: run it in a thread).
        Spawning a process costs milliseconds of the calling thread, which should not be
        the event loop's in the middle of a publish."""
        self._get_pool().submit(_ready).result()

    def broken(self) -> None:
        """The child died under an upload: start a fresh one next time."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
