"""Where an admin call about a topic served elsewhere is forwarded (services/admin/forward.py):
the owner's registered admin address with its scheme, a wildcard admin host replaced by the
host of the owner's advertised broker URL, and no forwarding of a forwarded call, outside a
cluster, or to an address that cannot be read."""

from types import SimpleNamespace

import pytest

from danube.broker.errors import TopicElsewhere
from danube.config import BrokerConfig
from danube.services.admin.forward import FORWARDED_BY, _target


def elsewhere(admin_addr, broker_url=None):
    exc = TopicElsewhere("served elsewhere")
    exc.admin_addr = admin_addr
    exc.broker_url = broker_url
    return exc


class Context:
    def __init__(self, *metadata):
        self.metadata = list(metadata)

    def invocation_metadata(self):
        return self.metadata


CORE = SimpleNamespace(placement=SimpleNamespace(spans_brokers=True))


@pytest.mark.parametrize("admin_addr, broker_url, expected", [
    ("http://10.0.0.7:50051", "http://10.0.0.7:6650", "http://10.0.0.7:50051"),
    ("https://b1.example:50051", "https://b1.example:6650", "https://b1.example:50051"),
    ("https://0.0.0.0:50051", "https://10.0.0.5:6650", "https://10.0.0.5:50051"),
    ("http://[::]:50051", "http://[fd00::1]:6650", "http://[fd00::1]:50051"),
    ("10.0.0.7:50051", None, "http://10.0.0.7:50051"),
])
def test_the_owners_admin_address(admin_addr, broker_url, expected):
    assert _target(CORE, elsewhere(admin_addr, broker_url), Context()) == expected


@pytest.mark.parametrize("core, exc, context", [
    (CORE, elsewhere("http://10.0.0.7:50051"), Context((FORWARDED_BY, "3"))),
    (SimpleNamespace(placement=SimpleNamespace(spans_brokers=False)),
     elsewhere("http://10.0.0.7:50051"), Context()),
    (CORE, elsewhere(None), Context()),
    (CORE, elsewhere("not an address"), Context()),
    (CORE, elsewhere("http://0.0.0.0:50051", None), Context()),
])
def test_not_forwarded(core, exc, context):
    assert _target(core, exc, context) is None


@pytest.mark.parametrize("auth_mode, admin_tls, scheme", [
    ("none", False, "http"), ("none", True, "http"), ("tls", False, "http"),
    ("tls", True, "https")])
def test_the_registered_admin_scheme_is_what_the_port_serves(auth_mode, admin_tls, scheme):
    cfg = BrokerConfig()
    cfg.auth_mode, cfg.admin_tls = auth_mode, admin_tls
    assert cfg.admin_scheme == scheme
