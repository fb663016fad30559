"""Placeholder until the protobuf rules land."""


def can_read(reader, writer, direction="backward"):
    return []
