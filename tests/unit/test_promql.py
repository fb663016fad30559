"""danube.promql in-process: upstream's arithmetic over Prometheus answers (sums truncated
per sample, the first sample, label maps, errors counted as zero and listed), label escaping,
and the HTTP client's refusals (an answer over its bound, not JSON, an error status, nothing
listening) against a small local HTTP server standing in for the faults a real Prometheus
does not produce (tests/e2e/test_admin_ui_api.py and test_admin_mcp.py use a real one)."""

import http.server
import json
import threading

import pytest

from danube.promql import client as promclient
from danube.promql.client import PromError, PrometheusClient
from danube.promql.queries import Queries, label


class Answers:
    """A stand-in query_instant: a fixed answer (or exception) per query."""

    def __init__(self, answers):
        self.answers = answers
        self.asked = []

    async def query_instant(self, query):
        self.asked.append(query)
        value = self.answers.get(query, [])
        if isinstance(value, Exception):
            raise value
        return value


def sample(value, **labels):
    return {"metric": labels, "value": [1.0, str(value)]}


def test_label_values_are_escaped():
    assert label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


async def test_sums_truncate_each_sample_and_errors_count_as_zero():
    q = Queries(Answers({"a": [sample(1.9), sample(2.9)], "b": PromError("down"),
                         "c": [sample("NaN"), sample(3)]}))
    errors = []
    assert await q.sum_int("a", errors) == 3          # 1 + 2, as upstream's `v as u64`
    assert await q.sum_float("a", errors) == pytest.approx(4.8)
    assert await q.sum_int("b", errors) == 0
    assert await q.sum_int("c", errors) == 3
    assert await q.one_float("c", errors) == 0.0       # NaN shows as 0
    assert errors == ["down"]


async def test_broker_connections_count_only_the_given_topics():
    q = Queries(Answers({
        'sum(danube_broker_rpc_total{broker="b1"})': [sample(42)],
        'danube_topic_active_producers{broker="b1"}': [sample(1, topic="/d/a"),
                                                      sample(5, topic="/d/other")],
        'danube_topic_active_consumers{broker="b1"}': [sample(2, topic="/d/a")]}))
    stats, errors = await q.broker_connections("b1", {"/d/a"})
    assert stats == {"rpc_total": 42, "active_connections": 3} and errors == []


async def test_reliable_figures_only_with_wal_activity():
    q = Queries(Answers({}))
    assert await q.reliable("/d/t", []) is None
    q = Queries(Answers({'sum(danube_wal_append_total{topic="/d/t"})': [sample(7)]}))
    figures = await q.reliable("/d/t", [])
    assert figures["wal_append_total"] == 7 and figures["cloud_upload_objects_total"] == 0


async def test_raw_lists_each_sample():
    q = Queries(Answers({"up": [sample(1, job="danube")]}))
    assert await q.raw("up") == 'Query: up\nResults:\n  {job="danube"} => 1\n'
    assert await Queries(Answers({})).raw("none") == "Query: none\nResults:\n  (no data)\n"


@pytest.fixture
def server():
    """A local HTTP server answering each request with the (status, body) set on it."""
    state = {"status": 200, "body": b"{}"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(state["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(state["body"])))
            self.end_headers()
            self.wfile.write(state["body"])

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{srv.server_address[1]}"
    yield state
    srv.shutdown()
    srv.server_close()


async def test_client_reads_a_vector(server):
    server["body"] = json.dumps({"status": "success", "data": {
        "resultType": "vector", "result": [sample(3, topic="/d/t")]}}).encode()
    assert await PrometheusClient(server["url"]).query_instant("x") == [
        sample(3, topic="/d/t")]


async def test_client_refuses_an_answer_over_its_bound(server, monkeypatch):
    monkeypatch.setattr(promclient, "MAX_RESPONSE_BYTES", 1000)
    server["body"] = b'{"status": "success", "data": {"result": []}}' + b" " * 1000
    with pytest.raises(PromError, match="larger than 1000 bytes"):
        await PrometheusClient(server["url"]).query_instant("x")


@pytest.mark.parametrize("status, body, words", [
    (200, b"<html>", "not JSON"),
    (400, b'{"status": "error", "error": "parse error at char 3"}', "HTTP 400: parse error"),
    (200, b'{"status": "error", "error": "bad data"}', "query failed: bad data")])
async def test_client_names_what_went_wrong(server, status, body, words):
    server["status"], server["body"] = status, body
    with pytest.raises(PromError, match=words):
        await PrometheusClient(server["url"]).query_range("x", 1, 2, "15s")


async def test_client_without_prometheus():
    with pytest.raises(PromError, match="unreachable"):
        await PrometheusClient("http://127.0.0.1:9", timeout=2).query_instant("up")


def test_client_refuses_a_url_without_scheme():
    with pytest.raises(ValueError, match="expected http"):
        PrometheusClient("localhost:9090")
