"""The one decision table from a cloud store's answer to the tier's error kinds
(durable/base.py http_error), with each backend's own codes."""

import pytest

from danube.storage.durable import azblob, gcs, s3
from danube.storage.durable.base import (ObjectExists, ObjectNotFound, ObjectStoreConfigError,
                                         ObjectStoreError, http_error)

S3, AZ, GCS = s3._CODES, azblob._CODES, gcs._CODES

CASES = [
    # codes, status, code, conditional, container_level, expected kind, words in the message
    (S3, 412, "PreconditionFailed", True, False, ObjectExists, "already exists"),
    (S3, 412, "PreconditionFailed", False, False, ObjectStoreError, "HTTP 412"),
    (S3, 403, "SignatureDoesNotMatch", False, False, ObjectStoreConfigError, "access denied"),
    (S3, 400, "InvalidAccessKeyId", False, False, ObjectStoreConfigError, "access denied"),
    (S3, 404, "NoSuchBucket", False, False, ObjectStoreConfigError, "bucket does not exist"),
    (S3, 404, "404", False, True, ObjectStoreConfigError, "bucket does not exist"),
    (S3, 404, "NoSuchKey", False, True, ObjectNotFound, "not found"),
    (S3, 404, "NoSuchKey", False, False, ObjectNotFound, "not found"),
    (S3, 301, "PermanentRedirect", False, False, ObjectStoreConfigError, "PermanentRedirect"),
    (S3, 400, "", False, False, ObjectStoreError, "HTTP 400"),
    (S3, 503, "SlowDown", False, False, ObjectStoreError, "HTTP 503"),
    (AZ, 409, "BlobAlreadyExists", True, False, ObjectExists, "already exists"),
    (AZ, 403, "AuthenticationFailed", False, False, ObjectStoreConfigError, "access denied"),
    (AZ, 404, "ContainerNotFound", False, False, ObjectStoreConfigError,
     "container does not exist"),
    (AZ, 404, "BlobNotFound", False, True, ObjectNotFound, "not found"),
    (AZ, 404, "", False, True, ObjectStoreConfigError, "container does not exist"),
    (AZ, 400, "InvalidResourceName", False, False, ObjectStoreConfigError, "InvalidResourceName"),
    (AZ, 500, "InternalError", False, False, ObjectStoreError, "HTTP 500"),
    (GCS, 412, "", True, False, ObjectExists, "already exists"),
    (GCS, 401, "", False, False, ObjectStoreConfigError, "access denied"),
    (GCS, 404, "", False, True, ObjectStoreConfigError, "bucket does not exist"),
    (GCS, 404, "", False, False, ObjectNotFound, "not found"),
    (GCS, 400, "", False, False, ObjectStoreConfigError, "HTTP 400"),
    (GCS, 429, "", False, False, ObjectStoreError, "HTTP 429"),
]


@pytest.mark.parametrize("codes,status,code,conditional,container_level,kind,words", CASES)
def test_decision_table(codes, status, code, conditional, container_level, kind, words):
    err = http_error("store: put 'k'", status, code, code, codes, conditional=conditional,
                     container_level=container_level)
    assert type(err) is kind
    assert words in str(err) and str(err).startswith("store: put 'k'")


def test_access_denied_names_whose_credentials_and_what_to_check():
    err = http_error("s3 bucket 'b': put 'k'", 403, "AccessDenied", "AccessDenied: no", S3,
                     who="access key 'AK'", hint="access_key and secret_key")
    assert "access denied for access key 'AK'" in str(err)
    assert "check access_key and secret_key" in str(err)
