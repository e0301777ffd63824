"""Merges into column-mapped tables (``delta.columnMapping.mode`` ``name`` and ``id``, PROTOCOL.md "Column
Mapping"): files read by physical name or field id, written with physical names and field ids, partition
values and stats keyed by physical name; renamed and dropped columns; schema evolution assigning ids.

deltalake makes the tables (protocol 2/5 and the mapping metadata); a rename or a drop is a ``metaData``
action committed here by hand, as ALTER TABLE would commit it. Rows are read back with deltalake and
DuckDB's delta-kernel extension, which must agree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.types import ArrayType, DataType, LongType, MapType, StringType, StructField, StructType

from spark_jobs.delta_merge.commit.conflicts import added_file
from spark_jobs.delta_merge.protocol.column_mapping import (
    map_new_fields,
    max_column_id_update,
    physical_arrow_schema,
    physical_read_schema,
)
from spark_jobs.delta_merge.protocol.files import LiveFile
from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
from spark_jobs.delta_merge.scan.data_skipping import prune_files
from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
from tests.unit.spark_jobs.test_pipeline import (
    check_commit,
    expected_rows,
    live_files,
    log_actions,
    merge,
    parquet_source,
    row_metrics,
)

UPSERT = """MERGE INTO t USING s ON t.id = s.id
WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"""
PHYSICAL = re.compile(r"^col-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
POINT = pa.struct([("x", pa.int64()), ("y", pa.string())])
# Logical names a Parquet column name could not be in a table without column mapping (space, comma,
# parentheses, braces, equals sign), next to a struct, an array and a map of structs and a partition
# column.
WIDE = pa.schema([
    ("id", pa.int64()), ("my col (1)", pa.string()), ("a,b={c}", pa.int32()), ("pt", POINT),
    ("tags", pa.list_(pa.struct([("k", pa.string())]))),
    ("attrs", pa.map_(pa.string(), pa.struct([("n", pa.int64())]))), ("p", pa.string()),
])


def mapped_table(path: Path, table: pa.Table, mode: str, *, partition_by: Sequence[str] = (),
                 configuration: Mapping[str, str] | None = None) -> Path:
    write_deltalake(str(path), table, partition_by=list(partition_by) or None,
                    configuration={"delta.columnMapping.mode": mode, **(configuration or {})})
    return path


def table_rows(path: Path, *, partition_columns: Sequence[str] = ()) -> list[tuple[Any, ...]]:
    """Live rows through deltalake, sorted; DuckDB's delta-kernel reader must read the same.

    DuckDB's Delta extension reads the partition columns of column-mapped tables as NULL, even in
    tables deltalake wrote itself, so those columns are compared through deltalake only.
    """
    names = [f.name for f in DeltaTable(str(path)).schema().fields]
    rows = sorted((tuple(r) for r in read_rows(path, columns=names)), key=repr)
    data = [n for n in names if n not in partition_columns]
    kernel = sorted((tuple(r) for r in read_rows_with_kernel(path, columns=data)), key=repr)
    assert kernel == sorted((tuple(r[names.index(n)] for n in data) for r in rows), key=repr)
    return rows


def schema_fields(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(DeltaTable(str(path)).schema().to_json())["fields"])


def mapping_of(fields: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, int]]:
    """(physical name, id) by dotted logical path, through structs and arrays/maps of structs."""
    out: dict[str, tuple[str, int]] = {}

    def visit(prefix: str, data_type: Any) -> None:
        if isinstance(data_type, dict) and data_type.get("type") == "struct":
            for field in data_type["fields"]:
                meta = field["metadata"]
                name = f"{prefix}{field['name']}"
                out[name] = (meta["delta.columnMapping.physicalName"], int(meta["delta.columnMapping.id"]))
                visit(name + ".", field["type"])
        elif isinstance(data_type, dict) and data_type.get("type") == "array":
            visit(prefix, data_type["elementType"])
        elif isinstance(data_type, dict) and data_type.get("type") == "map":
            visit(prefix, data_type["keyType"])
            visit(prefix, data_type["valueType"])

    visit("", {"type": "struct", "fields": list(fields)})
    return out


def parquet_ids(schema: pa.Schema) -> dict[str, int]:
    """Field id by dotted physical path of a Parquet file's Arrow schema (list elements skipped)."""
    out: dict[str, int] = {}

    def visit(prefix: str, field: pa.Field) -> None:
        name = f"{prefix}{field.name}"
        if field.metadata and b"PARQUET:field_id" in field.metadata:
            out[name] = int(field.metadata[b"PARQUET:field_id"])
        if pa.types.is_struct(field.type):
            for i in range(field.type.num_fields):
                visit(name + ".", field.type.field(i))
        elif pa.types.is_list(field.type):
            visit(prefix, field.type.value_field.with_name(field.name))
        elif pa.types.is_map(field.type):
            visit(prefix, field.type.item_field.with_name(field.name))

    for field in schema:
        visit("", field)
    return out


