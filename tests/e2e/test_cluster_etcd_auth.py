"""etcd with authentication enabled (``meta_store.etcd_auth: {user, password}``): a real etcd
whose users must authenticate, with tokens forgotten after one second without use.

The store works with the right password (calls, leases, watches), also after its token has
expired; a wrong password or none is a clear error; two brokers form a cluster on it."""

import asyncio
import subprocess
import sys

import pytest

from cluster_process import ClusterBrokers
from danube.metadata.errors import MetadataError
from danube.metadata.etcd import EtcdStore
from etcd_process import EtcdProcess

USER, PASSWORD = "danube", "danube-secret"


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    server = EtcdProcess(tmp_path_factory.mktemp("etcd-auth"), auth_token_ttl=1)
    server.start()
    server.enable_auth({USER: PASSWORD})
    yield server
    server.stop()


async def test_calls_and_watches_with_a_password_and_expiring_tokens(etcd):
    async with await EtcdStore.open([etcd.endpoint], auth=(USER, PASSWORD)) as store:
        watch = await store.watch("/auth/")
        await store.put("/auth/a", 1, ttl=5)
        assert await store.get("/auth/a") == 1
        assert (await asyncio.wait_for(anext(watch), 5)).value == 1
        tokens = store.conn.auth.tokens_total
        await asyncio.sleep(2.5)            # etcd forgets the token after 1 s unused
        await store.put("/auth/a", 2)
        assert store.conn.auth.tokens_total > tokens      # fetched anew, and the put done
        assert await store.get("/auth/a") == 2
        assert (await asyncio.wait_for(anext(watch), 5)).value == 2
        late = await store.watch("/auth/")  # a new stream, with a new token
        await store.delete("/auth/a")
        assert (await asyncio.wait_for(anext(late), 5)).key == "/auth/a"
        watch.close()
        late.close()


@pytest.mark.parametrize("auth, message", [
    ((USER, "wrong"), "etcd refused the credentials of user 'danube'"),
    (None, "etcd wants a user: set meta_store.etcd_auth"),
])
async def test_wrong_or_missing_credentials_are_a_clear_error(etcd, auth, message):
    with pytest.raises(MetadataError, match=message):
        store = await EtcdStore.open([etcd.endpoint], auth=auth, retry_for=2)
        await store.put("/auth/b", 1)


def test_two_brokers_form_a_cluster_with_a_password(etcd, tmp_path):
    brokers = ClusterBrokers(etcd, tmp_path, lease=3,
                             etcd_auth={"user": USER, "password": PASSWORD})
    try:
        brokers.start(2)
        ids = {b.broker_id for b in brokers.brokers}
        assert len(ids) == 2 and None not in ids
        out = subprocess.run(
            [sys.executable, "-P", "-m", "danube", "admin", "brokers", "list", "--endpoint",
             f"http://{brokers.brokers[1].admin_addr}"], capture_output=True, text=True,
            timeout=60)
        assert out.returncode == 0, out.stderr
        assert all(i in out.stdout for i in ids), out.stdout
    finally:
        brokers.stop()
