"""pyarrow file systems for a table root, configured from the same ``storage_options`` deltalake takes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs

__all__ = ["arrow_filesystem"]

# deltalake/object_store spellings (lowercased, with or without the aws_ prefix) -> S3FileSystem's.
_S3_KEYS = {
    "access_key_id": "access_key",
    "secret_access_key": "secret_key",
    "session_token": "session_token",
    "token": "session_token",
    "region": "region",
    "default_region": "region",
}
_ENDPOINT_KEYS = ("endpoint", "endpoint_url")


def arrow_filesystem(
    table_uri: str, storage_options: Mapping[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """(file system, base path) of the table root: local paths and ``file://`` URIs on local disk,
    ``s3://``/``s3a://`` with the storage options' endpoint and keys, other URIs as pyarrow resolves them.
    """
    parts = urlsplit(table_uri.rstrip("/"))
    if not parts.scheme or parts.scheme == "file":
        return pafs.LocalFileSystem(), os.path.abspath(unquote(parts.path) if parts.scheme else table_uri)
    if parts.scheme not in ("s3", "s3a"):
        fs, base = pafs.FileSystem.from_uri(table_uri.rstrip("/"))
        return fs, str(base)
    kwargs: dict[str, str] = {}
    for key, value in _with_environment_endpoint(storage_options or {}).items():
        name = key.lower().removeprefix("aws_")
        if name in _S3_KEYS:
            kwargs[_S3_KEYS[name]] = value
        elif name in _ENDPOINT_KEYS:
            endpoint = urlsplit(value)
            kwargs["endpoint_override"] = endpoint.netloc or value
            kwargs["scheme"] = endpoint.scheme or "https"
    fs = pafs.S3FileSystem(**kwargs, allow_bucket_creation=False, allow_bucket_deletion=False)
    return fs, f"{parts.netloc}{unquote(parts.path)}"


def _with_environment_endpoint(options: Mapping[str, str]) -> Mapping[str, str]:
    """``options``, or with no endpoint among them, the one the environment names as the AWS SDKs (and
    deltalake and object_store) read it: pyarrow takes keys and region from there by itself, not the
    endpoint."""
    if any(key.lower().removeprefix("aws_") in _ENDPOINT_KEYS for key in options):
        return options
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return {**options, "AWS_ENDPOINT_URL": endpoint} if endpoint else options
