"""Azure Blob Storage (and Azurite) through azure-storage-blob.

The SDK is imported when a store is made, not when this module is."""

from __future__ import annotations

import base64
import binascii
import logging
from urllib.parse import urlparse

from danube.storage.durable.base import (ObjectInfo, ObjectNotFound, ObjectStore,
                                         ObjectStoreConfigError, ObjectStoreError, FileSlice,
                                         ServiceCodes, http_error,
                                         PROBE_CONNECT_TIMEOUT, PROBE_READ_TIMEOUT, check_key,
                                         check_prefix, check_range, join, normalize_prefix,
                                         probe, shorten, strip, tuning)

_CODES = ServiceCodes(
    container="container",
    auth=frozenset({
        "AuthenticationFailed", "AuthorizationFailure", "AuthorizationPermissionMismatch",
        "AuthorizationSourceIPMismatch", "AuthorizationProtocolMismatch",
        "AuthorizationResourceTypeMismatch", "AuthorizationServiceMismatch",
        "InsufficientAccountPermissions", "InvalidAuthenticationInfo", "AccountIsDisabled",
        "NoAuthenticationInformation"}),
    missing_container=frozenset({"ContainerNotFound"}),
    config=frozenset({"ContainerBeingDeleted", "ContainerDisabled", "AccountNotFound",
                      "ResourceNotFound", "InvalidResourceName", "OutOfRangeInput",
                      "InvalidUri"}),
    missing_object=frozenset({"BlobNotFound"}),
    exists=frozenset({"BlobAlreadyExists", "ConditionNotMet"}),
)
# Uploads above this are sent as blocks of _BLOCK bytes, so one upload holds at most one
# block in memory (the SDK's single-put default is 64 MiB, a whole WAL segment).
_SINGLE_PUT = 8 << 20
_BLOCK = 8 << 20
# The SDK logs every request and response (headers included) at INFO on its own logger,
# which would flood the broker's log; its HTTP logging goes here instead, quiet unless this
# logger is turned up.
_http_log = logging.getLogger("danube.storage.durable.azblob.http")
_http_log.setLevel(logging.WARNING)


def account_from_endpoint(endpoint: str) -> str | None:
    """The account name in an endpoint: the first path segment for Azurite-style URLs
    (http://127.0.0.1:10000/devstoreaccount1), else the first label of the host name."""
    url = urlparse(endpoint)
    path = url.path.strip("/")
    if path:
        return path.split("/")[0]
    host = url.hostname or ""
    if host and not host.replace(".", "").isdigit() and host != "localhost":
        return host.split(".")[0]
    return None


