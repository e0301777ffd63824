"""Pin the target Delta table at one version: schema, protocol, properties and live files."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import deltalake
import pyarrow as pa
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.table import ProtocolVersions
from obstore.store import ObjectStore
from pyspark.sql.types import StructType

from spark_jobs.delta_merge.errors import MergeAnalysisError, MergeExecutionError
from spark_jobs.delta_merge.protocol.column_mapping import mapping_mode, partition_keys
from spark_jobs.delta_merge.protocol.delta_log import LogState, replay_log
from spark_jobs.delta_merge.protocol.delta_schema import spark_schema_from_delta
from spark_jobs.delta_merge.protocol.files import FileStats, LiveFile
from spark_jobs.delta_merge.storage.azure_options import check_azure_options
from spark_jobs.delta_merge.storage.log_store import log_store
from spark_jobs.delta_merge.storage.storage_errors import storage_errors, storage_failure

__all__ = ["TableProtocol", "TargetSnapshot", "load_snapshot", "relative_path_from_uri"]

_ABSOLUTE_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


@dataclass(frozen=True)
class TableProtocol:
    """The table's ``protocol`` action (feature sets are empty for legacy protocol versions)."""

    min_reader_version: int
    min_writer_version: int
    reader_features: frozenset[str] = frozenset()
    writer_features: frozenset[str] = frozenset()

    @property
    def supports_column_mapping(self) -> bool:
        """Writer version 5 or 6, or 7 listing the ``columnMapping`` feature (PROTOCOL.md)."""
        if self.min_writer_version >= 7:
            return "columnMapping" in self.writer_features
        return self.min_writer_version >= 5


@dataclass(frozen=True)
class TargetSnapshot:
    """The target table as of one version; every later stage reads the table through this.

    :param table_uri: the table root as deltalake names it, without a trailing slash
        (``file:///abs/path`` for local tables, percent-encoded).
    :param schema_json: the schema as delta-rs serializes ``metaData.schemaString``.
    :param configuration: the table properties (``metaData.configuration``).
    :param files: the live ``add`` actions. Partition values are the log's strings for strings,
        numbers, booleans and dates; timestamps are rendered ``YYYY-MM-DD HH:MM:SS.ffffff`` in UTC
        (delta-rs only exposes parsed partition values). Keys are the log's: physical names in
        column-mapped tables (see column_mapping.partition_keys), as are the stats' keys.
    :param storage_options: how to reach the table's store (to read deletion vectors).
    :param domains: the live ``domainMetadata`` configurations (JSON strings) by domain.
    :param in_commit_timestamp: the version's ``commitInfo.inCommitTimestamp``, if it has one.
    """

    table_uri: str
    version: int
    schema: StructType
    schema_json: str
    partition_columns: tuple[str, ...]
    configuration: Mapping[str, str]
    protocol: TableProtocol
    metadata_id: str
    files: tuple[LiveFile, ...] = field(repr=False)
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    domains: Mapping[str, str] = field(default_factory=dict)
    in_commit_timestamp: int | None = None
    _paths: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        paths = {_file_key(self.table_uri, f.path): f.path for f in self.files}
        object.__setattr__(self, "_paths", paths)

    @property
    def column_mapping_mode(self) -> str:
        """``none``, ``name`` or ``id``: the property where the protocol supports column mapping."""
        return mapping_mode(self.configuration, supported=self.protocol.supports_column_mapping)

    def file_uri(self, live_file: LiveFile) -> str:
        """The path to give ``spark.read.parquet`` for a live file: ``scheme://authority/decoded/path``.

        Hadoop's ``Path(String)`` takes the path part literally (``%20`` stays three characters), so the
        percent-encoding of ``add.path`` and of the table URI is decoded here. Spark reports the same
        file in ``_metadata.file_path`` as an encoded URI; map that back with
        :func:`relative_path_from_uri`, never by comparing strings. ``spark.read`` expands glob
        characters (``*?[]{}``); Delta writers escape them in partition directories, so only a table root
        containing them would need care.
        """
        if _ABSOLUTE_URI.match(live_file.path):
            parts = urlsplit(live_file.path)
            return f"{parts.scheme}://{parts.netloc}{unquote(parts.path)}"
        root = urlsplit(self.table_uri)
        return f"{root.scheme}://{root.netloc}{unquote(root.path).rstrip('/')}/{unquote(live_file.path)}"

    def file_key(self, live_file: LiveFile) -> str:
        """A scheme-less, decoded absolute path: the same string the table scan computes in Spark from
        ``_metadata.file_path`` (``scan.table_scan.FILE_KEY_COLUMN``)."""
        path = self.file_uri(live_file)
        without_scheme = path.split(":", 1)[1] if "://" in path else path
        return "/" + without_scheme.lstrip("/")

    @property
    def log_store(self) -> ObjectStore:
        """The store rooted at the table, opened once per snapshot (deletion vectors, checkpoints, commits).

        :raises FileNotFoundError: a local table root that no longer exists.
        """
        store = self.__dict__.get("_store")
        if store is None:
            store = log_store(self.table_uri, self.storage_options)
            object.__setattr__(self, "_store", store)
        return store

    def __getstate__(self) -> dict[str, Any]:
        # A snapshot captured by a Spark task travels without its open store (a handle of this process).
        state = dict(self.__dict__)
        state.pop("_store", None)
        return state


