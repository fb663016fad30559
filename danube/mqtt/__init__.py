"""MQTT 3.1.1 and 5.0 packets, sans I/O, shared by the edge's MQTT server
(danube/edge/mqtt/) and source-mqtt's client (danube/connectors/_mqtt_client.py):
``codec`` reads what a client sends and writes what a server sends; ``client_codec`` the
other way round."""
