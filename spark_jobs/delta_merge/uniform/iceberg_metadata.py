"""Iceberg metadata for a committed Delta version (UniForm), as Delta's ``IcebergConverter`` writes it after a
commit: an Iceberg v2 table at the Delta table's root whose metadata lives in ``metadata/``.

- **Layout.** Files are named as Iceberg's metastore catalogs name them (``NNNNN-<uuid>.metadata.json``,
  ``snap-<id>-1-<uuid>.avro``, ``<uuid>-m0.avro``); the newest metadata file is the one with the highest
  number. Delta's converter registers that file with a catalog; a path-based table has none, so a reader
  opens the newest file itself (pyiceberg's ``StaticTable.from_metadata``).
- **Properties.** ``delta-version`` and ``delta-timestamp`` name the Delta version converted;
  ``schema.name-mapping.default`` maps names to field ids; ``delta.universalFormat.config.iceberg.*``
  table properties are copied without their prefix.
- **Snapshots.** Each conversion writes one snapshot. Delta's converter replays the commit's actions; here
  the new snapshot is the difference between the Iceberg table's current files and the Delta version's
  files. Files still live stay EXISTING, with their sequence numbers; new ones are ADDED; gone ones are
  DELETED, all in one manifest. The operation is append, delete or overwrite, as Delta's converter picks it.
  Because it diffs, a conversion also catches up versions an earlier one missed (a merge killed after its
  commit, another writer without UniForm).
- **Metadata only.** A version that changes no file writes new metadata (schema, properties) without a
  snapshot.
- **Unreadable history.** Newest metadata whose manifests cannot be read (another writer's, at another
  root; a table copied or moved since) is not built on: the Iceberg table starts anew (a new table uuid,
  every file added) in a metadata file numbered after it.

pyiceberg writes the manifests, the manifest list and the metadata JSON. Only choosing the entries and
naming the files is written here: pyiceberg has no catalog for a path-based table, and its own
``create_table`` renumbers field ids, which must stay Delta's column-mapping ids.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    ManifestEntry,
    ManifestEntryStatus,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile, ToOutputFile
from pyiceberg.table.metadata import TableMetadata, TableMetadataV2
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AddSnapshotUpdate,
    SetCurrentSchemaUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
    update_table_metadata,
)

from spark_jobs.delta_merge.protocol.column_mapping import MAX_COLUMN_ID_PROPERTY
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot
from spark_jobs.delta_merge.storage.arrow_store import arrow_filesystem
from spark_jobs.delta_merge.uniform.iceberg_schema import data_file, iceberg_partition_spec, iceberg_schema

__all__ = ["IcebergConversion", "convert_to_iceberg", "latest_metadata_location"]

log = logging.getLogger("delta_merge")

DELTA_VERSION_PROPERTY = "delta-version"
DELTA_TIMESTAMP_PROPERTY = "delta-timestamp"
NAME_MAPPING_PROPERTY = "schema.name-mapping.default"
# Delta copies table properties with this prefix into the Iceberg table, without it.
_ICEBERG_CONFIG_PREFIX = "delta.universalformat.config.iceberg."
_METADATA_FILE = re.compile(r"^(\d+)-[0-9a-fA-F-]{36}\.metadata\.json$")
_CODEC: Literal["deflate"] = "deflate"
MAIN_BRANCH = "main"


@dataclass(frozen=True)
class IcebergConversion:
    """What one conversion wrote: the metadata file, the Delta version it holds, and the snapshot's
    operation and file counts (no snapshot when the version changed no file)."""

    metadata_location: str
    delta_version: int
    operation: str | None
    added_files: int
    deleted_files: int


def convert_to_iceberg(
    snapshot: TargetSnapshot, *, commit_timestamp_ms: int | None = None
) -> IcebergConversion | None:
    """Write the Iceberg metadata of Delta version ``snapshot.version``. Nothing is written when the newest
    Iceberg metadata already holds this version or a later one (another writer converted it).

    :param snapshot: the Delta table at the version to convert (its files, schema and properties).
    :param commit_timestamp_ms: the version's commit time, recorded as ``delta-timestamp``.
    """
    io = _TableFileIO(snapshot.storage_options)
    location = table_location(snapshot.table_uri)
    current_location = latest_metadata_location(snapshot.table_uri, snapshot.storage_options)
    current = FromInputFile.table_metadata(io.new_input(current_location)) if current_location else None
    if current is not None and int(current.properties.get(DELTA_VERSION_PROPERTY, "-1")) >= snapshot.version:
        return None
    previous: dict[str, ManifestEntry] = {}
    if current is not None:
        try:
            previous = _live_entries(current, io)
        except (OSError, ValueError) as exc:
            # Metadata another writer left whose manifests are not where it says (a table copied or moved
            # since, or written at another root): the Iceberg history starts anew after it.
            log.warning("UniForm: the files of Iceberg metadata %s cannot be read (%s: %s); the Iceberg "
                        "table starts anew at Delta version %d", current_location, type(exc).__name__, exc,
                        snapshot.version)  # fmt: skip
            current = None
    schema = iceberg_schema(snapshot.schema)
    spec = iceberg_partition_spec(schema, snapshot.partition_columns)
    base = current if current is not None else _new_table(snapshot, location, schema, spec)
    updates: list[TableUpdate] = []
    if current is not None and current.schema().as_struct() != schema.as_struct():
        next_id = max(s.schema_id for s in current.schemas) + 1
        schema = iceberg_schema(snapshot.schema, schema_id=next_id)
        # pydantic models of pyiceberg, built by their JSON names (-1: the schema just added).
        updates += [AddSchemaUpdate(schema=schema), SetCurrentSchemaUpdate.model_validate({"schema-id": -1})]
    mode = snapshot.column_mapping_mode
    files = {_file_path(location, f.path): f for f in snapshot.files}
    added = [
        data_file(
            files[p],
            file_path=p,
            schema=snapshot.schema,
            partition_columns=snapshot.partition_columns,
            mode=mode,
        )
        for p in files
        if p not in previous
    ]
    kept = [entry for p, entry in previous.items() if p in files]
    deleted = [entry for p, entry in previous.items() if p not in files]
    operation = None
    fs, base_path = arrow_filesystem(snapshot.table_uri, snapshot.storage_options)
    fs.create_dir(f"{base_path}/metadata", recursive=True)  # local disks need it; object stores ignore it
    if added or deleted:
        new_snapshot = _write_snapshot(
            base, io, location, schema, spec, added=added, kept=kept, deleted=deleted
        )
        operation = new_snapshot.summary.operation.value if new_snapshot.summary else None
        updates += [
            AddSnapshotUpdate(snapshot=new_snapshot),
            SetSnapshotRefUpdate.model_validate({"ref-name": MAIN_BRANCH, "type": SnapshotRefType.BRANCH,
                                    "snapshot-id": new_snapshot.snapshot_id}),
        ]
    updates.append(SetPropertiesUpdate(updates=_properties(snapshot, schema, commit_timestamp_ms)))
    metadata = update_table_metadata(
        base, tuple(updates), metadata_location=current_location if current is not None else None
    )
    number = _metadata_number(current_location) + 1 if current_location else 0
    metadata_location = f"{location}/metadata/{number:05d}-{uuid.uuid4()}.metadata.json"
    ToOutputFile.table_metadata(metadata, io.new_output(metadata_location))
    return IcebergConversion(metadata_location, snapshot.version, operation, len(added), len(deleted))


def latest_metadata_location(table_uri: str, storage_options: Mapping[str, str] | None = None) -> str | None:
    """The newest Iceberg metadata file under the table's ``metadata/`` (the highest number; of two with the
    same number, written by two converters at once, the one holding the later Delta version), or None."""
    fs, base = arrow_filesystem(table_uri, storage_options)
    listed = fs.get_file_info(pafs.FileSelector(f"{base}/metadata", allow_not_found=True))
    numbered = [
        (int(m.group(1)), info.base_name) for info in listed if (m := _METADATA_FILE.match(info.base_name))
    ]
    if not numbered:
        return None
    highest = max(number for number, _ in numbered)
    names = sorted(name for number, name in numbered if number == highest)
    location = table_location(table_uri)
    candidates = [f"{location}/metadata/{name}" for name in names]
    if len(candidates) == 1:
        return candidates[0]
    io = _TableFileIO(storage_options or {})

    def converted_version(candidate: str) -> int:
        metadata = FromInputFile.table_metadata(io.new_input(candidate))
        return int(metadata.properties.get(DELTA_VERSION_PROPERTY, "-1"))

    return max(candidates, key=converted_version)


def table_location(table_uri: str) -> str:
    """The table root as an Iceberg location: a URI (``file:`` for local paths) without a trailing slash."""
    parts = urlsplit(table_uri)
    if not parts.scheme or parts.scheme == "file":
        return "file://" + os.path.abspath(unquote(parts.path) if parts.scheme else table_uri).rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{unquote(parts.path)}".rstrip("/")


class _TableFileIO(PyArrowFileIO):
    """pyiceberg's pyarrow file IO on the job's file systems, which take the table's storage options as
    deltalake does (pyiceberg's own take other names)."""

    def __init__(self, storage_options: Mapping[str, str]) -> None:
        super().__init__()
        self._storage_options = dict(storage_options)

    def _initialize_fs(self, scheme: str, netloc: str | None = None) -> pafs.FileSystem:
        return arrow_filesystem(f"{scheme}://{netloc or ''}/", self._storage_options)[0]


def _new_table(snapshot: TargetSnapshot, location: str, schema: Schema, spec: PartitionSpec) -> TableMetadata:
    last_column_id = max(
        schema.highest_field_id, int(snapshot.configuration.get(MAX_COLUMN_ID_PROPERTY, "0"))
    )
    return TableMetadataV2.model_validate({
        "location": location,
        "table-uuid": uuid.uuid4(),
        "last-updated-ms": int(time.time() * 1000),
        "last-column-id": last_column_id,
        "schemas": [schema],
        "current-schema-id": schema.schema_id,
        "partition-specs": [spec],
        "default-spec-id": spec.spec_id,
        "last-partition-id": spec.last_assigned_field_id,
        "properties": {},
        "sort-orders": [UNSORTED_SORT_ORDER],
        "default-sort-order-id": UNSORTED_SORT_ORDER.order_id,
        "last-sequence-number": 0,
    })


def _live_entries(metadata: TableMetadata, io: PyArrowFileIO) -> dict[str, ManifestEntry]:
    """The live data files of the current snapshot, by path, with their manifest entries."""
    current = metadata.current_snapshot()
    if current is None:
        return {}
    return {
        entry.data_file.file_path: entry
        for manifest in current.manifests(io)
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True)
    }