def load_snapshot(
    uri: str, *, storage_options: Mapping[str, str] | None = None, version: int | None = None
) -> TargetSnapshot:
    """Read the Delta table at ``uri`` as of ``version`` (default: the latest).

    :raises MergeAnalysisError: the path is missing, is not a Delta table, has no such version,
        or its log cannot be read.
    """
    options = dict(storage_options) if storage_options else None
    table = _open_table(uri, options, version)
    try:
        metadata = table.metadata()
        schema_json = table.schema().to_json()
        protocol_versions = table.protocol()
        actions = pa.table(table.get_add_actions(flatten=False))
        log_state = _log_state(table, protocol_versions, options)
    except OSError as exc:  # deltalake raises the store's errors (credentials, bucket) as OSError
        operation = f"reading the Delta log at version {table.version()}"
        raise storage_failure(uri, operation, exc, options) from exc
    except DeltaError as exc:
        raise MergeAnalysisError(
            f"Cannot read the Delta log of target {uri} at version {table.version()}: {_first_line(exc)}. "
            "Check that _delta_log/ and any deletion vector files are intact."
        ) from exc
    schema = spark_schema_from_delta(schema_json)
    partition_columns = tuple(metadata.partition_columns)
    table_uri = table.table_uri.rstrip("/")
    protocol = TableProtocol(
        min_reader_version=protocol_versions.min_reader_version,
        min_writer_version=protocol_versions.min_writer_version,
        reader_features=frozenset(protocol_versions.reader_features or ()),
        writer_features=frozenset(protocol_versions.writer_features or ()),
    )
    # deltalake gives partition values by logical name; the log (and every LiveFile) keys them physically.
    mode = mapping_mode(metadata.configuration, supported=protocol.supports_column_mapping)
    keys = partition_keys(schema, partition_columns, mode)
    files = tuple(_live_file(row, keys, log_state) for row in actions.to_pylist())
    return TargetSnapshot(
        table_uri=table_uri,
        version=table.version(),
        schema=schema,
        schema_json=schema_json,
        partition_columns=partition_columns,
        configuration=dict(metadata.configuration),
        protocol=protocol,
        metadata_id=str(metadata.id),
        files=files,
        storage_options=dict(storage_options or {}),
        domains=dict(log_state.domains),
        in_commit_timestamp=log_state.in_commit_timestamp,
    )


def relative_path_from_uri(snapshot: TargetSnapshot, uri: str) -> str:
    """The ``add.path`` of the live file that ``uri`` names, exactly as the log spells it.

    ``uri`` is a percent-encoded URI or path: Spark's ``_metadata.file_path`` / ``input_file_name()``
    (``file:/abs/...``, non-ASCII left raw) or deltalake's ``deletion_vectors()`` (``file:///...``).
    Not deltalake's ``file_uris()``: it encodes the table root but not the relative part.
    Both sides are decoded before comparing; the scheme is ignored (``s3a://`` vs ``s3://``).

    :raises MergeExecutionError: ``uri`` is not a live file of the snapshot.
    """
    found = snapshot._paths.get(_uri_key(uri))
    if found is None:
        raise MergeExecutionError(
            f"{uri} is not a live file of target {snapshot.table_uri} at version {snapshot.version}. "
            "Pass a URI as Spark's _metadata.file_path reports it (percent-encoded)."
        )
    return found


def _open_table(uri: str, options: dict[str, str] | None, version: int | None) -> deltalake.DeltaTable:
    local = _local_path(uri)
    if local is not None:
        if not os.path.exists(local):
            raise MergeAnalysisError(
                f"{uri} is not a Delta table. {local} does not exist: check the URI, or create the table "
                "first (e.g. deltalake.write_deltalake).",
                error_class="DELTA_MISSING_DELTA_TABLE",
            )
        if not os.path.isdir(os.path.join(local, "_delta_log")):
            raise MergeAnalysisError(
                f"{uri} is not a Delta table. No _delta_log/ found: create it first "
                "(e.g. deltalake.write_deltalake) or check the URI.",
                error_class="DELTA_MISSING_DELTA_TABLE",
            )
        uri = os.path.abspath(local) if not urlsplit(uri).scheme else uri
    # Before deltalake: options the executors' pyarrow cannot use alike are refused, not found out later.
    check_azure_options(uri, options)
    try:
        return deltalake.DeltaTable(uri, version=version, storage_options=options)
    except TableNotFoundError as exc:
        raise MergeAnalysisError(
            f"{uri} is not a Delta table. No commits found in _delta_log/ ({_first_line(exc)}): create it "
            "first (e.g. deltalake.write_deltalake) or check the URI and storage options.",
            error_class="DELTA_MISSING_DELTA_TABLE",
        ) from exc
    except DeltaError as exc:
        raise MergeAnalysisError(_load_failure(uri, options, version, exc)) from exc
    except OSError as exc:  # deltalake raises the store's errors (credentials, bucket) as OSError
        raise storage_failure(uri, "reading the Delta log", exc, options) from exc


