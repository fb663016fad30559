"""The edge broker (`danube broker --mode edge`): an MQTT gateway that stores what devices
publish in local WALs and replicates it to a cluster over danube.edge.EdgeReplicatorService
(docs/edge.md)."""
