"""The broker process: builds the stores, the placement, the broker core and the servers from
the configuration, wires the services onto the servers, starts them and stops them cleanly
(``app.Broker``). The only place that knows every part; nothing imports it but the CLI."""
