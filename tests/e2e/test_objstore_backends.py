"""The object-store layer of tiered storage: one conformance suite run against every backend
(memory, fs, and s3/gcs/azblob against SeaweedFS, fake-gcs-server and Azurite on 127.0.0.1),
the start-up probe's errors (bad credentials, missing bucket, unreachable or hung endpoint),
an outage in the middle (server stopped, then started again with its data), and the
``storage.durable`` config parser."""

import concurrent.futures
import hashlib
import os
import socket
import threading
import time

import pytest

import objstore_servers
from danube.config import ConfigError
from danube.storage.durable import (DurableConfig, ObjectExists, ObjectNotFound,
                                    ObjectStoreConfigError, ObjectStoreError,
                                    open_object_store, parse_durable)
from danube.storage.durable.fs import TMP_PREFIX
from danube.storage.durable.memory import MemoryObjectStore
from objstore_servers import Silent, Unreachable, durable_config, make_store, server_for

KINDS = ["memory", "fs", "s3", "gcs", "azblob"]
CLOUD = ["s3", "gcs", "azblob"]
BINARY = bytes(range(256)) * 4 + b"\x00\xff\r\n\x1a"


@pytest.fixture(scope="module", params=KINDS)
def kind(request):
    return request.param


@pytest.fixture
def store(request, kind, tmp_path):
    """A store of ``kind`` under a root prefix of its own."""
    server = server_for(request, kind)
    s = make_store(kind, server, tmp_path=tmp_path, name=request.node.name)
    yield s
    s.close()


# ---------------------------------------------------------------- conformance

def test_check_passes_and_describe_names_the_place(store, kind):
    store.check()
    assert store.backend == kind
    text = store.describe()
    assert kind in text
    if kind in CLOUD:
        assert "127.0.0.1" in text and objstore_servers.BUCKET in text


def test_put_get_head_round_trip_binary(store):
    info = store.put("seg/obj.bin", BINARY)
    assert (info.key, info.size) == ("seg/obj.bin", len(BINARY))
    assert store.get("seg/obj.bin") == BINARY
    head = store.head("seg/obj.bin")
    assert (head.key, head.size) == ("seg/obj.bin", len(BINARY))
    assert head.etag and head.etag == info.etag
    assert store.put("empty", b"").size == 0
    assert store.get("empty") == b""
    assert store.head("empty").size == 0


def test_overwrite_replaces_the_object(store):
    first = store.put("k", b"one")
    second = store.put("k", b"second version")
    assert store.get("k") == b"second version"
    assert store.head("k").size == len(b"second version")
    assert second.etag != first.etag


def test_range_get(store):
    data = bytes(range(100))
    store.put("r", data)
    assert store.get("r", 10, 20) == data[10:20]
    assert store.get("r", 0, 1) == data[:1]
    assert store.get("r", 95) == data[95:]
    assert store.get("r", 90, 1000) == data[90:]       # past the end: cut short
    assert store.get("r", 100) == b""                  # at the end: nothing
    assert store.get("r", 500, 600) == b""
    assert store.get("r", 7, 7) == b""
    with pytest.raises(ValueError):
        store.get("r", 5, 4)


def test_missing_keys(store):
    with pytest.raises(ObjectNotFound):
        store.head("no/such/key")
    with pytest.raises(ObjectNotFound):
        store.get("no/such/key")
    with pytest.raises(ObjectNotFound):
        store.get("no/such/key", 3, 9)
    with pytest.raises(ObjectNotFound):
        store.get("no/such/key", 3, 3)
    store.delete("no/such/key")                        # deleting nothing is fine


def test_list_by_prefix_sorted_and_relative(store):
    keys = ["a/2", "a/1", "a/b/3", "ab/4", "c"]
    for i, key in enumerate(keys):
        store.put(key, b"x" * (i + 1))
    assert [i.key for i in store.list("a/")] == ["a/1", "a/2", "a/b/3"]
    assert [i.key for i in store.list("a")] == ["a/1", "a/2", "a/b/3", "ab/4"]
    assert [i.key for i in store.list("a/b")] == ["a/b/3"]
    everything = store.list("")
    assert [i.key for i in everything] == sorted(keys)
    assert {i.key: i.size for i in everything} == {k: n + 1 for n, k in enumerate(keys)}
    assert store.list("zzz/") == []


