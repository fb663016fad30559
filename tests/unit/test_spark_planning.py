"""danube-spark's option parsing (offsets JSON, service_url) and batch read planning (ranges
checked against the broker's offsets, splits), without Spark or a broker."""

import pytest

pytest.importorskip("danube_spark", reason="bin/test builds and installs connectors/spark")

from danube_spark.errors import DataLoss, OptionError  # noqa: E402
from danube_spark.options import (EARLIEST, LATEST, ReadOptions, WriteOptions,  # noqa: E402
                                  parse_offsets, service_urls, target)
from danube_spark.planning import PartitionRange, Split, ranges, splits  # noqa: E402

T = "/default/t"
PARTS = [PartitionRange(f"{T}-part-{i}", i, 0, 10 * (i + 1)) for i in range(3)]


def test_offsets_keywords_and_json():
    assert parse_offsets("startingOffsets", None, EARLIEST) == EARLIEST
    assert parse_offsets("startingOffsets", " Earliest ", LATEST) == EARLIEST
    assert parse_offsets("endingOffsets", "latest", EARLIEST) == LATEST
    assert parse_offsets("startingOffsets", '{"/default/t-part-0": 42, "/x": -2}', EARLIEST) \
        == {"/default/t-part-0": 42, "/x": EARLIEST}


@pytest.mark.parametrize("text, fragment", [
    ("{oops", "is not 'earliest', 'latest' or a JSON object"),
    ("[1, 2]", "must be a JSON object"),
    ('{"/t": "5"}', "the offset of '/t' must be an integer"),
    ('{"/t": -3}', "the offset of '/t' must be an integer"),
    ('{"/t": true}', "the offset of '/t' must be an integer"),
    ('{"/t": 1.5}', "the offset of '/t' must be an integer"),
])
def test_bad_offsets_name_the_option_and_the_problem(text, fragment):
    with pytest.raises(OptionError) as info:
        parse_offsets("startingOffsets", text, EARLIEST)
    assert "option startingOffsets" in str(info.value) and fragment in str(info.value)


def test_service_url_forms():
    assert target("http://127.0.0.1:6650") == ("127.0.0.1:6650", False)
    assert target("https://broker.example:443/") == ("broker.example:443", True)
    assert target("localhost:6650") == ("localhost:6650", False)
    with pytest.raises(OptionError, match="service_url 'http://nohost'"):
        target("http://nohost")


def test_service_url_names_one_or_several_brokers():
    assert service_urls("http://a:1") == ["http://a:1"]
    assert service_urls(" http://a:1, http://b:2 ,") == ["http://a:1", "http://b:2"]
    with pytest.raises(OptionError, match="service_url 'b'"):
        service_urls("http://a:1,b")
    with pytest.raises(OptionError, match="option service_url is empty"):
        ReadOptions.parse({"service_url": " , ", "topic": T})


def test_owner_wait_in_milliseconds():
    assert ReadOptions.parse({"service_url": "http://a:1", "topic": T}).owner_wait == 90.0
    opts = WriteOptions.parse({"service_url": "http://a:1,http://b:2", "ownerWaitMs": "2500"})
    assert opts.owner_wait == 2.5
    with pytest.raises(OptionError, match="option ownerWaitMs must be a positive number"):
        ReadOptions.parse({"service_url": "http://a:1", "topic": T, "ownerWaitMs": "-1"})


