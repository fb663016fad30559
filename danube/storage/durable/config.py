"""Opening the object store a ``storage.durable`` section describes. The section itself is
parsed with the rest of the configuration, in ``danube.config_durable`` (re-exported here)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from danube.config_durable import (BACKENDS, DISTRIBUTION, DurableConfig, parse_durable,
                                   require_sdk)
from danube.storage.durable.base import ObjectStore

__all__ = ["BACKENDS", "DISTRIBUTION", "DurableConfig", "open_object_store", "parse_durable",
           "require_sdk"]


def open_object_store(cfg: DurableConfig, *, environ: Mapping[str, str] | None = None
                      ) -> ObjectStore:
    """The ObjectStore a DurableConfig describes. Nothing is contacted yet: call check() to
    probe. SDKs are imported here, only the one the backend needs."""
    env = os.environ if environ is None else environ
    tuning = dict(connect_timeout=cfg.connect_timeout_seconds,
                  read_timeout=cfg.read_timeout_seconds, retries=cfg.retries)
    if cfg.backend == "memory":
        from danube.storage.durable.memory import MemoryObjectStore
        return MemoryObjectStore(cfg.name)
    if cfg.backend == "fs":
        from danube.storage.durable.fs import FsObjectStore
        return FsObjectStore(cfg.path)
    if cfg.backend == "s3":
        from danube.storage.durable.s3 import S3ObjectStore
        return S3ObjectStore(cfg.bucket, cfg.prefix, endpoint=cfg.endpoint, region=cfg.region,
                             access_key=cfg.access_key, secret_key=cfg.secret_key,
                             session_token=cfg.session_token, profile=cfg.profile,
                             role_arn=cfg.role_arn, anonymous=cfg.anonymous,
                             path_style=cfg.path_style, **tuning)
    if cfg.backend == "gcs":
        from danube.storage.durable.gcs import GcsObjectStore
        return GcsObjectStore(cfg.bucket, cfg.prefix, endpoint=cfg.endpoint,
                              project=cfg.project, credentials_file=cfg.credentials_file,
                              credentials_json=cfg.credentials_json, **tuning)
    if cfg.backend == "azblob":
        from danube.storage.durable.azblob import AzureBlobObjectStore
        connection_string = cfg.connection_string
        account_name, account_key = cfg.account_name, cfg.account_key
        if not (connection_string or account_key or cfg.endpoint or account_name):
            connection_string = env.get("AZURE_STORAGE_CONNECTION_STRING") or None
        if not connection_string:
            account_name = account_name or env.get("AZURE_STORAGE_ACCOUNT") or None
            account_key = account_key or env.get("AZURE_STORAGE_KEY") or None
        return AzureBlobObjectStore(cfg.bucket, cfg.prefix, account_name=account_name,
                                    account_key=account_key, endpoint=cfg.endpoint,
                                    connection_string=connection_string, **tuning)
    raise ValueError(f"unknown backend {cfg.backend!r}")