def test_delete(store):
    store.put("d/1", b"1")
    store.put("d/2", b"2")
    store.delete("d/1")
    with pytest.raises(ObjectNotFound):
        store.head("d/1")
    assert [i.key for i in store.list("d/")] == ["d/2"]


def test_conditional_put(store):
    store.put("once", b"first", if_absent=True)
    with pytest.raises(ObjectExists):
        store.put("once", b"second", if_absent=True)
    assert store.get("once") == b"first"
    store.put("once", b"forced")                       # unconditional still overwrites
    assert store.get("once") == b"forced"


def test_conditional_put_race_has_one_winner(store):
    barrier = threading.Barrier(4)

    def attempt(i):
        barrier.wait()
        try:
            store.put("race", b"writer %d" % i, if_absent=True)
            return i
        except ObjectExists:
            return None

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(attempt, range(4)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1, results
    assert store.get("race") == b"writer %d" % winners[0]


def test_put_file_uploads_only_size_bytes(store, tmp_path):
    # Larger than the 8 MiB above which Azure stages blocks and GCS uploads resumably.
    path = tmp_path / "segment.wal"
    data = os.urandom(10 << 20)
    path.write_bytes(data + b"\0" * (2 << 20))          # a preallocated tail
    size = len(data) - 12345
    info = store.put_file("segments/0001.seg", str(path), size, if_absent=True)
    assert info.size == size
    assert store.head("segments/0001.seg").size == size
    got = store.get("segments/0001.seg")
    assert hashlib.sha256(got).digest() == hashlib.sha256(data[:size]).digest()
    assert store.get("segments/0001.seg", 5 << 20, (5 << 20) + 4096) == \
        data[5 << 20:(5 << 20) + 4096]
    with pytest.raises(ObjectExists):
        store.put_file("segments/0001.seg", str(path), size, if_absent=True)
    small = store.put_file("segments/small", str(path), 1000)
    assert small.size == 1000 and store.get("segments/small") == data[:1000]
    with pytest.raises(ValueError):
        store.put_file("segments/too-long", str(path), path.stat().st_size + 1)


def test_invalid_keys_are_refused(store):
    for key in ["", "/abs", "a//b", "a/../b", "..", "trailing/", "a/./b"]:
        with pytest.raises(ValueError):
            store.put(key, b"x")


def test_root_prefix_isolates_stores(request, kind, tmp_path):
    server = server_for(request, kind)
    if kind == "fs":
        one = make_store(kind, tmp_path=tmp_path)
        two = make_store(kind, tmp_path=tmp_path)
    else:
        one = make_store(kind, server, name="one")
        two = make_store(kind, server, name="two")
    with one, two:
        one.put("k", b"1")
        two.put("k", b"2")
        assert one.get("k") == b"1" and two.get("k") == b"2"
        assert [i.key for i in one.list("")] == ["k"]


# ---------------------------------------------------------------- start-up probe errors

@pytest.mark.parametrize("kind", ["s3", "azblob"])
def test_bad_credentials_are_a_config_error(request, kind):
    server = server_for(request, kind)
    mapping = objstore_servers.with_bad_credentials(kind, durable_config(kind, server))
    with objstore_servers.store_from_config(mapping) as bad:
        with pytest.raises(ObjectStoreConfigError) as err:
            bad.check()
        message = str(err.value)
        assert kind in message and server.endpoint in message
        assert objstore_servers.BUCKET in message
        assert "access denied" in message
        # Not a retryable outage: the same error on the data path.
        with pytest.raises(ObjectStoreConfigError):
            bad.put("k", b"x")


def test_unknown_s3_access_key_is_named(request):
    server = server_for(request, "s3")
    with make_store("s3", server, access_key="nobody", secret_key="x") as bad:
        with pytest.raises(ObjectStoreConfigError) as err:
            bad.check()
    assert "'nobody'" in str(err.value) and "InvalidAccessKeyId" in str(err.value)


@pytest.mark.parametrize("kind", CLOUD)
def test_missing_bucket_is_a_config_error(request, kind):
    server = server_for(request, kind)
    scheme = {"s3": "s3", "gcs": "gs", "azblob": "azblob"}[kind]
    with make_store(kind, server, root=f"{scheme}://no-such-bucket-42/p") as store:
        with pytest.raises(ObjectStoreConfigError) as err:
            store.check()
        message = str(err.value)
        assert "no-such-bucket-42" in message and "does not exist" in message
        with pytest.raises(ObjectStoreConfigError):
            store.put("k", b"x")


@pytest.mark.parametrize("kind", CLOUD)
def test_unreachable_endpoint_is_retryable_and_fast(kind):
    with Unreachable() as nowhere, make_store(kind, nowhere) as store:
        started = time.monotonic()
        with pytest.raises(ObjectStoreError) as err:
            store.check()
        # Generous for a slow machine, and far below what retries of a 60 s read timeout take.
        assert time.monotonic() - started < 30
    assert not isinstance(err.value, ObjectStoreConfigError)
    assert "127.0.0.1" in str(err.value)


def test_hung_endpoint_check_gives_up_long_before_the_read_timeout():
    """A server that accepts connections and never answers: only the probe's read timeout
    ends check(). The three backends are probed at once to keep the test short."""
    with Silent() as silent:
        # The store's own read timeout is long, as in production; check() caps it.
        stores = [make_store(kind, silent, read_timeout_seconds=60, retries=3)
                  for kind in CLOUD]

        def probe(store):
            started = time.monotonic()
            try:
                store.check()
            except ObjectStoreError as exc:
                return exc, time.monotonic() - started
            return None, time.monotonic() - started

        with concurrent.futures.ThreadPoolExecutor(len(stores)) as pool:
            results = list(pool.map(probe, stores))
        for store in stores:
            store.close()
    for store, (exc, elapsed) in zip(stores, results):
        assert exc is not None and not isinstance(exc, ObjectStoreConfigError), store
        # The probe's caps (2 s connect, 3 s read) end it; generous for a slow machine, and
        # far below the store's own 60 s read timeout times its retries.
        assert elapsed < 30, (store, elapsed)


# ---------------------------------------------------------------- outage

@pytest.mark.parametrize("kind", CLOUD)
def test_outage_then_recovery_keeps_the_data(request, kind):
    server = server_for(request, kind)
    # No SDK retries: each call during the outage fails at once instead of backing off.
    with make_store(kind, server, name=request.node.name, retries=0) as store:
        store.put("before", BINARY)
        server.stop()
        try:
            for op in (lambda: store.put("during", b"x"), lambda: store.get("before"),
                       lambda: store.head("before"), lambda: store.list(""), store.check):
                with pytest.raises(ObjectStoreError) as err:
                    op()
                assert not isinstance(err.value, (ObjectStoreConfigError, ObjectNotFound))
        finally:
            server.start()
        assert store.get("before") == BINARY
        store.put("after", b"y", if_absent=True)
        assert [i.key for i in store.list("")] == ["after", "before"]
        store.check()


def test_memory_outage_switch():
    store = MemoryObjectStore()
    store.put("k", b"v")
    store.set_available(False)
    with pytest.raises(ObjectStoreError):
        store.get("k")
    store.set_available(True)
    assert store.get("k") == b"v"


# ---------------------------------------------------------------- backend specifics

def test_memory_named_stores_are_shared_and_private_ones_are_not():
    name = objstore_servers.unique_name("shared")
    a, b = MemoryObjectStore(name), MemoryObjectStore(name)
    a.put("k", b"v")
    assert b.get("k") == b"v"
    assert MemoryObjectStore().list("") == []
    with pytest.raises(ObjectNotFound):
        MemoryObjectStore().head("k")
    via_config = open_object_store(parse_durable({"backend": "memory", "root": name}))
    assert via_config.get("k") == b"v"


def test_fs_leaves_no_temporary_files_and_creates_its_root(tmp_path):
    root = tmp_path / "not" / "yet"
    store = make_store("fs", root=str(root))
    store.check()
    assert root.is_dir()
    store.put("a/b/c", b"1")
    store.put("a/b/c", b"2")
    with pytest.raises(ObjectExists):
        store.put("a/b/c", b"3", if_absent=True)
    leftovers = [p for p in root.rglob("*") if p.name.startswith(TMP_PREFIX)]
    assert leftovers == []
    assert (root / "a" / "b" / "c").read_bytes() == b"2"


def test_fs_root_that_is_a_file_is_a_config_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ObjectStoreConfigError, match="not a directory"):
        make_store("fs", root=str(tmp_path / "file")).check()


