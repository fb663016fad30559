"""The web console's parts in-process: its forms, the topic table's paging, the list
cache, and the app over a fake backend driven as ASGI (no broker, no browser: the browser
tests against a real broker are tests/e2e/test_admin_console.py)."""

import asyncio
import json

import pytest

from danube.client import errors
from danube.console import forms, listing
from danube.console.app import build_app
from danube.console.backend import readable_definition, totals
from danube.console.cache import TtlCache
from danube.proto import DanubeAdmin_pb2 as adm

# -- forms ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name, namespace, full", [
    ("orders", "default", "/default/orders"), ("orders", "", "/default/orders"),
    (" orders ", "/shop/", "/shop/orders"), ("/shop/orders", "ignored", "/shop/orders")])
def test_a_topic_name_is_made_whole(name, namespace, full):
    assert forms.topic_name(name, namespace) == full


@pytest.mark.parametrize("name, words", [
    ("", "required"), ("/shop", "/namespace/topic"), ("/a/b/c", "/namespace/topic"),
    ("a/b", "topic alone")])
def test_a_malformed_topic_name_is_refused(name, words):
    with pytest.raises(forms.FormError, match=words):
        forms.topic_name(name, "default")


def test_the_create_form():
    assert forms.create_topic({"name": "t", "partitions": "", "dispatch_strategy": "reliable",
                               "schema_subject": " s "}) == {
        "name": "/default/t", "partitions": 0, "reliable": True, "schema_subject": "s"}
    with pytest.raises(forms.FormError, match="partitions: 'x' is not a whole number"):
        forms.create_topic({"name": "t", "partitions": "x"})
    with pytest.raises(forms.FormError, match="dispatch strategy"):
        forms.create_topic({"name": "t", "dispatch_strategy": "sometimes"})


def test_the_failure_policy_form():
    form = {"max_redelivery_count": "3", "ack_timeout_ms": "100",
            "base_redelivery_delay_ms": "0", "max_redelivery_delay_ms": "9",
            "backoff_strategy": "Exponential", "poison_policy": "dead-letter",
            "dead_letter_topic": "/default/dlq"}
    policy = forms.failure_policy(form)
    assert adm.SubscriptionFailurePolicy(**policy) == adm.SubscriptionFailurePolicy(
        max_redelivery_count=3, ack_timeout_ms=100, max_redelivery_delay_ms=9,
        backoff_strategy=adm.Exponential, poison_policy=adm.DeadLetter,
        dead_letter_topic="/default/dlq")
    for field, value, words in (("max_redelivery_count", "-1", "out of range"),
                                ("ack_timeout_ms", "", "not a whole number"),
                                ("poison_policy", "ignore", "poison policy"),
                                ("backoff_strategy", "linear", "backoff")):
        with pytest.raises(forms.FormError, match=words):
            forms.failure_policy(dict(form, **{field: value}))


# -- the topic table -----------------------------------------------------------------------

def rows(n):
    return [{"name": f"/ns/t{i:05d}", "namespace": "ns", "delivery": "Reliable",
             "msg_rate_in": float(i % 7), "messages_in": i, "backlog": (i * 37) % 101,
             "subscriptions": 1, "producers": 1, "consumers": i % 2, "bytes_in": 0,
             "byte_rate_in": 0.0, "broker_id": "1", "schema_subject": None}
            for i in range(n)]


