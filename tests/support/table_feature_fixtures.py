"""Give a deltalake-made table row tracking, in-commit timestamps or liquid clustering, by a hand commit.

deltalake 1.6.6 cannot create such tables, so one commit written here per PROTOCOL.md turns them on:
protocol 3/7 with the writer features, metaData with the properties, the features' ``domainMetadata``
actions, and (row tracking) every live ``add`` recommitted with ``baseRowId`` and
``defaultRowCommitVersion``, as Delta's backfill does.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROW_ID_COLUMN = "delta.rowTracking.materializedRowIdColumnName"
ROW_COMMIT_VERSION_COLUMN = "delta.rowTracking.materializedRowCommitVersionColumnName"


Actions = dict[str, dict[str, Any]]

# The features a legacy protocol version supports (PROTOCOL.md "Table Features": a table moved to reader 3 /
# writer 7 lists them, or loses them; column mapping, for one, takes effect only where it is supported).
_LEGACY_WRITER_FEATURES = {
    2: ("appendOnly", "invariants"), 3: ("checkConstraints",), 4: ("changeDataFeed", "generatedColumns"),
    5: ("columnMapping",), 6: ("identityColumns",),
}  # fmt: skip


def listed_features(protocol: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(reader features, writer features) of a protocol action as reader 3 / writer 7 lists them: its
    lists, or the features its legacy versions support."""
    writer_version = int(protocol.get("minWriterVersion", 1))
    reader_version = int(protocol.get("minReaderVersion", 1))
    writer = set(protocol.get("writerFeatures", []))
    if writer_version < 7:
        writer |= {f for v, names in _LEGACY_WRITER_FEATURES.items() if v <= writer_version for f in names}
    reader = set(protocol.get("readerFeatures", []))
    if reader_version == 2:
        reader.add("columnMapping")
    return reader, writer


def replay(table: Path) -> tuple[int, Actions, dict[str, Any], dict[str, Any], Actions]:
    """(latest version, live adds by path, metaData, protocol, live domainMetadata by domain) from the JSON
    commits (the fixtures' tables have no checkpoint yet)."""
    log = table / "_delta_log"
    version = max(int(p.stem) for p in log.glob("*.json"))
    adds: dict[str, dict[str, Any]] = {}
    domains: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    protocol: dict[str, Any] = {}
    for v in range(version + 1):
        for line in (log / f"{v:020d}.json").read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                adds[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                adds.pop(action["remove"]["path"], None)
            elif "metaData" in action:
                metadata = action["metaData"]
            elif "protocol" in action:
                protocol = action["protocol"]
            elif "domainMetadata" in action:
                domain = action["domainMetadata"]
                if domain.get("removed"):
                    domains.pop(domain["domain"], None)
                else:
                    domains[domain["domain"]] = domain
    return version, adds, metadata, protocol, domains


def enable_features(
    table: Path,
    *,
    row_tracking: bool = False,
    row_tracking_enabled: bool = True,
    in_commit_timestamps: bool = False,
    clustering_columns: Sequence[str] = (),
    in_commit_timestamp: int | None = None,
    configuration: Mapping[str, str] | None = None,
    flat_clustering_columns: bool = False,
    change_data_feed: bool = False,
    materialize_partition_columns: bool = False,
) -> int:
    """Commit the next version turning the chosen features on; returns that version.

    :param row_tracking_enabled: with ``row_tracking``, also set ``delta.enableRowTracking`` (otherwise
        the feature is only supported: ids are assigned but not preserved).
    :param in_commit_timestamp: the enabling commit's in-commit timestamp (default: now).
    :param configuration: more table properties to set.
    :param change_data_feed: also turn on the change data feed (feature and property).
    :param materialize_partition_columns: add the ``materializePartitionColumns`` writer feature.
    :param flat_clustering_columns: write ``clusteringColumns`` as names, as PROTOCOL.md's example does,
        not as lists of name parts, as Delta writes them.
    """
    version, adds, metadata, protocol, _ = replay(table)
    new_version = version + 1
    now = in_commit_timestamp if in_commit_timestamp is not None else int(time.time() * 1000)
    reader_features, features = listed_features(protocol)
    features.add("domainMetadata")
    config = {**metadata["configuration"], **(configuration or {})}
    commit_info: dict[str, Any] = {"timestamp": now, "operation": "SET TBLPROPERTIES"}
    actions: list[dict[str, Any]] = []
    if change_data_feed:
        features.add("changeDataFeed")
        config["delta.enableChangeDataFeed"] = "true"
    if materialize_partition_columns:
        features.add("materializePartitionColumns")
    if in_commit_timestamps:
        features.add("inCommitTimestamp")
        config.update({
            "delta.enableInCommitTimestamps": "true",
            "delta.inCommitTimestampEnablementVersion": str(new_version),
            "delta.inCommitTimestampEnablementTimestamp": str(now),
        })  # fmt: skip
        commit_info = {"inCommitTimestamp": now, **commit_info}
    if clustering_columns:
        features.add("clustering")
        actions.append({"domainMetadata": {
            "domain": "delta.clustering",
            "configuration": json.dumps({
                "clusteringColumns": list(clustering_columns) if flat_clustering_columns
                else [[c] for c in clustering_columns],
            }),
            "removed": False,
        }})  # fmt: skip
    if row_tracking:
        features.add("rowTracking")
        config.update({
            ROW_ID_COLUMN: f"_row-id-col-{uuid.uuid4()}",
            ROW_COMMIT_VERSION_COLUMN: f"_row-commit-version-col-{uuid.uuid4()}",
        })  # fmt: skip
        if row_tracking_enabled:
            config["delta.enableRowTracking"] = "true"
        next_id = 0
        for path in sorted(adds):
            records = json.loads(adds[path]["stats"])["numRecords"]
            add = {**adds[path], "dataChange": False, "baseRowId": next_id}
            actions.append({"add": {**add, "defaultRowCommitVersion": new_version}})
            next_id += records
        actions.append({"domainMetadata": {
            "domain": "delta.rowTracking",
            "configuration": json.dumps({"rowIdHighWaterMark": next_id - 1}),
            "removed": False,
        }})  # fmt: skip
    head: list[dict[str, Any]] = [
        {"commitInfo": commit_info},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": sorted(reader_features),
                      "writerFeatures": sorted(features)}},
        {"metaData": {**metadata, "configuration": config}},
    ]  # fmt: skip
    body = "".join(json.dumps(a) + "\n" for a in head + actions)
    (table / "_delta_log" / f"{new_version:020d}.json").write_text(body)
    return new_version


