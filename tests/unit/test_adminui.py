"""danube.adminui's routing and checks in-process: upstream's route table on the raw path
(fixed segments first, a parameter one encoded segment), upstream's topic normalisation,
the status mapping of a broker's errors, and the console cache's bound the UI API shares.
The API against a real broker: tests/e2e/test_admin_ui_api.py."""

import asyncio
import json

import pytest

from danube.adminui import actions, reads
from danube.adminui.app import match
from danube.adminui.http import BadRequest, code_name, map_error
from danube.client import errors
from danube.console.cache import TtlCache
from danube.rpc import StatusCode


def routes(*segments):
    return [(m, h) for m, h, _ in match(list(segments))]


def test_fixed_segments_win_over_parameters():
    assert routes("topics", "actions") == [("POST", actions.topic_actions)]
    assert routes("topics", "/default/orders") == [("GET", reads.topic)]
    assert routes("topics", "/default/orders", "series") == [("GET", reads.topic_series)]
    assert routes("cluster", "raft", "actions") == [("POST", actions.raft_actions)]
    assert routes("topics", "") == []
    assert routes("nothing") == []


@pytest.mark.parametrize("text, namespace, name", [
    ("/default/orders", None, "/default/orders"), ("default/orders", None, "/default/orders"),
    (" orders ", "shop", "/shop/orders"), ("/ns/a_b-c", None, "/ns/a_b-c")])
def test_topic_normalisation(text, namespace, name):
    assert actions.normalize_topic(text, namespace) == name


@pytest.mark.parametrize("text, namespace, words", [
    ("orders", None, "missing namespace"), ("/a/b/c", None, "should be /namespace/topic"),
    ("/ns/a b", None, "should be /namespace/topic"), ("a/b/c", "x", "should be")])
def test_topic_normalisation_refuses(text, namespace, words):
    with pytest.raises(BadRequest, match=words):
        actions.normalize_topic(text, namespace)


@pytest.mark.parametrize("code, status, name", [
    (StatusCode.INVALID_ARGUMENT, 400, "InvalidArgument"),
    (StatusCode.UNAUTHENTICATED, 401, "Unauthenticated"),
    (StatusCode.PERMISSION_DENIED, 403, "PermissionDenied"),
    (StatusCode.NOT_FOUND, 404, "NotFound"), (StatusCode.DEADLINE_EXCEEDED, 504,
                                              "DeadlineExceeded"),
    (StatusCode.ALREADY_EXISTS, 502, "AlreadyExists"), (StatusCode.UNAVAILABLE, 502,
                                                        "Unavailable")])
def test_broker_errors_map_as_upstream(code, status, name):
    response = map_error(errors.DanubeError(f"{code.name}: it went wrong", code))
    assert response.status_code == status
    assert json.loads(response.body) == {"error": "it went wrong", "code": name}
    assert code_name(code) == name


async def test_the_cache_is_bounded():
    cache = TtlCache(60, max_entries=3)
    for i in range(5):
        await cache.get(i, lambda i=i: asyncio.sleep(0, result=i))
    assert list(cache._entries) == [2, 3, 4]
    cache.drop(3)
    assert list(cache._entries) == [2, 4]
