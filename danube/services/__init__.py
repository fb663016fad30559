"""The broker's edge toward clients, above danube.broker and danube.rpc: one module per gRPC
service (decode the request, call the broker core, encode the response; errors.py maps the
core's typed errors to status codes), the DeliverySink that carries a consumer's messages
over its ReceiveMessages stream (delivery.py), and the process that serves them (app.py)."""
