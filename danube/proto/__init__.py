"""Generated protobuf modules (built from protocol/*.proto by setup.py; never hand-edited)."""
