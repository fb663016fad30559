"""Security for `auth.mode: tls` (reference b.8): who is calling (tokens.py: JWT validation
and minting), what they may do (rbac.py: roles and bindings kept in the MetadataStore,
default deny; permissions.py: the permission each RPC needs) and the guard that puts both in
front of every registered method of a server (guard.py)."""