def set_column_defaults(
    table: Path,
    defaults: Mapping[str, str],
    *,
    not_null: Sequence[str] = (),
    writer_features: Sequence[str] = ("allowColumnDefaults",),
    configuration: Mapping[str, str] | None = None,
) -> int:
    """Commit the next version giving columns DEFAULT values (PROTOCOL.md "Default Columns"); returns it.

    :param defaults: Spark SQL default expression by top-level column, stored as the field's
        ``CURRENT_DEFAULT`` metadata, as Delta's ``ALTER COLUMN ... SET DEFAULT`` stores it.
    :param not_null: columns made NOT NULL (which needs the ``invariants`` feature, added).
    :param writer_features: writer features the protocol lists besides the table's own.
    :param configuration: more table properties to set.
    """
    version, _, metadata, protocol, _ = replay(table)
    schema = json.loads(metadata["schemaString"])
    names = {f["name"] for f in schema["fields"]}
    assert set(defaults) | set(not_null) <= names, names
    for schema_field in schema["fields"]:
        if schema_field["name"] in defaults:
            schema_field["metadata"] = {
                **schema_field.get("metadata", {}), "CURRENT_DEFAULT": defaults[schema_field["name"]]
            }
        if schema_field["name"] in not_null:
            schema_field["nullable"] = False
    reader_features, features = listed_features(protocol)
    features |= set(writer_features)
    if not_null:
        features.add("invariants")
    config = {**metadata["configuration"], **(configuration or {})}
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "ALTER COLUMN"}},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": sorted(reader_features),
                      "writerFeatures": sorted(features)}} if reader_features else
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": sorted(features)}},
        {"metaData": {**metadata, "schemaString": json.dumps(schema), "configuration": config}},
    ]
    new_version = version + 1
    body = "".join(json.dumps(a) + "\n" for a in actions)
    (table / "_delta_log" / f"{new_version:020d}.json").write_text(body)
    return new_version
