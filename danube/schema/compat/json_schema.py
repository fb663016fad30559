"""Placeholder until the JSON Schema rules land."""


def can_read(reader, writer, direction="backward"):
    return []
