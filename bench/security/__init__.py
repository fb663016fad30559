"""The cost of security: a broker in auth.mode tls (TLS, a JWT on every call, RBAC) against
the same broker in plain text without auth, measured in one run. See bench/README.md."""
