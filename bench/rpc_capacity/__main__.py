"""RPC capacity benchmark: our gRPC server vs grpc.aio.

    .venv/bin/python -m bench.rpc_capacity [--duration 10] [--quick]

See bench/README.md for what each number means.
"""

from bench.rpc_capacity.runner import main

if __name__ == "__main__":
    main()
