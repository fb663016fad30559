"""Codec layer: bytes in, bytes out, in Cython; imports only C and the standard library.

One ``.pyx``/``.pxd`` pair per concern, so that other extension modules call the C helpers
through ``cimport`` (no Python-level call on a hot path):

* ``crc32c``     CRC-32C over any buffer (the C arithmetic is ``_crc32c.h``)
* ``http2``      HTTP/2 frame parsing and serialisation (RFC 9113), HPACK block inspection
* ``grpcframe``  gRPC length-prefixed messages: framing, deframing, unary responses
* ``protowire``  protobuf varints and wire types (``.pxd`` only: inline helpers)
* ``msgbatch``   the client's encoder of danube_ext.MessageBatchRaw
"""
