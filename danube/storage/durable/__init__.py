"""Object stores for tiered storage: one blocking interface (base.ObjectStore) over S3, GCS,
Azure Blob, a directory and memory. Each cloud backend imports its SDK only when a store of
that kind is opened."""

from danube.storage.durable.base import (ObjectExists, ObjectInfo, ObjectNotFound, ObjectStore,
                                         ObjectStoreConfigError, ObjectStoreError)
from danube.storage.durable.config import DurableConfig, open_object_store, parse_durable

__all__ = [
    "DurableConfig", "ObjectExists", "ObjectInfo", "ObjectNotFound", "ObjectStore",
    "ObjectStoreConfigError", "ObjectStoreError", "open_object_store", "parse_durable",
]