def test_a_page_of_ten_thousand_topics():
    all_rows = rows(10_000)
    page = listing.page_of(all_rows, listing.Query({}))
    assert (page["matched"], page["pages"], page["first"], page["last"]) == (10_000, 100, 1,
                                                                             100)
    assert [r["name"] for r in page["rows"]][:2] == ["/ns/t00000", "/ns/t00001"]
    last = listing.page_of(all_rows, listing.Query({"page": "999", "per": "300"}))
    assert (last["page"], last["first"], last["last"]) == (34, 9_901, 10_000)
    hot = listing.page_of(all_rows, listing.Query({"sort": "backlog", "desc": "1"}))
    backlogs = [r["backlog"] for r in hot["rows"]]
    assert backlogs == sorted(backlogs, reverse=True) and backlogs[0] == 100
    found = listing.page_of(all_rows, listing.Query({"q": "T0999"}))
    assert found["matched"] == 10 and found["rows"][0]["name"] == "/ns/t09990"
    nothing = listing.page_of(all_rows, listing.Query({"q": "zzz", "sort": "evil"}))
    assert (nothing["matched"], nothing["first"], nothing["rows"]) == (0, 0, [])


def test_query_links_keep_the_view():
    q = listing.Query({"q": "a b", "sort": "backlog", "desc": "1", "per": "50"})
    assert q.args(page=2) == "q=a%20b&sort=backlog&desc=1&page=2&per=50"
    assert listing.Query({}).args() == ""


# -- the cache -------------------------------------------------------------------------------

async def test_the_cache_shares_one_call_and_expires():
    calls = []

    async def load():
        calls.append(1)
        await asyncio.sleep(0.01)
        return len(calls)
    # 1 s: the hit right after the first load must not expire first on a slow machine.
    cache = TtlCache(1.0)
    assert await asyncio.gather(*(cache.get("k", load) for _ in range(5))) == [1] * 5
    assert await cache.get("k", load) == 1
    await asyncio.sleep(1.05)                  # time passing is the condition here
    assert await cache.get("k", load) == 2
    cache.clear()
    assert await cache.get("k", load) == 3


async def test_a_failed_call_is_not_cached():
    attempts = []

    async def load():
        attempts.append(1)
        if len(attempts) == 1:
            raise errors.Unavailable("down")
        return "up"
    cache = TtlCache(10)
    with pytest.raises(errors.Unavailable):
        await cache.get("k", load)
    assert await cache.get("k", load) == "up"


def test_schema_definitions_are_unwrapped():
    wrapped = json.dumps({"JsonSchema": {"raw_schema": '{"type":"object"}', "fingerprint": "x"}})
    assert readable_definition(wrapped.encode()) == '{\n  "type": "object"\n}'
    proto = json.dumps({"Protobuf": {"raw_proto": "message M {}", "message_name": "M"}})
    assert readable_definition(proto.encode()) == "message M {}"
    assert readable_definition(b'"String"') == "(string: no definition)"


# -- the app over a fake backend -------------------------------------------------------------

class FakeBackend:
    endpoint = "http://broker.invalid:50051"

    def __init__(self, topics=(), fail=None):
        self.topics = list(topics)
        self.fail = fail
        self.created = []

    async def namespace_topics(self, namespace):
        if self.fail:
            raise self.fail
        return self.topics

    async def create_topic(self, **fields):
        self.created.append(fields)

    async def close(self):
        pass


async def call(app, method, path, body=b"", headers=()):
    """One request to an ASGI app: (status, headers, body)."""
    path, _, query = path.partition("?")
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": query.encode(), "root_path": "", "scheme": "http",
             "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 1), "http_version": "1.1",
             "headers": [(b"host", b"127.0.0.1:8080"), *headers]}
    sent, answer = [], {}

    async def receive():
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)

    async def send(message):
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = dict(message["headers"])
        elif message["type"] == "http.response.body":
            answer["body"] = answer.get("body", b"") + message.get("body", b"")
    await app(scope, receive, send)
    return answer["status"], answer["headers"], answer.get("body", b"").decode()


