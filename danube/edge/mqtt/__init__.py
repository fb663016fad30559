"""The edge's MQTT 3.1.1/5.0 server: the packet codec (sans I/O), one session per
connection, and the listener with its limits."""
