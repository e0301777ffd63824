"""Copy-on-write copying the unchanged rows of touched files by position (copy_by_position).

Each merge here runs twice on identical tables, once copying by position and once through Spark's
reader (the conf set to -1): the rows, the row metrics and the commit must agree, and the copies must be
ordinary Delta files (statistics from their rows, the touched file's partition) that deltalake and the
delta-kernel reader read.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.merge.copy_by_position import COPY_BY_POSITION_CONF
from tests.support.deletion_vector_fixture import add_deletion_vectors
from tests.support.delta_reader import table_version
from tests.unit.spark_jobs.protocol.test_column_mapping import mapped_table
from tests.unit.spark_jobs.test_pipeline import (
    check_commit,
    live_files,
    log_actions,
    make_target,
    merge,
    parquet_source,
    row_metrics,
    sorted_rows,
)

ROWS = pa.schema([("id", pa.int64()), ("region", pa.string()), ("v", pa.string()), ("n", pa.int64())])
UPSERT = """MERGE INTO t USING s ON t.id = s.id
WHEN MATCHED AND s.v = 'gone' THEN DELETE
WHEN MATCHED THEN UPDATE SET v = s.v, n = t.n + 1000
WHEN NOT MATCHED THEN INSERT *"""


def rows(ids: range, region: str = "eu", tag: str = "x") -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": i, "region": region, "v": f"{tag}{i}", "n": i} for i in ids], schema=ROWS
    )


@pytest.fixture
def copy_mode(spark: Any) -> Iterator[Any]:
    """Sets the conf for the next merge: "0" copies by position, "-1" through Spark's reader."""

    def use(value: str) -> None:
        spark.conf.set(COPY_BY_POSITION_CONF, value)

    yield use
    spark.conf.unset(COPY_BY_POSITION_CONF)


def both_ways(
    spark: Any, copy_mode: Any, tmp_path: Path, target: Path, source: dict[str, Any], sql: str
) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """The merge on a copy of ``target`` through Spark's reader, then on ``target`` by position: (metrics by
    position, metrics through Spark, the table merged through Spark)."""
    through_spark = tmp_path / "through-spark"
    shutil.copytree(target, through_spark)
    copy_mode("-1")
    spark_metrics = merge(spark, through_spark, source, sql)
    copy_mode("0")
    metrics = merge(spark, target, source, sql)
    return metrics, spark_metrics, through_spark


def check_copies(table: Path, adds: list[dict[str, Any]]) -> None:
    """Every added file: its stats' numRecords, min and max and null counts are its rows'."""
    for add in adds:
        data = pq.read_table(table / unquote(add["path"]))
        stats = json.loads(add["stats"])
        assert stats["numRecords"] == data.num_rows
        for name in ("id", "n"):
            values = [v for v in data.column(name).to_pylist() if v is not None]
            if values:
                assert (stats["minValues"][name], stats["maxValues"][name]) == (min(values), max(values))
            assert stats["nullCount"][name] == data.column(name).null_count


def test_upsert_copies_unchanged_rows_like_the_spark_path(spark: Any, tmp_path: Path, copy_mode: Any) -> None:
    target = make_target(tmp_path / "t", rows(range(50)), rows(range(50, 100)), rows(range(100, 150)))
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist([
        {"id": 3, "region": "eu", "v": "new", "n": 0}, {"id": 7, "region": "eu", "v": "gone", "n": 0},
        {"id": 60, "region": "eu", "v": "new", "n": 0}, {"id": 500, "region": "us", "v": "ins", "n": 5},
    ], schema=ROWS))  # fmt: skip
    before = live_files(target)

    metrics, spark_metrics, through_spark = both_ways(spark, copy_mode, tmp_path, target, source, UPSERT)

    merged = sorted_rows(target)
    assert merged == sorted_rows(through_spark)
    assert row_metrics(metrics) == row_metrics(spark_metrics)
    assert metrics["numTargetRowsCopied"] == 97  # 100 rows of the 2 touched files, 3 changed
    assert metrics["numTargetFilesRemoved"] == spark_metrics["numTargetFilesRemoved"] == 2
    removes, adds = check_commit(target, before, metrics)
    untouched = [p for p in before if p not in {r["path"] for r in removes}]
    assert len(untouched) == 1
    assert untouched[0] in live_files(target)
    check_copies(target, adds)
    assert (20, "x20", 20) in [(r[0], r[2], r[3]) for r in merged]
    assert [r for r in merged if r[0] in (3, 7, 60)] == [(3, "eu", "new", 1003),
                                                                        (60, "eu", "new", 1060)]


