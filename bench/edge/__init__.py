"""bench.edge: MQTT ingest at the edge vs mosquitto, and replication to the cluster."""
