"""Admin calls forwarded to a topic's owner when the brokers' admin ports serve mTLS
(`admin_tls: true`, `auth.mode: tls`, `auth.tls.require_client_cert`) with JWT
authentication, on a real etcd: the forwarding broker checks the owner's certificate against
the cluster's CA and presents its own, the caller's token goes along (an unauthenticated
caller is refused before anything is forwarded), and brokers register their admin port as
https."""

import grpc
import pytest

from cluster_process import etcd_cluster
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeApi_pb2 as pb
from official_client import unique_topic
from secure_broker import SUPER, SECRET, token, write_server_files
from waiting import wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, certs):
    cert, key = write_server_files(certs)
    auth = f"""\
admin_tls: true
auth:
  mode: tls
  tls: {{cert_file: "{cert}", key_file: "{key}", ca_file: "{certs.ca_file}",
        require_client_cert: true}}
  super_admins: ["{SUPER}"]
  jwt: {{issuer: danube-auth, expiration_time: 3600, secret_key: "{SECRET}"}}
"""
    with etcd_cluster(tmp_path_factory, n=2, extra_config=auth) as brokers:
        yield brokers


def channel(addr, certs):
    creds = grpc.ssl_channel_credentials(root_certificates=certs.ca_pem,
                                         private_key=certs.client_key_pem,
                                         certificate_chain=certs.client_chain_pem)
    return grpc.secure_channel(addr, creds)


def call(ch, path, request, response_cls, bearer=None):
    metadata = [("authorization", f"Bearer {bearer}")] if bearer else []
    return ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=response_cls.FromString)(
        request, metadata=metadata, timeout=15)


def test_admin_calls_are_forwarded_over_mtls_with_the_callers_token(cluster, certs):
    admin_token = token(SUPER)
    topic = unique_topic("tls-forward")
    first = cluster.brokers[0]
    with channel(first.client_addr, certs) as ch:
        try:
            call(ch, "/danube.ProducerService/CreateProducer",
                 pb.ProducerRequest(request_id=1, producer_name="p",
                                    topic_name=topic, dispatch_strategy=1),
                 pb.ProducerResponse, admin_token)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc   # placed elsewhere
    with channel(first.admin_addr, certs) as ch:
        owner_id = wait_for(lambda: call(
            ch, "/danube_admin.TopicAdmin/DescribeTopic", adm.DescribeTopicRequest(name=topic),
            adm.DescribeTopicResponse, admin_token).broker_id or None,
            what="the topic's owner")
    owner = next(b for b in cluster.brokers if b.broker_id == owner_id)
    other = next(b for b in cluster.brokers if b.broker_id != owner_id)

    with channel(owner.client_addr, certs) as ch:
        def subscribed():
            try:
                return call(ch, "/danube.ConsumerService/Subscribe",
                            pb.ConsumerRequest(request_id=1, topic_name=topic,
                                               consumer_name="c", subscription="tls-sub",
                                               subscription_type=0),
                            pb.ConsumerResponse, admin_token)
            except grpc.RpcError as exc:      # the owner is still loading the topic
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                return None
        wait_for(subscribed, what="a subscription on the owner")

    with channel(other.admin_addr, certs) as ch:
        subs = call(ch, "/danube_admin.TopicAdmin/ListSubscriptions",
                    adm.TopicRequest(name=topic), adm.SubscriptionListResponse, admin_token)
        assert list(subs.subscriptions) == ["tls-sub"]
        # No token: refused by the broker asked, nothing forwarded.
        with pytest.raises(grpc.RpcError) as info:
            call(ch, "/danube_admin.TopicAdmin/ListSubscriptions",
                 adm.TopicRequest(name=topic), adm.SubscriptionListResponse)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "forwarding failed" not in other.log()


def test_brokers_register_their_admin_port_as_https(cluster, certs):
    with channel(cluster.brokers[1].admin_addr, certs) as ch:
        brokers = call(ch, "/danube_admin.BrokerAdmin/ListBrokers", adm.Empty(),
                       adm.BrokerListResponse, token(SUPER)).brokers
    assert {b.admin_addr for b in brokers} == {f"https://{b.admin_addr}"
                                               for b in cluster.brokers}
