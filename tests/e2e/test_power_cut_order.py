"""The order of a sync job's calls, under a power cut (tests/support/power_cut.py): the WAL runs
in a child process under the sync-recording shim, makes one or two rotations without a sync
between them, and is killed with SIGKILL at a chosen point of the sync job that follows; the
directory is then rebuilt from what was synced.

* Killed just after a segment's fdatasync returned: every append of that segment and of the
  ones before it survives (they were all made before the job began). A new segment's data
  counts only with its directory entry, so the job syncs the directory before the new
  segments (a job that synced the directory last lost a whole new segment: one run of
  test_power_cut.py's interval test caught that).
* Killed just before or after the directory's sync: the WAL opens again holding a prefix of
  what was appended, and takes appends after it.
"""

import json
import os
import subprocess
import sys

import pytest

from danube.storage import WAL, WALConfig
from power_cut import PowerCut

CHILD = r"""
import asyncio, json, os, signal, sys
from danube.storage import WAL, WALConfig
from danube.storage.wal import group_commit

directory, mode, rotations, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
names = []                                  # the segments' file names, once armed
real_fdatasync, real_fsync_dir = group_commit._fdatasync, group_commit.fsync_dir

def fdatasync(fd):
    real_fdatasync(fd)
    name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    if name in names and kill_at == "after %d" % names.index(name):
        os.kill(os.getpid(), signal.SIGKILL)

def fsync_dir(path):
    if names and kill_at == "before directory":
        os.kill(os.getpid(), signal.SIGKILL)
    real_fsync_dir(path)
    if names and kill_at == "after directory":
        os.kill(os.getpid(), signal.SIGKILL)

group_commit._fdatasync, group_commit.fsync_dir = fdatasync, fsync_dir

async def main():
    config = WALConfig(durability=mode, sync_interval_ms=600_000, segment_max_bytes=4096,
                       segment_initial_bytes=1024)
    wal = await WAL.open(directory, config)
    for _ in range(20):
        wal.append([b"m%d" % wal.next_offset + b"x" * 100])
    await wal.sync_to()                     # segment 0 and its entry: durable
    while len(wal.segments()) < 1 + rotations:      # no await: the sync worker waits
        wal.append([b"m%d" % wal.next_offset + b"x" * 100])
    for _ in range(5):
        wal.append([b"m%d" % wal.next_offset + b"x" * 100])
    segments = wal.segments()
    names.extend(os.path.basename(info.path) for info in segments)
    print(json.dumps([[info.first_offset, info.last_offset] for info in segments]), flush=True)
    await wal.sync_to()
    print("not killed", flush=True)

asyncio.run(main())
"""


def run_until_killed(tmp_path, mode, rotations, kill_at):
    """The child's segments [(first, last offset)] when the job began, and the WAL's
    directory after the cut."""
    cut = PowerCut(tmp_path / "data", tmp_path / "cut")
    wal_dir = os.path.join(cut.root, "wal")
    env = {**os.environ, **cut.arm()}
    child = subprocess.run([sys.executable, "-P", "-c", CHILD, wal_dir, mode, str(rotations),
                            kill_at], capture_output=True, text=True, env=env, timeout=120)
    assert child.returncode == -9, (child.returncode, child.stdout, child.stderr)
    segments = json.loads(child.stdout)
    assert len(segments) == 1 + rotations
    cut.cut()
    return wal_dir, segments


async def reopened_prefix(wal_dir, mode):
    """Open the WAL after the cut: it must hold m0, m1, ... up to its next offset, and take
    an append after them. Returns that next offset."""
    wal = await WAL.open(wal_dir, WALConfig(durability=mode))
    try:
        kept = wal.next_offset
        got = wal.read(0, kept + 1)
        assert [p.split(b"x")[0] for _, p in got] == [b"m%d" % o for o in range(kept)]
        assert wal.append([b"after"]) == (kept, kept)
    finally:
        await wal.close()
    return kept


@pytest.mark.parametrize("mode,rotations,synced", [
    ("interval", 1, 1), ("always", 1, 1), ("interval", 1, 0),
    ("interval", 2, 1), ("interval", 2, 2), ("always", 2, 2)])
async def test_what_a_returned_sync_covered_survives(tmp_path, mode, rotations, synced):
    """Killed after the fdatasync of segment `synced` (0: the one sealed by the first
    rotation, whose entry was durable; then the new ones)."""
    wal_dir, segments = run_until_killed(tmp_path, mode, rotations, f"after {synced}")
    covered = segments[synced][1] + 1
    kept = await reopened_prefix(wal_dir, mode)
    assert kept >= covered, (
        f"{covered - kept} of {covered} appends in segments whose sync returned were lost "
        f"(segments {segments}, the cut after the sync of segment {synced})")


@pytest.mark.parametrize("rotations", [1, 2])
@pytest.mark.parametrize("kill_at", ["before directory", "after directory"])
async def test_a_cut_around_the_directory_s_sync_leaves_a_prefix(tmp_path, kill_at, rotations):
    wal_dir, segments = run_until_killed(tmp_path, "interval", rotations, kill_at)
    # Segment 0 (sealed, its entry durable) is synced before the directory.
    assert await reopened_prefix(wal_dir, "interval") >= segments[0][1] + 1
