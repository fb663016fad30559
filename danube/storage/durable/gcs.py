"""Google Cloud Storage (and fake-gcs-server) through google-cloud-storage.

The SDK is imported when a store is made, not when this module is."""

from __future__ import annotations

from danube.storage.durable.base import (ObjectInfo, ObjectNotFound, ObjectStore,
                                         ObjectStoreConfigError, ObjectStoreError, FileSlice,
                                         ServiceCodes, http_error,
                                         PROBE_CONNECT_TIMEOUT, PROBE_READ_TIMEOUT, check_key,
                                         check_prefix, check_range, join, normalize_prefix,
                                         probe, shorten, strip, tuning)

# GCS's JSON API carries no error code worth sorting on: the HTTP status decides, and a 400
# is a malformed name or request, which retrying cannot fix.
_CODES = ServiceCodes(container="bucket", bad_request_is_config=True)
_SCOPES = ["https://www.googleapis.com/auth/devstorage.read_write"]
# Resumable uploads send the file in chunks of this size (a multiple of 256 KiB); the SDK's
# default of 100 MiB would hold a whole WAL segment in memory per upload.
_UPLOAD_CHUNK = 8 << 20


class _Attempts:
    """A retry predicate that gives up after ``n`` attempts: google-api-core retries until a
    deadline, and a count is what the other backends are configured with."""

    def __init__(self, n, transient):
        self.left = n - 1
        self.transient = transient

    def __call__(self, exc):
        if self.left <= 0 or not self.transient(exc):
            return False
        self.left -= 1
        return True


def _credentials_from_json(text):
    """Credentials (and their project) from a credentials file's contents given inline."""
    import json

    import google.auth

    try:
        info = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(info, dict):
        raise ValueError("expected a JSON object")
    # The two kinds people use, by their own loaders (google-auth warns that its generic
    # loader also runs external-account configurations); anything else by the generic one.
    if info.get("type") == "service_account":
        from google.oauth2 import service_account
        creds = service_account.Credentials.from_service_account_info(info, scopes=_SCOPES)
        return creds, info.get("project_id")
    if info.get("type") == "authorized_user":
        from google.oauth2 import credentials as user_credentials
        creds = user_credentials.Credentials.from_authorized_user_info(info, scopes=_SCOPES)
        return creds, info.get("quota_project_id")
    return google.auth.load_credentials_from_dict(info, scopes=_SCOPES)


