"""The example DAGs load, stay light to parse, and build valid merge specs once rendered."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_merge_provider.operators.merge_into import MergeIntoOperator
from tests.support.airflow_fixtures import ContextFactory

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "dags_examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.py"))
EXPECTED_DAGS = {
    "merge_upsert_daily", "merge_upsert_daily_report", "merge_cdc_apply", "merge_metrics_branching",
    "merge_fire_and_forget", "merge_examples_seed", "merge_with_delta_engine",
}  # fmt: skip


@pytest.fixture(scope="module")
def dagbag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(EXAMPLES), safe_mode=False)


def test_every_example_loads_without_import_errors(dagbag: Any) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == EXPECTED_DAGS
    assert {Path(dag.fileloc).name for dag in dagbag.dags.values()} == {path.name for path in EXAMPLE_FILES}


def test_parsing_the_examples_loads_no_spark_deltalake_or_pyarrow() -> None:
    # One interpreter parses the files one after the other and names the first that loads a heavy module.
    code = (
        "import importlib.util, json, sys\n"
        "heavy = ('pyspark', 'deltalake', 'pyarrow')\n"
        "found = {}\n"
        f"for path in {[str(path) for path in EXAMPLE_FILES]!r}:\n"
        "    spec = importlib.util.spec_from_file_location('example', path)\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "    loaded = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
        "    if loaded:\n"
        "        found[path] = loaded\n"
        "        break\n"
        "print(json.dumps(found))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


def test_every_example_merge_renders_to_a_valid_spec(dagbag: Any, make_context: ContextFactory) -> None:
    merges = [
        task for dag in dagbag.dags.values() for task in dag.tasks if isinstance(task, MergeIntoOperator)
    ]
    assert {task.task_id for task in merges} == {
        "upsert_accounts", "apply_customer_changes", "sync_orders", "submit_merge", "upsert_customers"
    }  # fmt: skip
    for task in merges:
        context = make_context(dag_id=task.dag_id, task_id=task.task_id)
        task.render_template_fields(context)
        spec = task.build_spec(context)
        assert str(spec.source.uri).endswith("/2024-01-02"), task.task_id
        # The upsert is keyed on its date (a clear or another `dags test` skips); the others on the run.
        run_id, clear_number = context["run_id"], context["dag_run"].clear_number
        run_key = (f"airflow:{task.dag_id}.{task.task_id}:{run_id}", clear_number)
        by_date = {"upsert_accounts": ("accounts.2024-01-02", 1),
                   "upsert_customers": ("customers.2024-01-02", 1)}  # fmt: skip
        assert (spec.run.app_id, spec.run.app_version) == by_date.get(task.task_id, run_key), task.task_id
        assert spec.options.engine == ("delta" if task.task_id == "upsert_customers" else "native")


def test_the_cdc_example_purges_by_the_run_date(dagbag: Any, make_context: ContextFactory) -> None:
    task = dagbag.dags["merge_cdc_apply"].get_task("apply_customer_changes")
    context = make_context()
    task.render_template_fields(context)
    parsed = task.build_spec(context).validate()
    (purge,) = parsed.clauses_of("not_matched_by_source")
    assert purge.action == "delete"
    assert purge.condition is not None
    assert "2023-01-02" in purge.condition
