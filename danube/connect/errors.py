"""What a connector raises, and what the runtime does with each (docs/connect.md):

- ``Unavailable``: the external system cannot be reached (refused, timed out, down). The
  runtime retries the same batch for as long as it takes, with exponential backoff and jitter,
  and reports the connector not ready after ``retry.max_retries`` attempts: an outage must
  not turn into dead letters.
- ``RetryableError``: this request failed in a way another try may fix (HTTP 5xx or 429).
  Retried ``retry.max_retries`` times, then each record of the batch goes to the dead-letter
  topic with the last error as its reason.
- ``InvalidRecord``: this record can never be written (bad JSON, wrong schema, HTTP 4xx):
  to the dead-letter topic at once, with the reason.
- ``FatalError`` (and anything unexpected): the connector stops, the process exits 1 and
  nothing of the batch is committed, so a restart takes it again.

Upstream danube-connect-core has Retryable, Fatal and InvalidData; it retries Retryable up to
max_retries and leaves its dead-letter queue as a TODO.
"""


class ConnectorError(Exception):
    """The base of every connector error."""


class ConfigError(ConnectorError):
    """A configuration the connector cannot start with; the message names the key."""


class Unavailable(ConnectorError):
    """The external system cannot be reached; retried until it can."""


class RetryableError(ConnectorError):
    """A failed request another try may fix; dead-lettered after retry.max_retries:
    ``records`` (those that failed) if given, else the whole batch. The rest of the batch is
    then handed to ``process_batch`` again."""

    def __init__(self, message, records=None):
        super().__init__(message)
        self.records = records


class InvalidRecord(ConnectorError):
    """One record that can never be written: ``record`` goes to the dead-letter topic with
    ``reason``."""

    def __init__(self, reason, record=None):
        super().__init__(reason)
        self.reason = reason
        self.record = record


class FatalError(ConnectorError):
    """The connector cannot go on: stop without committing."""