def check_physical_files(path: Path, version: int, *, partition_columns: Sequence[str] = ()) -> None:
    """The files of ``version`` (data and change data) carry physical names and field ids; stats and
    partition values (of adds, removes and cdc actions) are keyed by physical name."""
    mapping = mapping_of(schema_fields(path))
    physical_paths = {}
    for logical, (physical, column_id) in mapping.items():
        parents = logical.split(".")[:-1]
        prefix = ".".join(mapping[".".join(parents[: i + 1])][0] for i in range(len(parents)))
        physical_paths[f"{prefix}.{physical}" if prefix else physical] = column_id
    partition_keys = {mapping[c][0] for c in partition_columns}
    actions = log_actions(path, version)
    files = [a[kind] for a in actions for kind in ("add", "cdc") if kind in a]
    assert files or any("remove" in a for a in actions)
    for action in files:
        written = pq.read_schema(path / unquote(action["path"]))
        ids = parquet_ids(written)
        columns = [n for n in written.names if n != "_change_type"]
        assert columns
        assert all(PHYSICAL.match(n) for n in columns), columns
        assert ids
        assert all(physical_paths[name] == column_id for name, column_id in ids.items()), ids
        assert {n for n in physical_paths if "." not in n} - partition_keys == set(columns)
        assert set(action["partitionValues"]) == partition_keys
    for add in (a["add"] for a in actions if "add" in a):
        stats = json.loads(add["stats"])
        for key in ("minValues", "maxValues", "nullCount"):
            assert stats[key]
            assert set(_stats_paths(stats[key])) <= set(physical_paths), stats
    for remove in (a["remove"] for a in actions if "remove" in a):
        assert set(remove["partitionValues"]) == partition_keys


