"""danube.storage.wal recovery: reopen, torn and corrupt tails, damaged sealed segments,
checkpoint loss. A crash is simulated by copying the directory of a WAL that is still open
(the copy sees the page cache, like a restart after kill -9 does); the kill -9 test itself
is in test_wal_durability.py."""

import logging
import os
import random
import shutil
import struct

import pytest

from danube.storage._walframes import encode_frames_into, frame_size
from danube.storage import WAL, CorruptSegmentError, WALConfig

SMALL = dict(segment_max_bytes=4096, segment_initial_bytes=1024)


def cfg(**kw):
    return WALConfig(**{"durability": "none", **SMALL, **kw})


def payload(off):
    """Non-empty, no zero bytes: every byte of a torn payload counts as dropped."""
    n = (off * 7919) % 200 + 1
    return bytes((off + i) % 251 + 1 for i in range(n))


async def build(path, n_messages, config=None, close=True):
    wal = await WAL.open(path, config or cfg())
    rnd = random.Random(n_messages)
    while wal.next_offset < n_messages:
        first = wal.next_offset
        k = min(rnd.randint(1, 12), n_messages - first)
        wal.append([payload(first + i) for i in range(k)])
    infos = wal.segments()
    if close:
        await wal.close()
        return infos
    return wal, infos


async def check_log(path, first, next_offset, config=None, **kw):
    """Reopen ``path``; the log must hold exactly payload(first..next_offset-1)."""
    wal = await WAL.open(path, config or cfg(validate_sealed="open", verify_reads=True), **kw)
    try:
        assert (wal.first_offset, wal.next_offset) == (first, next_offset)
        got = wal.read(first, next_offset - first + 1)
        assert [o for o, _ in got] == list(range(first, next_offset))
        assert all(p == payload(o) for o, p in got)
        return wal.recovery
    finally:
        await wal.close()


def frame_ends(info):
    ends, pos = [], 0
    for off in range(info.first_offset, info.last_offset + 1):
        pos += frame_size(len(payload(off)))
        ends.append(pos)
    return ends


# ---------------------------------------------------------------- reopen

async def test_reopen_continues_offsets(tmp_path):
    rnd = random.Random(5)
    nxt = 0
    for cycle in range(6):
        wal = await WAL.open(tmp_path, cfg())
        assert wal.next_offset == nxt
        assert wal.durable_offset == nxt - 1
        for _ in range(rnd.randint(1, 30)):
            first = wal.next_offset
            wal.append([payload(first + i) for i in range(rnd.randint(1, 8))])
        if cycle % 2:
            await wal.rotate()
        nxt = wal.next_offset
        await wal.close()
    report = await check_log(tmp_path, 0, nxt)
    assert report.dropped_bytes == 0 and report.checkpoint_used


async def test_crash_leaves_a_clean_zero_tail(tmp_path, caplog):
    wal, infos = await build(tmp_path / "live", 500, close=False)
    try:
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")
        active = tmp_path / "crashed" / os.path.basename(infos[-1].path)
        assert os.path.getsize(active) > infos[-1].size      # preallocated zero tail
    finally:
        await wal.close()
    with caplog.at_level(logging.INFO, logger="danube.storage.wal"):
        report = await check_log(tmp_path / "crashed", 0, 500)
    assert (report.dropped_bytes, report.dropped_status) == (0, None)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_handmade_segment_with_zero_tail(tmp_path):
    payloads = [payload(o) for o in range(10)]
    buf = bytearray(sum(frame_size(len(p)) for p in payloads) + 5000)
    encode_frames_into(buf, 0, 0, payloads)
    (tmp_path / f"wal.{0:020d}.log").write_bytes(buf)
    report = await check_log(tmp_path, 0, 10)
    assert report.dropped_bytes == 0 and not report.checkpoint_used


# ---------------------------------------------------------------- torn and corrupt tails

