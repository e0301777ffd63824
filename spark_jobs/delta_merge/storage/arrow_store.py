"""pyarrow file systems for a table root, configured from the same ``storage_options`` deltalake takes.

deltalake and obstore read object_store's option names; pyarrow's S3FileSystem and AzureFileSystem take
their own keyword arguments. No library translates one into the other, so the mapping is written here (for
Azure in :mod:`azure_options`, which refuses what pyarrow cannot honour). pyarrow's GcsFileSystem takes no
service account key at all (only the environment's credentials or an access token), so GCS tables opened
with ``google_*`` options go through obstore's fsspec store, wrapped as a pyarrow file system: the same
object_store client, with the same options, as the table's log. pyarrow's own fsspec wrapper reports any
failed look-up of a file (a refused key too) as a missing file and hands the store pyarrow buffers it cannot
take, so :class:`_ObjectStoreHandler` (written here) opens files without either.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from spark_jobs.delta_merge.storage.azure_options import AZURE_SCHEMES, azure_filesystem_arguments
from spark_jobs.delta_merge.storage.log_store import store_options

__all__ = ["GCS_SCHEMES", "arrow_file_path", "arrow_filesystem", "gcs_filesystem"]

GCS_SCHEMES = frozenset({"gs", "gcs"})

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
    ``s3://``/``s3a://``, Azure and GCS URIs with the storage options' endpoint and credentials, other URIs
    as pyarrow resolves them.

    :raises MergeSpecError: Azure storage options pyarrow cannot honour (the message says which).
    """
    parts = urlsplit(table_uri.rstrip("/"))
    scheme = parts.scheme.lower()
    if not scheme or scheme == "file":
        return pafs.LocalFileSystem(), os.path.abspath(unquote(parts.path) if parts.scheme else table_uri)
    if scheme in AZURE_SCHEMES:
        return _azure_filesystem(table_uri, storage_options or {}), arrow_file_path(
            f"{scheme}://{parts.netloc}{unquote(parts.path)}"
        )
    if scheme in GCS_SCHEMES and _google_options(storage_options or {}):
        return gcs_filesystem(storage_options or {}), f"{parts.netloc}{unquote(parts.path)}"
    if scheme not in ("s3", "s3a"):
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


def gcs_filesystem(storage_options: Mapping[str, str], protocol: str = "gs") -> pafs.FileSystem:
    """A pyarrow file system over obstore's fsspec store for ``protocol``, configured by deltalake-style
    ``storage_options`` exactly as the table's log store is; paths are ``bucket/key``."""
    from obstore.fsspec import FsspecStore

    config, client = store_options(storage_options)
    store = FsspecStore(protocol, config=config, client_options=client or None)  # type: ignore[call-overload]
    return pafs.PyFileSystem(_ObjectStoreHandler(store))


class _ObjectStoreHandler(pafs.FSSpecHandler):  # type: ignore[misc]
    """pyarrow's fsspec handler, opening files so that the store's own error (a refused key, a missing
    bucket) reaches the caller, and writing bytes the store takes."""

    def open_input_stream(self, path: str) -> pa.PythonFile:
        return self.open_input_file(path)

    def open_input_file(self, path: str) -> pa.PythonFile:
        # fsspec's isfile(), which pyarrow's handler asks first, answers False for any failure.
        if self.fs.info(path)["type"] != "file":
            raise FileNotFoundError(path)
        return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")

    def open_output_stream(self, path: str, metadata: Any) -> pa.PythonFile:
        return pa.PythonFile(_ByteWriter(self.fs.open(path, mode="wb")), mode="w")


class _ByteWriter:
    """A writable file that hands the store unsigned bytes (pyarrow writes its buffers, which obstore's
    writer refuses as not ``u8``)."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self.closed = False

    def write(self, data: Any) -> int:
        return int(self._file.write(memoryview(data).cast("B")))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
        self.closed = True

    def tell(self) -> int:
        return int(self._file.tell())

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


def _google_options(options: Mapping[str, str]) -> bool:
    """Whether ``options`` configure GCS (else pyarrow's own GcsFileSystem reads the environment's
    credentials, as object_store does)."""
    return any(key.lower().startswith(("google_", "service_account", "application_credentials"))
               for key in options)  # fmt: skip


def _with_environment_endpoint(options: Mapping[str, str]) -> Mapping[str, str]:
    """``options``, or with no endpoint among them, the one the environment names as the AWS SDKs (and
    deltalake and object_store) read it: pyarrow takes keys and region from there by itself, not the
    endpoint."""
    if any(key.lower().removeprefix("aws_") in _ENDPOINT_KEYS for key in options):
        return options
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return {**options, "AWS_ENDPOINT_URL": endpoint} if endpoint else options


def arrow_file_path(uri: str) -> str:
    """The path of an object-store URI in its pyarrow file system: the URI without its scheme
    (``bucket/key``), and on Azure ``container/path`` also for ``abfss://container@account.../path``.

    ``uri``'s path is taken as it is (already decoded): it is split by hand, not parsed, so that a ``?``
    or ``#`` in a file name stays part of the path.
    """
    scheme, _, rest = uri.partition("://")
    if scheme.lower() in AZURE_SCHEMES:
        authority, slash, path = rest.partition("/")
        container = authority.split("@", 1)[0] if "@" in authority else authority
        return f"{container}{slash}{path}".rstrip("/")
    return rest


def _azure_filesystem(table_uri: str, storage_options: Mapping[str, str]) -> pafs.AzureFileSystem:
    return pafs.AzureFileSystem(**azure_filesystem_arguments(table_uri, storage_options))
