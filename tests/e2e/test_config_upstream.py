"""Configuration files written for upstream Danube load here: every key upstream documents
(its sample, secure, docker and test configs, and its loader's older spellings) is read or,
for features this build does not have, named in one warning line; a key no upstream file
knows fails with a suggestion; upstream's secure file (`auth.mode: tls` with a JWT secret)
serves TLS with a token required on every call, and tls mode without any JWT key fails
closed; a backend whose SDK is missing fails with the command that installs it."""

import pathlib
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from broker_process import BrokerProcess
from danube.config import ConfigError, load_config
from danube.config_keys import unbuilt_warning
from ports import free_port

UPSTREAM_WRITE_BUFFER_YML = (pathlib.Path(__file__).parent / "upstream_configs"
                             / "danube_broker_write_buffer.yml")

# Every key of upstream's config/danube_broker.yml (commented-out ones included), with
# values of our own so that a key read from the wrong place shows.
FULL = """
cluster_name: "TEST_CLUSTER"
broker:
  host: "127.0.0.1"
  ports:
    client: 0
    admin: 0
    raft: 7650
    prometheus: 0
  advertised_listeners:
    broker_url: "broker-0.internal:6650"
    connect_url: "proxy.example.com:6650"
meta_store:
  data_dir: "{data}/raft"
  seed_nodes: ["127.0.0.1:7650"]
bootstrap_namespaces: ["default", "extra_ns"]
auto_create_topics: false
admin_tls: false
auth:
  mode: none
  tls: {{cert_file: a.pem, key_file: b.pem, ca_file: c.pem}}
  jwt: {{secret_key: "s", issuer: "danube-auth", expiration_time: 3600}}
  super_admins: ["admin"]
load_manager:
  assignment_strategy: "fair"
  load_report_interval_seconds: 30
  rebalancing:
    enabled: false
    aggressiveness: "balanced"
    check_interval_seconds: 300
    max_moves_per_hour: 10
    cooldown_seconds: 60
    min_brokers_for_rebalance: 2
    min_topic_age_seconds: 300
    blacklist_topics: []
storage:
  mode: local
  local_wal_root: "{data}/wal-x"
  metadata_prefix: "/danube-x"
  local_retention: {{time_minutes: 60, size_mb: 512, check_interval_minutes: 2}}
  wal:
    rotation: {{max_bytes: 1048576, max_hours: 24}}
    advanced:
      cache_capacity: 77
      file_sync: {{interval_ms: 1234, max_batch_bytes: 10485760}}
  write_buffer:
    backend: valkey
    endpoints: ["redis://127.0.0.1:6379"]
    wait_replicas: 0
    wait_timeout_ms: 100
    on_wait_timeout: fail
    max_cached_closed_segments: 5
dispatch:
  max_unacked_messages: 42
policies:
  max_producers_per_topic: 1
  max_subscriptions_per_topic: 2
  max_consumers_per_topic: 3
  max_consumers_per_subscription: 4
  max_publish_rate: 5
  max_subscription_dispatch_rate: 6
  max_message_size: 52428800
"""