def test_copies_stay_in_their_partition(spark: Any, tmp_path: Path, copy_mode: Any) -> None:
    target = make_target(tmp_path / "t", pa.concat_tables([rows(range(10), "eu west"),
                                                           rows(range(10, 20), "us/east")]),
                         partition_by=["region"])  # fmt: skip
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist(
        [{"id": 12, "region": "us/east", "v": "new", "n": 0}], schema=ROWS))
    before = live_files(target)

    metrics, spark_metrics, through_spark = both_ways(spark, copy_mode, tmp_path, target, source, UPSERT)

    assert sorted_rows(target) == sorted_rows(through_spark)
    assert row_metrics(metrics) == row_metrics(spark_metrics)
    removes, adds = check_commit(target, before, metrics, partition_columns=["region"])
    assert [r["partitionValues"] for r in removes] == [{"region": "us/east"}]
    assert {json.dumps(a["partitionValues"]) for a in adds} == {json.dumps({"region": "us/east"})}
    assert all(unquote(a["path"]).startswith("region=us%2Feast/") for a in adds)
    check_copies(target, adds)


def test_rows_a_deletion_vector_deletes_are_not_copied(
    spark: Any, tmp_path: Path, copy_mode: Any, copy_on_write: None
) -> None:
    target = make_target(tmp_path / "t", rows(range(10)), rows(range(10, 20)))
    first = sorted(live_files(target))[0]
    add_deletion_vectors(target, {first: ([0, 5], "i")})
    gone = {r[0] for r in sorted_rows(target)} ^ set(range(20))
    assert len(gone) == 2
    assert gone in ({0, 5}, {10, 15})
    ids = [1, 6, 11, 16]  # live rows of both files
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist(
        [{"id": i, "region": "eu", "v": "new", "n": 0} for i in ids], schema=ROWS))
    before = live_files(target)

    metrics, spark_metrics, through_spark = both_ways(spark, copy_mode, tmp_path, target, source, UPSERT)

    assert sorted_rows(target) == sorted_rows(through_spark)
    assert {r[0] for r in sorted_rows(target)} == set(range(20)) - gone
    assert row_metrics(metrics) == row_metrics(spark_metrics)
    assert metrics["numTargetFilesRemoved"] == 2
    assert metrics["numTargetRowsCopied"] == 18 - len(ids)
    _, adds = check_commit(target, before, metrics)
    assert all("deletionVector" not in a or a["deletionVector"] is None for a in adds)
    check_copies(target, adds)


def test_column_mapped_table_gains_a_column(spark: Any, tmp_path: Path, copy_mode: Any) -> None:
    target = mapped_table(tmp_path / "t", rows(range(20)), "id")
    source_rows = pa.Table.from_pylist([{"id": 4, "region": "eu", "v": "new", "n": 0, "extra": 1.5}],
                                       schema=ROWS.append(pa.field("extra", pa.float64())))
    source = parquet_source(tmp_path / "s", source_rows)
    sql = "MERGE WITH SCHEMA EVOLUTION INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *"
    metrics, spark_metrics, through_spark = both_ways(spark, copy_mode, tmp_path, target, source, sql)

    got = sorted_rows(target, ["id", "v", "n", "extra"])
    assert got == sorted_rows(through_spark, ["id", "v", "n", "extra"])
    assert (4, "new", 0, 1.5) in got
    assert (5, "x5", 5, None) in got
    assert row_metrics(metrics) == row_metrics(spark_metrics)


def test_small_merges_keep_one_write_by_default(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", rows(range(10)))
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist(
        [{"id": 1, "region": "eu", "v": "new", "n": 0}], schema=ROWS))
    metrics = merge(spark, target, source, UPSERT)
    # Far below the default's 32 MiB: the changed and the copied rows go to one file, as Delta writes them.
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetFilesAdded"]) == (1, 1)
    assert metrics["numTargetRowsCopied"] == 9


def test_a_bad_conf_is_refused_before_anything_is_written(spark: Any, tmp_path: Path, copy_mode: Any) -> None:
    target = make_target(tmp_path / "t", rows(range(10)))
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist(
        [{"id": 1, "region": "eu", "v": "new", "n": 0}], schema=ROWS))
    files = sorted(p.name for p in target.iterdir())
    copy_mode("lots")
    with pytest.raises(MergeSpecError, match=r"spark\.delta_merge\.copyByPosition\.minFileBytes.*'lots'"):
        merge(spark, target, source, UPSERT)
    assert table_version(target) == 0
    assert sorted(p.name for p in target.iterdir()) == files
    assert len(log_actions(target, 0)) > 0
