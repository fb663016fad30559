"""A WAL's lifecycle states, shared by the modules of the package."""

OPEN, CLOSING, CLOSED = 0, 1, 2