def test_azblob_connection_string_from_the_environment(request):
    server = server_for(request, "azblob")
    conn = (f"DefaultEndpointsProtocol=http;AccountName={server.account_name};"
            f"AccountKey={server.account_key};BlobEndpoint={server.endpoint};")
    cfg = parse_durable({"backend": "azblob", "root": f"azblob://{server.container}/env"})
    with open_object_store(cfg, environ={"AZURE_STORAGE_CONNECTION_STRING": conn}) as store:
        store.check()
        store.put("k", b"v")
        assert store.get("k") == b"v"
        assert server.endpoint in store.describe()


# ---------------------------------------------------------------- storage.durable parsing

@pytest.mark.parametrize("mapping, expected", [
    ({"backend": "s3", "root": "s3://bkt/some/prefix/", "endpoint": "http://127.0.0.1:1",
      "access_key": "a", "secret_key": "s", "region": "eu-west-1"},
     dict(backend="s3", bucket="bkt", prefix="some/prefix", endpoint="http://127.0.0.1:1",
          access_key="a", secret_key="s", region="eu-west-1")),
    ({"backend": "s3", "bucket": "bkt", "prefix": "/p/"},
     dict(backend="s3", bucket="bkt", prefix="p", access_key=None)),
    ({"root": "s3://bkt"}, dict(backend="s3", bucket="bkt", prefix="")),
    ({"backend": "gcs", "root": "gs://g/p", "project": "proj"},
     dict(backend="gcs", bucket="g", prefix="p", project="proj")),
    ({"root": "gcs://g/p", "credentials_file": "/k.json"},
     dict(backend="gcs", bucket="g", prefix="p", credentials_file="/k.json")),
    ({"backend": "azblob", "root": "azblob://c/p", "account_name": "acct",
      "account_key": "a2V5"}, dict(backend="azblob", bucket="c", prefix="p",
                                   account_name="acct", account_key="a2V5")),
    ({"backend": "azblob", "container": "c", "connection_string": "UseDevelopmentStorage=true"},
     dict(backend="azblob", bucket="c", connection_string="UseDevelopmentStorage=true")),
    ({"backend": "fs", "root": "/var/lib/danube/durable"},
     dict(backend="fs", path="/var/lib/danube/durable")),
    ({"backend": "memory"}, dict(backend="memory", name="default")),
    ({"backend": "memory", "root": "shared", "upload_interval_seconds": 0.25},
     dict(backend="memory", name="shared", upload_interval_seconds=0.25)),
    ({"backend": "s3", "root": "s3://b", "upload_interval_seconds": 60, "retries": 0,
      "connect_timeout_seconds": 1.5, "read_timeout_seconds": 30, "path_style": False},
     dict(upload_interval_seconds=60.0, retries=0, connect_timeout_seconds=1.5,
          read_timeout_seconds=30.0, path_style=False)),
])
def test_parse_durable_good(mapping, expected):
    cfg = parse_durable(mapping)
    assert isinstance(cfg, DurableConfig)
    for field, value in expected.items():
        assert getattr(cfg, field) == value, field
    if "upload_interval_seconds" not in mapping:
        assert cfg.upload_interval_seconds == 300.0


