"""The delta engine on both session kinds: Delta's own MERGE INTO runs the spec, and the job's contract holds
around it (metrics equal to what Delta's DESCRIBE HISTORY shows, the idempotency key applied once, Delta's
error class with the table unchanged, the statement's USING query, the commit metadata)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import MergeAnalysisError, MultipleSourceRowMatchesError
from tests.integration.airflow_merge_provider.test_integration import _txns
from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
from tests.support.delta_reference import JOB_ONLY_METRICS, delta_history_metrics
from tests.support.delta_tables import create_table

UPSERT = ("MERGE INTO target t USING source s ON t.id = s.id "
          "WHEN MATCHED THEN UPDATE SET name = s.name WHEN NOT MATCHED THEN INSERT *")  # fmt: skip


def _source(path: Path, ids: list[int]) -> str:
    path.mkdir()
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "name": [f"s{i}" for i in ids]}),
                   path / "part-0.parquet")  # fmt: skip
    return str(path)


def _spec(table: str, source: str, merge_sql: str, version: int = 1, **run: Any) -> dict[str, Any]:
    return {"target": {"uri": table}, "source": {"uri": source}, "merge_sql": merge_sql,
            "options": {"engine": "delta"},
            "run": {"app_id": "delta-engine", "app_version": version, **run}}  # fmt: skip


def test_delta_merges_and_the_metrics_are_its_commit_s(merge_spark: Any, spark: Any, tmp_path: Path) -> None:
    table = create_table(tmp_path / "table", rows=6)
    source = _source(tmp_path / "source", [4, 5, 6, 7])
    spec = _spec(table, source, UPSERT, commit_metadata={"team": "ledger"})

    metrics = run_merge(merge_spark, spec).to_dict()

    expected = [[i, f"n{i}"] for i in range(4)] + [[i, f"s{i}"] for i in range(4, 8)]
    assert sorted(read_rows(table)) == expected
    assert sorted(read_rows_with_kernel(table)) == expected
    # Every metric Delta records, as DESCRIBE HISTORY shows it; the job-only ones Delta does not record.
    history = delta_history_metrics(spark, Path(table))
    assert {name: metrics[name] for name in history} == history
    assert (history["numTargetRowsUpdated"], history["numTargetRowsInserted"]) == (2, 2)
    assert (metrics["readVersion"], metrics["tableVersion"], metrics["skipped"]) == (0, 1, False)
    assert set(metrics) - set(history) <= JOB_ONLY_METRICS | {"appId", "appVersion", "stageTimesMs"}
    assert _txns(table) == [(1, "delta-engine", 1)]
    last = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()[0]
    assert (last["operation"], json.loads(last["userMetadata"])) == ("MERGE", {"team": "ledger"})

    again = run_merge(merge_spark, _spec(table, source, UPSERT.replace("s.name", "concat(t.name, s.name)")))

    # Applied once: the retry finds the key in the log and reports that commit.
    assert (again.skipped, again.tableVersion, again.numTargetRowsUpdated) == (True, 1, 2)
    assert table_version(table) == 1
    assert sorted(read_rows(table)) == expected


@pytest.mark.parametrize(
    ("merge_sql", "error", "error_class"),
    [
        ("MERGE INTO target t USING source s ON t.id = s.id WHEN MATCHED THEN UPDATE SET name = s.nope",
         MergeAnalysisError, "DELTA_MERGE_UNRESOLVED_EXPRESSION"),
        ("MERGE INTO target t USING (SELECT id % 2 AS id, name FROM source) s ON t.id = s.id "
         "WHEN MATCHED THEN UPDATE SET name = s.name",
         MultipleSourceRowMatchesError, "DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE"),
    ],
)  # fmt: skip
def test_delta_s_failure_is_the_job_s_error_with_delta_s_class_and_the_table_unchanged(
    merge_spark: Any, tmp_path: Path, merge_sql: str, error: type[Exception], error_class: str
) -> None:
    table = create_table(tmp_path / "table", rows=4)
    source = _source(tmp_path / "source", [0, 1, 2, 3])

    with pytest.raises(error) as failed:
        run_merge(merge_spark, _spec(table, source, merge_sql))

    assert failed.value.error_class == error_class  # type: ignore[attr-defined]
    assert f"[{error_class}] " in str(failed.value)
    assert "INTERNAL_ERROR" not in str(failed.value)
    assert table_version(table) == 0
    assert sorted(read_rows(table)) == [[i, f"n{i}"] for i in range(4)]
    assert _txns(table) == []


def test_a_using_query_over_the_source_and_a_merge_that_changes_nothing(
    merge_spark: Any, tmp_path: Path
) -> None:
    table = create_table(tmp_path / "table", rows=4)
    source = _source(tmp_path / "source", [1, 2, 9])
    filtered = ("MERGE INTO target t USING (SELECT id, upper(name) AS name FROM source WHERE id > 1) s "
                "ON t.id = s.id WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT *")  # fmt: skip

    metrics = run_merge(merge_spark, _spec(table, source, filtered))

    assert sorted(read_rows(table)) == [[0, "n0"], [1, "n1"], [3, "n3"], [9, "S9"]]
    assert (metrics.numSourceRows, metrics.numTargetRowsDeleted, metrics.numTargetRowsInserted) == (2, 1, 1)
    nothing = "MERGE INTO target t USING source s ON t.id = s.id AND false WHEN MATCHED THEN DELETE"

    empty = run_merge(merge_spark, _spec(table, source, nothing, version=2))

    # Delta records the key even when nothing changed (an empty commit with only the app transaction), so
    # a retry still finds it.
    assert (empty.skipped, empty.tableVersion, empty.numTargetRowsDeleted) == (False, 2, 0)
    assert _txns(table) == [(1, "delta-engine", 1), (2, "delta-engine", 2)]
