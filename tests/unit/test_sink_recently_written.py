"""The sink runtime's memory of what it wrote lately (danube/connect/sink.py): the copies the
broker sends again are recognised, and it never holds more than its limit."""

from danube.connect.sink import RecentlyWritten


def test_it_remembers_what_was_added():
    written = RecentlyWritten(4)
    written.add([("/default/t-part-0", 7)])
    assert ("/default/t-part-0", 7) in written
    assert ("/default/t-part-1", 7) not in written
    assert ("/default/t-part-0", 8) not in written


def test_it_holds_its_limit_forgetting_the_oldest_first():
    written = RecentlyWritten(3)
    for offset in range(10):
        written.add([("p", offset)])
        assert len(written) == min(offset + 1, 3)
    assert [("p", o) in written for o in range(10)] == [False] * 7 + [True] * 3


def test_a_batch_larger_than_the_limit_keeps_its_newest():
    written = RecentlyWritten(4)
    written.add([("p", o) for o in range(10)])
    assert len(written) == 4
    assert [("p", o) in written for o in range(10)] == [False] * 6 + [True] * 4
