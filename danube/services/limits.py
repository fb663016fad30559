"""The broker's message-size policy at the gRPC length prefix: the publish RPCs give the
transport a limit of their own (Server.limit_requests), so a request that cannot be taken is
refused before its body is read, with the same status and wording as the exact check that
runs after decoding (Topic._check_size).

The prefix counts the whole request, not the payload the policy is about, so SendMessage's
early limit is policies.max_message_size plus config.ENVELOPE_ALLOWANCE for the rest of the
StreamMessage; anything shorter is decoded and gets the exact payload check. A batch
(danube_ext.BatchProducer) holds many messages, each checked after decoding; only the
transport's cap bounds the whole, and it is refused as INVALID_ARGUMENT too, because a
RESOURCE_EXHAUSTED is what clients retry (the official ones without end)."""

from danube.broker import errors as e
from danube.config import ENVELOPE_ALLOWANCE
from danube.services.errors import to_rpc_error

SEND_MESSAGE = "/danube.ProducerService/SendMessage"
SEND_MESSAGES = "/danube_ext.BatchProducer/SendMessages"


def limit_send_message(server, core):
    policy = core.cfg.policies.max_message_size
    cap = core.cfg.grpc_max_message_size

    def refuse(size, head):
        topic = _topic_of(core, head)
        where = f" on {topic}" if topic else ""
        if policy:
            text = f"message of {size} bytes exceeds max_message_size ({policy} bytes){where}"
        else:
            text = _over_cap_text("message", size, cap) + where
        return to_rpc_error(e.MessageTooLarge(text))
    server.limit_requests(SEND_MESSAGE, policy + ENVELOPE_ALLOWANCE if policy else cap, refuse)


def limit_send_messages(server, core):
    cap = core.cfg.grpc_max_message_size
    server.limit_requests(SEND_MESSAGES, cap, lambda size, head: to_rpc_error(
        e.MessageTooLarge(_over_cap_text("batch", size, cap))))


def _over_cap_text(what, size, cap):
    return f"{what} of {size} bytes exceeds the broker's grpc.max_message_size ({cap} bytes)"


def _topic_of(core, head):
    """The topic of the producer a StreamMessage's first bytes name, or None."""
    producer_id = _producer_id(head)
    if producer_id is None:
        return None
    try:
        return core.producer_table.producer(producer_id).topic.name
    except e.BrokerError:
        return None


def _producer_id(data):
    """msg_id.producer_id from the start of a serialized StreamMessage, if it is there:
    clients serialize fields in number order, so request_id (1) and msg_id (2) lead, ahead
    of the payload (3). None when the bytes run out or hold something else first."""
    pos = 0
    try:
        while pos < len(data):
            tag, pos = _varint(data, pos)
            if tag == 0x08:                     # request_id
                _, pos = _varint(data, pos)
            elif tag == 0x12:                   # msg_id
                _, pos = _varint(data, pos)
                tag, pos = _varint(data, pos)
                if tag != 0x08:                 # producer_id is msg_id's first field
                    return None
                return _varint(data, pos)[0]
            else:
                return None
    except IndexError:
        pass
    return None


def _varint(data, pos):
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
