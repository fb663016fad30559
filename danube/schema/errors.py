"""The package's exceptions (a module of their own: every other module raises them)."""


class SchemaError(ValueError):
    """A schema that does not parse, or a type or mode that does not exist."""


class PayloadInvalid(ValueError):
    """A message payload that does not match its schema."""
