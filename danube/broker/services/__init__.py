"""One module per gRPC service: decode the request, call the broker core, map errors."""
