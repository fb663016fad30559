"""Fuzz target: WAL recovery over segment files and a checkpoint that are random, or real ones
(written by the project's WAL) damaged by the mutation engine.

The input is a small archive of the directory's files, so that the engines mutate file
contents, names and the checkpoint alike::

    record = tag u8 | [base u64 LE, segments only] | length u32 LE | bytes
    tag % 3 == 0: a segment file wal.{base:020d}.log
    tag % 3 == 1: a checkpoint body (JSON); the target adds the CRC, so it is believed
    tag % 3 == 2: a whole checkpoint file, as is

The top bit of the first tag byte opens with lazy validation of sealed segments.

Every message written into a seed is `payload(offset)`, so whatever recovery gives back can be
checked: it is a run of consecutive offsets whose payloads are byte-identical to what was
written there (frames are CRC'd with their offsets, so damage cannot forge one). Recovery
must either do that or raise the storage error (WALError) with a message; anything else, or
an open that does not return, is a finding.
"""

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
import struct
import tempfile
import zlib

from danube.storage import WAL, WALConfig
from danube.storage.checkpoint import CHECKPOINT_NAME, _canonical
from danube.storage.errors import WALError
from fuzz_codecs import Finding, check

SMALL = dict(durability="none", segment_max_bytes=4096, segment_initial_bytes=1024)
OPEN_TIMEOUT = 10.0
MAX_BASE = 10**19 - 1          # what fits the 20 digits of a segment name


def payload(offset: int) -> bytes:
    """The message written at `offset` in every seed."""
    n = (offset * 7919) % 120 + 1
    return bytes((offset + i) % 251 + 1 for i in range(n))


def pack(files, raw_checkpoint=False) -> bytes:
    """Archive `files` ({name: bytes}) of a WAL directory as a fuzz input; the checkpoint as
    its body (mutations of it are then believed), or as the file it is."""
    out = bytearray()
    for name, data in sorted(files.items()):
        if name.startswith("wal.") and name.endswith(".log"):
            out += struct.pack("<BQI", 0, int(name[4:-4]), len(data)) + data
        elif name == CHECKPOINT_NAME and raw_checkpoint:
            out += struct.pack("<BI", 2, len(data)) + data
        elif name == CHECKPOINT_NAME:
            body = json.dumps(json.loads(data)["checkpoint"]).encode()
            out += struct.pack("<BI", 1, len(body)) + body
    return bytes(out)


def unpack(data: bytes):
    """The files an input stands for; a record cut short keeps the bytes that are there."""
    files, pos = {}, 0
    while pos < len(data):
        tag = data[pos] % 3
        pos += 1
        base = None
        if tag == 0:
            base = int.from_bytes(data[pos:pos + 8], "little") % (MAX_BASE + 1)
            pos += 8
        length = int.from_bytes(data[pos:pos + 4], "little")
        pos += 4
        body = data[pos:pos + length]
        pos += length
        if tag == 0:
            files[f"wal.{base:020d}.log"] = body
        elif tag == 1:
            try:
                doc = json.loads(body)
            except ValueError:
                continue
            files[CHECKPOINT_NAME] = (json.dumps({"checkpoint": doc,
                                                  "crc32": zlib.crc32(_canonical(doc))})
                                      .encode())
        else:
            files[CHECKPOINT_NAME] = body
    return files


class WalRecoveryTarget:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.executor = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="fuzz-wal")
        # DANUBE_FUZZ_TMP: set by tests/fuzz/run.py, which removes it after the run.
        root = os.environ.get("DANUBE_FUZZ_TMP") or (
            "/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.root = tempfile.mkdtemp(prefix="danube-fuzz-wal-", dir=root)
        self.runs = 0
        # Recovery warns about every damaged file it meets: here that is every input.
        self._log = logging.getLogger("danube.storage")
        self._log_level = self._log.level
        self._log.setLevel(logging.ERROR)

    def close(self):
        self._log.setLevel(self._log_level)
        self.executor.shutdown(wait=True)
        self.loop.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __call__(self, data: bytes):
        self.runs += 1
        directory = os.path.join(self.root, str(self.runs))
        os.mkdir(directory)
        try:
            for name, body in unpack(data).items():
                with open(os.path.join(directory, name), "wb") as f:
                    f.write(body)
            lazy = bool(data[:1]) and data[0] & 0x80    # the first tag byte's top bit
            config = WALConfig(**SMALL, verify_reads=True,
                               validate_sealed="lazy" if lazy else "open")
            self.loop.run_until_complete(asyncio.wait_for(self._recover(directory, config),
                                                          OPEN_TIMEOUT))
        except asyncio.TimeoutError:
            raise Finding(f"recovery did not finish within {OPEN_TIMEOUT} s") from None
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    async def _recover(self, directory, config):
        try:
            wal = await WAL.open(directory, config, executor=self.executor)
        except WALError as exc:
            check(str(exc), f"{type(exc).__name__} without a message")
            return
        try:
            await self._check_prefix(wal)
        finally:
            await wal.close()

    async def _check_prefix(self, wal):
        offset = wal.first_offset
        while offset < wal.next_offset:
            try:
                got = wal.read(offset, 256)
            except WALError as exc:
                check(str(exc), f"{type(exc).__name__} without a message")
                return
            check(got, f"read({offset}) returned nothing below next_offset {wal.next_offset}")
            for off, body in got:
                check(off == offset, f"recovered offset {off} where {offset} was due")
                if bytes(body) != payload(off):
                    raise Finding(f"recovered message {off} is not the one written there")
                offset += 1


@contextlib.contextmanager
def wal_recovery():
    target = WalRecoveryTarget()
    try:
        yield target
    finally:
        target.close()


async def _write_seed(directory, counts, rotate_every, close):
    """A real WAL directory: `counts` appends of batches, rotating every `rotate_every`."""
    wal = await WAL.open(directory, WALConfig(**SMALL))
    for i, k in enumerate(counts):
        first = wal.next_offset
        wal.append([payload(first + j) for j in range(k)])
        if rotate_every and i % rotate_every == rotate_every - 1:
            await wal.rotate()
    if close:
        await wal.close()
        return None
    return wal


def _snapshot(directory):
    files = {}
    for name in os.listdir(directory):
        if name == "wal.lock":
            continue
        try:
            with open(os.path.join(directory, name), "rb") as f:
                files[name] = f.read()
        except FileNotFoundError:
            pass            # the open WAL's checkpoint writer renamed its temporary file
    return files


def wal_seeds():
    """Archives of real WAL directories: closed cleanly, several sealed segments with a
    checkpoint, and one copied while still open (a crash: zero-padded active segment)."""
    loop = asyncio.new_event_loop()
    seeds = []
    try:
        for counts, rotate, close, lazy in (([3, 1, 4], 0, True, False),
                                            ([5, 2, 6, 3, 8, 1, 2], 2, True, True),
                                            ([30, 40, 20], 0, True, True),
                                            ([4, 4, 4], 1, False, False)):
            with tempfile.TemporaryDirectory(prefix="danube-fuzz-seed-") as d:
                wal = loop.run_until_complete(_write_seed(d, counts, rotate, close))
                files = _snapshot(d)
                if wal is not None:
                    loop.run_until_complete(wal.close())
            archive = pack(files, raw_checkpoint=not rotate)
            # The first tag byte's top bit asks for lazy validation of sealed segments.
            seeds.append(bytes((archive[0] | 0x81,)) + archive[1:] if lazy else archive)
    finally:
        loop.close()
    return seeds
