"""What a merge commits is valid: live removes; adds inside the root with their size, schema and stats."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.commit.actions import plan_commit
from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.protocol.files import LiveFile, WrittenFile
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot, load_snapshot
from spark_jobs.delta_merge.write.merge_output import WriteOutcome, write_merge_output
from tests.support.delta_reader import read_rows, table_version

KV = pa.schema([("id", pa.int64()), ("v", pa.string())])


def _table(root: Path, *, partitioned: bool = False) -> TargetSnapshot:
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    write_deltalake(root, data, partition_by=["v"] if partitioned else None)
    return load_snapshot(str(root))


def _file(root: Path, relative: str, data: pa.Table, **changes: Any) -> WrittenFile:
    (root / relative).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, root / relative)
    written = WrittenFile(
        path=relative, size=(root / relative).stat().st_size, partition_values={},
        stats_json=json.dumps({"numRecords": data.num_rows}), num_records=data.num_rows, modification_time=0,
    )
    return dataclasses.replace(written, **changes)


def _plan(snapshot: TargetSnapshot, adds: list[WrittenFile], removes: list[LiveFile] | None = None,
          new_schema: StructType | None = None) -> None:
    plan_commit(snapshot, removes=removes or [], adds=adds, new_schema=new_schema, operation_parameters={},
                operation_metrics={}, app_transaction=None, commit_metadata={})


def _refused(snapshot: TargetSnapshot, adds: list[WrittenFile], *fragments: str, **kwargs: Any) -> str:
    with pytest.raises(MergeExecutionError) as raised:
        _plan(snapshot, adds, **kwargs)
    message = str(raised.value)
    assert message.startswith(f"Refusing to commit to {snapshot.table_uri}: the merge "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# -- plan_commit on files written by pyarrow (no JVM) ------------------------------------------------------
def test_valid_files_pass(tmp_path: Path) -> None:
    root = tmp_path / "a root with space, % and ü"  # the table URI is percent-encoded
    snapshot = _table(root)
    data = pa.table({"id": pa.array([3], pa.int64()), "v": ["c"]})
    _plan(snapshot, [_file(root, "part-ok.parquet", data)], removes=[snapshot.files[0]])


def test_size_existence_and_removes(tmp_path: Path) -> None:
    snapshot = _table(tmp_path)
    good = _file(tmp_path, "part-1.parquet", KV.empty_table())
    _refused(snapshot, [dataclasses.replace(good, size=good.size + 1)],
             f"adds 'part-1.parquet' with size {good.size + 1}, but the file has {good.size} bytes")
    _refused(snapshot, [dataclasses.replace(good, path="part-gone.parquet")],
             "adds 'part-gone.parquet', which does not exist (no file at ")
    ghost = dataclasses.replace(snapshot.files[0], path="ghost.parquet")
    _refused(snapshot, [good], "removes files that are not live at version 0: ['ghost.parquet']",
             removes=[ghost])
    _refused(snapshot, [good], "removes the same file twice", removes=[snapshot.files[0]] * 2)


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("../escape.parquet", "leaves the table root"),
        ("a/%2E%2E/%2E%2E/escape.parquet", "leaves the table root"),
        ("a//b.parquet", "has empty"),
        ("/tmp/elsewhere.parquet", "is an absolute path"),
        ("%2Ftmp%2Felsewhere.parquet", "is an absolute path"),
        ("s3://other-bucket/x.parquet", "has a URI scheme"),
        ("file:///tmp/x.parquet", "has a URI scheme"),
    ],
)
def test_paths_outside_the_table_root(tmp_path: Path, path: str, fragment: str) -> None:
    snapshot = _table(tmp_path / "t")
    outside = _file(tmp_path, "escape.parquet", KV.empty_table(), path=path)
    _refused(snapshot, [outside], f"adds {path!r}, which", fragment)


def test_schema_must_be_the_table_schema_without_partition_columns(tmp_path: Path) -> None:
    snapshot = _table(tmp_path, partitioned=True)  # data columns: id
    ids = pa.array([3], pa.int64())
    in_c = {"partition_values": {"v": "c"}}
    with_partition = _file(tmp_path, "v=c/a.parquet", pa.table({"id": ids, "v": ["c"]}), **in_c)
    _refused(snapshot, [with_partition], "adds 'v=c/a.parquet', whose Parquet schema is not the table's: "
             "unexpected columns ['v']")
    wrong_type = _file(tmp_path, "v=c/b.parquet", pa.table({"id": pa.array([3], pa.int32())}), **in_c)
    _refused(snapshot, [wrong_type], "column 'id' is int32, expected int64")
    right = _file(tmp_path, "v=c/c.parquet", pa.table({"id": ids}), **in_c)
    _plan(snapshot, [right])
    # After schema evolution the files must have the new columns.
    evolved = StructType([StructField("id", LongType()), StructField("v", StringType()),
                          StructField("extra", StringType())])
    _refused(snapshot, [right], "missing columns ['extra']", new_schema=evolved)
    extra = pa.table({"id": ids, "extra": pa.array(["x"], pa.string())})
    _plan(snapshot, [_file(tmp_path, "v=c/d.parquet", extra, **in_c)], new_schema=evolved)


def test_stats_must_count_the_rows_written(tmp_path: Path) -> None:
    snapshot = _table(tmp_path)
    data = pa.table({"id": pa.array([3, 4], pa.int64()), "v": ["c", "d"]})
    _refused(snapshot, [_file(tmp_path, "a.parquet", data, stats_json=json.dumps({"numRecords": 3}))],
             "adds 'a.parquet' whose stats say numRecords=3", "its footer has 2 rows")
    _refused(snapshot, [_file(tmp_path, "b.parquet", data, stats_json="{}")], "numRecords=None")
    _refused(snapshot, [_file(tmp_path, "c.parquet", data, num_records=1)], "the writer counted 1")
    (tmp_path / "d.parquet").write_bytes(b"not parquet at all")
    garbage = _file(tmp_path, "e.parquet", data, path="d.parquet", size=len(b"not parquet at all"))
    _refused(snapshot, [garbage], "adds 'd.parquet', which is not a readable Parquet file")


# -- a whole merge whose written files were tampered with: refused, table unchanged -----------------------
def _resized(f: WrittenFile, root: Path) -> WrittenFile:
    return dataclasses.replace(f, size=f.size - 1)


def _deleted(f: WrittenFile, root: Path) -> WrittenFile:
    (root / f.path).unlink()
    return f


def _outside(f: WrittenFile, root: Path) -> WrittenFile:
    return dataclasses.replace(f, path=f"../{f.path}")


def _reshaped(f: WrittenFile, root: Path) -> WrittenFile:
    table = pq.read_table(root / f.path)
    pq.write_table(table.set_column(0, "id", table.column("id").cast(pa.int32())), root / f.path)
    return dataclasses.replace(f, size=(root / f.path).stat().st_size)


def _miscounted(f: WrittenFile, root: Path) -> WrittenFile:
    stats = json.loads(f.stats_json)
    return dataclasses.replace(f, stats_json=json.dumps({**stats, "numRecords": stats["numRecords"] + 1}))
@pytest.mark.parametrize(
    ("tamper", "fragment"),
    [
        (_resized, "bytes"),
        (_deleted, "which does not exist"),
        (_outside, "leaves the table root"),
        (_reshaped, "column 'id' is int32, expected int64"),
        (_miscounted, "whose stats say numRecords="),
    ],
    ids=["size", "missing", "outside-root", "schema", "num-records"],
)
def test_merge_with_tampered_files_is_refused(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    tamper: Callable[[WrittenFile, Path], WrittenFile], fragment: str,
) -> None:
    target = tmp_path / "t"
    write_deltalake(str(target), pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
    source = tmp_path / "s"
    source.mkdir()
    pq.write_table(pa.table({"id": pa.array([2, 3], pa.int64()), "v": ["B", "c"]}), source / "part-0.parquet")
    def tampered(*args: Any, **kwargs: Any) -> WriteOutcome:
        outcome = write_merge_output(*args, **kwargs)
        files = (tamper(outcome.files[0], target), *outcome.files[1:])
        return dataclasses.replace(outcome, files=files)

    monkeypatch.setattr("spark_jobs.delta_merge.merge.output.write_merge_output", tampered)
    sql = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    spec = {"target": {"uri": str(target)}, "source": {"uri": str(source)}, "merge_sql": sql}

    with pytest.raises(MergeExecutionError, match="Refusing to commit") as raised:
        run_merge(spark, spec)

    assert fragment in str(raised.value)
    assert "Nothing was committed" in str(raised.value)
    assert table_version(target) == 0
    assert sorted(map(tuple, read_rows(target))) == [(1, "a"), (2, "b")]