class AzureBlobObjectStore(ObjectStore):
    backend = "azblob"

    def __init__(self, container: str, prefix: str = "", *, account_name: str | None = None,
                 account_key: str | None = None, endpoint: str | None = None,
                 connection_string: str | None = None, connect_timeout: float = 5.0,
                 read_timeout: float = 60.0, retries: int = 3):
        """Either ``connection_string``, or an account: ``endpoint`` (default
        https://ACCOUNT.blob.core.windows.net) with ``account_key``. Without a key the store
        uses azure-identity's DefaultAzureCredential when that package is installed."""
        if not container:
            raise ObjectStoreConfigError("azblob: no container given")
        self.container = container
        self.prefix = normalize_prefix(prefix)
        self.account_name = account_name or (account_from_endpoint(endpoint)
                                             if endpoint else None)
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        if not self.endpoint and self.account_name and not connection_string:
            self.endpoint = f"https://{self.account_name}.blob.core.windows.net"
        from azure.core import exceptions as core_exceptions
        from azure.storage.blob import BlobServiceClient, ExponentialRetry
        self._core = core_exceptions
        options = dict(
            connection_timeout=connect_timeout, read_timeout=read_timeout,
            retry_policy=ExponentialRetry(initial_backoff=0.5, increment_base=2,
                                          retry_total=retries, random_jitter_range=0.5),
            max_single_put_size=_SINGLE_PUT, max_block_size=_BLOCK, logger=_http_log)
        try:
            if connection_string:
                self._service = BlobServiceClient.from_connection_string(connection_string,
                                                                         **options)
                self.endpoint = self._service.url.rstrip("/")
                self.account_name = self._service.account_name
            else:
                if not self.endpoint:
                    raise ObjectStoreConfigError(
                        f"azblob container {container!r}: needs account_name (or endpoint) "
                        f"with account_key, or connection_string")
                credential = self._credential(account_key)
                self._service = BlobServiceClient(self.endpoint, credential=credential,
                                                  **options)
        except ValueError as exc:
            raise ObjectStoreConfigError(f"{self.describe()}: {exc}") from None
        self._container = self._service.get_container_client(container)

    def _credential(self, account_key):
        if account_key:
            try:
                base64.b64decode(account_key, validate=True)
            except (binascii.Error, ValueError):
                raise ObjectStoreConfigError(f"{self.describe()}: account_key is not valid "
                                             f"base64") from None
            if not self.account_name:
                raise ObjectStoreConfigError(f"{self.describe()}: account_key needs "
                                             f"account_name")
            return {"account_name": self.account_name, "account_key": account_key}
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError:
            raise ObjectStoreConfigError(
                f"{self.describe()}: no credentials: give account_key or connection_string "
                f"(or install azure-identity for Azure AD credentials)") from None
        return DefaultAzureCredential()

    def describe(self) -> str:
        where = getattr(self, "endpoint", None) or "(connection string)"
        return f"azblob container {self.container!r} at {where} prefix {self.prefix!r}"

    def _error(self, exc, op, key=None, *, conditional=False, container_level=False):
        where = f"{self.describe()}: {op}" + (f" {key!r}" if key is not None else "")
        core = self._core
        if isinstance(exc, core.HttpResponseError) and exc.status_code is not None:
            code = str(getattr(exc.error_code, "value", exc.error_code) or "")
            detail = shorten(": ".join(p for p in (code, exc.reason) if p))
            who = f"account {self.account_name!r}" if self.account_name else \
                "the credentials given"
            return http_error(where, exc.status_code, code, detail, _CODES,
                              conditional=conditional, container_level=container_level,
                              who=who, hint="account_name and account_key (or "
                                            "connection_string)")
        if isinstance(exc, core.ClientAuthenticationError):
            return ObjectStoreConfigError(f"{where}: the credentials were refused: "
                                          f"{shorten(exc)}")
        if isinstance(exc, (core.ServiceRequestError, core.ServiceResponseError)):
            return ObjectStoreError(f"{where}: unreachable ({shorten(exc)})")
        return ObjectStoreError(f"{where}: {type(exc).__name__}: {shorten(exc)}")

    def _catch(self):
        return self._core.AzureError

    def check(self) -> None:
        def attempt():
            try:
                pages = self._container.list_blobs(
                    name_starts_with=join(self.prefix, "") or None, results_per_page=1,
                    retry_total=0, connection_timeout=PROBE_CONNECT_TIMEOUT,
                    read_timeout=PROBE_READ_TIMEOUT).by_page()
                list(next(pages, []))
            except self._catch() as exc:
                raise self._error(exc, "check", container_level=True) from exc
        probe(attempt)

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> ObjectInfo:
        blob = self._container.get_blob_client(join(self.prefix, check_key(key)))
        try:
            resp = blob.upload_blob(bytes(data), length=len(data), overwrite=not if_absent)
        except self._catch() as exc:
            raise self._error(exc, "put", key, conditional=if_absent,
                              container_level=True) from exc
        return ObjectInfo(key, len(data), _etag(resp.get("etag")))

    def put_file(self, key: str, path: str, size: int, *,
                 if_absent: bool = False) -> ObjectInfo:
        blob = self._container.get_blob_client(join(self.prefix, check_key(key)))
        with FileSlice(path, size) as body:
            try:
                # Above _SINGLE_PUT the SDK stages blocks and commits the block list with
                # If-None-Match: * when overwrite is False: still all-or-nothing.
                resp = blob.upload_blob(body, length=size, overwrite=not if_absent,
                                        max_concurrency=1)
            except self._catch() as exc:
                raise self._error(exc, "put", key, conditional=if_absent,
                                  container_level=True) from exc
        return ObjectInfo(key, size, _etag(resp.get("etag")))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        blob = self._container.get_blob_client(join(self.prefix, check_key(key)))
        if end == start:
            self.head(key)
            return b""
        try:
            if end is None:
                stream = blob.download_blob(offset=start or None)
            else:
                stream = blob.download_blob(offset=start, length=end - start)
            return stream.readall()
        except self._catch() as exc:
            if isinstance(exc, self._core.HttpResponseError) and exc.status_code == 416:
                self.head(key)   # past the end of an object that exists: nothing there
                return b""
            raise self._error(exc, "get", key) from exc

    def head(self, key: str) -> ObjectInfo:
        blob = self._container.get_blob_client(join(self.prefix, check_key(key)))
        try:
            props = blob.get_blob_properties()
        except self._catch() as exc:
            raise self._error(exc, "head", key) from exc
        return ObjectInfo(key, props.size, _etag(props.etag))

    def list(self, prefix: str) -> list[ObjectInfo]:
        check_prefix(prefix)
        found = []
        try:
            for props in self._container.list_blobs(
                    name_starts_with=join(self.prefix, prefix) or None):
                found.append(ObjectInfo(strip(self.prefix, props.name), props.size,
                                        _etag(props.etag)))
        except self._catch() as exc:
            raise self._error(exc, "list", prefix, container_level=True) from exc
        return sorted(found, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        blob = self._container.get_blob_client(join(self.prefix, check_key(key)))
        try:
            blob.delete_blob()
        except self._catch() as exc:
            err = self._error(exc, "delete", key)
            if not isinstance(err, ObjectNotFound):
                raise err from exc

    def close(self) -> None:
        self._service.close()


def _etag(value):
    return value.strip('"') if value else None


def open_store(cfg, environ):
    """storage.durable.backend azblob (danube.config_durable.REGISTRY); without credentials
    in the section, Azure's environment variables."""
    connection_string = cfg.connection_string
    account_name, account_key = cfg.account_name, cfg.account_key
    if not (connection_string or account_key or cfg.endpoint or account_name):
        connection_string = environ.get("AZURE_STORAGE_CONNECTION_STRING") or None
    if not connection_string:
        account_name = account_name or environ.get("AZURE_STORAGE_ACCOUNT") or None
        account_key = account_key or environ.get("AZURE_STORAGE_KEY") or None
    return AzureBlobObjectStore(cfg.bucket, cfg.prefix, account_name=account_name,
                                account_key=account_key, endpoint=cfg.endpoint,
                                connection_string=connection_string, **tuning(cfg))
