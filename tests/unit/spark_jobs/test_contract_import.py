"""The contract imports and validates where pyspark, deltalake, pyarrow and Airflow are not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Runs in a fresh interpreter: a meta path finder makes every blocked import fail as if not installed.
SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    BLOCKED = {"pyspark", "py4j", "deltalake", "pyarrow", "airflow", "pandas"}


    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None


    sys.meta_path.insert(0, Blocker())

    import spark_jobs.delta_merge as package
    from spark_jobs.delta_merge.spec import MergeSpec

    assert package.MergeSpec is MergeSpec
    spec = MergeSpec.from_dict({
        "target": {"uri": "/data/tables/accounts"},
        "source": {"uri": "/data/landing", "format": "parquet"},
        "merge_sql": "MERGE INTO target t USING source s ON t.id <=> s.id "
                     "WHEN MATCHED AND s.op = 'D' THEN DELETE "
                     "WHEN MATCHED THEN UPDATE SET t.addr.city = s.city "
                     "WHEN NOT MATCHED THEN INSERT *",
        "run": {"app_id": "dag.task", "app_version": 3},
    })
    parsed = MergeSpec.from_json(spec.to_json()).validate()
    structural = MergeSpec.from_dict({
        "target": {"uri": "/data/tables/accounts"},
        "source": {"query": "SELECT * FROM updates"},
        "condition": "target.id = source.id",
        "clauses": [{"when": "matched", "action": "update", "set": {"v": "source.v"}}],
    }).validate()
    try:
        package.run_merge
    except ImportError:
        pass
    else:
        raise AssertionError("run_merge imported without pyspark")
    loaded = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
    counts = {"clauses": len(parsed.clauses), "structural": len(structural.clauses)}
    print(json.dumps({**counts, "loaded": loaded}))
    """
)


def test_spec_imports_and_validates_without_spark_arrow_deltalake_or_airflow() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == '{"clauses": 3, "structural": 1, "loaded": []}'


# The provider's import of the job: also without the SQL parser, which only MergeSpec needs.
CONTRACT_SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    BLOCKED = {"pyspark", "py4j", "deltalake", "pyarrow", "airflow", "pandas", "sqlglot"}


    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None


    sys.meta_path.insert(0, Blocker())

    from spark_jobs.delta_merge import contract
    from spark_jobs.delta_merge.errors import ConstraintViolationError

    line = contract.failure_line(ConstraintViolationError(
        "NOT NULL constraint violated for column: n.", error_class="DELTA_NOT_NULL_CONSTRAINT_VIOLATED"))
    failure = contract.parse_failure_line(line)
    metrics = contract.MergeMetrics.from_mapping(
        contract.parse_metrics_line(contract.metrics_line({"numTargetRowsInserted": 3})))
    try:
        contract.MergeSpec
    except ImportError:
        spec = "lazy"
    else:
        spec = "loaded"
    loaded = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
    print(json.dumps({"kind": failure.kind, "deterministic": failure.deterministic,
                      "inserted": metrics.numTargetRowsInserted, "spec": spec, "loaded": loaded,
                      "failed": contract.failed_expectations({"numTargetRowsInserted": 3},
                                                             {"numTargetRowsInserted": {"equal_to": 3}})}))
    """
)


def test_the_contract_imports_without_spark_arrow_deltalake_airflow_or_the_sql_parser() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", CONTRACT_SCRIPT],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "kind": "ConstraintViolationError", "deterministic": True, "inserted": 3, "spec": "lazy",
        "loaded": [], "failed": [],
    }