def _write(tmp_path, text, name="broker.yml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_every_documented_key_loads_and_lands_where_it_belongs(tmp_path):
    cfg = load_config(_write(tmp_path, FULL.format(data=tmp_path))).validate()
    assert cfg.cluster_name == "TEST_CLUSTER"
    assert (cfg.host, cfg.client_port, cfg.admin_port, cfg.prom_port) == ("127.0.0.1", 0, 0, 0)
    assert cfg.broker_url == "broker-0.internal:6650"
    assert cfg.connect_url == "proxy.example.com:6650"
    assert cfg.data_dir == f"{tmp_path}/raft"
    assert cfg.bootstrap_namespaces == ["default", "extra_ns"]
    assert cfg.auto_create_topics is False
    assert (cfg.assignment_strategy, cfg.load_report_interval_seconds) == ("fair", 30)
    assert cfg.jwt["issuer"] == "danube-auth" and cfg.super_admins == ["admin"]
    assert cfg.wal_root == f"{tmp_path}/wal-x" and cfg.metadata_prefix == "/danube-x"
    assert (cfg.retention_time_minutes, cfg.retention_size_mb,
            cfg.retention_check_interval_minutes) == (60, 512, 2)
    assert (cfg.wal_segment_max_bytes, cfg.wal_segment_max_hours) == (1048576, 24)
    assert (cfg.wal_cache_capacity, cfg.wal_sync_interval_ms) == (77, 1234)
    assert cfg.max_unacked_messages == 42
    p = cfg.policies
    assert (p.max_producers_per_topic, p.max_subscriptions_per_topic,
            p.max_consumers_per_topic, p.max_consumers_per_subscription, p.max_publish_rate,
            p.max_subscription_dispatch_rate) == (1, 2, 3, 4, 5, 6)
    # Upstream's docker config allows 50 MB messages: the transport cap follows the policy.
    assert p.max_message_size == 52428800
    assert cfg.grpc_max_message_size > p.max_message_size


def test_unbuilt_features_are_named_in_one_warning_line(tmp_path):
    cfg = load_config(_write(tmp_path, FULL.format(data=tmp_path)))
    line = unbuilt_warning(cfg.unbuilt_keys)
    assert "\n" not in line
    for key in ("broker.ports.raft", "meta_store.seed_nodes",
                "storage.wal.advanced.file_sync.max_batch_bytes"):
        assert key in line
    # Keys that are read are not in it.
    assert "policies" not in line and "auth" not in line and "rebalancing" not in line
    assert "write_buffer" not in line
    wb = cfg.write_buffer       # upstream's write buffer section, read
    assert (wb.backend, wb.endpoints, wb.wait_replicas, wb.wait_timeout_ms, wb.on_wait_timeout,
            wb.max_cached_closed_segments) == ("valkey", ("redis://127.0.0.1:6379",), 0, 100,
                                               "fail", 5)
    r = cfg.rebalancing         # upstream's values in FULL, which are also its defaults
    assert (r.enabled, r.aggressiveness, r.check_interval_seconds, r.max_moves_per_hour,
            r.cooldown_seconds, r.min_brokers_for_rebalance, r.min_topic_age_seconds,
            r.blacklist_topics) == (False, "balanced", 300, 10, 60, 2, 300, ())


@pytest.mark.parametrize("durable, expected", [
    ("""backend: s3
        root: "s3://my-bucket/danube"
        region: "us-east-1"
        endpoint: "http://127.0.0.1:9000"
        access_key: "ak"
        secret_key: "sk"
        session_token: "tok"
        role_arn: "arn:aws:iam::1:role/r"
        anonymous: false
        virtual_host_style: false""",
     dict(backend="s3", bucket="my-bucket", prefix="danube", session_token="tok",
          role_arn="arn:aws:iam::1:role/r", anonymous=False, path_style=True)),
    ("""backend: s3
        root: "s3://b/p"
        profile: "default"
        virtual_host_style: true""", dict(profile="default", path_style=False)),
    ("""backend: gcs
        root: "gcs://my-bucket/danube"
        project: "my-gcp-project"
        credentials_path: "/path/to/credentials.json\"""",
     dict(backend="gcs", bucket="my-bucket", project="my-gcp-project",
          credentials_file="/path/to/credentials.json")),
    ("""backend: gcs
        root: "gcs://my-bucket/danube"
        credentials_json: '{"type":"service_account"}'""",
     dict(credentials_json='{"type":"service_account"}')),
    ("""backend: azblob
        root: "my-container/danube"
        endpoint: "https://acct.blob.core.windows.net"
        account_name: "acct"
        account_key: "a2V5\"""",
     dict(backend="azblob", bucket="my-container", prefix="danube", account_name="acct")),
])
def test_upstream_durable_sections_load(tmp_path, durable, expected):
    body = "\n".join("    " + line.strip() for line in durable.splitlines())
    path = _write(tmp_path, f"storage:\n  mode: object_store\n  durable:\n{body}\n")
    cfg = load_config(path)
    for field, value in expected.items():
        assert getattr(cfg.durable, field) == value, field


def test_upstream_older_spellings_are_read(tmp_path):
    # Upstream's loader accepts these aliases: storage.root / cache_root for the WAL root,
    # metadata_root, shared_fs's own `root`, the `object_store` section, wal.dir,
    # wal.retention, wal.cache_capacity, wal.file_sync and wal.advanced.rotation.
    cfg = load_config(_write(tmp_path, """
        storage:
          mode: shared_fs
          root: /mnt/shared
          cache_root: /var/wal
          metadata_root: /meta
          wal:
            cache_capacity: 5
            file_sync: {interval_ms: 250}
            retention: {time_minutes: 9}
            advanced: {rotation: {max_bytes: 4096}}
        """))
    assert cfg.durable.backend == "fs" and cfg.durable.path == "/mnt/shared"
    assert cfg.wal_root == "/var/wal" and cfg.metadata_prefix == "/meta"
    assert (cfg.wal_cache_capacity, cfg.wal_sync_interval_ms) == (5, 250)
    assert cfg.retention_time_minutes == 9 and cfg.wal_segment_max_bytes == 4096
    cfg = load_config(_write(tmp_path, """
        storage:
          mode: object_store
          root: /ignored-by-object-store
          wal: {dir: /wal-dir}
          object_store: {backend: s3, root: "s3://b/p", anonymous: true}
        """))
    assert cfg.durable.bucket == "b" and cfg.durable.anonymous is True
    assert cfg.wal_root == "/ignored-by-object-store"


@pytest.mark.parametrize("text, where, suggestion", [
    ("polices:\n  max_message_size: 10\n", "polices", "'policies'"),
    ("storage:\n  wal:\n    rotation:\n      max_byte: 10\n",
     "storage.wal.rotation.max_byte", "'max_bytes'"),
    ("broker:\n  ports:\n    clinet: 6650\n", "broker.ports.clinet", "'client'"),
    ("max_message_size: 10\n", "max_message_size", "'policies.max_message_size'"),
    ("auth:\n  super_admin: [a]\n", "auth.super_admin", "'super_admins'"),
    ("storage:\n  mode: object_store\n  durable:\n    backend: s3\n    root: s3://b\n"
     "    acess_key: a\n", "storage.durable.acess_key", "'access_key'"),
    ("storage:\n  mode: object_store\n  durable:\n    backend: s3\n    root: s3://b\n"
     "    virtual_hosted_style: true\n", "storage.durable.virtual_hosted_style",
     "'virtual_host_style'"),
])
def test_a_misspelt_key_fails_with_a_suggestion(tmp_path, text, where, suggestion):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text))
    message = str(err.value)
    assert f"{where}: unknown key" in message and f"did you mean {suggestion}" in message


