"""Producer and consumer ids: random, non-zero, unique on this broker."""

import secrets


def random_id(taken):
    while True:
        value = secrets.randbits(64)
        if value and value not in taken:
            return value
