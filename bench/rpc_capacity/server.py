"""Benchmark server subprocess for bench.rpc_capacity.

    python -m bench.rpc_capacity.server --impl ours|grpcio --port 0

Prints the bound port (one line) on stdout once it is serving, then runs until SIGTERM/SIGINT
or until its stdin reaches EOF (the parent died), so it never outlives the benchmark.

Methods (all raw bytes in / bytes out, no serializers):
  /bench.Bench/Unary        unary-unary   echo the request
  /bench.Bench/Stream       unary-stream  request = ASCII count N; N 100-byte messages
                                          (ours: ctx.write_batch of 1,000 at a time;
                                           grpcio: async generator, one yield per message)
  /bench.Bench/StreamGen    unary-stream  same, one `yield` per message (both impls)
  /bench.Bench/Hang         unary-stream  (ours only) awaits forever: an idle open stream
  /bench.Bench/OpenStreams  unary-unary   (ours only) JSON {"hang": handlers waiting in Hang,
                                          "streams": open HTTP/2 streams over all connections}
"""

import argparse
import asyncio
import json
import os
import signal
import sys

MSG = b"x" * 100
BATCH = 1000


def _count(request):
    try:
        return int(bytes(request).decode("ascii").strip() or "0")
    except ValueError:
        return 0


def _install_stop(loop, stop):
    """Stop on SIGTERM/SIGINT, or when the parent closes our stdin (it exited or died)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        return

    def on_stdin():
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            stop.set()

    try:
        os.set_blocking(fd, False)
        loop.add_reader(fd, on_stdin)
    except (OSError, ValueError, PermissionError):
        pass  # stdin is not pollable (a file, /dev/null): rely on signals only


async def run_ours(host, port):
    from danube.rpc.server import Kind, Server

    server = Server()
    hanging = 0

    async def unary(request, context):
        return request

    async def stream(request, context):
        n = _count(request)
        full, rest = divmod(n, BATCH)
        batch = [MSG] * BATCH
        write_batch = context.write_batch
        for _ in range(full):
            await write_batch(batch)
        if rest:
            await write_batch([MSG] * rest)

    async def stream_gen(request, context):
        for _ in range(_count(request)):
            yield MSG

    async def hang(request, context):
        nonlocal hanging
        hanging += 1
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            hanging -= 1

    async def open_streams(request, context):
        streams = sum(len(conn.streams) for conn in server.connections)
        return json.dumps({"hang": hanging, "streams": streams,
                           "connections": len(server.connections)}).encode()

    server.add_method("/bench.Bench/Unary", Kind.UNARY_UNARY, unary)
    server.add_method("/bench.Bench/Stream", Kind.UNARY_STREAM, stream)
    server.add_method("/bench.Bench/StreamGen", Kind.UNARY_STREAM, stream_gen)
    server.add_method("/bench.Bench/Hang", Kind.UNARY_STREAM, hang)
    server.add_method("/bench.Bench/OpenStreams", Kind.UNARY_UNARY, open_streams)

    stop = asyncio.Event()
    _install_stop(asyncio.get_running_loop(), stop)
    bound = await server.start(host, port)
    print(bound, flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop(0)


async def run_grpcio(host, port):
    import grpc

    async def unary(request, context):
        return request

    async def stream(request, context):
        for _ in range(_count(request)):
            yield MSG

    handler = grpc.method_handlers_generic_handler("bench.Bench", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
        "StreamGen": grpc.unary_stream_rpc_method_handler(stream),
    })
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    bound = server.add_insecure_port(f"{host}:{port}")
    stop = asyncio.Event()
    _install_stop(asyncio.get_running_loop(), stop)
    await server.start()
    print(bound, flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop(0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=("ours", "grpcio"), required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    if args.impl == "ours":
        import uvloop
        uvloop.run(run_ours(args.host, args.port))
    else:
        # grpc.aio on the stock asyncio loop: the configuration grpc.aio supports.
        asyncio.run(run_grpcio(args.host, args.port))


if __name__ == "__main__":
    main()