def test_a_write_buffer_key_is_checked_for_typos(tmp_path):
    with pytest.raises(ConfigError, match=r"storage.write_buffer.backnd: unknown key "
                                          r"\(did you mean 'backend'\?\)"):
        load_config(_write(tmp_path, "storage:\n  write_buffer:\n    backnd: x\n"))


@pytest.mark.parametrize("section, message", [
    ("backend: memcached", "backend: expected valkey or redis"),
    ("endpoints: []", "endpoints: expected a list of URLs"),
    ("endpoints: ['http://h:6379']", "is not a redis:// or rediss:// URL"),
    ("wait_replicas: -1", "wait_replicas: expected an integer from 0"),
    ("wait_timeout_ms: 'soon'", "wait_timeout_ms: expected an integer"),
    ("on_wait_timeout: retry", "on_wait_timeout: expected fail or ack, got 'retry'"),
    ("max_cached_closed_segments: 1.5", "max_cached_closed_segments: expected an integer"),
    ("max_pending_bytes: 10", "max_pending_bytes: expected an integer from 1048576"),
])
def test_write_buffer_values_are_checked(tmp_path, section, message):
    with pytest.raises(ConfigError, match=r"^storage\.write_buffer\.") as err:
        load_config(_write(tmp_path, f"storage:\n  write_buffer: {{{section}}}\n"))
    assert message in str(err.value)


def test_upstream_write_buffer_config_loads(tmp_path):
    """Upstream's config/for_tests/danube_broker_write_buffer.yml, as it is."""
    cfg = load_config(str(UPSTREAM_WRITE_BUFFER_YML))
    cfg.validate()
    assert cfg.write_buffer.endpoints == ("redis://127.0.0.1:6379",)
    assert cfg.write_buffer.wait_replicas == 0 and cfg.write_buffer.on_wait_timeout == "fail"
    assert cfg.storage_mode == "local"


