"""What the fuzz targets found, each with the input that found it (or the smallest one that
shows it), run through the same target: the input must now pass. Each also checks the answer
the fix gives, so that a regression shows as what it is, not only as a target failure."""

import asyncio
import json
import os
import struct

import pytest

from danube.codec import http2
from danube.proto import DanubeApi_pb2 as pb
from danube.rpc import StatusCode
from danube.rpc.request_errors import explain
from danube.rpc.server import RequestHead
from danube.storage import WAL, CorruptSegmentError, WALConfig
from danube.storage._walframes import encode_frame
from fuzz_broker import BrokerTarget
from fuzz_targets import TARGETS
from fuzz_server import ServerConnectionTarget, _request
from fuzz_wal import WalRecoveryTarget, pack, payload

# Inputs a long run saved (tests/fuzz/run.py --crashes), named TARGET-what.bin.
INPUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inputs")


@pytest.mark.parametrize("name", sorted(os.listdir(INPUTS)))
def test_saved_inputs_pass_their_target(name):
    target_name = next(t for t in TARGETS if name.startswith(t + "-"))
    with open(os.path.join(INPUTS, name), "rb") as f:
        data = f.read()
    with TARGETS[target_name].open() as (target, _):
        target(data)


GRPC_HEAD = [(b":method", b"POST"), (b":path", b"/test.Echo/Unary"),
             (b"content-type", b"application/grpc")]


# -- server connection: header fields no request may carry -----------------------------------

@pytest.fixture(scope="module")
def server_target():
    t = ServerConnectionTarget()
    yield t
    t.close()


def test_header_name_not_a_token_is_refused_before_the_handler(server_target):
    # Found: a Metadata call whose header name was "x-key-b" and two bytes over 0x7f
    # reached the handler as the key 'x-key-b\ufffd\ufffd', which it could not send back
    # ("handler for /test.Echo/Metadata failed: ValueError: invalid metadata key").
    data = b"\x00" + http2.settings_frame([]) + _request(
        1, "Metadata", [b""], extra=[(b"x-key-b\xc3\xa9", b"v")])
    server_target(data)
    assert RequestHead([*GRPC_HEAD, (b"x-key-b\xc3\xa9", b"v")]).http_error == 400


@pytest.mark.parametrize("value", [b"caf\xc3\xa9", b"a\x01b", b"a\x7fb"])
def test_metadata_value_not_printable_ascii_is_invalid_argument(server_target, value):
    # Found: a Metadata call with x-val: caf\xc3\xa9 reached the handler as 'cafÃ©', which
    # it could not send back ("metadata value for 'x-val' must be printable ASCII").
    server_target(b"\x00" + http2.settings_frame([]) + _request(
        1, "Metadata", [b""], extra=[(b"x-val", value)]))
    head = RequestHead([*GRPC_HEAD, (b"x-val", value)])
    assert head.http_error is None and head.error[0] == StatusCode.INVALID_ARGUMENT
    assert "x-val" in head.error[1]
    assert RequestHead([*GRPC_HEAD, (b"x-val-bin", value)]).error is None


def test_metadata_key_outside_grpc_grammar_is_invalid_argument(server_target):
    # Found by the long run: 'x-#ey-bin' is an HTTP token but no gRPC metadata key; the
    # Metadata handler could not send it back ("invalid metadata key 'x-#ey-bin'").
    server_target(b"\x00" + http2.settings_frame([]) + _request(
        1, "Metadata", [b""], extra=[(b"x-#ey-bin", b"AAEC")]))
    head = RequestHead([*GRPC_HEAD, (b"x-#ey-bin", b"AAEC")])
    assert head.error[0] == StatusCode.INVALID_ARGUMENT and "x-#ey-bin" in head.error[1]


@pytest.mark.parametrize("field", [(b"X-Upper", b"v"), (b"", b"v"), (b"a b", b"v"),
                                   (b"x-nul", b"a\x00b"), (b"x-crlf", b"a\r\nb"),
                                   (b"x-space", b" v"), (b"x-tab", b"v\t")])
def test_malformed_fields_are_http_400(field):
    assert RequestHead([*GRPC_HEAD, field]).http_error == 400


def test_well_formed_fields_still_pass():
    head = RequestHead([*GRPC_HEAD, (b"x-ok", b"a value; with=things"), (b"te", b"trailers")])
    assert head.http_error is None and head.path == b"/test.Echo/Unary"


# -- WAL recovery -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wal_target():
    t = WalRecoveryTarget()
    yield t
    t.close()


def _ckpt(body):
    raw = json.dumps(body).encode()
    return struct.pack("<BI", 1, len(raw)) + raw


SEGMENT = b"".join(encode_frame(o, payload(o)) for o in range(3))
CKPT = dict(version=1, first_offset=0, next_offset=3, durable_offset=2, segments=[])


