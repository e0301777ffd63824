"""Delta Lake's own MERGE test scenarios (a sample, as data) run through the merge job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
from tests.support.scenario_harness import create_target, dataframe, load_scenarios, merge_spec, multiset

SCENARIOS = load_scenarios()
# Depend on the number of files the original test's table had, not on the merge's semantics.
FILE_DEPENDENT_METRICS = {"numTargetRowsCopied", "numOutputRows"}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["id"] for s in SCENARIOS])
def test_scenario(spark: Any, tmp_path: Path, scenario: dict[str, Any], copy_by_position: None) -> None:
    """Each scenario with copy-on-write's unchanged rows copied by position (the default path of small
    merges, through Spark's reader, is the one every other merge test takes)."""
    from spark_jobs.delta_merge import run_merge
    from spark_jobs.delta_merge.errors import MergeJobError

    target = tmp_path / "target"
    create_target(spark, target, scenario)
    view = "source_" + scenario["id"].replace("-", "_")
    dataframe(spark, scenario["source_schema"], scenario["source_rows"]).createOrReplaceTempView(view)
    spec = merge_spec(scenario, target, view)
    version_before = table_version(target)

    if "expected_error" in scenario:
        with pytest.raises(MergeJobError) as raised:
            run_merge(spark, spec)
        assert scenario["expected_error"].lower() in str(raised.value).lower()
        assert table_version(target) == version_before
        return

    metrics = run_merge(spark, spec).to_dict()
    expected_columns = None
    if "expected_schema" in scenario:
        expected_columns = [f.name for f in spark.createDataFrame([], scenario["expected_schema"]).schema]
    actual = read_rows(target, columns=expected_columns)
    assert multiset(actual) == multiset(scenario["expected_rows"])
    assert multiset(read_rows_with_kernel(target, columns=expected_columns)) == multiset(actual)
    # One version per merge, schema evolution included.
    assert metrics["tableVersion"] == table_version(target) == version_before + 1
    for name, value in scenario.get("expected_metrics", {}).items():
        if name not in FILE_DEPENDENT_METRICS:
            assert metrics[name] == value, name