class GcsObjectStore(ObjectStore):
    backend = "gcs"

    def __init__(self, bucket: str, prefix: str = "", *, endpoint: str | None = None,
                 project: str | None = None, credentials_file: str | None = None,
                 credentials_json: str | None = None, connect_timeout: float = 5.0,
                 read_timeout: float = 60.0, retries: int = 3):
        """``endpoint`` points at an emulator (fake-gcs-server): without ``credentials_file``
        the store then sends no credentials, as emulators expect. With neither, the SDK's
        usual chain is used (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application default
        credentials, the metadata server; STORAGE_EMULATOR_HOST for an emulator)."""
        if not bucket:
            raise ObjectStoreConfigError("gcs: no bucket given")
        self.bucket_name = bucket
        self.prefix = normalize_prefix(prefix)
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self._timeout = (connect_timeout, read_timeout)
        self._attempts = retries + 1
        import requests
        from google.api_core import exceptions as api_exceptions
        from google.api_core.retry import if_transient_error
        from google.auth import exceptions as auth_exceptions
        from google.cloud import storage
        from google.cloud.storage import retry as gretry
        from google.cloud.storage.exceptions import InvalidResponse
        self._api = api_exceptions
        self._auth = auth_exceptions
        self._errors = (api_exceptions.GoogleAPIError, auth_exceptions.GoogleAuthError,
                        InvalidResponse, requests.exceptions.RequestException, ConnectionError,
                        TimeoutError)
        self._default_retry = gretry.DEFAULT_RETRY
        # The SDK's own notion of "transient" (429, 5xx, connection errors) is private; fall
        # back to api-core's public one if it moves.
        self._transient = getattr(gretry, "_should_retry", if_transient_error)
        credentials = None
        try:
            if credentials_file:
                with open(credentials_file, encoding="utf-8") as f:
                    credentials, file_project = _credentials_from_json(f.read())
                project = project or file_project
            elif credentials_json:
                credentials, file_project = _credentials_from_json(credentials_json)
                project = project or file_project
            elif self.endpoint:
                from google.auth.credentials import AnonymousCredentials
                credentials = AnonymousCredentials()
                project = project or "danube"
            options = {"api_endpoint": self.endpoint} if self.endpoint else None
            kwargs = {"project": project} if project else {}
            self._client = storage.Client(credentials=credentials, client_options=options,
                                          **kwargs)
        except auth_exceptions.DefaultCredentialsError as exc:
            raise ObjectStoreConfigError(f"{self.describe()}: no usable credentials: "
                                         f"{exc}") from None
        except (OSError, ValueError) as exc:
            source = (f"credentials_file {credentials_file!r}" if credentials_file
                      else "credentials_json")
            raise ObjectStoreConfigError(f"{self.describe()}: {source}: {exc}") from None
        self._bucket = self._client.bucket(bucket)

    def describe(self) -> str:
        where = self.endpoint or "https://storage.googleapis.com"
        return f"gcs bucket {self.bucket_name!r} at {where} prefix {self.prefix!r}"

    def _retry(self, attempts=None):
        return self._default_retry.with_predicate(
            _Attempts(attempts or self._attempts, self._transient))

    def _error(self, exc, op, key=None, *, conditional=False, bucket_level=False):
        where = f"{self.describe()}: {op}" + (f" {key!r}" if key is not None else "")
        api = self._api
        if isinstance(exc, api.GoogleAPICallError):
            message = shorten(getattr(exc, "message", None) or exc)
            # GCS answers 404 for a missing bucket and a missing object alike; an upload or a
            # listing can only miss the bucket, and GCS says so in the message.
            bucket_missing = bucket_level or "bucket does not exist" in message.lower()
            return http_error(where, exc.code, "", message, _CODES, conditional=conditional,
                              container_level=bucket_missing, hint="the credentials")
        if isinstance(exc, self._auth.RefreshError):
            return ObjectStoreConfigError(f"{where}: the credentials were refused: "
                                          f"{shorten(exc)}")
        if isinstance(exc, self._auth.GoogleAuthError):
            return ObjectStoreError(f"{where}: {shorten(exc)}")
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status is not None:          # google-resumable-media's InvalidResponse: an upload
            return http_error(where, status, "", "", _CODES, conditional=conditional,
                              container_level=True, hint="the credentials")
        return ObjectStoreError(f"{where}: unreachable or failed ({type(exc).__name__}: "
                                f"{shorten(exc)})")

    def _catch(self):
        return self._errors

    def check(self) -> None:
        timeout = (min(self._timeout[0], PROBE_CONNECT_TIMEOUT),
                   min(self._timeout[1], PROBE_READ_TIMEOUT))

        def attempt():
            try:
                # Listing needs only storage.objects.list, which the uploader needs anyway;
                # reading the bucket's metadata would need storage.buckets.get.
                list(self._client.list_blobs(self._bucket, prefix=join(self.prefix, ""),
                                             max_results=1, timeout=timeout, retry=None))
            except self._catch() as exc:
                raise self._error(exc, "check", bucket_level=True) from exc
        probe(attempt)

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> ObjectInfo:
        blob = self._bucket.blob(join(self.prefix, check_key(key)))
        try:
            blob.upload_from_string(bytes(data), content_type="application/octet-stream",
                                    if_generation_match=0 if if_absent else None,
                                    timeout=self._timeout, retry=self._retry())
        except self._catch() as exc:
            raise self._error(exc, "put", key, conditional=if_absent,
                              bucket_level=True) from exc
        return ObjectInfo(key, len(data), blob.etag)

    def put_file(self, key: str, path: str, size: int, *,
                 if_absent: bool = False) -> ObjectInfo:
        blob = self._bucket.blob(join(self.prefix, check_key(key)), chunk_size=_UPLOAD_CHUNK)
        if if_absent:
            # GCS enforces if_generation_match on the resumable upload itself; this HEAD
            # saves sending a whole segment only to have it refused, and is the only check
            # fake-gcs-server makes (it ignores preconditions on resumable uploads, so there
            # two racing writers can both succeed).
            self.refuse_existing(key)
        with FileSlice(path, size) as body:
            try:
                blob.upload_from_file(body, size=size, content_type="application/octet-stream",
                                      if_generation_match=0 if if_absent else None,
                                      timeout=self._timeout, retry=self._retry())
            except self._catch() as exc:
                raise self._error(exc, "put", key, conditional=if_absent,
                                  bucket_level=True) from exc
        return ObjectInfo(key, size, blob.etag)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        blob = self._bucket.blob(join(self.prefix, check_key(key)))
        if end == start:
            self.head(key)
            return b""
        try:
            # The SDK's end is inclusive.
            return blob.download_as_bytes(start=start or None,
                                          end=None if end is None else end - 1,
                                          timeout=self._timeout, retry=self._retry())
        except self._catch() as exc:
            if isinstance(exc, self._api.GoogleAPICallError) and exc.code == 416:
                self.head(key)   # past the end of an object that exists: nothing there
                return b""
            raise self._error(exc, "get", key) from exc

    def head(self, key: str) -> ObjectInfo:
        blob = self._bucket.blob(join(self.prefix, check_key(key)))
        try:
            blob.reload(timeout=self._timeout, retry=self._retry())
        except self._catch() as exc:
            raise self._error(exc, "head", key) from exc
        return ObjectInfo(key, blob.size, blob.etag)

    def list(self, prefix: str) -> list[ObjectInfo]:
        check_prefix(prefix)
        found = []
        try:
            for blob in self._client.list_blobs(self._bucket, prefix=join(self.prefix, prefix),
                                                timeout=self._timeout, retry=self._retry()):
                if blob.name.endswith("/"):
                    continue
                found.append(ObjectInfo(strip(self.prefix, blob.name), blob.size, blob.etag))
        except self._catch() as exc:
            raise self._error(exc, "list", prefix, bucket_level=True) from exc
        return sorted(found, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        blob = self._bucket.blob(join(self.prefix, check_key(key)))
        try:
            blob.delete(timeout=self._timeout, retry=self._retry())
        except self._catch() as exc:
            err = self._error(exc, "delete", key)
            if not isinstance(err, ObjectNotFound):
                raise err from exc

    def close(self) -> None:
        http = getattr(self._client, "_http_internal", None)
        if http is not None:
            http.close()


def open_store(cfg, environ):
    """storage.durable.backend gcs (danube.config_durable.REGISTRY)."""
    return GcsObjectStore(cfg.bucket, cfg.prefix, endpoint=cfg.endpoint,
                          project=cfg.project, credentials_file=cfg.credentials_file,
                          credentials_json=cfg.credentials_json, **tuning(cfg))