def test_segment_named_past_the_largest_offset(wal_target, tmp_path):
    # Found: wal.{base:020d}.log with base >= 2**63 crashed recovery with OverflowError
    # ("Python int too large to convert to C long") from scan_frames.
    name = "wal.09999999999999999999.log"
    wal_target(pack({name: SEGMENT}))
    (tmp_path / name).write_bytes(SEGMENT)
    with pytest.raises(CorruptSegmentError, match="beyond the largest offset"):
        asyncio.run(WAL.open(tmp_path, WALConfig(durability="none")))


@pytest.mark.parametrize("body", [
    # Found: a checkpoint with a valid CRC but the wrong shape crashed recovery with
    # TypeError (unhashable name) or AttributeError (active not an object).
    dict(CKPT, segments=[{"name": [1]}]),
    dict(CKPT, active=5),
    [1, 2, 3],
    dict(CKPT, next_offset=2**64),
    dict(CKPT, first_offset=-4),
], ids=["list-name", "active-int", "body-list", "offset-too-large", "negative-offset"])
def test_checkpoint_of_the_wrong_shape_is_ignored(wal_target, body):
    wal_target(pack({"wal.00000000000000000000.log": SEGMENT}) + _ckpt(body))


# -- broker requests --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker_target():
    t = BrokerTarget()
    yield t
    t.close()


def _status(target, path, body):
    index = [p for p, _ in target.methods].index(path)
    channel = target.channels[target.served[index][0]]
    method = target.methods[index][1]
    return target.loop.run_until_complete(target._call(channel, path, method, body))


@pytest.mark.parametrize("path, body, field", [
    # Found: a subject with NUL reached the metadata store, whose InvalidKey came back as
    # INTERNAL "Exception calling application" with a traceback in the log.
    ("/danube_schema.SchemaRegistry/GetLatestSchema", b"\n\x04fuz\x00", "subject"),
    ("/danube_schema.SchemaRegistry/DeleteSchemaVersion", b"\n\x04fu\x00z\x10\x01", "subject"),
    # Found: a malformed MessageBatch was INTERNAL "failed to parse request message".
    ("/danube_ext.BatchProducer/SendMessages", b"\x1a\x02\xff\xff", "MessageBatch"),
    # Found by a long run: NUL in a binding id reached the metadata store: INTERNAL
    # "failed to store binding: metadata key must not contain NUL".
    ("/danube_admin.SecurityAdmin/CreateBinding",
     b'\n%\n\x04fuz\x00\x12\x04user\x1a\x04fuzz"\x04fuzz*\x05topic2\x04fuzz', "binding id"),
    ("/danube_admin.SecurityAdmin/CreateRole", b"\n\x06\n\x04r\x00le", "role name"),
    # Known gap: invalid UTF-8 in a string field was INTERNAL.
    ("/danube.ProducerService/CreateProducer",
     pb.ProducerRequest(topic_name="/default/x", producer_name="p").SerializeToString()
     .replace(b"/default/x", b"/default/\xff"), "topic_name"),
    ("/danube.ConsumerService/Ack",
     pb.AckRequest(subscription_name="s\x01", msg_id=pb.MsgID(topic_name="/default/t"))
     .SerializeToString().replace(b"/default/t", b"/d\xc3(\xa1ult/t"), "msg_id.topic_name"),
])
def test_bad_requests_are_invalid_argument_naming_the_field(broker_target, path, body, field):
    index = [p for p, _ in broker_target.methods].index(path)
    broker_target(broker_target.input_for(path, body, broker_target.served[index][0]))
    code, details = _status(broker_target, path, body)
    assert code == StatusCode.INVALID_ARGUMENT and field in details, (code, details)


def test_ack_of_an_unknown_subscription_is_not_found(broker_target):
    # Known gap: Ack and Nack naming a subscription that does not exist were INTERNAL.
    for path, cls in (("/danube.ConsumerService/Ack", pb.AckRequest),
                      ("/danube.ConsumerService/Nack", pb.NackRequest)):
        body = cls(request_id=1, subscription_name="no-such-sub",
                   msg_id=pb.MsgID(topic_name="/default/fuzz")).SerializeToString()
        broker_target(broker_target.input_for(path, body))
        code, details = _status(broker_target, path, body)
        assert code == StatusCode.NOT_FOUND and "no-such-sub" in details, (code, details)
    broker_target.check_alive()


def test_explain_names_the_fault():
    cls = pb.ProducerRequest
    good = cls(topic_name="/default/x", producer_name="p").SerializeToString()
    assert "field topic_name is not valid UTF-8" in explain(
        cls.DESCRIPTOR, good.replace(b"x", b"\xff"))
    assert "runs past the end" in explain(cls.DESCRIPTOR, good[:-1])
    assert "invalid wire type 7" in explain(cls.DESCRIPTOR, b"\x0f")
    assert "truncated varint" in explain(cls.DESCRIPTOR, b"\x08\xff")
    nested = pb.AckRequest(msg_id=pb.MsgID(topic_name="/t")).SerializeToString()
    assert "msg_id.topic_name" in explain(pb.AckRequest.DESCRIPTOR,
                                          nested.replace(b"/t", b"\xc0t"))
