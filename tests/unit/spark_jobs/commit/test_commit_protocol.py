"""Every action of a merge commit, as the job writes it, against the action schemas of Delta's PROTOCOL.md.

The schemas below transcribe PROTOCOL.md's field tables (Commit Provenance Information, Change Metadata,
Add File and Remove File, Add CDC File, Transaction Identifiers, Domain Metadata): required fields, their
types, and no field the protocol does not define for the action.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake
from jsonschema import Draft202012Validator

from tests.unit.spark_jobs.commit.test_commit import _commit, _file_in, _log, _table, _write
from tests.unit.spark_jobs.test_pipeline import log_actions, merge, parquet_source

_LONG = {"type": "integer"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": ["string", "null"]}}
_TAGS = {"type": ["object", "null"], "additionalProperties": {"type": "string"}}
ACTION_SCHEMAS: dict[str, dict[str, Any]] = {
    "commitInfo": {
        # Free-form by the protocol; Delta's own keys have these types.
        "type": "object",
        "required": [
            "timestamp",
            "operation",
            "operationParameters",
            "readVersion",
            "isolationLevel",
            "isBlindAppend",
            "operationMetrics",
            "engineInfo",
            "txnId",
        ],
        "properties": {
            "timestamp": _LONG,
            "operation": {"const": "MERGE"},
            "operationParameters": {"type": "object", "additionalProperties": {"type": "string"}},
            "operationMetrics": {"type": "object", "additionalProperties": {"type": "string"}},
            "readVersion": _LONG,
            "isolationLevel": {"type": "string"},
            "isBlindAppend": {"type": "boolean"},
            "engineInfo": {"type": "string"},
            "txnId": {"type": "string"},
            # In-Commit Timestamps; Row Tracking's delta.rowTracking.preserved tag.
            "inCommitTimestamp": _LONG,
            "tags": _TAGS,
        },
    },
    "domainMetadata": {
        "type": "object",
        "required": ["domain", "configuration", "removed"],
        "additionalProperties": False,
        "properties": {
            "domain": {"type": "string"},
            "configuration": {"type": "string"},
            "removed": {"type": "boolean"},
        },
    },
    "metaData": {
        "type": "object",
        "required": ["id", "format", "schemaString", "partitionColumns", "configuration"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string"},
            "name": {"type": ["string", "null"]},
            "description": {"type": ["string", "null"]},
            "format": {
                "type": "object",
                "required": ["provider", "options"],
                "properties": {"provider": {"const": "parquet"}, "options": _STRING_MAP},
            },
            "schemaString": {"type": "string"},
            "partitionColumns": {"type": "array", "items": {"type": "string"}},
            "createdTime": {"type": ["integer", "null"]},
            "configuration": _STRING_MAP,
        },
    },
    "txn": {
        "type": "object",
        "required": ["appId", "version"],
        "additionalProperties": False,
        "properties": {"appId": {"type": "string"}, "version": _LONG, "lastUpdated": _LONG},
    },
    "add": {
        "type": "object",
        "required": ["path", "partitionValues", "size", "modificationTime", "dataChange"],
        "additionalProperties": False,
        "properties": {
            "path": {"type": "string"},
            "partitionValues": _STRING_MAP,
            "size": _LONG,
            "modificationTime": _LONG,
            "dataChange": {"const": True},
            "stats": {"type": "string"},
            "tags": _TAGS,
            "deletionVector": {"type": "object"},
            "baseRowId": _LONG,
            "defaultRowCommitVersion": _LONG,
            "clusteringProvider": {"type": "string"},
        },
    },
    "remove": {
        "type": "object",
        "required": ["path", "dataChange"],
        "additionalProperties": False,
        "properties": {
            "path": {"type": "string"},
            "deletionTimestamp": _LONG,
            "dataChange": {"const": True},
            "extendedFileMetadata": {"type": "boolean"},
            "partitionValues": _STRING_MAP,
            "size": _LONG,
            "stats": {"type": "string"},
            "tags": _TAGS,
            "deletionVector": {"type": "object"},
            "baseRowId": _LONG,
            "defaultRowCommitVersion": _LONG,
        },
    },
    "cdc": {
        "type": "object",
        "required": ["path", "partitionValues", "size", "dataChange"],
        "additionalProperties": False,
        "properties": {
            "path": {"type": "string"},
            "partitionValues": _STRING_MAP,
            "size": _LONG,
            "dataChange": {"const": False},
            "tags": _TAGS,
        },
    },
}


def _check_actions(actions: list[dict[str, Any]]) -> list[str]:
    kinds = [next(iter(action)) for action in actions]
    assert set(kinds) <= set(ACTION_SCHEMAS), kinds
    assert kinds[0] == "commitInfo"
    for action in actions:
        ((kind, body),) = action.items()
        errors = sorted(Draft202012Validator(ACTION_SCHEMAS[kind]).iter_errors(body), key=str)
        assert not errors, (kind, [e.message for e in errors])
    return kinds


def test_a_commit_with_an_app_transaction(tmp_path: Path) -> None:
    snapshot = _table(tmp_path)
    new = _write(tmp_path, "a", {"id": [1, 3]})
    version = _commit(snapshot, [_file_in(snapshot, "a")], [new], app_transaction=("dag.task", 7))
    assert _check_actions(_log(tmp_path, version)) == ["commitInfo", "txn", "remove", "add"]
def test_a_merge_commit_holds_only_protocol_actions_of_the_protocols_shape(
    spark: Any, tmp_path: Path
) -> None:
    target = tmp_path / "t"
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("p", pa.string())])
    rows = [{"id": 1, "v": "a", "p": "x"}, {"id": 2, "v": "b", "p": "y"}, {"id": 3, "v": "c", "p": "x"}]
    write_deltalake(
        str(target),
        pa.Table.from_pylist(rows, schema),
        partition_by=["p"],
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    wide = pa.schema([*schema, ("extra", pa.int64())])
    updates = [{"id": 1, "v": "A", "p": "x", "extra": 7}, {"id": 4, "v": "d", "p": "y", "extra": None}]
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist(updates, wide))
    sql = (
        "MERGE WITH SCHEMA EVOLUTION INTO t USING s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT * "
        "WHEN NOT MATCHED BY SOURCE AND t.id = 3 THEN DELETE"
    )
    metrics = merge(spark, target, source, sql)

    kinds = _check_actions(log_actions(target, metrics["tableVersion"]))
    assert {"commitInfo", "metaData", "remove", "add", "cdc"} <= set(kinds)
    actions = log_actions(target, metrics["tableVersion"])
    metadata = next(a["metaData"] for a in actions if "metaData" in a)
    assert [f["name"] for f in json.loads(metadata["schemaString"])["fields"]] == ["id", "v", "p", "extra"]
