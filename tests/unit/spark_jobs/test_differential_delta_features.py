"""The merge job against Delta's own MERGE (delta-spark 4.4, the only reference: delta-rs cannot merge
most of these) on seeded random merges into tables Delta itself creates with table features.

Each case (tests/support/differential_tables.py) has Delta create a target with a nested, NULL-heavy
schema (a struct holding a struct, an array, a map; many NULL keys, structs and nested fields), with
deletion vectors, the change data feed and column mapping by name each on or off, partitioned or not,
write it in one or two INSERTs and sometimes a DELETE; the folder is copied, the job merges one copy and
Delta's ``MERGE INTO`` the other (with schema evolution on or off, the source sometimes with an extra
column, an extra nested field, a missing column or its struct's fields reordered). Compared:

- the outcome: both merge, or both refuse with the same error class (the job's ``error_class`` among the
  conditions Delta's error names), neither leaving a version;
- the schema and rows, both tables read by Delta;
- the version: a new one on both sides, or none on either (skipRecordingEmptyCommits);
- every metric Delta's commit records in ``operationMetrics`` (the row metrics, ``DELTA_ROW_METRICS`` of
  test_differential, the files removed, the deletion vectors, the change files...), name by name, but the
  times and the ``ALLOWANCES``;
- with the change data feed, the change rows of the merge's version as Delta reads them from both tables
  (every column, ``_change_type`` included, ``_commit_timestamp`` left out, ``_commit_version`` checked to
  be the merge's), as multisets.

``ALLOWANCES`` names where the job differs from Delta on purpose, with the documentation that says so: the
layout metrics. Other documented differences do not show here: the job's refusals concern features these
tables do not have (docs/table-features.md), the error classes documented as differing (docs/how-it-works.md,
"Checked against Delta's own MERGE") come from statements the generator does not write (a struct and its
field in one SET, subqueries), and the change data feed's (a rewrite without changes) does not show through
Delta's reader (see the comparison of feeds below). ``FOUND_DIFFERENCES`` lists seeds that found a
difference from Delta, since fixed in the job; they run every time.

``MERGE_DIFFERENTIAL_CASES`` (default 12) sets the number of seeded cases; a failing case's id carries its
seed, and the assertion message prints the features, the statement and both inputs.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.delta_reader import table_version
from tests.support.delta_reference import TIME_METRICS, delta_merge_outcome
from tests.support.differential_tables import (
    Case,
    create_delta_target,
    delta_change_rows,
    delta_rows,
    generate_case,
    log_actions,
    write_source,
)
from tests.unit.spark_jobs.test_differential import DELTA_ROW_METRICS

NUM_CASES = int(os.environ.get("MERGE_DIFFERENTIAL_CASES", "12"))
# Seeds that found a difference from Delta, fixed since: they run every time (the assertion message gives the
# statement, the inputs and both outcomes).
FOUND_DIFFERENCES = {
    26: (
        "UPDATE SET * with schema evolution writes a struct of NULL fields where the source's struct (here "
        "st.n) is NULL; Delta writes NULL"
    ),
    32: (
        "a merge that extends a file's existing deletion vector: Delta records numTargetDeletionVectorsAdded "
        "1, Removed 1, Updated 1; the job Added 0, Removed 0, Updated 1"
    ),
}
SEEDS = sorted(set(range(NUM_CASES)) | set(FOUND_DIFFERENCES))
AUTO_MERGE_CONF = "spark.databricks.delta.schema.autoMerge.enabled"
# Where the job differs from Delta on purpose, by name: (what differs, where it is documented). Every other
# metric Delta's commit records (times aside) is compared with the job's.
ALLOWANCES = {
    "numTargetFilesAdded": (
        "file layout: Delta writes an unpartitioned rewrite as one file, the job one per shuffle partition",
        "docs/how-it-works.md, Checked against Delta's own MERGE: File layout",
    ),
    "numTargetBytesAdded": (
        "file layout and Parquet encodings differ",
        "docs/how-it-works.md, Checked against Delta's own MERGE: File layout",
    ),
}


def _feed(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True) for r in rows)


def _run_job(spark: Any, case: Case, target: Path, source: Path) -> tuple[dict[str, Any] | None, Any]:
    """(the job's metrics, None) or (None, its MergeJobError)."""
    from spark_jobs.delta_merge import run_merge
    from spark_jobs.delta_merge.errors import MergeJobError

    spec = {
        "target": {"uri": str(target)},
        "source": {"uri": str(source), "format": "parquet"},
        "merge_sql": case.merge_sql(),
        "options": {"schema_evolution": case.features.schema_evolution},
    }
    try:
        return run_merge(spark, spec).to_dict(), None
    except MergeJobError as error:
        return None, error


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_same_as_delta_on_table_features(
    spark: Any, tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    if seed % 2:
        # Odd seeds copy the unchanged rows of rewritten files by position, even seeds through Spark's
        # reader (the default for files this small), as in test_differential.
        request.getfixturevalue("copy_by_position")
    case = generate_case(seed)
    where = case.describe()
    if seed in FOUND_DIFFERENCES:
        where += f"\n  found before, fixed since: {FOUND_DIFFERENCES[seed]}"
    ours, theirs, source = tmp_path / "job", tmp_path / "delta", tmp_path / "source"
    create_delta_target(spark, ours, case)
    shutil.copytree(ours, theirs)
    write_source(spark, source, case)
    before = table_version(ours)

    metrics, job_error = _run_job(spark, case, ours, source)
    confs = {AUTO_MERGE_CONF: "true"} if case.features.schema_evolution else {}
    delta = delta_merge_outcome(spark, theirs, case.merge_sql(), spark.read.parquet(str(source)), confs=confs)

    if "error" in delta or job_error is not None:
        conditions, message = delta.get("error", (set(), ""))
        job_class = getattr(job_error, "error_class", None)
        assert job_error is not None, f"{where}\n  Delta failed, the job merged: {conditions} {message}"
        assert "error" in delta, f"{where}\n  the job failed, Delta merged: {job_error}"
        assert job_class in conditions, f"{where}\n  job: {job_error}\n  Delta: {conditions} {message}"
        if case.multiple_match_error:
            assert job_class == "DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE", where
        assert table_version(ours) == before == table_version(theirs), where
        return
    assert metrics is not None
    assert not case.multiple_match_error, f"{where}\n  both merged a multiple match"

    assert delta_rows(spark, ours) == delta_rows(spark, theirs), where
    version = table_version(ours)
    assert version - before == delta["version"] - before in (0, 1), where
    if version == before:
        return
    recorded = delta["metrics"]
    assert set(DELTA_ROW_METRICS) <= set(recorded), where
    compared = set(recorded) - TIME_METRICS - set(ALLOWANCES)
    differing = {name: (metrics.get(name), recorded[name]) for name in sorted(compared)
                 if metrics.get(name) != recorded[name]}  # fmt: skip
    assert differing == {}, f"(job, Delta) {where}"

    if case.features.change_data_feed:
        # A merge that rewrites files without changing a row: Delta commits no cdc action, the job an empty
        # change data file (docs/how-it-works.md, "Change data feed"). Delta 4.4's reader reads neither
        # version as holding changes (deltalake's reads Delta's as deletes and inserts of the copied rows),
        # so the feeds compare as they are.
        actions = {"job": log_actions(ours, version), "Delta": log_actions(theirs, version)}
        feeds = [_feed(delta_change_rows(spark, table, version)) for table in (ours, theirs)]
        assert feeds[0] == feeds[1], f"{where}\n  commits: {actions}"