@pytest.mark.parametrize("text, mode, message", [
    ("meta_store: {etcd_endpoints: ['h:2379']}\n", "standalone", "needs --mode cluster"),
    ("meta_store: {etcd_endpoints: ['nohost']}\n", "cluster", "expected HOST:PORT"),
    ("meta_store: {etcd_endpoints: 5}\n", "cluster", "a list of HOST:PORT"),
    ("meta_store: {lease_ttl_seconds: 0.5}\n", "cluster", "1 to 3600 seconds"),
    ("meta_store: {lease_ttl_seconds: 'x'}\n", "cluster", "expected a number"),
    ("load_manager: {assignment_strategy: random}\n", "cluster",
     "fair, balanced or weighted_load"),
    ("load_manager: {load_report_interval_seconds: 0}\n", "cluster", "positive number"),
    ("load_manager: {rebalancing: {enabled: 1}}\n", "cluster", "enabled: expected true"),
    ("load_manager: {rebalancing: {aggressiveness: wild}}\n", "cluster",
     "conservative, balanced or aggressive"),
    ("load_manager: {rebalancing: {check_interval_seconds: 0}}\n", "cluster",
     "check_interval_seconds: expected a positive number"),
    ("load_manager: {rebalancing: {cooldown_seconds: -1}}\n", "cluster",
     "cooldown_seconds: expected a non-negative number"),
    ("load_manager: {rebalancing: {max_moves_per_hour: 2.5}}\n", "cluster",
     "max_moves_per_hour: expected an integer of at least 0"),
    ("load_manager: {rebalancing: {min_brokers_for_rebalance: 0}}\n", "cluster",
     "at least 1"),
    ("load_manager: {rebalancing: {blacklist_topics: [default/x]}}\n", "cluster",
     "'/namespace/\\*' patterns"),
    ("load_manager: {rebalancing: 5}\n", "cluster", "expected a mapping"),
    ("meta_store: {etcd_endpoints: ['ftp://h:1']}\n", "cluster", "expected http:// or https"),
    ("meta_store: {etcd_endpoints: ['http://h:1', 'https://h:2']}\n", "cluster",
     "mix http:// and https://"),
    ("meta_store: {etcd_endpoints: ['http://h:1'], etcd_tls: {}}\n", "cluster",
     "etcd_tls is set but"),
    ("meta_store: {etcd_tls: {cert_file: /etc/hostname}}\n", "cluster", "go together"),
    ("meta_store: {etcd_tls: {ca_file: /nonexistent.pem}}\n", "cluster",
     "etcd_tls.ca_file: no such file: /nonexistent.pem"),
    ("meta_store: {etcd_tls: {ca_file: 5}}\n", "cluster", "expected a file path"),
    ("meta_store: {etcd_tls: {ca_fil: x}}\n", "cluster", "did you mean 'ca_file'"),
    ("meta_store: {etcd_auth: {password: x}}\n", "cluster", "etcd_auth.user: expected"),
    ("meta_store: {etcd_auth: {user: u, password: 5}}\n", "cluster",
     "etcd_auth.password: expected"),
])
def test_cluster_keys_are_checked(tmp_path, text, mode, message):
    with pytest.raises(ConfigError, match=message):
        cfg = load_config(_write(tmp_path, text))
        cfg.mode = mode
        cfg.validate()


def test_cluster_keys_load(tmp_path):
    cfg = load_config(_write(tmp_path, """\
        meta_store: {etcd_endpoints: ["10.0.0.1:2379", "http://10.0.0.2:2379"],
                     lease_ttl_seconds: 3}
        load_manager: {assignment_strategy: weighted_load, load_report_interval_seconds: 5}
        storage: {failover: lossy_local_wal}
        """))
    cfg.mode = "cluster"
    cfg.validate()
    assert cfg.etcd_endpoints == ["10.0.0.1:2379", "http://10.0.0.2:2379"]
    assert (cfg.lease_ttl_seconds, cfg.assignment_strategy,
            cfg.load_report_interval_seconds) == (3, "weighted_load", 5)
    assert unbuilt_warning(cfg.unbuilt_keys) is None


ETCD = "meta_store: {etcd_endpoints: ['127.0.0.1:2379']}\n"
S3_TIER = "  mode: shared_fs\n  durable: {backend: fs, root: /tmp/durable}\n"


