"""A cluster on one machine for trying and testing cluster mode (`danube cluster up`,
`status`, `down`): etcd, an S3-compatible store and N brokers as processes of their own,
and the HAProxy ingress configuration of proxy mode (`ingress.py`)."""
