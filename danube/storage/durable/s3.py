"""Amazon S3 and S3-compatible servers (SeaweedFS, MinIO, Ceph RGW, ...) through boto3.

boto3 is imported when a store is made, not when this module is, so a broker that does not
use S3 never loads it."""

from __future__ import annotations

import threading

from danube.storage.durable.base import (ObjectInfo, ObjectNotFound, ObjectStore,
                                         ObjectStoreConfigError, ObjectStoreError, FileSlice,
                                         ServiceCodes, http_error,
                                         PROBE_CONNECT_TIMEOUT, PROBE_READ_TIMEOUT, check_key,
                                         check_prefix, check_range, join, normalize_prefix,
                                         probe, shorten, strip, tuning)

_CODES = ServiceCodes(
    container="bucket",
    auth=frozenset({
        "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken",
        "ExpiredToken", "TokenRefreshRequired", "AuthorizationHeaderMalformed",
        "AllAccessDisabled", "InvalidSecurity", "AccountProblem", "403", "401", "Forbidden",
        "Unauthorized"}),
    missing_container=frozenset({"NoSuchBucket"}),
    config=frozenset({"InvalidBucketName", "PermanentRedirect", "IllegalLocation"}),
    not_found=frozenset({"NoSuchKey", "404", "NotFound"}),
    missing_object=frozenset({"NoSuchKey"}),
    exists=frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}),
)



def _assume_role_session(base, role_arn):
    """A boto3 session whose credentials come from STS AssumeRole of ``role_arn`` with the
    base session's credentials, renewed by botocore before they expire (the same mechanism
    as a profile with role_arn in ~/.aws/config). STS is reached at its usual endpoint, or
    AWS_ENDPOINT_URL_STS."""
    import boto3
    import botocore.credentials
    import botocore.session

    source = base.get_credentials()
    if source is None:
        raise ObjectStoreConfigError(f"s3 role_arn {role_arn!r}: no credentials to assume "
                                     f"the role with (access_key/secret_key, profile, or the "
                                     f"SDK's environment)")
    fetcher = botocore.credentials.AssumeRoleCredentialFetcher(
        client_creator=base._session.create_client, source_credentials=source,
        role_arn=role_arn, extra_args={"RoleSessionName": "danube-broker"})
    credentials = botocore.credentials.DeferredRefreshableCredentials(
        method="assume-role", refresh_using=fetcher.fetch_credentials)
    session = botocore.session.Session()
    session._credentials = credentials
    return boto3.session.Session(botocore_session=session, region_name=base.region_name)