async def test_torn_tail_at_random_points(tmp_path, caplog):
    infos = await build(tmp_path / "base", 400)
    last = infos[-1]
    assert len(infos) > 5 and last.size > 1000
    ends = frame_ends(last)
    name = os.path.basename(last.path)
    data = (tmp_path / "base" / name).read_bytes()
    rnd = random.Random(7)
    cuts = {0, last.size - 1, last.size - 15, last.size - 16, last.size - 17, ends[-2]}
    cuts |= {rnd.randrange(last.size) for _ in range(30)}
    for i, cut in enumerate(sorted(cuts)):
        d = tmp_path / f"cut{i}"
        shutil.copytree(tmp_path / "base", d)
        os.truncate(d / name, cut)
        kept = sum(1 for e in ends if e <= cut)
        valid_end = ends[kept - 1] if kept else 0
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="danube.storage.wal"):
            report = await check_log(d, 0, last.first_offset + kept)
        dropped = len(data[valid_end:cut].rstrip(b"\0"))
        assert report.dropped_bytes == dropped
        assert bool(caplog.records) == bool(dropped)
        if dropped:
            assert f"dropped {dropped} bytes" in caplog.text and name in caplog.text
        # Appending after recovery continues right after the last good frame, and leaves
        # nothing of the torn frame behind.
        wal = await WAL.open(d, cfg())
        nxt = wal.next_offset
        wal.append([payload(nxt + j) for j in range(3)])
        await wal.close()
        report = await check_log(d, 0, nxt + 3)
        assert report.dropped_bytes == 0


@pytest.mark.parametrize("where", ["offset", "length", "crc", "payload-first", "payload-last"])
async def test_corrupt_byte_in_last_frame(tmp_path, where):
    infos = await build(tmp_path, 300)
    last = infos[-1]
    start = frame_ends(last)[-2]
    at = {"offset": 0, "length": 9, "crc": 13, "payload-first": 16,
          "payload-last": last.size - start - 1}[where]
    with open(last.path, "r+b") as f:
        f.seek(start + at)
        b = f.read(1)
        f.seek(start + at)
        f.write(bytes([b[0] ^ 0x40]))
    report = await check_log(tmp_path, 0, 299)          # exactly the last frame is lost
    assert report.dropped_bytes == last.size - start
    assert report.dropped_status in ("corrupt", "torn", "offset gap")


async def test_corrupt_frame_inside_last_segment(tmp_path):
    infos = await build(tmp_path, 300)
    last = infos[-1]
    ends = frame_ends(last)
    k = len(ends) // 2
    with open(last.path, "r+b") as f:
        f.seek(ends[k - 1] + 20)
        f.write(b"\x00")
    # The damaged frame and everything after it in the tail goes; nothing before.
    report = await check_log(tmp_path, 0, last.first_offset + k)
    assert report.dropped_status == "corrupt"


async def test_garbage_after_a_zero_hole(tmp_path):
    payloads = [payload(o) for o in range(5)]
    n = sum(frame_size(len(p)) for p in payloads)
    buf = bytearray(n + 4096)
    encode_frames_into(buf, 0, 0, payloads)
    buf[n + 100:n + 300] = b"\xab" * 200       # page written back, the one before it not
    (tmp_path / f"wal.{0:020d}.log").write_bytes(buf)
    report = await check_log(tmp_path, 0, 5)
    assert (report.dropped_bytes, report.dropped_status) == (300, "clean")


# ---------------------------------------------------------------- sealed segments

def damage(path, pos):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))


async def test_damaged_sealed_segment_is_an_error(tmp_path):
    infos = await build(tmp_path, 300)
    seg = infos[1]
    ends = frame_ends(seg)
    damage(seg.path, ends[2] + 20)                      # inside the 4th frame's payload
    bad = seg.first_offset + 3
    with pytest.raises(CorruptSegmentError) as ei:
        await WAL.open(tmp_path, cfg(validate_sealed="open"))
    err = ei.value
    assert (err.path, err.offset, err.position) == (seg.path, bad, ends[2])
    assert os.path.basename(seg.path) in str(err) and f"offset {bad}" in str(err)
    # Lazy validation (the default): open succeeds, the damage surfaces on the first read of
    # that segment, and the files are left alone.
    wal = await WAL.open(tmp_path, cfg())
    try:
        assert wal.recovery.lazy_segments == len(infos) - 1
        assert wal.read(0, 5) == [(o, payload(o)) for o in range(5)]
        with pytest.raises(CorruptSegmentError) as ei:
            wal.read(seg.first_offset, 1)
        assert ei.value.offset == bad
        assert wal.read(infos[2].first_offset, 1) == [(infos[2].first_offset,
                                                        payload(infos[2].first_offset))]
    finally:
        await wal.close()
    assert os.path.getsize(seg.path) == seg.size


