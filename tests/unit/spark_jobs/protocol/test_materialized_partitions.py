"""materializePartitionColumns (PROTOCOL.md, "Materialize Partition Columns"): every file a merge writes
holds the partition columns too, after the other columns, while the log keeps the partition values and
readers take them from there.

The target is laid out as Delta on Spark writes such a table: its files hold the partition column as
their last column (rewritten from deltalake's files, the log's sizes fixed), the protocol is 3/7 with the
writer feature. deltalake and DuckDB's Delta extension read it before and after each merge.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from spark_jobs.delta_merge.merge.copy_by_position import COPY_BY_POSITION_CONF
from tests.support.delta_reader import read_rows, read_rows_with_kernel
from tests.support.table_feature_fixtures import enable_features
from tests.unit.spark_jobs.test_pipeline import (
    check_commit,
    expected_rows,
    live_files,
    log_actions,
    merge,
    parquet_source,
    row_metrics,
)

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("p", pa.string())])
UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"


def rows(path: Path) -> list[tuple[Any, ...]]:
    """Live rows through deltalake, checked equal to DuckDB's (delta-kernel), sorted."""
    found = sorted(tuple(r) for r in read_rows(path, columns=SCHEMA.names))
    assert sorted(tuple(r) for r in read_rows_with_kernel(path, columns=SCHEMA.names)) == found
    return found


def _materialize_partition_column(path: Path) -> None:
    """Rewrite each data file with its partition value as its last column, as Delta on Spark writes
    files of such a table, and fix the ``size`` of its ``add`` in the log."""
    sizes = {}
    for add_path, add in live_files(path).items():
        file = path / add_path
        data = pq.read_table(file)
        data = data.append_column("p", pa.array([add["partitionValues"]["p"]] * data.num_rows, pa.string()))
        pq.write_table(data, file)
        sizes[add_path] = file.stat().st_size
    for commit in sorted((path / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text(encoding="utf-8").splitlines()]
        for action in actions:
            if "add" in action and action["add"]["path"] in sizes:
                action["add"]["size"] = sizes[action["add"]["path"]]
        commit.write_text("".join(json.dumps(a) + "\n" for a in actions), encoding="utf-8")


@pytest.fixture
def target(tmp_path: Path) -> Path:
    path = tmp_path / "t"
    rows_x = [{"id": i, "v": "a", "p": "x"} for i in range(3)]
    table = pa.Table.from_pylist(rows_x + [{"id": i, "v": "b", "p": "y"} for i in range(3, 6)], schema=SCHEMA)
    write_deltalake(str(path), table, partition_by=["p"])
    _materialize_partition_column(path)
    assert rows(path) == sorted((r["id"], r["v"], r["p"]) for r in table.to_pylist())
    return path


def _file(path: Path, action: dict[str, Any]) -> Path:
    return path / unquote(action["path"])


@pytest.mark.parametrize("layout", ["copy-on-write", "copy-by-position", "change-data-feed"])
def test_every_file_a_merge_writes_holds_the_partition_column_last(
    spark: Any, target: Path, tmp_path: Path, layout: str
) -> None:
    enable_features(target, materialize_partition_columns=True, change_data_feed=layout == "change-data-feed")
    before = live_files(target)
    source = parquet_source(
        tmp_path / "s", pa.Table.from_pylist([{"id": 1, "v": "A", "p": "x"}, {"id": 9, "v": "N", "p": "z"}],
                                              schema=SCHEMA),
    )  # fmt: skip
    if layout == "copy-by-position":
        spark.conf.set(COPY_BY_POSITION_CONF, "0")
    try:
        metrics = merge(spark, target, source, UPSERT)
    finally:
        spark.conf.unset(COPY_BY_POSITION_CONF)

    assert rows(target) == [(0, "a", "x"), (1, "A", "x"), (2, "a", "x"), (3, "b", "y"), (4, "b", "y"),
                            (5, "b", "y"), (9, "N", "z")]  # fmt: skip
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=2
    )
    _, adds = check_commit(target, before, metrics, partition_columns=["p"])
    assert {a["partitionValues"]["p"] for a in adds} == {"x", "z"}
    for add in adds:
        # The partition value is in the file and in the log; statistics leave it out, as Delta's do.
        written = pq.read_table(_file(target, add))
        assert written.column_names == ["id", "v", "p"]
        assert set(written.column("p").to_pylist()) == {add["partitionValues"]["p"]}
        assert set(json.loads(add["stats"])["minValues"]) == {"id", "v"}
    changes = [a["cdc"] for a in log_actions(target, metrics["tableVersion"]) if "cdc" in a]
    assert bool(changes) is (layout == "change-data-feed")
    for change in changes:
        assert pq.read_schema(_file(target, change)).names == ["id", "v", "p", "_change_type"]
