"""The fuzz targets, one per surface, for the hypothesis tests (tests/fuzz/test_fuzz_*.py) and
the long-run driver (tests/fuzz/run.py).

A target is `target(data: bytes)`: it returns for any input its surface handles as documented
and raises only on a finding (`Finding` for a broken invariant or a hang, or whatever
unexpected exception escaped). `TARGETS[name].open()` is a context manager giving
`(target, seeds)`: the codec targets are plain functions; the others hold state (an event
loop, a temporary directory, a broker process) that the context sets up once and takes down.

    h2_frames          HTTP/2 FrameReader (danube/codec/http2.pyx)
    hpack              HeaderDecoder and its cache against hpack (danube/rpc/headers.py)
    grpc_frames        GrpcDeframer (danube/codec/grpcframe.pyx)
    wal_frames         scan_frames / read_frame(s) / walk_frames (danube/storage/_walframes.pyx)
    mqtt_packets       the edge's MQTT decoder with publish_run/encode_run (danube/codec/mqtt.pyx)
    server_connection  a whole ServerConnection in process (danube/rpc/server.py)
    wal_recovery       WAL.open over damaged segment files and checkpoints (storage/recovery.py)
    broker_requests    every request of every service, raw, to a real broker process
"""

import contextlib
import dataclasses
from typing import Callable

import fuzz_broker
import fuzz_codecs
import fuzz_server
import fuzz_wal
from fuzz_codecs import Finding

__all__ = ["Finding", "TARGETS", "Target"]


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    description: str
    _open: Callable
    # Inputs longer than this are cut (the engines' size cap).
    max_len: int = 1 << 16
    # A process of its own (a broker): slower, so fewer inputs in the short run.
    external: bool = False

    def open(self):
        return self._open()


def _pure(fn, seeds):
    @contextlib.contextmanager
    def opener():
        yield fn, seeds()
    return opener


def _stateful(factory, seeds):
    @contextlib.contextmanager
    def opener():
        with factory() as target:
            yield target, seeds()
    return opener


@contextlib.contextmanager
def _broker():
    with fuzz_broker.broker_requests() as target:
        yield target, target.seeds()


TARGETS = {t.name: t for t in (
    Target("h2_frames", "HTTP/2 frame codec (FrameReader)",
           _pure(fuzz_codecs.h2_frames, fuzz_codecs.h2_seeds)),
    Target("hpack", "HPACK header blocks (HeaderDecoder)",
           _pure(fuzz_codecs.hpack_block, fuzz_codecs.hpack_seeds), max_len=1 << 14),
    Target("grpc_frames", "gRPC length-prefix framing (GrpcDeframer)",
           _pure(fuzz_codecs.grpc_frames, fuzz_codecs.grpc_seeds)),
    Target("wal_frames", "WAL frame codec (scan/read/walk)",
           _pure(fuzz_codecs.wal_frames, fuzz_codecs.wal_seeds)),
    Target("mqtt_packets", "the edge's MQTT decoder and its C runs of PUBLISH packets",
           _pure(fuzz_codecs.mqtt_packets, fuzz_codecs.mqtt_seeds)),
    Target("server_connection", "a whole gRPC server connection in process",
           _stateful(fuzz_server.server_connection, fuzz_server.server_seeds)),
    Target("wal_recovery", "WAL recovery over damaged segment files and checkpoints",
           _stateful(fuzz_wal.wal_recovery, fuzz_wal.wal_seeds), max_len=1 << 15),
    Target("broker_requests", "every request of every service, raw, to a real broker",
           _broker, max_len=1 << 12, external=True),
)}
