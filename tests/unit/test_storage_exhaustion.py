"""A full disk and the descriptor limit in the WAL and the log manager, for real: a small
tmpfs mounted by the test (root; skipped otherwise) and a lowered RLIMIT_NOFILE. Refusals are
typed (DiskFullError, DescriptorLimitError), leave nothing torn, leave the WAL usable, and
map to RESOURCE_EXHAUSTED; `danube produce` counts each message once."""

import errno
import os
import resource
import subprocess
import types

import pytest

from danube.broker import errors as be
from danube.cli.produce import Report
from danube.rpc import StatusCode
from danube.services.errors import to_rpc_error
from danube.storage import WAL, WALConfig
from danube.storage.errors import DescriptorLimitError, DiskFullError, WALError
from danube.storage.exhaustion import STATE, exhausted

PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def volume(tmp_path):
    mnt = tmp_path / "vol"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def free(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def ballast(path, leave):
    """A file that leaves exactly ``leave`` bytes (whole pages) of the volume free."""
    f = path / "ballast"
    with open(f, "wb") as out:
        out.write(b"\xff" * (free(path) - leave))
    assert free(path) == leave
    return f


# -- a full disk ------------------------------------------------------------------------------

async def test_full_disk_refuses_typed_and_the_wal_goes_on(volume):
    config = WALConfig(durability="always", segment_initial_bytes=64 << 10,
                       segment_max_bytes=1 << 20)
    wal = await WAL.open(volume / "t", config)
    try:
        weight = ballast(volume, 32 << 10)
        acked = []
        refusal = None
        for i in range(2000):
            try:
                first, last = wal.append([b"%06d" % i + b"x" * 1000])
            except DiskFullError as exc:
                refusal = exc
                break
            await wal.sync_to(last)
            acked.append(i)
        assert refusal is not None and acked
        assert isinstance(refusal.__cause__, OSError)
        assert refusal.__cause__.errno == errno.ENOSPC
        assert refusal.mount_point == str(volume) and refusal.free_bytes is not None
        assert str(volume) in str(refusal) and "bytes free" in str(refusal)
        assert STATE.disk_full_now() is refusal
        # Refused again while full; the WAL is not failed, its offsets did not move.
        nxt = wal.next_offset
        with pytest.raises(DiskFullError):
            wal.append([b"%06d" % 99999 + b"x" * 1000])
        assert wal.next_offset == nxt
        weight.unlink()
        first, last = wal.append([b"%06d" % 5000 + b"x" * 1000])
        await wal.sync_to(last)
        assert first == nxt
        assert STATE.disk_full is None
    finally:
        await wal.close()
    # Recovery finds every acknowledged append and nothing torn.
    wal = await WAL.open(volume / "t", config)
    try:
        assert wal.recovery.dropped_bytes == 0
        got = [int(p[:6]) for _, p in wal.read(0, 10_000)]
        assert got == acked + [5000]
    finally:
        await wal.close()


async def test_checkpoint_that_finds_the_disk_full_does_not_fail_the_wal(volume):
    # Segments of exactly 16 frames of 4 KiB: the sealed one keeps all its pages, and the
    # next one takes the last free pages, so the checkpoint after the rotation cannot be
    # written. The WAL must go on (the checkpoint is a hint), not refuse appends for good.
    size = 64 << 10
    config = WALConfig(durability="always", segment_initial_bytes=size,
                       segment_max_bytes=size)
    wal = await WAL.open(volume / "t", config)
    try:
        body = 4096 - 16
        for i in range(16):
            await wal.sync_to(wal.append([bytes([i + 1]) * body])[1])
        ballast(volume, size)
        first, last = wal.append([b"\x11" * body])      # rotates into the last free pages
        await wal.sync_to(last)
        assert len(wal.segments()) == 2
        await wal.sync_to(wal.append([b"\x12" * body])[1])       # the pass after it
        await wal.sync_to(wal.append([b"\x13" * body])[1])
        assert wal.read(16, 10)[-1][1] == b"\x13" * body
    finally:
        await wal.close()


# -- the descriptor limit ---------------------------------------------------------------------

async def test_descriptor_limit_opening_a_log_is_typed(tmp_path):
    from danube.storage.logs import LogManager

    cfg = types.SimpleNamespace(
        wal_root=str(tmp_path / "wal"), data_dir=str(tmp_path), durable=None,
        write_buffer=None, wal_sync_interval_ms=5, wal_segment_max_bytes=1 << 20,
        wal_segment_max_hours=None, wal_cache_capacity=1000,
        durability_for=lambda name: "always")
    logs = LogManager(cfg, None)
    await logs.start()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    opened = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 24,
                                                    hard))
        with pytest.raises(DescriptorLimitError) as caught:
            for n in range(100):
                opened.append(await logs.open(f"/default/t{n}"))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        exc = caught.value
        assert exc.__cause__.errno == errno.EMFILE
        assert "RLIMIT_NOFILE soft" in str(exc) and "ulimit -n" in str(exc)
        assert "LimitNOFILE=" in str(exc)
        assert opened
        # With descriptors back, the same topic opens.
        opened.append(await logs.open(f"/default/t{len(opened)}"))
    finally:
        for log in opened:
            await log.close()
        await logs.close()


def test_exhausted_leaves_other_errors_alone(tmp_path):
    assert exhausted(OSError(errno.EIO, "I/O error"), str(tmp_path)) is None
    assert exhausted(ValueError("x"), str(tmp_path)) is None
    err = exhausted(OSError(errno.EDQUOT, "Disk quota exceeded"), str(tmp_path / "a" / "b"))
    assert isinstance(err, DiskFullError) and "quota" in str(err)
    STATE.space_back()


# -- the one error mapping --------------------------------------------------------------------

def test_storage_errors_map_to_status_codes(tmp_path):
    full = exhausted(OSError(errno.ENOSPC, "No space left on device"), str(tmp_path))
    STATE.space_back()
    fds = exhausted(OSError(errno.EMFILE, "Too many open files"), str(tmp_path))
    cases = [(full, be.DiskFull, StatusCode.RESOURCE_EXHAUSTED),
             (fds, be.DescriptorLimit, StatusCode.RESOURCE_EXHAUSTED),
             (OSError(errno.EIO, "Input/output error"), be.StorageFailed,
              StatusCode.UNAVAILABLE),
             (WALError("closed"), be.StorageFailed, StatusCode.UNAVAILABLE)]
    for exc, cls, code in cases:
        err = be.storage_error(exc, "could not store the messages on /default/t")
        assert type(err) is cls
        rpc = to_rpc_error(err)
        assert rpc.code == code
        assert "Errno" not in str(rpc)


# -- danube produce's count -------------------------------------------------------------------

def test_produce_report_counts_each_message_once(capsys):
    args = types.SimpleNamespace(count=10, output="json")
    report = Report(args)
    report.start()
    for i in range(1, 5):
        report.result(i, i * 100)
    failure = RuntimeError("RESOURCE_EXHAUSTED: disk full")
    for i in range(1, 11):          # send_many reports a batch's error for every message
        report.result(i, failure)
    report.finish()
    lines = capsys.readouterr().out.splitlines()
    import json
    objs = [json.loads(line) for line in lines]
    assert objs[-1]["sent"] == 4 and objs[-1]["failed"] == 6
    assert sorted(o["index"] for o in objs[:-1]) == list(range(1, 11))