async def test_ten_thousand_topics_render_one_page():
    app = build_app(FakeBackend(rows(10_000)))
    status, _, body = await call(app, "GET", "/namespaces/ns")
    assert status == 200 and body.count("<tr data-topic=") == 100
    assert "10,000 topics" in body and "page 1 of 100" in body
    status, _, body = await call(app, "GET", "/namespaces/ns?live=1&page=100")
    assert status == 200 and not body.startswith("<!doctype")
    assert "/ns/t09999" in body and "/ns/t09899" not in body
    status, headers, body = await call(app, "GET", "/api/namespaces/ns/topics?per=10000")
    data = json.loads(body)
    assert headers[b"content-type"] == b"application/json" and len(data["rows"]) == 10_000
    assert data["totals"] == totals(rows(10_000))


@pytest.mark.parametrize("exc, status", [
    (errors.Unavailable("list topics of ns: UNAVAILABLE: connection refused"), 503),
    (errors.DeadlineExceeded("list topics of ns: DEADLINE_EXCEEDED: late"), 504),
    (errors.NotFound("list topics of ns: NOT_FOUND: no namespace ns"), 404),
    (errors.InternalError("list topics of ns: INTERNAL: oops"), 502)])
async def test_a_broker_error_is_a_page_naming_the_endpoint(exc, status):
    app = build_app(FakeBackend(fail=exc))
    got, _, body = await call(app, "GET", "/namespaces/ns")
    assert got == status and str(exc) in body and "http://broker.invalid:50051" in body
    got, _, body = await call(app, "GET", "/api/namespaces/ns/topics")
    assert got == status and json.loads(body)["error"] == str(exc)


async def test_forms_post_from_the_console_only():
    backend = FakeBackend()
    app = build_app(backend)
    status, _, _ = await call(app, "POST", "/create-topic", b"name=t",
                              [(b"origin", b"http://elsewhere.example")])
    assert status == 403 and backend.created == []
    status, headers, _ = await call(app, "POST", "/create-topic", b"name=t&partitions=2",
                                    [(b"origin", b"http://127.0.0.1:8080")])
    assert status == 303 and headers[b"location"].startswith(b"/topics/default/t?notice=")
    assert backend.created == [{"name": "/default/t", "partitions": 2, "reliable": False,
                                "schema_subject": None}]


async def test_an_unknown_page_is_a_404_page():
    status, _, body = await call(build_app(FakeBackend()), "GET", "/nowhere")
    assert status == 404 and "no such page: /nowhere" in body


async def test_cors_lets_the_named_origin_read_the_api():
    app = build_app(FakeBackend(rows(3)), cors_allow_origin="http://dash.example")
    _, headers, _ = await call(app, "GET", "/api/namespaces/ns/topics",
                               headers=[(b"origin", b"http://dash.example")])
    assert headers[b"access-control-allow-origin"] == b"http://dash.example"
    _, headers, _ = await call(app, "GET", "/api/namespaces/ns/topics",
                               headers=[(b"origin", b"http://other.example")])
    assert b"access-control-allow-origin" not in headers
    _, headers, _ = await call(build_app(FakeBackend(rows(3))), "GET",
                               "/api/namespaces/ns/topics",
                               headers=[(b"origin", b"http://dash.example")])
    assert b"access-control-allow-origin" not in headers


@pytest.mark.parametrize("argv, env, endpoint", [
    (["admin", "serve"], None, "http://127.0.0.1:50051"),
    (["admin", "serve"], "http://env:1", "http://env:1"),
    (["admin", "--endpoint", "http://global:2", "serve"], "http://env:1", "http://global:2"),
    (["admin", "--endpoint", "http://global:2", "serve", "--broker-endpoint", "http://b:3"],
     None, "http://b:3")])
def test_the_console_s_broker_endpoint(monkeypatch, argv, env, endpoint):
    from danube.cli.admin.serve import broker_endpoint
    from danube.cli.main import build_parser
    if env:
        monkeypatch.setenv("DANUBE_ADMIN_ENDPOINT", env)
    else:
        monkeypatch.delenv("DANUBE_ADMIN_ENDPOINT", raising=False)
    assert broker_endpoint(build_parser().parse_args(argv)) == endpoint
