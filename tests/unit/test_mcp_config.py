"""The MCP server's config file (upstream's mcp-config.yml): what loads, and each refusal
naming its reason (the server refuses to start with it: tests/e2e/test_admin_mcp.py)."""

import pytest

from danube.mcp_server.config import ConfigError, McpConfig


def load(tmp_path, text):
    path = tmp_path / "mcp-config.yml"
    path.write_text(text)
    return McpConfig.from_file(str(path))


def test_upstreams_example_loads(tmp_path):
    config = load(tmp_path, """
broker_endpoint: http://127.0.0.1:50051
prometheus_url: http://localhost:9090
deployment:
  type: docker
  docker:
    brokers:
      - id: broker1
        container: danube-broker1
    other:
      - id: etcd
        container: danube-etcd
resources:
  docs_dir: ./info
""")
    assert config.broker_endpoint == "http://127.0.0.1:50051"
    assert config.has_log_access() and config.deployment["type"] == "docker"


def test_minimal_has_no_log_access():
    config = McpConfig.minimal("http://b:50051")
    assert not config.has_log_access() and config.prometheus_url == "http://localhost:9090"


@pytest.mark.parametrize("text, words", [
    ("deployment: {type: local}", "missing field `broker_endpoint`"),
    ("broker_endpoint: x\ndeployment: {type: podman}", "one of docker, kubernetes, local"),
    ("broker_endpoint: x\ndeployment: {type: docker}", "requires 'docker' configuration"),
    ("broker_endpoint: x\ndeployment: {type: docker, docker: {brokers: []}}",
     "at least one broker"),
    ("broker_endpoint: x\ndeployment: {type: kubernetes, kubernetes: {namespace: n}}",
     "'broker_service' or 'broker_selector'"),
    ("broker_endpoint: x\ndeployment: {type: local, local: {log_dir: /no/such/dir, "
     "brokers: [{id: a, log_file: a.log}]}}", "does not exist"),
    ("broker_endpoint: x\nprometheus_url: [1]", "must be a string"),
    ("- a list", "mapping at the top"),
    ("broker_endpoint: [unclosed", "Failed to parse")])
def test_refusals_name_the_reason(tmp_path, text, words):
    with pytest.raises(ConfigError, match=words):
        load(tmp_path, text)


def test_a_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="Failed to read config file"):
        McpConfig.from_file(str(tmp_path / "none.yml"))
