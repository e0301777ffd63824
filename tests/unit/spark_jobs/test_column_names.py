"""Any column name Delta allows (a backtick, a dot, spaces, unicode) through every stage of a merge:
the statement (``UPDATE SET *``, explicit assignments, conditions), scans, the output, statistics, the change
data feed and the commit. Read back with deltalake and DuckDB's delta-kernel reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.unit.spark_jobs.test_pipeline import log_actions, merge, parquet_source, sorted_rows

NAMES = pa.schema([
    ("id", pa.int64()), ("col`name", pa.string()), ("a.b c", pa.int64()), ("größe ü", pa.string()),
])


def _table(rows: list[tuple[Any, ...]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(NAMES.names, row, strict=True)) for row in rows], schema=NAMES)


@pytest.mark.parametrize(
    "sql",
    [
        "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        "MERGE INTO t USING s ON t.id = s.id AND s.`a.b c` > 0 "
        "WHEN MATCHED AND t.`col``name` <> s.`col``name` THEN UPDATE SET t.`col``name` = s.`col``name`, "
        "`größe ü` = s.`größe ü`, `a.b c` = s.`a.b c` "
        "WHEN NOT MATCHED THEN INSERT (id, `col``name`, `a.b c`, `größe ü`) "
        "VALUES (s.id, s.`col``name`, s.`a.b c`, s.`größe ü`)",
    ],
    ids=["star", "named"],
)
def test_names_with_backticks_dots_spaces_and_unicode(spark: Any, tmp_path: Path, sql: str) -> None:
    target = tmp_path / "t"
    write_deltalake(str(target), _table([(1, "x", 10, "s"), (2, "y", 20, "m")]),
                    configuration={"delta.enableChangeDataFeed": "true"})  # fmt: skip
    source = parquet_source(tmp_path / "s", _table([(2, "Y", 21, "L"), (3, "z", 30, "XL")]))

    metrics = merge(spark, target, source, sql)

    assert sorted_rows(target) == [(1, "x", 10, "s"), (2, "Y", 21, "L"), (3, "z", 30, "XL")]
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (1, 1)
    changes = pa.table(DeltaTable(str(target)).load_cdf(starting_version=1).read_all()).to_pylist()
    kinds = sorted((row["_change_type"], row["id"], row["col`name"]) for row in changes)
    assert kinds == [("insert", 3, "z"), ("update_postimage", 2, "Y"), ("update_preimage", 2, "y")]
    # Statistics under each name as the log spells it.
    (stats,) = {json.dumps(sorted(json.loads(a["add"]["stats"])["minValues"]))
                for a in log_actions(target, 1) if "add" in a}  # fmt: skip
    assert json.loads(stats) == sorted(NAMES.names)
