"""The ``storage.durable`` section of the broker's YAML: which object store tiered storage
writes to, and how to reach it. Parsed with the rest of the configuration (this module sits
at the bottom, beside ``danube.config``); ``danube.storage.durable`` opens the store it names.

    storage:
      durable:
        backend: s3                          # s3 | gcs | azblob | fs | memory
        root: s3://danube/cluster-1          # or bucket: danube + prefix: cluster-1
        endpoint: http://127.0.0.1:8333      # S3-compatible server; omit for AWS
        region: us-east-1
        access_key: ...                      # omit to use AWS_ACCESS_KEY_ID / AWS_SECRET_...
        secret_key: ...
        upload_interval_seconds: 300

``root`` is ``s3://BUCKET/PREFIX``, ``gs://BUCKET/PREFIX`` (or ``gcs://``),
``azblob://CONTAINER/PREFIX``, a directory for ``fs`` and a store name for ``memory``; with a
URL the backend may be left out. Credentials not given here come from each SDK's usual
environment (AWS_*, GOOGLE_APPLICATION_CREDENTIALS, and for Azure the CLI's
AZURE_STORAGE_CONNECTION_STRING / AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Mapping

from danube.config_errors import ConfigError
from danube.config_keys import suggest

_TUNING = {"connect_timeout_seconds", "read_timeout_seconds", "retries"}
_COMMON = {"backend", "root", "upload_interval_seconds"}
#: What a cloud store (a bucket and a prefix in it) accepts whatever its kind.
_CLOUD_KEYS = _COMMON | _TUNING | {"bucket", "prefix", "endpoint"}


@dataclasses.dataclass(frozen=True)
class Backend:
    """One object store, registered in REGISTRY (the one table a new backend joins)."""
    keys: frozenset                     # the storage.durable keys it accepts
    opener: str                         # "module:function(cfg, environ) -> ObjectStore"
    schemes: tuple = ()                 # root URL schemes naming it (root: s3://b/p)
    sdk: tuple | None = None            # (import name, distribution, our extra)


#: Every backend, by its storage.durable.backend name. A new object store is its module in
#: danube/storage/durable/ (with its ``open_store``) and one row here.
REGISTRY = {
    # anonymous .. virtual_host_style are upstream's; path_style is ours (its inverse).
    "s3": Backend(frozenset(_CLOUD_KEYS | {
        "region", "access_key", "secret_key", "session_token", "profile", "role_arn",
        "anonymous", "virtual_host_style", "path_style"}),
        "danube.storage.durable.s3:open_store", ("s3",), ("boto3", "boto3", "s3")),
    # credentials_path / credentials_json are upstream's; credentials_file is our alias.
    "gcs": Backend(frozenset(_CLOUD_KEYS | {
        "project", "credentials_file", "credentials_path", "credentials_json"}),
        "danube.storage.durable.gcs:open_store", ("gs", "gcs"),
        ("google.cloud.storage", "google-cloud-storage", "gcs")),
    "azblob": Backend(frozenset(_CLOUD_KEYS | {
        "container", "account_name", "account_key", "connection_string"}),
        "danube.storage.durable.azblob:open_store", ("azblob",),
        ("azure.storage.blob", "azure-storage-blob", "azure")),
    # fs and memory take no bucket: a directory, a store's name (parse_durable).
    "fs": Backend(frozenset(_COMMON), "danube.storage.durable.fs:open_store"),
    "memory": Backend(frozenset(_COMMON), "danube.storage.durable.memory:open_store"),
}
BACKENDS = tuple(REGISTRY)
_SCHEMES = {scheme: name for name, b in REGISTRY.items() for scheme in b.schemes}
_KEYS = {name: b.keys for name, b in REGISTRY.items()}
_ALL_KEYS = set().union(*_KEYS.values())
# backend -> (the SDK's import name, its distribution, our extra that installs it)
_SDKS = {name: b.sdk for name, b in REGISTRY.items() if b.sdk is not None}
DISTRIBUTION = "danube-broker-py"


@dataclasses.dataclass(frozen=True)
class DurableConfig:
    backend: str                        # s3 | gcs | azblob | fs | memory
    bucket: str | None = None           # s3/gcs bucket, azblob container
    prefix: str = ""                    # root prefix inside the bucket, no leading/trailing /
    path: str | None = None             # fs: the directory
    name: str | None = None             # memory: the process-wide store name
    endpoint: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = dataclasses.field(default=None, repr=False)
    session_token: str | None = dataclasses.field(default=None, repr=False)
    profile: str | None = None
    role_arn: str | None = None
    anonymous: bool = False
    project: str | None = None
    credentials_file: str | None = None
    credentials_json: str | None = dataclasses.field(default=None, repr=False)
    account_name: str | None = None
    account_key: str | None = dataclasses.field(default=None, repr=False)
    connection_string: str | None = dataclasses.field(default=None, repr=False)
    path_style: bool | None = None
    connect_timeout_seconds: float = 5.0
    read_timeout_seconds: float = 60.0
    retries: int = 3
    upload_interval_seconds: float = 300.0

    @property
    def root(self) -> str:
        """The root as a URL (s3://b/p), the directory, or the memory store's name."""
        if self.backend == "fs":
            return self.path
        if self.backend == "memory":
            return self.name
        scheme = "gs" if self.backend == "gcs" else self.backend
        return f"{scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")


