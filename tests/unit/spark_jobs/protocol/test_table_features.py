"""check_writable refuses what the job cannot write; table_constraints exposes what it must enforce."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge.errors import MergeAnalysisError, UnsupportedTableFeatureError
from spark_jobs.delta_merge.protocol.deletion_vectors import DeletionVector
from spark_jobs.delta_merge.protocol.delta_schema import spark_schema_from_delta
from spark_jobs.delta_merge.protocol.files import LiveFile
from spark_jobs.delta_merge.protocol.snapshot import TableProtocol, TargetSnapshot, load_snapshot
from spark_jobs.delta_merge.protocol.table_features import TableConstraints, check_writable, table_constraints


def _field(
    name: str, type_json: Any = "long", *, nullable: bool = True, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"name": name, "type": type_json, "nullable": nullable, "metadata": metadata or {}}


def _file(path: str, *, dv: bool = False) -> LiveFile:
    vector = DeletionVector(storage_type="i", path_or_inline_dv="00000", size_in_bytes=4, cardinality=1)
    return LiveFile(
        path=path, size=10, partition_values={}, stats=None, modification_time=0,
        deletion_vector=vector if dv else None,
    )  # fmt: skip


def _snapshot(
    *,
    fields: list[dict[str, Any]] | None = None,
    configuration: Mapping[str, str] | None = None,
    protocol: TableProtocol | None = None,
    files: tuple[LiveFile, ...] = (),
) -> TargetSnapshot:
    schema_json = json.dumps({"type": "struct", "fields": fields or [_field("id")]})
    return TargetSnapshot(
        table_uri="file:///t",
        version=3,
        schema=spark_schema_from_delta(schema_json),
        schema_json=schema_json,
        partition_columns=(),
        configuration=dict(configuration or {}),
        protocol=protocol or TableProtocol(1, 2),
        metadata_id="m",
        files=files,
    )


def _features(*names: str) -> TableProtocol:
    return TableProtocol(3, 7, frozenset(names), frozenset(names))


def _refusal(snapshot: TargetSnapshot, *, removes_files: bool = True) -> str:
    with pytest.raises(UnsupportedTableFeatureError) as err:
        check_writable(snapshot, removes_files=removes_files)
    return str(err.value)


def test_plain_and_supported_feature_tables_are_writable() -> None:
    check_writable(_snapshot(), removes_files=True)
    supported = _features(
        "appendOnly",
        "invariants",
        "checkConstraints",
        "generatedColumns",
        "timestampNtz",
        "domainMetadata",
        "vacuumProtocolCheck",
        "v2Checkpoint",
        "changeDataFeed",
        "deletionVectors",
        "rowTracking",
        "inCommitTimestamp",
        "clustering",
        "allowColumnDefaults",
        "checkpointProtection",
    )
    check_writable(_snapshot(protocol=supported), removes_files=True)
    # Merges into change data feed tables write _change_data files and cdc actions.
    cdf = {"delta.enableChangeDataFeed": "TRUE"}
    check_writable(_snapshot(protocol=supported, configuration=cdf), removes_files=True)


def test_conditional_features_are_fine_while_unused() -> None:
    protocol = _features("columnMapping", "changeDataFeed", "identityColumns")
    config = {"delta.columnMapping.mode": "none", "delta.enableChangeDataFeed": "false"}
    snapshot = _snapshot(protocol=protocol, configuration=config, files=(_file("a"),))
    check_writable(snapshot, removes_files=True)


def test_identity_columns_are_writable() -> None:
    # Inserts draw values beyond the high-water mark (identity_columns); writer version 6 implies the feature.
    identity = {
        "delta.identity.start": 1, "delta.identity.step": 1, "delta.identity.allowExplicitInsert": False,
    }
    for protocol in (_features("identityColumns"), TableProtocol(1, 6)):
        snapshot = _snapshot(protocol=protocol, fields=[_field("id", metadata=identity)], files=(_file("a"),))
        check_writable(snapshot, removes_files=True)


@pytest.mark.parametrize("mode", ["name", "id", "NAME"])
def test_column_mapped_tables_are_writable(mode: str) -> None:
    # Files are read by physical name or field id and written with both (test_column_mapping.py).
    config = {"delta.columnMapping.mode": mode}
    snapshot = _snapshot(protocol=_features("columnMapping"), configuration=config)
    check_writable(snapshot, removes_files=True)


def test_files_with_deletion_vectors_are_rewritten_not_refused() -> None:
    # Copy-on-write: the scan leaves deleted rows out and the remove carries the descriptor.
    config = {"delta.enableDeletionVectors": "true"}
    files = (_file("p=1/a.parquet", dv=True), _file("b.parquet"))
    snapshot = _snapshot(protocol=_features("deletionVectors"), configuration=config, files=files)
    check_writable(snapshot, removes_files=True)
    assert snapshot.files[0].has_deletion_vector
    assert not snapshot.files[1].has_deletion_vector


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"configuration": {"delta.columnMapping.mode": "sideways"}},
            "columnMapping (delta.columnMapping.mode=sideways): not one of none, name, id",
        ),
        ({"protocol": _features("icebergCompatV1")}, "icebergCompatV1: IcebergCompatV1's rules"),
        (
            {"protocol": _features("icebergCompatV2"),
             "configuration": {"delta.enableIcebergCompatV2": "true"}},
            "icebergCompatV2: requires column mapping in 'name' or 'id' mode, but delta.columnMapping.mode "
            "is 'none'",
        ),
        (
            {"protocol": _features("icebergCompatV2", "columnMapping", "deletionVectors"),
             "configuration": {"delta.enableIcebergCompatV2": "true", "delta.columnMapping.mode": "name",
                               "delta.enableDeletionVectors": "true"}},
            "icebergCompatV2: requires deletion vectors to be disabled",
        ),
        (
            {"protocol": _features("icebergCompatV2", "icebergCompatV1", "columnMapping"),
             "configuration": {"delta.enableIcebergCompatV2": "true", "delta.enableIcebergCompatV1": "true",
                               "delta.columnMapping.mode": "id"}},
            "icebergCompatV2: IcebergCompatV1 is active too",
        ),
        (
            {"protocol": _features("variantType", "variantShredding-preview"),
             "fields": [_field("v", "variant")]},
            "variantShredding-preview: shredded VARIANT files hold typed_value columns",
        ),
        (
            {"protocol": _features("rowTracking"), "configuration": {"delta.enableRowTracking": "true"}},
            "names no materialized row id or row commit version column",
        ),
        ({"protocol": _features("rowTracking")}, "rowTracking without domainMetadata"),
        ({"protocol": _features("someFutureFeature")}, "someFutureFeature: this job does not know its rules"),
        ({"protocol": TableProtocol(4, 8)}, "protocol version (reader 4, writer 8)"),
    ],
)
def test_refused_features(kwargs: dict[str, Any], expected: str) -> None:
    assert expected in _refusal(_snapshot(**kwargs))


def test_the_variant_feature_is_writable_with_or_without_a_variant_column() -> None:
    # deltalake lists variantType on every table it creates with features (deletion vectors, say).
    names = {"type": "struct", "fields": [_field("name", "string")]}
    tags = {"type": "array", "elementType": names, "containsNull": True}
    protocol = _features("variantType", "deletionVectors")
    snapshot = _snapshot(protocol=protocol, fields=[_field("id"), _field("tags", tags)])
    check_writable(snapshot, removes_files=True)
    body = {"type": "struct", "fields": [_field("body", "variant")]}
    for feature in ("variantType", "variantType-preview"):
        variant_table = _snapshot(protocol=_features(feature), fields=[_field("doc", body)])
        check_writable(variant_table, removes_files=True)


def test_row_tracking_with_change_data_feed_is_writable() -> None:
    # Change data files leave the materialized row id columns out (test_row_tracking.py).
    config = {
        "delta.enableRowTracking": "true", "delta.enableChangeDataFeed": "true",
        "delta.rowTracking.materializedRowIdColumnName": "_row-id",
        "delta.rowTracking.materializedRowCommitVersionColumnName": "_row-commit-version",
    }  # fmt: skip
    protocol = _features("rowTracking", "domainMetadata", "changeDataFeed")
    snapshot = _snapshot(protocol=protocol, configuration=config)
    check_writable(snapshot, removes_files=False)
    check_writable(snapshot, removes_files=True)


def test_clustering_columns_must_have_statistics() -> None:
    fields = [_field("id"), _field("v", "string")]
    protocol = _features("clustering", "domainMetadata")
    domains = {"delta.clustering": '{"clusteringColumns": [["v"]]}'}
    check_writable(replace(_snapshot(fields=fields, protocol=protocol), domains=domains), removes_files=True)
    one_column = {"delta.dataSkippingNumIndexedCols": "1"}
    narrow = _snapshot(fields=fields, protocol=protocol, configuration=one_column)
    message = _refusal(replace(narrow, domains=domains))
    assert "clustering (columns v): writers must collect statistics" in message


def test_append_only_refuses_only_merges_that_remove_files() -> None:
    snapshot = _snapshot(configuration={"delta.appendOnly": "true"})
    check_writable(snapshot, removes_files=False)
    assert "appendOnly (delta.appendOnly=true)" in _refusal(snapshot, removes_files=True)


def test_every_problem_is_listed_at_once() -> None:
    snapshot = _snapshot(
        configuration={"delta.columnMapping.mode": "sideways", "delta.appendOnly": "true"},
        protocol=_features("columnMapping", "changeDataFeed", "icebergCompatV1"),
    )
    message = _refusal(snapshot)
    assert message.count("\n  - ") == 3
    assert "icebergCompatV1" in message
    assert "engine='delta'" in message  # Delta's own MERGE merges what the job refuses


def test_table_constraints_from_properties_and_field_metadata() -> None:
    fields = [
        _field("id", nullable=False),
        _field("ts", "timestamp"),
        _field("day", "date", metadata={"delta.generationExpression": "CAST(ts AS DATE)"}),
        _field("s", {"type": "struct", "fields": [_field("a", nullable=False), _field("b")]}, nullable=True),
        _field("q", "integer", metadata={"delta.invariants": '{"expression":{"expression":"q > 0"}}'}),
        _field(
            "arr",
            {
                "type": "array",
                "elementType": {"type": "struct", "fields": [_field("z", nullable=False)]},
                "containsNull": True,
            },
        ),
    ]
    config = {"delta.constraints.positive_id": "id > 0", "delta.appendOnly": "false"}
    constraints = table_constraints(_snapshot(fields=fields, configuration=config))
    assert constraints == TableConstraints(
        checks={"positive_id": "id > 0", "invariant:q": "q > 0"},
        not_null=(("id",), ("s", "a")),
        generated={"day": "CAST(ts AS DATE)"},
    )


def test_malformed_invariant_is_an_analysis_error() -> None:
    with pytest.raises(MergeAnalysisError, match=r"Column q has a delta\.invariants entry"):
        table_constraints(_snapshot(fields=[_field("q", metadata={"delta.invariants": "q > 0"})]))


def test_constraints_of_a_real_table(tmp_path: Path) -> None:
    write_deltalake(tmp_path, pa.table({"id": pa.array([1], pa.int64())}))
    DeltaTable(tmp_path).alter.add_constraint({"id_positive": "id > 0"})
    snapshot = load_snapshot(str(tmp_path))
    assert table_constraints(snapshot).checks == {"id_positive": "id > 0"}
    check_writable(snapshot, removes_files=True)