class S3ObjectStore(ObjectStore):
    backend = "s3"

    def __init__(self, bucket: str, prefix: str = "", *, endpoint: str | None = None,
                 region: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None, session_token: str | None = None,
                 profile: str | None = None, role_arn: str | None = None,
                 anonymous: bool = False, path_style: bool | None = None,
                 connect_timeout: float = 5.0, read_timeout: float = 60.0, retries: int = 3):
        """``endpoint`` None is AWS itself. Without ``access_key``/``secret_key`` boto3's
        usual chain is used (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE and
        ~/.aws, instance roles); without ``region``, AWS_REGION / AWS_DEFAULT_REGION, else
        us-east-1. ``path_style`` (bucket in the path, not the host name) defaults to True
        with a custom endpoint: S3-compatible servers rarely have wildcard DNS; False is
        virtual-hosted style. ``session_token`` goes with temporary keys; ``profile`` names
        a profile of ~/.aws; ``role_arn`` is assumed through STS with whichever of those
        credentials (refreshed before they expire); ``anonymous`` sends unsigned requests
        (public buckets)."""
        if not bucket:
            raise ObjectStoreConfigError("s3: no bucket given")
        if (access_key is None) != (secret_key is None):
            raise ObjectStoreConfigError(
                f"s3 bucket {bucket!r}: access_key and secret_key go together; give both or "
                f"neither")
        self.bucket = bucket
        self.prefix = normalize_prefix(prefix)
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self.path_style = path_style
        self.anonymous = anonymous
        self._access_key = access_key
        self._secret_key = secret_key
        self._timeouts = (connect_timeout, read_timeout)
        self._retries = retries
        self._probe_client = None
        self._lock = threading.Lock()
        # Some S3-compatible servers answer a conditional put with 501; from then on this
        # store checks with a HEAD first (see _put).
        self._native_conditional = True
        import boto3
        import botocore.exceptions
        self._boto_errors = botocore.exceptions
        try:
            self._session = boto3.session.Session(aws_access_key_id=access_key,
                                                  aws_secret_access_key=secret_key,
                                                  aws_session_token=session_token,
                                                  profile_name=profile, region_name=region)
            if role_arn:
                self._session = _assume_role_session(self._session, role_arn)
        except botocore.exceptions.BotoCoreError as exc:
            raise ObjectStoreConfigError(f"{self.describe()}: {exc}") from None
        self.region = self._session.region_name or "us-east-1"
        self._client = self._make_client(connect_timeout, read_timeout, retries + 1)

    def _make_client(self, connect_timeout, read_timeout, attempts):
        from botocore import UNSIGNED
        from botocore.config import Config
        if self.path_style is None:
            style = "path" if self.endpoint else "auto"
        else:
            style = "path" if self.path_style else "virtual"
        config = Config(
            connect_timeout=connect_timeout, read_timeout=read_timeout,
            retries={"total_max_attempts": attempts, "mode": "standard"},
            s3={"addressing_style": style},
            **({"signature_version": UNSIGNED} if self.anonymous else {}),
            # The flexible-checksum defaults of recent botocore send headers that many
            # S3-compatible servers reject; Content-MD5/ETag integrity is kept either way.
            request_checksum_calculation="when_required" if self.endpoint else
            "when_supported",
            response_checksum_validation="when_required" if self.endpoint else
            "when_supported",
        )
        try:
            return self._session.client("s3", endpoint_url=self.endpoint,
                                        region_name=self.region, config=config)
        except ValueError as exc:
            raise ObjectStoreConfigError(f"{self.describe()}: {exc}") from None

    def describe(self) -> str:
        where = self.endpoint or f"AWS region {getattr(self, 'region', None) or 'default'}"
        return f"s3 bucket {self.bucket!r} at {where} prefix {self.prefix!r}"

    # -- errors --

    def _error(self, exc, op, key=None, *, conditional=False, probe=False):
        """The ObjectStoreError for a boto3 exception."""
        e = self._boto_errors
        where = f"{self.describe()}: {op}" + (f" {key!r}" if key is not None else "")
        if isinstance(exc, e.ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            message = shorten(err.get("Message") or "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            detail = f"{code}" + (f": {message}" if message and message != code else "")
            who = f"access key {self._access_key!r}" if self._access_key else \
                "the credentials from the environment"
            return http_error(where, status, code, detail, _CODES, conditional=conditional,
                              container_level=probe, who=who, hint="access_key and secret_key")
        if isinstance(exc, (e.NoCredentialsError, e.PartialCredentialsError)):
            return ObjectStoreConfigError(f"{where}: no usable credentials ({exc}); set "
                                          f"access_key and secret_key")
        if isinstance(exc, (e.EndpointConnectionError, e.ConnectTimeoutError)):
            return ObjectStoreError(f"{where}: unreachable ({shorten(exc)})")
        if isinstance(exc, e.ParamValidationError):
            return ObjectStoreConfigError(f"{where}: {exc}")
        return ObjectStoreError(f"{where}: {type(exc).__name__}: {shorten(exc)}")

    def _catch(self):
        return (self._boto_errors.BotoCoreError, self._boto_errors.ClientError)

    # -- operations --

    def check(self) -> None:
        with self._lock:
            if self._probe_client is None:
                self._probe_client = self._make_client(
                    min(self._timeouts[0], PROBE_CONNECT_TIMEOUT),
                    min(self._timeouts[1], PROBE_READ_TIMEOUT), 1)

        def attempt():
            try:
                # A listing (rather than HEAD bucket) answers with an error body, so a
                # refusal says whether the key id or the signature is wrong.
                self._probe_client.list_objects_v2(Bucket=self.bucket, MaxKeys=1,
                                                   Prefix=join(self.prefix, ""))
            except self._catch() as exc:
                raise self._error(exc, "check", probe=True) from exc
        probe(attempt)

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> ObjectInfo:
        return self._put(key, bytes(data), len(data), if_absent)

    def put_file(self, key: str, path: str, size: int, *,
                 if_absent: bool = False) -> ObjectInfo:
        # One PUT (up to 5 GiB, far above a WAL segment): a multipart upload through
        # boto3's transfer manager cannot carry If-None-Match.
        with FileSlice(path, size) as body:
            return self._put(key, body, size, if_absent)

    def _put(self, key, body, size, if_absent):
        name = join(self.prefix, check_key(key))
        args = {"Bucket": self.bucket, "Key": name, "Body": body, "ContentLength": size}
        if if_absent and self._native_conditional:
            args["IfNoneMatch"] = "*"
        elif if_absent:
            # Race: another writer can create the key between this HEAD and the PUT, and
            # one of the two uploads silently wins. Only used against servers that refuse
            # If-None-Match; tiered storage writes each key from one broker at a time.
            self.refuse_existing(key)
        try:
            resp = self._client.put_object(**args)
        except self._catch() as exc:
            if (if_absent and self._native_conditional
                    and isinstance(exc, self._boto_errors.ClientError)
                    and exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 501):
                self._native_conditional = False
                if hasattr(body, "seek"):
                    body.seek(0)
                return self._put(key, body, size, if_absent)
            raise self._error(exc, "put", key, conditional=if_absent) from exc
        return ObjectInfo(key, size, _etag(resp.get("ETag")))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        name = join(self.prefix, check_key(key))
        if end == start:
            self.head(key)
            return b""
        args = {"Bucket": self.bucket, "Key": name}
        ranged = start > 0 or end is not None
        if ranged:
            args["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        try:
            resp = self._client.get_object(**args)
            data = resp["Body"].read()
        except self._catch() as exc:
            if (isinstance(exc, self._boto_errors.ClientError)
                    and exc.response.get("Error", {}).get("Code") == "InvalidRange"):
                self.head(key)       # past the end of an object that exists: nothing there
                return b""
            raise self._error(exc, "get", key) from exc
        if ranged and "ContentRange" not in resp:
            data = data[start:end]   # the server ignored Range and sent it all
        return data

    def head(self, key: str) -> ObjectInfo:
        name = join(self.prefix, check_key(key))
        try:
            resp = self._client.head_object(Bucket=self.bucket, Key=name)
        except self._catch() as exc:
            raise self._error(exc, "head", key) from exc
        return ObjectInfo(key, resp["ContentLength"], _etag(resp.get("ETag")))

    def list(self, prefix: str) -> list[ObjectInfo]:
        check_prefix(prefix)
        full = join(self.prefix, prefix)
        found = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full)  # "p/" for prefix "": only the store's keys
            for page in pages:
                for obj in page.get("Contents", ()):
                    name = obj["Key"]
                    if name.endswith("/"):
                        continue        # a "directory" marker some servers list
                    found.append(ObjectInfo(strip(self.prefix, name), obj["Size"],
                                            _etag(obj.get("ETag"))))
        except self._catch() as exc:
            raise self._error(exc, "list", prefix) from exc
        return sorted(found, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        name = join(self.prefix, check_key(key))
        try:
            self._client.delete_object(Bucket=self.bucket, Key=name)
        except self._catch() as exc:
            err = self._error(exc, "delete", key)
            if not isinstance(err, ObjectNotFound):
                raise err from exc

    def close(self) -> None:
        for client in (self._client, self._probe_client):
            if client is not None:
                client.close()


def _etag(value):
    return value.strip('"') if value else None


def open_store(cfg, environ):
    """storage.durable.backend s3 (danube.config_durable.REGISTRY)."""
    return S3ObjectStore(cfg.bucket, cfg.prefix, endpoint=cfg.endpoint, region=cfg.region,
                         access_key=cfg.access_key, secret_key=cfg.secret_key,
                         session_token=cfg.session_token, profile=cfg.profile,
                         role_arn=cfg.role_arn, anonymous=cfg.anonymous,
                         path_style=cfg.path_style, **tuning(cfg))