def _load_failure(uri: str, options: dict[str, str] | None, version: int | None, exc: Exception) -> str:
    if version is not None:
        try:
            latest = deltalake.DeltaTable(uri, storage_options=options).version()
        except (DeltaError, OSError):
            latest = None
        if latest is not None:
            if version > latest:
                return f"Target {uri} has no version {version}: the latest version is {latest}."
            return (
                f"Cannot read target {uri} at version {version} (the latest is {latest}): "
                f"{_first_line(exc)}. Its log files may have been cleaned up; pick a newer version."
            )
    at = f" at version {version}" if version is not None else ""
    return (
        f"Cannot read the Delta log of target {uri}{at}: {_first_line(exc)}. Check that _delta_log/ "
        "is intact (commit JSON and checkpoints) and readable with these storage options."
    )


def _local_path(uri: str) -> str | None:
    parts = urlsplit(uri)
    if parts.scheme == "":
        return os.path.abspath(uri)
    if parts.scheme == "file":
        return unquote(parts.path)
    return None


def _first_line(exc: Exception) -> str:
    # delta-rs appends a Rust backtrace to some messages; the first line carries the cause.
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _log_state(
    table: deltalake.DeltaTable, protocol: ProtocolVersions, options: dict[str, str] | None
) -> LogState:
    # get_add_actions() exposes neither deletion vectors nor row tracking fields, and nothing exposes
    # domain metadata or in-commit timestamps: replay the log for them, only for tables with features.
    if not (protocol.reader_features or protocol.writer_features):
        return LogState()
    operation = (
        "reading deletion vectors, row tracking fields and domains from the Delta log at version "
        f"{table.version()}"
    )
    try:
        with storage_errors(table.table_uri, operation, options):
            return replay_log(log_store(table.table_uri, options), table.version())
    except (ValueError, KeyError) as exc:
        raise MergeAnalysisError(
            f"Cannot read the deletion vectors, row tracking fields and domain metadata of target "
            f"{table.table_uri} at version {table.version()}: {exc}. Check that _delta_log/ is intact."
        ) from exc


def _live_file(row: Mapping[str, Any], partition_keys: Mapping[str, str], log_state: LogState) -> LiveFile:
    partition = row.get("partition") or {}
    path = str(row["path"])
    extra = log_state.files.get(path)
    return LiveFile(
        path=path,
        size=int(row["size_bytes"]),
        partition_values={key: _partition_string(partition.get(c)) for c, key in partition_keys.items()},
        stats=_file_stats(row),
        modification_time=int(row["modification_time"]),
        deletion_vector=extra.deletion_vector if extra else None,
        base_row_id=extra.base_row_id if extra else None,
        default_row_commit_version=extra.default_row_commit_version if extra else None,
        stats_json=extra.stats_json if extra else None,
    )


def _file_stats(row: Mapping[str, Any]) -> FileStats | None:
    num_records = row.get("num_records")
    mins = _json_values(row.get("min"))
    maxs = _json_values(row.get("max"))
    nulls = _json_values(row.get("null_count"))
    if num_records is None and not (mins or maxs or nulls):
        return None
    return FileStats(
        num_records=None if num_records is None else int(num_records),
        min_values=mins,
        max_values=maxs,
        null_count=nulls,
    )


def _json_values(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """Parsed stats back in their JSON form; a missing (None) bound is dropped, so it never prunes."""
    out: dict[str, Any] = {}
    for name, value in (values or {}).items():
        if isinstance(value, Mapping):
            nested = _json_values(value)
            if nested:
                out[name] = nested
            continue
        converted = _json_scalar(value)
        if converted is not None:
            out[name] = converted
    return out


def _json_scalar(value: Any) -> Any:
    if isinstance(value, bool | int | float | str | decimal.Decimal):
        return value
    if isinstance(value, dt.datetime):
        spec = "milliseconds" if value.microsecond % 1000 == 0 else "microseconds"
        if value.tzinfo is None:
            return value.isoformat(timespec=spec)
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat(timespec=spec) + "Z"
    if isinstance(value, dt.date):
        return value.isoformat()
    return None  # binary and other values have no usable bound


def _partition_string(value: Any) -> str | None:
    """A parsed partition value serialized as PROTOCOL.md's "Partition Value Serialization"."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dt.datetime):
        naive: dt.datetime = value if value.tzinfo is None else value.astimezone(dt.timezone.utc)
        return naive.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


def _uri_key(uri: str) -> str:
    parts = urlsplit(uri)
    return parts.netloc + unquote(parts.path)


def _file_key(table_uri: str, path: str) -> str:
    if _ABSOLUTE_URI.match(path):
        return _uri_key(path)
    return _uri_key(table_uri).rstrip("/") + "/" + unquote(path)