def _stats_paths(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted key paths of a stats object (nested objects are struct fields)."""
    out: list[str] = []
    for key, value in values.items():
        out += _stats_paths(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]
    return out


def commit_schema_change(
    path: Path, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], *,
    partition_columns: Sequence[str] | None = None,
) -> None:
    """Commit the next version with only a ``metaData`` action: the table's, its schema edited as ALTER
    TABLE RENAME COLUMN / DROP COLUMN would (mapping metadata kept, so old files still read); a renamed
    partition column is renamed in ``partitionColumns`` too."""
    version = table_version(path)
    metadata = next(a["metaData"] for v in range(version, -1, -1) for a in log_actions(path, v)
                    if "metaData" in a)
    schema = json.loads(metadata["schemaString"])
    schema["fields"] = edit(schema["fields"])
    metadata = {**metadata, "schemaString": json.dumps(schema)}
    if partition_columns is not None:
        metadata["partitionColumns"] = list(partition_columns)
    info = {"timestamp": 1, "operation": "CHANGE COLUMN", "operationParameters": {}}
    lines = [json.dumps({"commitInfo": info}), json.dumps({"metaData": metadata})]
    (path / "_delta_log" / f"{version + 1:020d}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")


def wide(rows: Sequence[Sequence[Any]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(WIDE.names, r, strict=True)) for r in rows], schema=WIDE)


@pytest.mark.parametrize("mode", ["name", "id"])
def test_upsert_reads_and_writes_physical_columns_at_every_level(
    spark: Any, tmp_path: Path, mode: str
) -> None:
    target = mapped_table(tmp_path / "t", wide([
        (1, "a", 10, {"x": 1, "y": "p"}, [{"k": "u"}], [("m", {"n": 1})], "one"),
        (2, "b", 20, {"x": 2, "y": "q"}, [], None, "two"),
    ]), mode, partition_by=["p"])
    source = parquet_source(tmp_path / "s", wide([
        (2, "B", 21, {"x": 22, "y": "Q"}, [{"k": "v"}, {"k": "w"}], [("m", {"n": 2})], "two"),
        (3, "C", 30, {"x": 3, "y": "r"}, None, [], "one"),
    ]))
    before = live_files(target)

    metrics = merge(spark, target, source, UPSERT)

    assert table_rows(target, partition_columns=["p"]) == sorted([
        (1, "a", 10, {"x": 1, "y": "p"}, [{"k": "u"}], [("m", {"n": 1})], "one"),
        (2, "B", 21, {"x": 22, "y": "Q"}, [{"k": "v"}, {"k": "w"}], [("m", {"n": 2})], "two"),
        (3, "C", 30, {"x": 3, "y": "r"}, None, [], "one"),
    ], key=repr)
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1)
    assert metrics["numTargetPartitionsAddedTo"] == 2
    # The log keys partition values by physical name.
    check_commit(target, before, metrics, partition_columns=[mapping_of(schema_fields(target))["p"][0]])
    check_physical_files(target, metrics["tableVersion"], partition_columns=["p"])
    commit = log_actions(target, metrics["tableVersion"])
    assert not [a for a in commit if "metaData" in a]  # nothing new to map

    # A second merge reads the files the first wrote: their partition values and stats (physical keys,
    # read back through deltalake) prune the partition 'two' file and deltalake's file of id 1.
    deleted = parquet_source(tmp_path / "s2", wide([(3, "", 0, None, None, None, "one")]))
    on = "t.id = s.id AND t.p = 'one' AND t.id >= 3"
    delete = merge(spark, target, deleted, f"MERGE INTO t USING s ON {on} WHEN MATCHED THEN DELETE")

    assert (delete["numTargetFilesBeforeSkipping"], delete["numTargetFilesAfterSkipping"]) == (3, 1)
    assert [r[0] for r in table_rows(target, partition_columns=["p"])] == [1, 2]
    check_physical_files(target, delete["tableVersion"], partition_columns=["p"])


def test_stats_and_partition_values_by_physical_name_prune_files(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("the id", pa.int64()), ("v", pa.string()), ("part col", pa.string())])
    target = tmp_path / "t"
    for batch in ([(1, "a", "x"), (2, "b", "x")], [(10, "c", "x")], [(20, "d", "y")]):
        write_deltalake(str(target), pa.Table.from_pylist(
            [dict(zip(schema.names, r, strict=True)) for r in batch], schema=schema),
            mode="append", partition_by=["part col"], configuration={"delta.columnMapping.mode": "name"})
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist(
        [{"the id": 10, "v": "C", "part col": "x"}], schema=schema))

    metrics = merge(spark, target, source, """MERGE INTO t USING s
        ON t.`the id` = s.`the id` AND t.`part col` = 'x' AND t.`the id` >= 5
        WHEN MATCHED THEN UPDATE SET v = s.v""")

    # The partition value prunes the 'y' file, the stats of `the id` the file holding 1 and 2.
    assert (metrics["numTargetFilesBeforeSkipping"], metrics["numTargetFilesAfterSkipping"]) == (3, 1)
    assert metrics["numTargetPartitionsAfterSkipping"] == 1
    assert table_rows(target, partition_columns=["part col"]) == [
        (1, "a", "x"), (10, "C", "x"), (2, "b", "x"), (20, "d", "y")]
    check_physical_files(target, metrics["tableVersion"], partition_columns=["part col"])


@pytest.mark.parametrize("mode", ["name", "id"])
def test_renamed_columns_keep_reading_their_old_files(spark: Any, tmp_path: Path, mode: str) -> None:
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("pt", POINT), ("p", pa.string())])
    target = mapped_table(tmp_path / "t", pa.Table.from_pylist([
        {"id": 1, "v": "a", "pt": {"x": 1, "y": "q"}, "p": "one"},
        {"id": 2, "v": "b", "pt": {"x": 2, "y": "r"}, "p": "two"},
    ], schema=schema), mode, partition_by=["p"])

    def rename(fields: list[dict[str, Any]]) -> list[dict[str, Any]]:
        names = {"v": "value", "p": "part"}
        for field in fields:
            field["name"] = names.get(field["name"], field["name"])
            if field["name"] == "pt":
                field["type"]["fields"][0]["name"] = "x renamed"
        return fields

    commit_schema_change(target, rename, partition_columns=["part"])
    renamed = pa.schema([("id", pa.int64()), ("value", pa.string()),
                         ("pt", pa.struct([("x renamed", pa.int64()), ("y", pa.string())])),
                         ("part", pa.string())])
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist([
        {"id": 2, "value": "B", "pt": {"x renamed": 20, "y": "R"}, "part": "two"},
        {"id": 3, "value": "C", "pt": {"x renamed": 3, "y": "s"}, "part": "one"},
    ], schema=renamed))

    metrics = merge(spark, target, source, UPSERT)

    assert [f["name"] for f in schema_fields(target)] == ["id", "value", "pt", "part"]
    assert table_rows(target, partition_columns=["part"]) == sorted([
        (1, "a", {"x renamed": 1, "y": "q"}, "one"),
        (2, "B", {"x renamed": 20, "y": "R"}, "two"),
        (3, "C", {"x renamed": 3, "y": "s"}, "one"),
    ], key=repr)
    check_physical_files(target, metrics["tableVersion"], partition_columns=["part"])


def test_dropped_column_stays_in_old_files_and_leaves_new_ones(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("gone", pa.string()), ("v", pa.string())])
    target = mapped_table(tmp_path / "t", pa.Table.from_pylist([
        {"id": 1, "gone": "x", "v": "a"}, {"id": 2, "gone": "y", "v": "b"},
    ], schema=schema), "name")
    gone_physical = mapping_of(schema_fields(target))["gone"][0]
    old_files = list(live_files(target))
    commit_schema_change(target, lambda fields: [f for f in fields if f["name"] != "gone"])
    # A column of the same name added after the drop is another column: new id, new physical name.
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist(
        [{"id": 2, "v": "B", "gone": "new"}, {"id": 3, "v": "C", "gone": "newer"}],
        schema=pa.schema([("id", pa.int64()), ("v", pa.string()), ("gone", pa.string())])))

    metrics = merge(spark, target, source, UPSERT, schema_evolution=True)

    assert table_rows(target) == [(1, "a", None), (2, "B", "new"), (3, "C", "newer")]
    mapping = mapping_of(schema_fields(target))
    assert mapping["gone"][0] != gone_physical
    assert mapping["gone"][1] == 4
    assert gone_physical in pq.read_schema(target / unquote(old_files[0])).names
    check_physical_files(target, metrics["tableVersion"])


def test_schema_evolution_maps_new_columns_and_fields_in_the_same_commit(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("pt", POINT)])
    target = mapped_table(tmp_path / "t", pa.Table.from_pylist(
        [{"id": 1, "pt": {"x": 1, "y": "a"}}], schema=schema), "id")
    old_mapping = mapping_of(schema_fields(target))
    assert max(i for _, i in old_mapping.values()) == 4
    wider = pa.schema([
        ("id", pa.int64()),
        ("pt", pa.struct([("x", pa.int64()), ("y", pa.string()), ("z", pa.float64())])),
        ("new col", pa.list_(pa.struct([("q", pa.int32())]))),
    ])
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist([
        {"id": 1, "pt": {"x": 10, "y": "A", "z": 0.5}, "new col": [{"q": 1}]},
        {"id": 2, "pt": {"x": 2, "y": "b", "z": 1.5}, "new col": None},
    ], schema=wider))

    metrics = merge(spark, target, source, UPSERT, schema_evolution=True)

    commit = log_actions(target, metrics["tableVersion"])
    assert [next(iter(a)) for a in commit][:2] == ["commitInfo", "metaData"]
    metadata = commit[1]["metaData"]
    assert metadata["configuration"]["delta.columnMapping.maxColumnId"] == "7"
    assert metadata["configuration"]["delta.columnMapping.mode"] == "id"
    mapping = mapping_of(json.loads(metadata["schemaString"])["fields"])
    assert {k: v for k, v in mapping.items() if k in old_mapping} == old_mapping
    new = {k: v for k, v in mapping.items() if k not in old_mapping}
    assert sorted(new) == ["new col", "new col.q", "pt.z"]
    assert sorted(i for _, i in new.values()) == [5, 6, 7]
    assert all(PHYSICAL.match(p) for p, _ in new.values())
    assert table_rows(target) == [
        (1, {"x": 10, "y": "A", "z": 0.5}, [{"q": 1}]), (2, {"x": 2, "y": "b", "z": 1.5}, None)]
    check_physical_files(target, metrics["tableVersion"])


def test_change_data_files_use_physical_names(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("my v", pa.string()), ("p", pa.string())])
    target = mapped_table(tmp_path / "t", pa.Table.from_pylist([
        {"id": 1, "my v": "a", "p": "x"}, {"id": 2, "my v": "b", "p": "x"},
    ], schema=schema), "name", partition_by=["p"], configuration={"delta.enableChangeDataFeed": "true"})
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist([
        {"id": 2, "my v": "B", "p": "x"}, {"id": 3, "my v": "C", "p": "x"},
    ], schema=schema))

    metrics = merge(spark, target, source, UPSERT)

    assert table_rows(target, partition_columns=["p"]) == [(1, "a", "x"), (2, "B", "x"), (3, "C", "x")]
    # Read from the files: deltalake 1.6.6's load_cdf refuses column-mapped tables ("Column mapping is not
    # supported for read operation 'CHANGE DATA FEED scans' yet").
    commit = log_actions(target, metrics["tableVersion"])
    cdc = [a["cdc"] for a in commit if "cdc" in a]
    assert cdc
    assert all(c["path"].startswith("_change_data/") for c in cdc)
    change_rows = [r for c in cdc for r in pq.read_table(target / unquote(c["path"])).to_pylist()]
    v_physical = mapping_of(schema_fields(target))["my v"][0]
    assert sorted((r[v_physical], r["_change_type"]) for r in change_rows) == [
        ("B", "update_postimage"), ("C", "insert"), ("b", "update_preimage")]
    check_physical_files(target, metrics["tableVersion"], partition_columns=["p"])


def test_id_mode_reads_by_field_id_whatever_the_parquet_names(spark: Any, tmp_path: Path) -> None:
    kv_schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    target = mapped_table(tmp_path / "t", pa.Table.from_pylist(
        [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}], schema=kv_schema), "id")
    mapping = mapping_of(schema_fields(target))
    # A file another writer made: other column names, the table's field ids (PROTOCOL.md: in id mode,
    # readers resolve columns by field_id).
    foreign = pa.schema([
        pa.field("first", pa.int64(), metadata={b"PARQUET:field_id": str(mapping["id"][1]).encode()}),
        pa.field("second", pa.string(), metadata={b"PARQUET:field_id": str(mapping["v"][1]).encode()}),
    ])
    pq.write_table(pa.Table.from_pylist([{"first": 5, "second": "e"}, {"first": 6, "second": "f"}],
                                        schema=foreign), target / "foreign.parquet")
    id_key, v_key = mapping["id"][0], mapping["v"][0]
    stats = {"numRecords": 2, "minValues": {id_key: 5, v_key: "e"}, "maxValues": {id_key: 6, v_key: "f"},
             "nullCount": {id_key: 0, v_key: 0}}
    size = (target / "foreign.parquet").stat().st_size
    add = {"path": "foreign.parquet", "partitionValues": {}, "size": size, "modificationTime": 1,
           "dataChange": True, "stats": json.dumps(stats)}
    lines = [json.dumps({"commitInfo": {"timestamp": 1, "operation": "WRITE"}}), json.dumps({"add": add})]
    (target / "_delta_log" / f"{1:020d}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist([{"id": 5, "v": "E"}], schema=kv_schema))

    metrics = merge(spark, target, source, UPSERT)

    # Read by name, the foreign file would hold NULLs: id 5 would be inserted, not matched.
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=1, numTargetRowsMatchedUpdated=1, numTargetRowsCopied=1)
    assert [r["path"] for r in (a["remove"] for a in log_actions(target, 2) if "remove" in a)] == [
        "foreign.parquet"]
    assert table_rows(target) == [(1, "a"), (2, "b"), (5, "E"), (6, "f")]
    check_physical_files(target, metrics["tableVersion"])


# -- the mapping itself (no JVM) ------------------------------------------------------------------------
def _mapped(name: str, data_type: DataType, column_id: int) -> StructField:
    return StructField(name, data_type, True, {"delta.columnMapping.id": column_id,
                                               "delta.columnMapping.physicalName": f"col-{column_id}"})


def test_new_fields_get_the_next_ids_at_any_depth_and_old_ones_keep_theirs() -> None:
    old = StructType([
        _mapped("id", LongType(), 1), _mapped("s", StructType([_mapped("a", LongType(), 2)]), 3),
    ])
    foreign = {"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-of-the-source",
               "parquet.field.id": 1, "comment": "kept"}
    new = StructType([
        StructField("ID", LongType()),  # the same column, matched case-insensitively
        StructField("s", StructType([
            StructField("a", LongType()), StructField("b", LongType(), True, foreign),
        ])),
        StructField("m", MapType(StringType(), ArrayType(StructType([StructField("z", LongType())])))),
    ])
    config = {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "5"}

    mapped = map_new_fields(config, old, new, mode="name")

    ids = {path: (i, p) for path, (p, i) in mapping_of(json.loads(mapped.json())["fields"]).items()}
    assert {path: i for path, (i, _) in ids.items()} == {
        "ID": 1, "s": 3, "s.a": 2, "s.b": 6, "m": 7, "m.z": 8}
    assert ids["s.a"][1] == "col-2"
    assert all(PHYSICAL.match(ids[path][1]) for path in ("s.b", "m", "m.z"))
    assert mapped["s"].dataType["b"].metadata["comment"] == "kept"  # type: ignore[index]
    assert "parquet.field.id" not in mapped["s"].dataType["b"].metadata  # type: ignore[index]
    assert max_column_id_update(config, mapped, mode="name") == {"delta.columnMapping.maxColumnId": "8"}
    assert max_column_id_update(config, old, mode="name") == {}
    assert map_new_fields({}, old, new, mode="none") is new


def test_arrow_and_spark_read_schemas_carry_physical_names_and_ids() -> None:
    schema = StructType([
        _mapped("my id", LongType(), 1),
        _mapped("l", ArrayType(StructType([_mapped("x", LongType(), 3)])), 2),
    ])
    arrow = pa.schema([("my id", pa.int64()), ("l", pa.list_(pa.struct([("x", pa.int64())])))])

    physical = physical_arrow_schema(schema, arrow, "name")

    assert physical.names == ["col-1", "col-2"]
    assert parquet_ids(physical) == {"col-1": 1, "col-2": 2, "col-2.col-3": 3}
    assert physical_read_schema(schema, "name")["col-1"].metadata == {}
    by_id = physical_read_schema(schema, "id")
    assert by_id["col-1"].metadata == {"parquet.field.id": 1}
    assert by_id["col-2"].dataType.elementType["col-3"].metadata == {"parquet.field.id": 3}  # type: ignore[attr-defined]
    assert physical_read_schema(schema, "none") is schema


def test_a_rewrite_that_only_copies_rows_commits_an_empty_physical_change_data_file(
    spark: Any, tmp_path: Path
) -> None:
    schema = pa.schema([("id", pa.int64()), ("my v", pa.string()), ("p", pa.string())])
    target = mapped_table(tmp_path / "t", pa.Table.from_pylist([
        {"id": 1, "my v": "a", "p": "x"}, {"id": 2, "my v": "b", "p": "x"},
    ], schema=schema), "name", partition_by=["p"], configuration={"delta.enableChangeDataFeed": "true"})
    source = parquet_source(
        tmp_path / "s", pa.Table.from_pylist([{"id": 2, "my v": "B", "p": "x"}], schema=schema))

    metrics = merge(spark, target, source, """MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED AND s.`my v` = 'never' THEN UPDATE SET *
        WHEN NOT MATCHED BY SOURCE AND t.id > 5 THEN DELETE""")

    assert table_rows(target, partition_columns=["p"]) == [(1, "a", "x"), (2, "b", "x")]
    assert row_metrics(metrics) == expected_rows(numSourceRows=1, numTargetRowsCopied=2)
    cdc = [a["cdc"] for a in log_actions(target, metrics["tableVersion"]) if "cdc" in a]
    assert len(cdc) == 1
    assert pq.read_metadata(target / unquote(cdc[0]["path"])).num_rows == 0
    check_physical_files(target, metrics["tableVersion"], partition_columns=["p"])


def test_concurrent_adds_are_checked_against_the_read_by_their_physical_keys(
    spark: Any, tmp_path: Path
) -> None:
    # The conflict check (conflicts.added_file, then prune_files) takes a winning commit's add as logged.
    schema = pa.schema([("the id", pa.int64()), ("part col", pa.string())])
    rows = pa.Table.from_pylist([{"the id": 1, "part col": "x"}], schema=schema)
    target = mapped_table(tmp_path / "t", rows, "name", partition_by=["part col"])
    mapping = mapping_of(schema_fields(target))
    part_key, id_key = mapping["part col"][0], mapping["the id"][0]

    def concurrent_add(path: str, part: str, low: int, high: int) -> LiveFile:
        stats = {"numRecords": 2, "minValues": {id_key: low}, "maxValues": {id_key: high},
                 "nullCount": {id_key: 0}}
        return added_file({"path": path, "size": 1, "partitionValues": {part_key: part},
                           "modificationTime": 1, "stats": json.dumps(stats)})

    files = [concurrent_add("in.parquet", "x", 5, 9), concurrent_add("other-partition.parquet", "y", 5, 9),
             concurrent_add("below.parquet", "x", 1, 2)]

    kept = prune_files(spark, load_snapshot(str(target)), files,
                       predicates=["t.`part col` = 'x'", "t.`the id` >= 5"], target_alias="t")

    assert [f.path for f in kept] == ["in.parquet"]


def test_a_column_mapped_delta_source_is_read_by_logical_names(spark: Any, tmp_path: Path) -> None:
    source_schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("pt", POINT)])
    source = mapped_table(tmp_path / "s", pa.Table.from_pylist([
        {"id": 2, "v": "B", "pt": {"x": 2, "y": "b"}}, {"id": 3, "v": "C", "pt": {"x": 3, "y": "c"}},
    ], schema=source_schema), "id")
    target = tmp_path / "t"
    kv_schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    rows = pa.Table.from_pylist([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}], schema=kv_schema)
    write_deltalake(str(target), rows)

    merge(spark, target, {"uri": str(source), "format": "delta"}, UPSERT, schema_evolution=True)

    assert table_rows(target) == [(1, "a", None), (2, "B", {"x": 2, "y": "b"}), (3, "C", {"x": 3, "y": "c"})]
    # The source's ids and physical names are no business of a target without column mapping.
    assert "delta.columnMapping" not in DeltaTable(str(target)).schema().to_json()
    assert "parquet.field.id" not in DeltaTable(str(target)).schema().to_json()


def test_insert_only_merge_appends_physical_files(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("my v", pa.string()), ("p", pa.string())])
    rows = pa.Table.from_pylist([{"id": 1, "my v": "a", "p": "x"}], schema=schema)
    target = mapped_table(tmp_path / "t", rows, "name", partition_by=["p"])
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist(
        [{"id": 1, "my v": "A", "p": "x"}, {"id": 2, "my v": "b", "p": "y"}], schema=schema))

    insert_new = "MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *"
    metrics = merge(spark, target, source, insert_new)

    assert row_metrics(metrics) == expected_rows(numSourceRows=2, numTargetRowsInserted=1)
    assert table_rows(target, partition_columns=["p"]) == [(1, "a", "x"), (2, "b", "y")]
    check_physical_files(target, metrics["tableVersion"], partition_columns=["p"])
