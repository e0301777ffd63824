"""The getting-started page's change-data-capture recipe, run as written (with this test's paths): the table
its first block creates, the operator its second block builds merging a CDC batch on the shared session,
and its third block printing the commit's change feed."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pendulum
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "getting-started.md"
HEADING = "## A change-data-capture recipe"
TABLE, LANDING = "/data/tables/customers", "/data/landing/customers/{{ ds }}"


def _blocks() -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    _, found, section = text.partition(f"\n{HEADING}\n")
    assert found, f"{PAGE} has no {HEADING!r} section"
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 3, f"{HEADING}: expected 3 python blocks (create, merge, read), found {len(blocks)}"
    return [str(block) for block in blocks]


def test_the_recipe_creates_the_table_merges_a_cdc_batch_and_reads_its_changes(
    spark: Any, tmp_path: Path
) -> None:
    from airflow.sdk import DAG

    from airflow_merge_provider.operators.merge_into import MergeIntoOperator
    from spark_jobs.delta_merge import run_merge

    create, merge, read = _blocks()
    table, landing = tmp_path / "customers", tmp_path / "landing"
    assert all(TABLE in block for block in (create, merge, read))
    namespace: dict[str, Any] = {}
    exec(compile(create.replace(TABLE, str(table)), f"{PAGE}: create", "exec"), namespace)

    # The operator the second block builds (constructing it checks its statement), in a DAG.
    ast.parse(merge)
    with DAG("cdc_recipe", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")) as dag:
        exec(compile(merge, f"{PAGE}: merge", "exec"), {"MergeIntoOperator": MergeIntoOperator})
    (operator,) = dag.tasks
    assert (operator.target, operator.source) == (TABLE, LANDING)
    assert (operator.app_id, operator.app_version) == ("customers.{{ ds }}", 1)

    landing.mkdir()
    batch = pa.table({
        "id": pa.array([2, 3, 4, 5], pa.int64()),
        "name": ["Benjamin", "Cy", "Dee", "Eve"],
        "email": ["ben@example.org", "cy@example.com", "dee@example.com", "eve@example.com"],
        "op": ["U", "D", "I", "D"],  # 5 is deleted before the table ever had it: nothing to do
    })  # fmt: skip
    pq.write_table(batch, landing / "part-0.parquet")
    spec = {"target": {"uri": str(table)}, "source": {"uri": str(landing), "format": "parquet"},
            "merge_sql": operator.merge_sql}  # fmt: skip
    metrics = run_merge(spark, spec).to_dict()
    counts = ("numTargetRowsUpdated", "numTargetRowsDeleted", "numTargetRowsInserted")
    assert [metrics[name] for name in counts] == [1, 1, 1]
    assert metrics["numTargetChangeFilesAdded"] >= 1

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(read.replace(TABLE, str(table)), f"{PAGE}: read", "exec"), namespace)
    rows = [ast.literal_eval(line) for line in printed.getvalue().splitlines()]
    assert sorted((r["id"], r["name"], r["_change_type"], r["_commit_version"]) for r in rows) == [
        (2, "Ben", "update_preimage", 1),
        (2, "Benjamin", "update_postimage", 1),
        (3, "Cy", "delete", 1),
        (4, "Dee", "insert", 1),
    ]