def test_read_options_required_and_case_insensitive():
    opts = ReadOptions.parse({"SERVICE_URL": "http://h:1", "Topic": T,
                              "startingoffsets": "latest", "maxOffsetsPerSplit": "5",
                              "failOnDataLoss": "false"})
    assert (opts.topic, opts.starting, opts.ending) == (T, LATEST, LATEST)
    assert opts.max_offsets_per_split == 5 and opts.fail_on_data_loss is False
    with pytest.raises(OptionError, match="option service_url is required"):
        ReadOptions.parse({"topic": T})
    with pytest.raises(OptionError, match="option topic is required"):
        ReadOptions.parse({"service_url": "http://h:1"})
    with pytest.raises(OptionError, match="option maxOffsetsPerSplit must be a positive"):
        ReadOptions.parse({"service_url": "http://h:1", "topic": T, "maxOffsetsPerSplit": "0"})
    with pytest.raises(OptionError, match="option failOnDataLoss must be true or false"):
        ReadOptions.parse({"service_url": "http://h:1", "topic": T, "failOnDataLoss": "maybe"})
    assert WriteOptions.parse({"service_url": "http://h:1"}).topic is None
    base = {"service_url": "http://h:1", "topic": T}
    plain = ReadOptions.parse(base)
    assert (plain.max_offsets_per_trigger, plain.starting_given) == (None, False)
    capped = ReadOptions.parse({**base, "maxoffsetspertrigger": "7", "startingOffsets": "{}"})
    assert (capped.max_offsets_per_trigger, capped.starting_given) == (7, True)


def test_earliest_to_latest_is_every_partition_whole():
    planned = ranges(PARTS, EARLIEST, LATEST, True, T)
    assert [(p.topic, s, e) for p, s, e in planned] == \
        [(f"{T}-part-0", 0, 10), (f"{T}-part-1", 0, 20), (f"{T}-part-2", 0, 30)]
    assert splits(planned, 1_000_000) == [Split(f"{T}-part-{i}", i, 0, 10 * (i + 1))
                                          for i in range(3)]


def test_json_offsets_per_partition_and_defaults():
    planned = ranges(PARTS, {f"{T}-part-1": 5}, {f"{T}-part-1": 7, f"{T}-part-2": 99},
                     True, T)
    # Left out: start at the earliest, end at the latest; an end past the latest is capped.
    assert [(s, e) for _, s, e in planned] == [(0, 10), (5, 7), (0, 30)]


def test_unknown_partition_in_json_is_named():
    with pytest.raises(OptionError, match=r"option endingOffsets names /default/t-part-9"):
        ranges(PARTS, EARLIEST, {f"{T}-part-9": 1}, True, T)


def test_start_after_end_is_an_error():
    with pytest.raises(OptionError, match="startingOffsets 8 of /default/t-part-0 is after"):
        ranges(PARTS, {f"{T}-part-0": 8}, {f"{T}-part-0": 4}, True, T)


def test_history_gone_fails_or_skips():
    parts = [PartitionRange(T, 0, 100, 150)]
    with pytest.raises(DataLoss, match=r"offsets \[40, 100\) of /default/t are no longer"):
        ranges(parts, {T: 40}, LATEST, True, T)
    assert [(s, e) for _, s, e in ranges(parts, {T: 40}, LATEST, False, T)] == [(100, 150)]


def test_large_ranges_are_split_and_empty_ones_dropped():
    parts = [PartitionRange(f"{T}-part-0", 0, 0, 25), PartitionRange(f"{T}-part-1", 1, 7, 7)]
    assert splits(ranges(parts, EARLIEST, LATEST, True, T), 10) == [
        Split(f"{T}-part-0", 0, 0, 10), Split(f"{T}-part-0", 0, 10, 20),
        Split(f"{T}-part-0", 0, 20, 25)]
    # Nothing to read still plans one empty split, so Spark has a task.
    assert splits(ranges(parts, LATEST, LATEST, True, T), 10) == [Split(f"{T}-part-0", 0, 25, 25)]


def test_max_offsets_per_trigger_is_shared_by_backlog():
    from danube_spark.planning import cap_offsets
    start = {"a": 0, "b": 10, "c": 5}
    latest = {"a": 30, "b": 20, "c": 5}
    assert cap_offsets(start, latest, None) == latest
    assert cap_offsets(start, latest, 100) == latest
    assert cap_offsets(start, latest, 8) == {"a": 6, "b": 12, "c": 5}
    # Too small a limit to share still moves on, from the largest backlog.
    assert cap_offsets(start, latest, 1) == {"a": 1, "b": 10, "c": 5}
    # A new partition counts from where the caller starts it (its earliest offset).
    assert cap_offsets({"a": 30, "n": 0}, {"a": 30, "n": 4}, 3) == {"a": 30, "n": 3}
