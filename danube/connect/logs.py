"""Structured logs: one JSON object a line on stderr (``processing.log_format = "json"``,
the default), with the connector's name on every line and any ``extra=`` fields a call
gives, so a log pipeline can filter by connector, topic or error kind."""

import json
import logging
import sys
import time

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
LEVELS = {"trace": "DEBUG", "debug": "DEBUG", "info": "INFO", "warn": "WARNING",
          "warning": "WARNING", "error": "ERROR"}


class JsonFormatter(logging.Formatter):
    def __init__(self, connector):
        super().__init__()
        self.connector = connector

    def format(self, record):
        out = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name,
               "connector": self.connector, "msg": record.getMessage()}
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, (int, float, bool, str)) or \
                    value is None else str(value)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup(connector, level, fmt):
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(connector))
    else:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)s {connector} %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level])