async def test_truncated_sealed_segment_is_an_error_at_open(tmp_path):
    infos = await build(tmp_path, 300)
    seg = infos[2]
    os.truncate(seg.path, seg.size - 5)       # size no longer matches the checkpoint
    with pytest.raises(CorruptSegmentError) as ei:
        await WAL.open(tmp_path, cfg())
    assert ei.value.path == seg.path and ei.value.offset == seg.last_offset


async def test_missing_middle_segment_is_a_gap(tmp_path):
    infos = await build(tmp_path, 300)
    os.unlink(infos[2].path)
    with pytest.raises(CorruptSegmentError, match="starts at offset") as ei:
        await WAL.open(tmp_path, cfg())
    assert ei.value.offset == infos[2].first_offset


def lose_tail_after_rotation(infos, keep, last_content):
    """A machine crash just after a rotation, as the disk can leave it: the last sealed
    segment kept only its first ``keep`` frames (a zero tail after them: its preallocated
    size reached the disk), and the new segment after it holds ``last_content``."""
    sealed, last = infos[-2], infos[-1]
    size = os.path.getsize(sealed.path)
    os.truncate(sealed.path, frame_ends(sealed)[keep - 1])
    os.truncate(sealed.path, size + 2048)
    with open(last.path, "wb") as f:
        f.write(last_content(last.first_offset))
    return sealed.first_offset + keep


def torn_first_frame(base):
    buf = bytearray(frame_size(len(payload(base))))
    encode_frames_into(buf, 0, base, [payload(base)])
    return bytes(buf[:-1]) + bytes(1024)


@pytest.mark.parametrize("last_content", [lambda base: b"", lambda base: bytes(1024),
                                          torn_first_frame],
                         ids=["no bytes", "preallocated zeros", "a torn first frame"])
@pytest.mark.parametrize("more", [0, 2])
async def test_empty_last_segments_after_a_lost_tail_are_removed(tmp_path, last_content, more,
                                                                 caplog):
    infos = await build(tmp_path, 300)
    end = lose_tail_after_rotation(infos, 5, last_content)
    # More rotations before the crash: segments that got their entries and nothing else.
    extra = [tmp_path / f"wal.{infos[-1].first_offset + 7 * k:020d}.log"
             for k in range(1, more + 1)]
    for path in extra:
        path.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="danube.storage.wal"):
        await check_log(tmp_path, 0, end)
    names = [os.path.basename(infos[-1].path)] + [p.name for p in extra]
    assert not any(os.path.exists(tmp_path / name) for name in names)
    assert f"removed {', '.join(names)}, empty and after the end of the log" in caplog.text
    # The segment before is the active one again: appends continue after what it kept.
    wal = await WAL.open(tmp_path, cfg())
    try:
        wal.append([payload(end + i) for i in range(40)])
    finally:
        await wal.close()
    await check_log(tmp_path, 0, end + 40)


async def test_an_empty_last_segment_right_after_the_log_is_kept(tmp_path):
    """A rotation just made (or a crash right after it): the log goes on in the new one."""
    wal, infos = await build(tmp_path, 300, close=False)
    await wal.rotate()
    empty = os.path.join(tmp_path, f"wal.{300:020d}.log")
    await wal.close()
    assert os.path.exists(empty)
    await check_log(tmp_path, 0, 300)
    assert os.path.exists(empty)


async def test_a_last_segment_with_frames_after_a_lost_tail_is_a_gap(tmp_path):
    infos = await build(tmp_path, 300)
    last = infos[-1]
    with open(last.path, "rb") as f:
        content = f.read()
    lose_tail_after_rotation(infos, 5, lambda base: content)
    with pytest.raises(CorruptSegmentError, match="starts at offset"):
        await WAL.open(tmp_path, cfg())
    assert os.path.exists(last.path)


async def test_sealed_zero_tail_is_trimmed(tmp_path):
    infos = await build(tmp_path, 300)
    with open(infos[1].path, "ab") as f:     # a seal whose truncation never hit the disk
        f.write(bytes(3000))
    report = await check_log(tmp_path, 0, 300, config=cfg())
    assert report.trimmed_bytes == 3000
    assert os.path.getsize(infos[1].path) == infos[1].size


