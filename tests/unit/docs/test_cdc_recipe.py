"""The getting-started page's change-data-capture recipe, each block run on its own as written (with this
test's paths): the table and the CDC batch its first block writes, the DAG its second block defines, whose
operator's statement merges the batch on the shared session, and its third block printing the commit's
change feed."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "getting-started.md"
HEADING = "## A change-data-capture recipe"
ROOT_DIR = "/tmp/lake"
TABLE, LANDING = f"{ROOT_DIR}/tables/customers", f"{ROOT_DIR}/landing/customers/{{{{ ds }}}}"


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

    from spark_jobs.delta_merge import run_merge

    create, merge, read = _blocks()
    assert all(TABLE in block for block in (create, merge, read))
    exec(compile(create.replace(ROOT_DIR, str(tmp_path)), f"{PAGE}: create", "exec"), {})
    table, landing = tmp_path / "tables" / "customers", tmp_path / "landing" / "customers" / "2024-06-01"
    assert pq.read_table(landing).num_rows == 4

    # The DAG the second block defines, as a DAG file is loaded (constructing the operator checks its
    # statement), then its statement on the batch the first block wrote.
    ast.parse(merge)
    namespace: dict[str, Any] = {}
    exec(compile(merge, f"{PAGE}: merge", "exec"), namespace)
    assert isinstance(namespace["dag"], DAG)
    (operator,) = namespace["dag"].tasks
    assert (operator.target, operator.source) == (TABLE, LANDING)
    assert (operator.app_id, operator.app_version) == ("customers.{{ ds }}", 1)
    spec = {"target": {"uri": str(table)}, "source": {"uri": str(landing), "format": "parquet"},
            "merge_sql": operator.merge_sql}  # fmt: skip
    metrics = run_merge(spark, spec).to_dict()
    counts = ("numTargetRowsUpdated", "numTargetRowsDeleted", "numTargetRowsInserted")
    assert [metrics[name] for name in counts] == [1, 1, 1]
    assert metrics["numTargetChangeFilesAdded"] >= 1

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(read.replace(ROOT_DIR, str(tmp_path)), f"{PAGE}: read", "exec"), {})
    rows = [ast.literal_eval(line) for line in printed.getvalue().splitlines()]
    assert sorted((r["id"], r["name"], r["_change_type"], r["_commit_version"]) for r in rows) == [
        (2, "Ben", "update_preimage", 1),
        (2, "Benjamin", "update_postimage", 1),
        (3, "Cy", "delete", 1),
        (4, "Dee", "insert", 1),
    ]
