"""Opening the object store a ``storage.durable`` section describes. The section itself is
parsed with the rest of the configuration, in ``danube.config_durable`` (re-exported here)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from danube.config_durable import (BACKENDS, DISTRIBUTION, REGISTRY, DurableConfig,
                                   parse_durable, require_sdk)
from danube.storage.durable.base import ObjectStore

__all__ = ["BACKENDS", "DISTRIBUTION", "DurableConfig", "open_object_store", "parse_durable",
           "require_sdk"]


def open_object_store(cfg: DurableConfig, *, environ: Mapping[str, str] | None = None
                      ) -> ObjectStore:
    """The ObjectStore a DurableConfig describes, made by its backend's module (its
    ``open_store``, named in danube.config_durable.REGISTRY). Nothing is contacted yet: call
    check() to probe. SDKs are imported here, only the one the backend needs."""
    env = os.environ if environ is None else environ
    backend = REGISTRY.get(cfg.backend)
    if backend is None:
        raise ValueError(f"unknown backend {cfg.backend!r}")
    module, function = backend.opener.split(":")
    return getattr(importlib.import_module(module), function)(cfg, env)