@pytest.mark.parametrize("storage, failover, durability", [
    # None of the three ways to lose nothing named: acknowledged once in the durable tier.
    (S3_TIER, "uploaded", "uploaded"),
    (S3_TIER + "  wal: {durability: uploaded}\n", "uploaded", "uploaded"),
    (S3_TIER + "  write_buffer: {endpoints: ['redis://127.0.0.1:6379'], wait_replicas: 1}\n",
     "write_buffer", "always"),
    (S3_TIER + "  failover: shared_wal_root\n", "shared_wal_root", "always"),
    (S3_TIER + "  failover: lossy_local_wal\n  wal: {durability: always}\n",
     "lossy_local_wal", "always"),
    ("  failover: lossy_local_wal\n", "lossy_local_wal", "always"),
])
def test_a_cluster_loses_nothing_acknowledged_unless_told(tmp_path, storage, failover,
                                                          durability):
    cfg = load_config(_write(tmp_path, ETCD + "storage:\n" + storage))
    cfg.mode = "cluster"
    cfg.validate()
    assert (cfg.failover, cfg.wal_durability) == (failover, durability)
    assert cfg.failover_is_lossy == (failover == "lossy_local_wal")


@pytest.mark.parametrize("storage, message", [
    ("  mode: local\n", "storage.mode local keeps a topic's messages on its owner's disk"),
    (S3_TIER + "  wal: {durability: always}\n", "durability always acknowledges a message "
                                                "before it leaves its owner's disk"),
    (S3_TIER + "  failover: uploaded\n  wal: {durability: interval}\n",
     "interval contradicts storage.failover: uploaded"),
    ("  failover: uploaded\n", "needs storage.mode object_store or shared_fs"),
    ("  failover: write_buffer\n", "needs a storage.write_buffer section"),
    ("  failover: maybe\n", "expected write_buffer, uploaded, shared_wal_root, "
                            "lossy_local_wal, got 'maybe'"),
])
def test_a_cluster_that_could_lose_acknowledged_messages_must_say_so(tmp_path, storage,
                                                                     message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        cfg = load_config(_write(tmp_path, ETCD + "storage:\n" + storage))
        cfg.mode = "cluster"
        cfg.validate()


def test_failover_is_not_asked_of_one_broker(tmp_path):
    """Standalone, or cluster mode without etcd (upstream's configs: a one-broker cluster):
    there is no other owner to fail over to."""
    for mode, text in (("standalone", ""), ("cluster", "")):
        cfg = load_config(_write(tmp_path, text))
        cfg.mode = mode
        cfg.validate()
        assert cfg.failover is None and cfg.wal_durability == "always"


def test_transport_cap_set_below_the_policy_is_an_error(tmp_path):
    path = _write(tmp_path, "policies: {max_message_size: 20000000}\n"
                            "grpc: {max_message_size: 16777216}\n")
    with pytest.raises(ConfigError, match="leave grpc.max_message_size out"):
        load_config(path).validate()


# ---------------------------------------------------------------- as a process

def _run(*args, timeout=30):
    return subprocess.run([sys.executable, "-P", "-m", "danube", "broker", *args],
                          capture_output=True, text=True, timeout=timeout)


def _without_write_buffer(text):
    return re.sub(r"\n  write_buffer:\n(    .*\n)+", "\n", text)


def _refused(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_upstream_config_starts_the_broker_in_the_default_cluster_mode(tmp_path):
    """`danube broker --config-file danube_broker.yml`, upstream's own command line: no
    --mode, so cluster mode; without etcd it is a single-node cluster."""
    # The write buffer needs a reachable Redis (test_write_buffer_e2e starts one).
    path = _write(tmp_path, _without_write_buffer(FULL).format(data=tmp_path))
    b = BrokerProcess(data_dir=tmp_path / "unused")
    b.args = ["--config-file", path]
    b.start()
    try:
        import grpc

        from danube.proto import DanubeApi_pb2 as pb
        with grpc.insecure_channel(b.client_addr) as ch:
            check = ch.unary_unary("/danube.HealthCheck/HealthCheck",
                                   request_serializer=pb.HealthCheckRequest.SerializeToString,
                                   response_deserializer=pb.HealthCheckResponse.FromString)
            assert check(pb.HealthCheckRequest(id=1), timeout=5).status == \
                pb.HealthCheckResponse.CLOSE
        log = b.log()
        warnings = [line for line in log.splitlines() if "features this build does not have"
                    in line]
        assert len(warnings) == 1 and "broker.ports.raft" in warnings[0]
        assert "single-node cluster" in log
    finally:
        assert b.stop() == 0


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    import trustme
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    d = tmp_path_factory.mktemp("certs")
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    return d


def _secure_config(tmp_path, certs, port):
    # The shape of upstream's config/danube_broker_secure.yml.
    return _write(tmp_path, f"""
        cluster_name: "MY_CLUSTER"
        broker:
          host: "127.0.0.1"
          ports: {{client: {port}, admin: 0, raft: 7650}}
        meta_store: {{data_dir: "{tmp_path}/raft"}}
        bootstrap_namespaces: ["default"]
        auto_create_topics: true
        auth:
          mode: tls
          tls:
            cert_file: "{certs}/cert.pem"
            key_file: "{certs}/key.pem"
            ca_file: "{certs}/ca.pem"
          jwt: {{secret_key: "your-secret-key", issuer: "danube-auth", expiration_time: 3600}}
          super_admins: ["admin"]
        """, "secure.yml")


def test_upstreams_secure_config_serves_tls_and_requires_a_token(tmp_path, certs):
    import grpc

    from danube.proto import DanubeApi_pb2 as pb
    path = _secure_config(tmp_path, certs, 0)
    b = BrokerProcess(data_dir=tmp_path / "unused")
    b.args = ["--config-file", path]
    b.start()
    try:
        assert "authentication on" in b.log()
        creds = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
        with grpc.secure_channel(b.client_addr, creds) as ch:
            check = ch.unary_unary("/danube.HealthCheck/HealthCheck",
                                   request_serializer=pb.HealthCheckRequest.SerializeToString,
                                   response_deserializer=pb.HealthCheckResponse.FromString)
            with pytest.raises(grpc.RpcError) as info:
                check(pb.HealthCheckRequest(id=1), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert info.value.details() == "Authentication credentials are missing"
    finally:
        assert b.stop() == 0


def test_tls_mode_without_a_jwt_key_fails_closed(tmp_path, certs):
    port = free_port()
    path = _secure_config(tmp_path, certs, port)
    with open(path) as f:
        text = f.read().replace('secret_key: "your-secret-key", ', "")
    assert "secret_key" not in text
    with open(path, "w") as f:
        f.write(text)
    result = _run("--config-file", path)
    assert result.returncode == 2
    assert "neither auth.jwt.secret_key nor auth.jwt.public_key_file" in result.stderr
    assert "--insecure-allow-unauthenticated" in result.stderr
    # Nothing was ever served, so no call could have succeeded unauthenticated.
    assert _refused(port)


def test_tls_mode_with_the_explicit_flag_serves_tls_and_says_so(tmp_path, certs):
    import ssl
    path = _secure_config(tmp_path, certs, 0)
    b = BrokerProcess(data_dir=tmp_path / "unused")
    b.args = ["--config-file", path, "--insecure-allow-unauthenticated"]
    b.start()
    try:
        assert "every call is accepted without a token" in b.log()
        ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        ctx.set_alpn_protocols(["h2"])
        with socket.create_connection(("127.0.0.1", b.client_port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.selected_alpn_protocol() == "h2"
    finally:
        assert b.stop() == 0


def test_mode_none_with_jwt_and_super_admins_starts(tmp_path):
    # Upstream ignores auth.jwt and super_admins when mode is none.
    path = _write(tmp_path, """
        broker: {host: 127.0.0.1, ports: {client: 0, admin: 0}}
        auth:
          mode: none
          jwt: {secret_key: k, issuer: i, expiration_time: 60}
          super_admins: [admin]
        """)
    b = BrokerProcess(data_dir=tmp_path / "d")
    b.args = ["--mode", "standalone", "--data-dir", str(tmp_path / "d"), "--config-file", path]
    b.start()
    assert b.stop() == 0


_WITHOUT_BOTO3 = """
import sys
sys.modules["boto3"] = None      # as if the s3 extra were not installed
from danube.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_backend_without_its_sdk_fails_with_the_install_command(tmp_path):
    path = _write(tmp_path, "storage:\n  mode: object_store\n  durable:\n"
                            "    backend: s3\n    root: s3://b/p\n")
    result = subprocess.run(
        [sys.executable, "-P", "-c", _WITHOUT_BOTO3, "broker", "--mode", "standalone",
         "--data-dir", str(tmp_path / "d"), "--config-file", path],
        capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "backend s3 needs the boto3 package, which is not installed" in result.stderr
    assert f"{sys.executable} -m pip install 'boto3>=" in result.stderr