# ---------------------------------------------------------------- segments with a second name
#
# The fs object store keeps an uploaded segment as a hard link to the WAL's file. Recovery
# changes files in place (trims a zero tail, reopens the last one for appends); it must first
# give the file an inode of its own, or it would change the uploaded object.

async def test_reopening_a_linked_last_segment_leaves_the_other_name_alone(tmp_path):
    infos = await build(tmp_path / "wal", 300)
    last = infos[-1]
    store = tmp_path / "store.seg"
    os.link(last.path, store)
    before = store.read_bytes()
    wal = await WAL.open(tmp_path / "wal", cfg())
    try:
        assert os.stat(last.path).st_nlink == 1
        for off in range(300, 400):
            wal.append([payload(off)])
    finally:
        await wal.close()
    assert store.read_bytes() == before and os.stat(store).st_nlink == 1
    await check_log(tmp_path / "wal", 0, 400)
    assert not [n for n in os.listdir(tmp_path / "wal") if n.endswith(".tmp")]


async def test_trimming_a_linked_sealed_segment_leaves_the_other_name_alone(tmp_path):
    infos = await build(tmp_path / "wal", 300)
    with open(infos[1].path, "ab") as f:     # a seal whose truncation never hit the disk
        f.write(bytes(3000))
    store = tmp_path / "store.seg"
    os.link(infos[1].path, store)
    before = store.read_bytes()
    report = await check_log(tmp_path / "wal", 0, 300, config=cfg())
    assert report.trimmed_bytes == 3000
    assert os.path.getsize(infos[1].path) == infos[1].size
    assert store.read_bytes() == before


async def test_a_crash_while_unsharing_leaves_no_copy_behind(tmp_path):
    infos = await build(tmp_path, 300)
    leftover = infos[-1].path + ".unshare.tmp"
    shutil.copyfile(infos[-1].path, leftover)
    await check_log(tmp_path, 0, 300)
    assert not os.path.exists(leftover)


@pytest.mark.parametrize("how", ["missing", "garbage", "bad-crc"])
async def test_checkpoint_is_only_a_hint(tmp_path, how, caplog):
    infos = await build(tmp_path, 300)
    ck = tmp_path / "wal.ckpt"
    if how == "missing":
        ck.unlink()
    elif how == "garbage":
        ck.write_bytes(b"{not json")
    else:
        ck.write_bytes(ck.read_bytes().replace(b'"next_offset": 300', b'"next_offset": 999'))
    with caplog.at_level(logging.WARNING, logger="danube.storage.wal"):
        report = await check_log(tmp_path, 0, 300, config=cfg())
    assert not report.checkpoint_used and report.lazy_segments == 0
    assert report.segments == len(infos)
    assert ("ignoring checkpoint" in caplog.text) == (how != "missing")


async def test_checkpoint_keeps_next_offset_without_segments(tmp_path):
    await build(tmp_path, 100)
    for name in os.listdir(tmp_path):
        if name.endswith(".log"):
            os.unlink(tmp_path / name)
    wal = await WAL.open(tmp_path, cfg())
    try:
        assert wal.first_offset == wal.next_offset == 100
        assert wal.append([b"x"]) == (100, 100)
    finally:
        await wal.close()


async def test_stale_checkpoint_tmp_is_removed(tmp_path):
    await build(tmp_path, 50)
    (tmp_path / "wal.ckpt.tmp").write_bytes(b"half written")
    await check_log(tmp_path, 0, 50)
    assert not (tmp_path / "wal.ckpt.tmp").exists()


async def test_recovered_offsets_are_checked_against_names(tmp_path):
    # A segment whose frames do not carry the offset its name says is damaged data.
    payloads = [payload(o) for o in range(3)]
    buf = bytearray(sum(frame_size(len(p)) for p in payloads))
    encode_frames_into(buf, 0, 7, payloads)
    (tmp_path / f"wal.{0:020d}.log").write_bytes(buf)
    report = await check_log(tmp_path, 0, 0)
    assert report.dropped_status == "offset gap" and report.dropped_bytes == len(buf)
    assert struct.unpack_from("<Q", buf)[0] == 7