def _write_snapshot(
    base: TableMetadata,
    io: PyArrowFileIO,
    location: str,
    schema: Schema,
    spec: PartitionSpec,
    *,
    added: list[DataFile],
    kept: list[ManifestEntry],
    deleted: list[ManifestEntry],
) -> Snapshot:
    snapshot_id = uuid.uuid4().int & ((1 << 63) - 1)  # positive 63 bits, as Iceberg draws snapshot ids
    sequence_number = getattr(base, "last_sequence_number", 0) + 1  # v1 metadata has none
    commit_uuid = uuid.uuid4()
    manifest_output = io.new_output(f"{location}/metadata/{commit_uuid}-m0.avro")
    collector = SnapshotSummaryCollector()
    with write_manifest(
        format_version=2,
        spec=spec,
        schema=schema,
        output_file=manifest_output,
        snapshot_id=snapshot_id,
        avro_compression=_CODEC,
    ) as writer:
        for new_file in added:
            writer.add(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, data_file=new_file
                )
            )
            collector.add_file(new_file, schema=schema, partition_spec=spec)
        for entry in kept:
            writer.existing(entry)
        for entry in deleted:
            writer.delete(entry)
            collector.remove_file(entry.data_file, schema=schema, partition_spec=spec)
    parent = base.current_snapshot()
    list_location = f"{location}/metadata/snap-{snapshot_id}-1-{commit_uuid}.avro"
    with write_manifest_list(
        format_version=2,
        output_file=io.new_output(list_location),
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id if parent else None,
        sequence_number=sequence_number,
        avro_compression=_CODEC,
    ) as manifests:
        manifests.add_manifests([writer.to_manifest_file()])
    operation = Operation.OVERWRITE if added and deleted else Operation.APPEND if added else Operation.DELETE
    summary = update_snapshot_summaries(
        Summary(operation=operation, **collector.build()), previous_summary=parent.summary if parent else None
    )
    return Snapshot.model_validate({
        "snapshot-id": snapshot_id,
        "parent-snapshot-id": parent.snapshot_id if parent else None,
        "sequence-number": sequence_number,
        "timestamp-ms": int(time.time() * 1000),
        "manifest-list": list_location,
        "summary": summary,
        "schema-id": schema.schema_id,
    })


def _properties(snapshot: TargetSnapshot, schema: Schema, commit_timestamp_ms: int | None) -> dict[str, str]:
    copied = {
        key[len(_ICEBERG_CONFIG_PREFIX) :]: value
        for key, value in snapshot.configuration.items()
        if key.lower().startswith(_ICEBERG_CONFIG_PREFIX)
    }
    timestamp = commit_timestamp_ms if commit_timestamp_ms is not None else int(time.time() * 1000)
    return {
        **copied,
        DELTA_VERSION_PROPERTY: str(snapshot.version),
        DELTA_TIMESTAMP_PROPERTY: str(timestamp),
        NAME_MAPPING_PROPERTY: create_mapping_from_schema(schema).model_dump_json(),
    }


def _file_path(location: str, add_path: str) -> str:
    """The absolute, decoded path of an ``add`` (relative and percent-encoded, or an absolute URI)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", add_path):
        parts = urlsplit(add_path)
        return f"{parts.scheme}://{parts.netloc}{unquote(parts.path)}"
    return f"{location}/{unquote(add_path)}"


def _metadata_number(metadata_location: str) -> int:
    match = _METADATA_FILE.match(metadata_location.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else -1
