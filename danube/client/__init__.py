"""The project's asyncio client library for Danube brokers, on danube.rpc (no grpcio).

    async with DanubeClient("http://127.0.0.1:6650") as client:
        producer = await client.create_producer("/default/t", "p1")
        request_id = await producer.send(b"hello", {"k": "v"})
        consumer = await client.subscribe("/default/t", "c1", "sub", sub_type="shared")
        async for msg in consumer.messages():
            await consumer.ack(msg)
"""

from danube.client._delivery import Message, MsgId
from danube.client.client import DanubeClient
from danube.client.connection import BrokerAddress
from danube.client.consumer import Consumer
from danube.client.errors import (Aborted, AlreadyExists, ClientClosed, DanubeError,
                                  DeadlineExceeded, FailedPrecondition, InternalError,
                                  InvalidArgument, NoTopicsFound, NotFound, PermissionDenied,
                                  ResourceExhausted, Unauthenticated, Unavailable,
                                  Unimplemented)
from danube.client.producer import Producer, fnv1a64
from danube.client.retry import RetryPolicy
from danube.client.schema import register_schema, schema_reference

__all__ = [
    "Message", "MsgId",
    "DanubeClient", "Producer", "Consumer", "BrokerAddress", "RetryPolicy", "fnv1a64",
    "schema_reference", "register_schema",
    "DanubeError", "Unavailable", "DeadlineExceeded", "NotFound", "NoTopicsFound",
    "InvalidArgument", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "Unauthenticated", "Unimplemented", "Aborted", "InternalError",
    "ClientClosed",
]