def parse_durable(mapping, where: str = "storage.durable") -> DurableConfig:
    """The DurableConfig of a ``storage.durable`` mapping; ConfigError naming the key."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(mapping).__name__}")
    for key in mapping:
        if key not in _ALL_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key{suggest(str(key), _ALL_KEYS)}")

    def text(key, required=False):
        value = mapping.get(key)
        if value is None:
            if required:
                raise ConfigError(f"{where}.{key}: required")
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ConfigError(f"{where}.{key}: expected a string, got {value!r}")
        value = str(value).strip()
        if not value:
            raise ConfigError(f"{where}.{key}: must not be empty")
        return value

    def number(key, default, *, minimum, integer=False, inclusive=False):
        value = mapping.get(key)
        if value is None:
            return default
        kinds = int if integer else (int, float)
        ok = not isinstance(value, bool) and isinstance(value, kinds)
        if ok:
            ok = value >= minimum if inclusive else value > minimum
        if not ok:
            what = "an integer" if integer else "a number"
            bound = f">= {minimum}" if inclusive else f"> {minimum}"
            raise ConfigError(f"{where}.{key}: expected {what} {bound}, got {value!r}")
        return value if integer else float(value)

    root = text("root")
    backend = text("backend")
    if backend is None and root and "://" in root:
        backend = _SCHEMES.get(root.split("://", 1)[0].lower())
    if backend is None:
        raise ConfigError(f"{where}.backend: required ({', '.join(BACKENDS)})")
    backend = backend.lower()
    if backend not in BACKENDS:
        raise ConfigError(f"{where}.backend: expected one of {', '.join(BACKENDS)}, got "
                          f"{mapping.get('backend')!r}")
    for key in mapping:
        if key not in _KEYS[backend]:
            raise ConfigError(f"{where}.{key}: not used by backend {backend}")

    values = {"backend": backend,
              "upload_interval_seconds": number("upload_interval_seconds", 300.0, minimum=0)}
    if backend == "fs":
        if root is None:
            raise ConfigError(f"{where}.root: required for backend fs (the directory)")
        if root.startswith("file://"):
            root = root[len("file://"):]
        values["path"] = root
        return DurableConfig(**values)
    if backend == "memory":
        values["name"] = root or "default"
        return DurableConfig(**values)

    bucket_key = "container" if backend == "azblob" else "bucket"
    bucket = text(bucket_key)
    if backend == "azblob" and bucket is None:
        bucket_key, bucket = "bucket", text("bucket")
    elif backend == "azblob" and "bucket" in mapping:
        raise ConfigError(f"{where}.bucket: give container (or bucket), not both")
    prefix = mapping.get("prefix")
    if prefix is not None and not isinstance(prefix, str):
        raise ConfigError(f"{where}.prefix: expected a string, got {prefix!r}")
    prefix = (prefix or "").strip("/")
    if root is not None:
        if bucket is not None:
            raise ConfigError(f"{where}.{bucket_key}: give either root or {bucket_key}, "
                              f"not both")
        bucket, root_prefix = _split_root(root, backend, f"{where}.root")
        if root_prefix and prefix:
            raise ConfigError(f"{where}.prefix: the root {root!r} already has a prefix")
        prefix = root_prefix or prefix
    if bucket is None:
        scheme = "gs" if backend == "gcs" else backend
        raise ConfigError(f"{where}.root: backend {backend} needs a "
                          f"{'container' if backend == 'azblob' else 'bucket'}: "
                          f"root: {scheme}://NAME/PREFIX or {bucket_key}: NAME")
    if "/" in bucket:
        raise ConfigError(f"{where}.{bucket_key}: expected a name without '/', got {bucket!r}")
    for part in prefix.split("/") if prefix else ():
        if part in ("", ".", ".."):
            raise ConfigError(f"{where}.prefix: invalid prefix {prefix!r}")
    values.update(bucket=bucket, prefix=prefix)

    endpoint = text("endpoint")
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"{where}.endpoint: expected an http:// or https:// URL, got "
                          f"{endpoint!r}")
    values["endpoint"] = endpoint
    for key in ("region", "access_key", "secret_key", "session_token", "profile", "role_arn",
                "project", "credentials_file", "credentials_json", "account_name",
                "account_key", "connection_string"):
        if key in _KEYS[backend]:
            values[key] = text(key)
    if backend == "gcs":
        path = text("credentials_path")
        if path and values["credentials_file"] and path != values["credentials_file"]:
            raise ConfigError(f"{where}.credentials_path: give credentials_path or "
                              f"credentials_file (the same setting), not both")
        values["credentials_file"] = path or values["credentials_file"]
        if values["credentials_file"] and values["credentials_json"]:
            raise ConfigError(f"{where}.credentials_json: give credentials_json or "
                              f"credentials_path, not both")
    if backend == "s3":
        _check_s3_credentials(mapping, values, where)
    if backend == "azblob" and values["connection_string"] and (
            values["account_key"] or values["endpoint"]):
        raise ConfigError(f"{where}.connection_string: give either connection_string or "
                          f"endpoint/account_name/account_key, not both")
    for key in ("path_style", "virtual_host_style", "anonymous"):
        if key in mapping and not isinstance(mapping[key], bool):
            raise ConfigError(f"{where}.{key}: expected true or false, got {mapping[key]!r}")
    if "virtual_host_style" in mapping:
        path_style = not mapping["virtual_host_style"]
        if "path_style" in mapping and mapping["path_style"] != path_style:
            raise ConfigError(f"{where}.path_style: contradicts virtual_host_style")
        values["path_style"] = path_style
    elif "path_style" in mapping:
        values["path_style"] = mapping["path_style"]
    values["connect_timeout_seconds"] = number("connect_timeout_seconds", 5.0, minimum=0)
    values["read_timeout_seconds"] = number("read_timeout_seconds", 60.0, minimum=0)
    values["retries"] = number("retries", 3, minimum=0, integer=True, inclusive=True)
    return DurableConfig(**values)


def require_sdk(backend: str, where: str = "storage.durable.backend") -> None:
    """ConfigError with the exact install command when ``backend``'s SDK is missing. The
    SDKs are extras, so a broker on local disk does not carry ~150 MB of cloud clients."""
    if backend not in _SDKS:
        return
    module, distribution, extra = _SDKS[backend]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):     # a parent package missing, or a blocked import
        found = False
    if found:
        return
    requirement = _requirement(distribution, extra)
    raise ConfigError(
        f"{where}: backend {backend} needs the {distribution} package, which is not "
        f"installed: run {sys.executable} -m pip install '{requirement}' (or, in the "
        f"source checkout, pip install '.[{extra}]')")


def _requirement(distribution, extra):
    """The version range our own metadata gives for ``distribution`` (one source of truth:
    pyproject.toml's extras), or the bare name."""
    from importlib import metadata

    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return distribution
    for line in requires:
        spec, _, marker = line.partition(";")
        if f'extra == "{extra}"' in marker and spec.strip().startswith(distribution):
            return spec.strip().replace(" ", "")
    return distribution


def _check_s3_credentials(mapping, values, where):
    if (values["access_key"] is None) != (values["secret_key"] is None):
        missing = "secret_key" if values["secret_key"] is None else "access_key"
        raise ConfigError(f"{where}.{missing}: access_key and secret_key go together")
    if values["session_token"] and values["access_key"] is None:
        raise ConfigError(f"{where}.session_token: goes with access_key and secret_key "
                          f"(temporary credentials)")
    if values["profile"] and values["access_key"] is not None:
        raise ConfigError(f"{where}.profile: give either profile or access_key/secret_key, "
                          f"not both")
    values["anonymous"] = mapping.get("anonymous") is True
    if values["anonymous"]:
        for key in ("access_key", "profile", "role_arn"):
            if values[key]:
                raise ConfigError(f"{where}.anonymous: unsigned requests take no credentials, "
                                  f"but {key} is set")


def _split_root(root, backend, where):
    if "://" in root:
        scheme, rest = root.split("://", 1)
        if _SCHEMES.get(scheme.lower()) != backend:
            expected = " or ".join(f"{s}://" for s in REGISTRY[backend].schemes)
            raise ConfigError(f"{where}: backend {backend} expects {expected}BUCKET/PREFIX, "
                              f"got {root!r}")
    else:
        rest = root
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"{where}: no bucket in {root!r}")
    return bucket, prefix.strip("/")
