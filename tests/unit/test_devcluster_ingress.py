"""danube.devcluster.ingress: the HAProxy configuration of proxy mode. HAProxy itself runs it
in tests/e2e/test_cluster_ingress.py (after `haproxy -c`); here, its shape and its checks."""

import pytest

from danube.devcluster.ingress import HEADER, backend_name, haproxy_config


def test_one_route_per_broker_and_any_broker_without_the_header():
    urls = ["http://10.0.0.11:6650", "http://10.0.0.12:6650"]
    text = haproxy_config("0.0.0.0:6650", urls)
    assert "bind 0.0.0.0:6650 proto h2" in text
    for i, url in enumerate(urls):
        name = backend_name(url)
        assert f"acl to_b{i} req.hdr({HEADER}) -m str {url}" in text
        assert f"use_backend danube_any if to_b{i} !b{i}_up health_check" in text
        assert f"use_backend {name} if to_b{i}" in text
        assert f"backend {name}\n    server b{i} {url[7:]}" in text
    assert "default_backend danube_any" in text
    any_backend = text.split("\nbackend danube_any", 1)[1].split("\nbackend broker_", 1)[0]
    assert all(f"server b{i} {u[7:]}" in any_backend for i, u in enumerate(urls))


@pytest.mark.parametrize("urls, message", [
    ([], "at least one broker"),
    (["http://10.0.0.11"], "expected [http://]HOST:PORT"),
    (["http://10.0.0.11:6650; rm -rf /"], "expected [http://]HOST:PORT"),
])
def test_bad_broker_urls_are_refused(urls, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        haproxy_config("127.0.0.1:6650", urls)
