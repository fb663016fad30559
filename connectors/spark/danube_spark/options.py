"""Options of the data source: parsed and checked on the driver, before any task runs.

Option names are matched case-insensitively (as Spark's own sources do)."""

import json
from dataclasses import dataclass

from danube_spark.errors import OptionError

EARLIEST = -2
LATEST = -1
DEFAULT_MAX_OFFSETS_PER_SPLIT = 1_000_000


def lower_keys(options):
    return {str(k).lower(): v for k, v in dict(options or {}).items()}


def target(service_url):
    """(grpc target host:port, secure) of a service_url such as http://127.0.0.1:6650."""
    url = str(service_url).strip()
    secure = url.startswith("https://")
    for scheme in ("http://", "https://", "grpc://", "grpcs://"):
        if url.startswith(scheme):
            secure = secure or scheme == "grpcs://"
            url = url[len(scheme):]
            break
    url = url.rstrip("/")
    host, sep, port = url.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise OptionError(f"option service_url {service_url!r} is not host:port "
                          "(e.g. http://127.0.0.1:6650)")
    return url, secure


def service_urls(service_url):
    """The brokers a comma-separated service_url names (each checked by target()): the
    connector asks them in turn, so a cluster's broker that is down is passed over."""
    urls = [u.strip() for u in str(service_url).split(",") if u.strip()]
    if not urls:
        raise OptionError("option service_url is empty")
    for url in urls:
        target(url)
    return urls


def parse_offsets(option, text, default):
    """startingOffsets / endingOffsets: "earliest", "latest", or JSON
    {"/ns/t-part-0": 42, ...} (-2 earliest, -1 latest, as Kafka's source). Returns either
    EARLIEST / LATEST for every partition, or a dict partition name -> offset."""
    if text is None or str(text).strip() == "":
        return default
    value = str(text).strip()
    if value.lower() == "earliest":
        return EARLIEST
    if value.lower() == "latest":
        return LATEST
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise OptionError(f"option {option} is not 'earliest', 'latest' or a JSON object of "
                          f"partition -> offset: {value!r} ({exc})") from None
    if not isinstance(parsed, dict):
        raise OptionError(f"option {option} must be a JSON object of partition -> offset, "
                          f"e.g. {{\"/default/t-part-0\": 42}}, not {value!r}")
    out = {}
    for name, offset in parsed.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
            raise OptionError(f"option {option}: the offset of {name!r} must be an integer "
                              f">= 0 (or -2 earliest, -1 latest), not {offset!r}")
        out[name] = offset
    return out


def _positive_int(opts, name, default, what="a positive integer"):
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if value < 1:
        raise OptionError(f"option {name} must be {what}, not {raw!r}")
    return value


def _bool(opts, name, default):
    raw = opts.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name} must be true or false, not {raw!r}")


def _millis(opts, name, default):
    value = _positive_int(opts, name, None, "a positive number of milliseconds")
    return default if value is None else value / 1000.0


# How long a task goes on looking for the owner of its partition after a call to it failed
# (the owner killed: its lease must run out and the leader place the partition again).
DEFAULT_OWNER_WAIT_MS = 90_000


def _timeout(opts):
    raw = opts.get("timeoutms")
    if raw is None:
        return 30.0
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = 0
    if value <= 0:
        raise OptionError(f"option timeoutMs must be a positive number, not {raw!r}")
    return value / 1000.0


def required(opts, name):
    value = opts.get(name.lower())
    if value is None or str(value).strip() == "":
        raise OptionError(f"option {name} is required")
    return str(value).strip()


# Messages per ReadRange batch: each becomes one Arrow record batch.
DEFAULT_READ_BATCH = 8192


@dataclass(frozen=True)
class ReadOptions:
    service_url: str
    topic: str
    starting: object
    ending: object
    max_offsets_per_split: int
    fail_on_data_loss: bool
    batch_messages: int
    timeout: float
    starting_given: bool = False
    max_offsets_per_trigger: int | None = None
    owner_wait: float = DEFAULT_OWNER_WAIT_MS / 1000.0

    @classmethod
    def parse(cls, options):
        opts = lower_keys(options)
        service_url = required(opts, "service_url")
        service_urls(service_url)
        return cls(
            owner_wait=_millis(opts, "ownerWaitMs", DEFAULT_OWNER_WAIT_MS / 1000.0),
            starting_given=opts.get("startingoffsets") is not None,
            max_offsets_per_trigger=_positive_int(opts, "maxOffsetsPerTrigger", None),
            service_url=service_url,
            topic=required(opts, "topic"),
            starting=parse_offsets("startingOffsets", opts.get("startingoffsets"), EARLIEST),
            ending=parse_offsets("endingOffsets", opts.get("endingoffsets"), LATEST),
            max_offsets_per_split=_positive_int(opts, "maxOffsetsPerSplit",
                                                DEFAULT_MAX_OFFSETS_PER_SPLIT),
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            batch_messages=_positive_int(opts, "batchMessages", DEFAULT_READ_BATCH),
            timeout=_timeout(opts),
        )


@dataclass(frozen=True)
class WriteOptions:
    service_url: str
    topic: str | None
    batch_messages: int
    batch_bytes: int
    timeout: float
    owner_wait: float = DEFAULT_OWNER_WAIT_MS / 1000.0

    @classmethod
    def parse(cls, options):
        opts = lower_keys(options)
        service_url = required(opts, "service_url")
        service_urls(service_url)
        topic = opts.get("topic")
        return cls(
            owner_wait=_millis(opts, "ownerWaitMs", DEFAULT_OWNER_WAIT_MS / 1000.0),
            service_url=service_url,
            topic=str(topic).strip() if topic is not None and str(topic).strip() else None,
            batch_messages=_positive_int(opts, "batchMessages", 1000),
            batch_bytes=_positive_int(opts, "batchBytes", 1 << 20),
            timeout=_timeout(opts),
        )
