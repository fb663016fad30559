"""Danube Connect: a runtime for source connectors (an external system -> topics) and sink
connectors (topics -> an external system) over the project's asyncio client. See
docs/connect.md."""

from danube.connect.connector import (ConsumerConfig, ProducerConfig, SinkConnector,
                                      SourceConnector)
from danube.connect.errors import (ConfigError, ConnectorError, FatalError, InvalidRecord,
                                   RetryableError, Unavailable)
from danube.connect.records import SinkRecord, SourceRecord
from danube.connect.settings import REQUIRED, Field, Table, Tables

__all__ = ["SourceConnector", "SinkConnector", "ProducerConfig", "ConsumerConfig",
           "SourceRecord", "SinkRecord", "ConnectorError", "ConfigError", "Unavailable",
           "RetryableError", "InvalidRecord", "FatalError", "Field", "Table", "Tables",
           "REQUIRED"]