def test_parse_durable_root_round_trip_and_secrets_hidden():
    cfg = parse_durable({"backend": "s3", "root": "s3://b/p", "access_key": "AK",
                         "secret_key": "very-secret"})
    assert cfg.root == "s3://b/p"
    assert "very-secret" not in repr(cfg) and "AK" in repr(cfg)
    assert parse_durable({"root": "gcs://g"}).root == "gs://g"


@pytest.mark.parametrize("mapping, key", [
    ({"backend": "s3", "root": "s3://b", "bukket": "x"}, "bukket"),
    ({"backend": "minio", "root": "s3://b"}, "backend"),
    ({"root": "/just/a/path"}, "backend"),
    ({"backend": "fs"}, "root"),
    ({"backend": "s3"}, "root"),
    ({"backend": "s3", "root": "gs://b/p"}, "root"),
    ({"backend": "gcs", "root": "s3://b/p"}, "root"),
    ({"backend": "s3", "root": "s3:///p"}, "root"),
    ({"backend": "s3", "root": "s3://b", "bucket": "b"}, "bucket"),
    ({"backend": "azblob", "root": "azblob://c", "container": "c"}, "container"),
    ({"backend": "s3", "root": "s3://b/p", "prefix": "q"}, "prefix"),
    ({"backend": "s3", "root": "s3://b", "prefix": "a/../b"}, "prefix"),
    ({"backend": "s3", "bucket": "a/b"}, "bucket"),
    ({"backend": "s3", "root": "s3://b", "endpoint": "127.0.0.1:8333"}, "endpoint"),
    ({"backend": "s3", "root": "s3://b", "access_key": "a"}, "secret_key"),
    ({"backend": "s3", "root": "s3://b", "secret_key": "s"}, "access_key"),
    ({"backend": "s3", "root": "s3://b", "account_key": "k"}, "account_key"),
    ({"backend": "fs", "root": "/d", "endpoint": "http://x"}, "endpoint"),
    ({"backend": "gcs", "root": "gs://b", "access_key": "a"}, "access_key"),
    ({"backend": "azblob", "root": "azblob://c", "connection_string": "x",
      "account_key": "k"}, "connection_string"),
    ({"backend": "memory", "upload_interval_seconds": 0}, "upload_interval_seconds"),
    ({"backend": "memory", "upload_interval_seconds": -5}, "upload_interval_seconds"),
    ({"backend": "memory", "upload_interval_seconds": "300"}, "upload_interval_seconds"),
    ({"backend": "memory", "upload_interval_seconds": True}, "upload_interval_seconds"),
    ({"backend": "s3", "root": "s3://b", "retries": -1}, "retries"),
    ({"backend": "s3", "root": "s3://b", "retries": 1.5}, "retries"),
    ({"backend": "s3", "root": "s3://b", "connect_timeout_seconds": 0},
     "connect_timeout_seconds"),
    ({"backend": "s3", "root": "s3://b", "path_style": "yes"}, "path_style"),
    ({"backend": "s3", "root": "s3://b", "region": ""}, "region"),
    ({"backend": "s3", "root": "s3://b", "region": ["x"]}, "region"),
])
def test_parse_durable_bad_key_is_named(mapping, key):
    with pytest.raises(ConfigError) as err:
        parse_durable(mapping, "storage.durable")
    assert f"storage.durable.{key}" in str(err.value)


def test_parse_durable_not_a_mapping():
    with pytest.raises(ConfigError, match="storage.durable"):
        parse_durable(["s3"])


@pytest.mark.parametrize("taken", ["s3", "master"])
def test_a_first_start_whose_port_was_taken_meanwhile_picks_others(tmp_path, taken):
    """A port picked free can be taken before the server binds it (a parallel test's server
    once took SeaweedFS's S3 port): the first start tries other ports."""
    server = objstore_servers.SeaweedFS(tmp_path)
    port = server.port if taken == "s3" else server.extra_ports["master"]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        try:
            server.start()
            assert port not in server.ports()
            assert server.starts == 2
            with make_store("s3", server) as store:
                store.put("k", b"v")
                assert store.get("k") == b"v"
        finally:
            server.close()
